#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "adapters/api/provider.h"
#include "adapters/local/process_runner.h"
#include "nlohmann/json.hpp"

namespace sandbox {

// Settings of the local provider (config key providers.local).
struct LocalConfig {
  // "bwrap": each run in bubblewrap namespaces (user, pid, net, ipc, uts),
  // no network, read-only system. "none": no isolation at all, for
  // development on machines without user namespaces; loudly logged.
  std::string isolation = "bwrap";
  std::string bwrap_path = "/usr/bin/bwrap";
  // Host directory holding one workspace per sandbox. Empty = a default
  // (/var/lib/sandbox-broker/workspaces as root, else $TMPDIR/...).
  std::string workspace_root;
  // Where sandboxed code sees its workspace (its cwd and HOME).
  std::string mount_point = "/workspace";
  // When the broker runs as root each sandbox runs as its own uid from
  // [uid_base, uid_base + uid_count), so process limits are per sandbox.
  int64_t uid_base = 600000;
  int64_t uid_count = 4096;
  // Per-run limits.
  int64_t cpu_seconds = 300;
  int64_t memory_bytes = int64_t{1} << 30;  // address space
  int64_t max_processes = 128;
  int64_t file_size_bytes = int64_t{256} << 20;
  int64_t open_files = 1024;
  // Largest file WriteFile/ReadFile moves.
  int64_t max_transfer_bytes = int64_t{16} << 20;
  // Extra host paths made visible read-only at the same place.
  std::vector<std::string> extra_ro_paths;
  // If set, code runs as this user (uid/gid 1000 inside the sandbox, with
  // matching /etc/passwd and /etc/group entries, home = mount_point), as in
  // cloud sandbox images (E2B's "user", Daytona's "daytona").
  std::string user_name;
  // Keep /tmp for the sandbox's whole life (shared by its runs, reachable by
  // WriteFile/ReadFile) instead of a fresh /tmp per run.
  bool persistent_tmp = false;
};

// Reads providers.local; INVALID_ARGUMENT naming the key on bad values.
absl::StatusOr<LocalConfig> ParseLocalConfig(const nlohmann::json& json);

// Runs each sandbox on this machine: a private workspace directory and, per
// run, a bubblewrap container around python3 / node / bash.
//
// Thread-safe.
class LocalProvider final : public Provider {
 public:
  // Checks that isolation works here (runs a probe sandbox) and prepares the
  // workspace root. FAILED_PRECONDITION with the reason when it cannot.
  static absl::StatusOr<std::unique_ptr<LocalProvider>> Create(LocalConfig config);

  absl::string_view name() const override { return "local"; }
  absl::StatusOr<std::unique_ptr<Sandbox>> Create(const SandboxSpec& spec) override;
  // Durable sessions: a sandbox on the workspace <workspace_root>/<id> left
  // by an earlier process (processes that ran in it died with that process;
  // its files remain), and the workspaces whose marker
  // (<workspace_root>/.owners/<id>) names
  // `deployment_id`. Untagged workspaces are never listed.
  absl::StatusOr<std::unique_ptr<Sandbox>> Attach(const std::string& sandbox_id,
                                                  const SandboxSpec& spec) override;
  absl::StatusOr<std::vector<OwnedSandbox>> ListOwned(const std::string& deployment_id) override;

  // Arguments that wrap `command` in the sandbox (bwrap options included);
  // exposed for benchmarks that run the same invocation without the broker.
  std::vector<std::string> WrapCommand(const std::string& workspace,
                                       const std::vector<std::string>& command,
                                       const std::string& tmp_dir = "",
                                       const std::string& cwd = "") const;
  const LocalConfig& config() const { return config_; }

  class UidPool;

 private:
  LocalProvider(LocalConfig config, std::shared_ptr<UidPool> uids);
  absl::Status Probe();

  const LocalConfig config_;
  // Set when running as root: one uid per sandbox. Shared with sandboxes,
  // which give their uid back when destroyed.
  const std::shared_ptr<UidPool> uids_;
  std::vector<std::string> system_args_;  // bwrap options for /usr, /etc, ...
};

}  // namespace sandbox
