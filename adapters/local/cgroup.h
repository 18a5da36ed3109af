#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sandbox {

// Limits for all processes of one sandbox together. 0 = unlimited.
struct CgroupLimits {
  int64_t memory_bytes = 0;  // swap is never usable on top
  double cpus = 0;           // CFS quota, in CPUs
  int64_t pids = 0;
};

// What the kernel accounts for a sandbox right now.
struct CgroupUsage {
  int64_t memory_bytes = 0;
  double cpu_seconds = 0;
  int64_t oom_kills = 0;  // processes killed by the memory limit, ever
};

// The cgroup filesystem of this machine, found under `root` (the seam: tests
// point it at a fake tree in a temp dir). cgroup v2 when the unified
// hierarchy at `root` has the memory, pids and cpu controllers; else cgroup
// v1 with root/memory, root/pids, root/cpu (and root/cpuacct) hierarchies.
//
// Layout of one sandbox `name` below `parent` (in each v1 hierarchy, or once
// in v2):  <parent>/<name>/            limits, accounting
//          <parent>/<name>/init/       the container's PID 1
//          <parent>/<name>/run-N/      one per run, so a run can be killed alone
//
// Thread-safe (no mutable state).
class CgroupFs {
 public:
  static absl::StatusOr<CgroupFs> Detect(const std::string& root, const std::string& parent);

  int version() const { return version_; }
  // A human description: "cgroup v2 at /sys/fs/cgroup/sandbox-broker".
  std::string Describe() const;

  // Sets the CPU weight of the parent group, i.e. of all sandboxes together
  // against the host's other processes and groups (creating the group):
  // v2 cpu.weight = `weight` (1-10000, 100 = the kernel's default, one
  // ordinary process); v1 cpu.shares = weight * 1024 / 100.
  absl::Status SetTreeCpuWeight(int64_t weight) const;
  // The parent group's own memory and pids limits (0 = none), over all
  // sandboxes together: v2 memory.max and pids.max; v1
  // memory.limit_in_bytes and pids.max.
  absl::Status SetTreeLimits(int64_t memory_bytes, int64_t pids) const;
  // Creates (or, after a crash, reuses) the sandbox's group with `limits`.
  absl::Status CreateSandbox(const std::string& name, const CgroupLimits& limits) const;
  // Creates a child group ("init", "run-3"); its cgroup.procs files opened
  // for writing (O_CLOEXEC; the caller closes them). v2: one. v1: the
  // child in the pids (the kill set) and memory (OOM kills) hierarchies;
  // for "init" the child in pids plus the sandbox's own group in memory,
  // cpu and cpuacct.
  absl::StatusOr<std::vector<int>> CreateChild(const std::string& name,
                                               const std::string& child) const;
  // SIGKILLs every process of the group (child empty = the whole sandbox)
  // until it is empty; true when it is.
  bool Kill(const std::string& name, const std::string& child = "") const;
  // Whether the group has no processes.
  bool Empty(const std::string& name, const std::string& child = "") const;
  // Removes a child group, or (child empty) the sandbox's whole subtree.
  // Kill first. Missing is success.
  absl::Status Remove(const std::string& name, const std::string& child = "") const;
  CgroupUsage Usage(const std::string& name) const;
  // Processes killed by the memory limit: of the child group ("run-3")
  // when it has its own count (v2: memory enabled for the sandbox's
  // children; v1: the run's memory group), else of the whole sandbox (v2's
  // memory.events is hierarchical; v1's memory.oom_control counts per group,
  // so it is summed over the sandbox's groups). Compare before and after a
  // run.
  int64_t OomKills(const std::string& name, const std::string& child) const;
  // Whether the group exists (e.g. left by a crashed broker).
  bool Exists(const std::string& name) const;

 private:
  CgroupFs() = default;
  // Directories of the group in each hierarchy.
  std::vector<std::string> Dirs(const std::string& name, const std::string& child) const;
  std::string MemDir(const std::string& name) const;
  std::string PidsDir(const std::string& name, const std::string& child) const;
  // v2: enables our controllers at the root and creates the parent group.
  absl::Status MakeV2Parent() const;

  int version_ = 0;
  std::string root_;
  std::string parent_;
  // v1: hierarchy directories (memory, pids, cpu, cpuacct); v2: root_ once.
  std::string mem_, pids_, cpu_, cpuacct_;
};

}  // namespace sandbox
