#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "adapters/api/provider.h"
#include "adapters/local/capacity.h"
#include "adapters/local/process_runner.h"
#include "nlohmann/json.hpp"

namespace sandbox {

class CgroupFs;
class Egress;

// Limits of one local sandbox; 0 = none.
struct LocalLimits {
  int64_t memory_bytes = int64_t{1} << 30;  // all processes + /tmp + /dev/shm
  double cpus = 1.0;                        // CFS quota
  int64_t pids = 256;
  int64_t disk_bytes = int64_t{1} << 30;  // workspace quota
  int64_t disk_inodes = 100000;
  int64_t tmp_bytes = int64_t{256} << 20;  // /tmp and /dev/shm together
  static LocalLimits Max() {
    LocalLimits m;
    m.memory_bytes = int64_t{8} << 30;
    m.cpus = 4;
    m.pids = 4096;
    m.disk_bytes = int64_t{16} << 30;
    m.disk_inodes = 2000000;
    m.tmp_bytes = int64_t{4} << 30;
    return m;
  }
};

// Settings of the local provider (config key providers.local).
// providers.local.isolation: "bwrap" (a container per session) or "none"
// (code runs as the broker, unisolated: development only).
enum class Isolation { kBwrap, kNone };
// providers.local.enforcement: "strict" refuses to start without cgroups and
// disk quotas; "best_effort" runs without what is missing.
enum class Enforcement { kStrict, kBestEffort };

struct LocalConfig {
  // "bwrap": each run in bubblewrap namespaces (user, pid, net, ipc, uts),
  // no network, read-only system. "none": no isolation at all, for
  // development on machines without user namespaces; loudly logged.
  Isolation isolation = Isolation::kBwrap;
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
  // Per-process open files (RLIMIT_NOFILE).
  int64_t open_files = 1024;
  // Per-sandbox limits the kernel enforces (providers.local.limits), and the
  // most a session may ask for (providers.local.max_limits).
  LocalLimits limits;
  LocalLimits max_limits = LocalLimits::Max();
  // "strict": refuse to start unless cgroups and disk quotas work here.
  // "best_effort": run without whatever is missing (logged loudly, shown by
  // health).
  Enforcement enforcement = Enforcement::kStrict;
  // The cgroup filesystem (a seam for tests) and our group under it.
  std::string cgroup_root = "/sys/fs/cgroup";
  std::string cgroup_parent = "sandbox-broker";
  // The CPU weight of all sandboxes together (the cgroup_parent group)
  // against the host's other processes when they compete for the CPU: v2
  // cpu.weight, v1 cpu.shares = weight * 1024 / 100. 100 (the kernel's
  // default) makes the whole tree weigh one ordinary process, so the
  // broker's own threads come first; higher gives bursts of sandboxed
  // starts the CPU sooner at the broker's expense. Each sandbox is still
  // capped at limits.cpus.
  int64_t cpu_weight = 100;
  // The container's PID 1 (sandbox-init); empty = next to this executable.
  std::string init_path;
  // Largest file WriteFile/ReadFile moves.
  int64_t max_transfer_bytes = int64_t{16} << 20;
  // Extra host paths made visible read-only at the same place.
  std::vector<std::string> extra_ro_paths;
  // If set, code runs as this user (uid/gid 1000 inside the sandbox, home =
  // mount_point), as in cloud sandbox images (E2B's "user", Daytona's
  // "daytona"); if not, as "sandbox" with the sandbox's own uid. Either way
  // the sandbox's /etc/passwd and /etc/group hold root, that user and
  // nobody, none of the host's accounts.
  std::string user_name;
  // Retired: /tmp now always lasts the sandbox's life (one container per
  // session). Accepted for old configs.
  bool persistent_tmp = true;
  // Host-wide admission (capacity.h; providers.local.capacity): what all
  // sandboxes together may reserve. -1 = what the host has (HostCapacity),
  // 0 = no limit.
  LocalCapacity capacity = {-1, -1, -1, 0};
};

// Reads providers.local; INVALID_ARGUMENT naming the key on bad values.
absl::StatusOr<LocalConfig> ParseLocalConfig(const nlohmann::json& json);

// What the machine enforces, found at startup.
struct LocalEnforcement {
  bool cgroups = false;  // memory, cpu, pids limits per sandbox
  bool disk = false;     // workspace quota (loop-mounted ext4 image)
  std::string detail;    // why something is missing, or the mechanisms used
};

// Runs each sandbox on this machine as one long-lived container per session:
// bubblewrap namespaces around our sandbox-init as PID 1, one cgroup, one
// disk image; runs are fork+exec inside it. Everything of sandbox <id> lives
// under workspace_root/<id>/ (workspace/, disk.img, container.log) and in
// the cgroup <cgroup_parent>/<id>.
//
// Thread-safe.
class LocalProvider final : public Provider {
 public:
  // Checks that isolation works here (runs a probe sandbox) and prepares the
  // workspace root. FAILED_PRECONDITION with the reason when it cannot.
  static absl::StatusOr<std::unique_ptr<LocalProvider>> Create(LocalConfig config);

  ~LocalProvider() override;
  absl::string_view name() const override { return "local"; }
  absl::StatusOr<std::unique_ptr<Sandbox>> Create(const SandboxSpec& spec) override;
  // Runs one probe sandbox (fork, namespaces, a shell), as at startup.
  // Starts a container and runs `exit 0` in it (the periodic health probe).
  absl::Status CheckHealth() override;

  // For crash recovery (durable sessions). Sandbox ids found under
  // workspace_root (live or left by a killed broker, the probe's included).
  std::vector<std::string> ListSandboxIds() const;
  // A new container on the existing workspace of sandbox `id` (files
  // survive, processes do not): whatever is left running in its cgroup is
  // killed, its disk image remounted and its files re-owned by the uid it
  // gets now. SandboxGoneError when there is no such workspace (what is left
  // of it, its owner marker included, is removed); INVALID_ARGUMENT for an
  // id this provider never makes for sessions ("local-" + hex).
  absl::StatusOr<std::unique_ptr<Sandbox>> Attach(const std::string& id,
                                                  const SandboxSpec& spec) override;
  // Durable sessions: the sandboxes whose owner marker
  // (<workspace_root>/.owners/<id>, written before <workspace_root>/<id>/
  // and removed after it) names `deployment_id`, whether or not their
  // directory still exists. Untagged sandboxes (and the probe) are never
  // listed.
  absl::StatusOr<std::vector<OwnedSandbox>> ListOwned(const std::string& deployment_id) override;
  // Kills whatever is left of sandbox `id` (cgroup), unmounts its disk and
  // removes its directory. Missing is OK. Not for a sandbox in use.
  absl::Status RemoveSandbox(const std::string& id) const;
  // The directory of sandbox `id` (its workspace is <dir>/workspace).
  std::string SandboxDir(const std::string& id) const;

  // The limits a session gets: the config's, overridden by the request's
  // nonzero fields. INVALID_ARGUMENT naming the field and the maximum.
  absl::StatusOr<LocalLimits> LimitsFor(const SandboxResources& requested,
                                        const SandboxResources& ceiling = {}) const;
  const LocalEnforcement& enforcement() const { return enforcement_; }
  // "best_effort: <what is not enforced>" when limits are not all enforced.
  std::string Degraded() const override;
  void SetHooks(ProviderHooks hooks) override;
  // Whether sessions here may have network rules (docs/network.md), and
  // why not.
  bool egress_available() const { return egress_ != nullptr; }
  // The host-wide reservations (capacity.h).
  const CapacityLedger& capacity() const { return *capacity_; }

  // Arguments that wrap `command` in the sandbox (bwrap options included);
  // exposed for benchmarks that run the same invocation without the broker.
  // Unlike a container it binds no /etc/passwd, /etc/group or nsswitch.conf
  // (a container's are written into its sandbox's directory).
  std::vector<std::string> WrapCommand(const std::string& workspace,
                                       const std::vector<std::string>& command,
                                       const std::string& tmp_dir = "",
                                       const std::string& cwd = "") const;
  const LocalConfig& config() const { return config_; }
  // Runs started and not yet ended, over all of this provider's sandboxes
  // (spares are readied only when few are: see sandbox_init.cc).
  std::atomic<int>& runs_in_flight() const { return runs_in_flight_; }

  class UidPool;

 private:
  LocalProvider(LocalConfig config, std::shared_ptr<UidPool> uids);
  absl::Status Probe();
  absl::Status ProbeSandbox();
  absl::Status ProbeEnforcement();
  void PrepareWorkspaceRoot();
  absl::StatusOr<std::unique_ptr<Sandbox>> Start(const std::string& id, const SandboxSpec& spec,
                                                 bool fresh);
  std::vector<std::string> ContainerArgs(const std::string& dir, const std::string& workspace,
                                         const LocalLimits& limits, bool egress) const;

  const LocalConfig config_;
  // Set when running as root: one uid per sandbox. Shared with sandboxes,
  // which give their uid back when destroyed.
  const std::shared_ptr<UidPool> uids_;
  std::vector<std::string> system_args_;  // bwrap options for /usr, /etc, ...
  std::vector<std::string> proc_masks_;   // bwrap options masking /proc paths
  std::vector<std::string> user_args_;    // bwrap options for user_name
  std::string seccomp_bpf_;
  // sandbox-init's copy in workspace_root, which containers bind (see
  // CopyInitIntoWorkspaceRoot).
  std::string init_copy_;
  LocalEnforcement enforcement_;
  mutable std::atomic<int> runs_in_flight_{0};
  std::unique_ptr<CgroupFs> cgroups_;  // null when not enforced
  // Every sandbox's limits reserved against the host (capacity.h).
  std::unique_ptr<CapacityLedger> capacity_;
  // Network policies (egress.h); null when this host cannot enforce them,
  // and why. Declared after nothing a sandbox needs: sandboxes end first.
  std::unique_ptr<Egress> egress_;
  std::string no_egress_;
  // Each new container drops the other workspaces from a mount namespace
  // of its own; workspace_root, resolved, is a mount (PrepareWorkspaceRoot).
  bool own_mount_namespace_ = false;
  std::string root_mount_;
  bool made_root_mount_ = false;  // this process bind-mounted workspace_root
};

}  // namespace sandbox
