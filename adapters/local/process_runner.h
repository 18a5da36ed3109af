#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "adapters/api/output.h"
#include "adapters/api/provider.h"

namespace sandbox {

// Resource limits applied to a child before exec (setrlimit). 0 = leave as is.
struct ProcessLimits {
  uint64_t cpu_seconds = 0;
  uint64_t address_space_bytes = 0;
  uint64_t max_processes = 0;
  uint64_t file_size_bytes = 0;
  uint64_t open_files = 0;
};

struct ProcessSpec {
  std::vector<std::string> argv;  // argv[0] is an absolute path
  std::vector<std::string> env;   // "K=V", the child's whole environment
  std::string cwd;                // empty = inherit
  // Switch to this uid/gid (with no supplementary groups) before exec;
  // -1 = keep the broker's.
  int uid = -1;
  int gid = -1;
  ProcessLimits limits;
  // Bytes fed to the child's stdin (through a memfd, so any size and any
  // bytes); empty = /dev/null.
  std::string stdin_data;
  // Bytes readable on the child's fd 3 (a memfd); empty = no fd 3.
  std::string fd3_data;
  absl::Duration timeout = absl::Seconds(30);
  size_t max_output_bytes = 64 * 1024;
  std::function<void(OutputStream, absl::string_view)> on_output;
  std::function<bool()> cancelled;
  // Called with the child's pid right after it starts, and with -1 once it
  // has been reaped (so an owner can kill it from another thread meanwhile).
  std::function<void(pid_t)> on_pid;
};

// Runs a process to completion, collecting stdout and stderr in arrival
// order. The child leads its own process group; on timeout or cancellation
// the whole group gets SIGKILL (a namespace-isolated child takes its
// namespace with it). Errors only when the process cannot be started
// (INTERNAL / INVALID_ARGUMENT); everything after that is a result.
//
// Thread-safe (no shared state); blocks the calling thread.
absl::StatusOr<ExecResult> RunProcess(const ProcessSpec& spec);

// The result of a finished run: the collected output and the exit code from
// a waitpid status (124 on timeout, 128+N when killed by signal N).
ExecResult FinishResult(OutputCollector& collector, int wait_status, bool timed_out,
                        bool cancelled);

}  // namespace sandbox
