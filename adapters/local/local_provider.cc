#include "adapters/local/local_provider.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "adapters/api/output.h"
#include "adapters/local/cgroup.h"
#include "adapters/local/contexts.h"
#include "adapters/local/disk_image.h"
#include "adapters/local/egress.h"
#include "adapters/local/init_binary.h"
#include "adapters/local/seccomp_filter.h"
#include "adapters/local/workspace_fs.h"
#include "common/child_reaper.h"
#include "common/clock.h"
#include "common/config_reader.h"
#include "common/event_loop.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/text.h"

namespace sandbox {

// Hands out sandbox uids; a uid is reused only after its sandbox is
// destroyed (all its processes dead, its workspace removed).
class LocalProvider::UidPool {
 public:
  UidPool(int64_t base, int64_t count) : base_(base), count_(count) {}
  absl::StatusOr<int> Acquire() {
    absl::MutexLock l(&mu_);
    if (!free_.empty()) {
      int uid = free_.back();
      free_.pop_back();
      return uid;
    }
    if (next_ >= count_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "local: all ", count_, " sandbox uids are in use (providers.local.uid_count)"));
    }
    return static_cast<int>(base_ + next_++);
  }
  void Release(int uid) {
    absl::MutexLock l(&mu_);
    free_.push_back(uid);
  }

 private:
  const int64_t base_, count_;
  absl::Mutex mu_;
  std::vector<int> free_ ABSL_GUARDED_BY(mu_);
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;
};

namespace {

// open_tree(2) and move_mount(2) (Linux 5.2), by number: glibc 2.36's
// <sys/mount.h> and <linux/mount.h> do not mix.
constexpr unsigned kOpenTreeClone = 1;           // OPEN_TREE_CLONE
constexpr unsigned kMoveMountFEmptyPath = 0x04;  // MOVE_MOUNT_F_EMPTY_PATH
#ifndef SYS_open_tree
#define SYS_open_tree 428
#endif
#ifndef SYS_move_mount
#define SYS_move_mount 429
#endif

// In a new container's process, before it runs bwrap (async-signal-safe):
// a mount namespace of its own in which `root` shows its own directories
// but no workspace mounted below it, except `ws`. bwrap reads the whole
// mount table for each of its ~50 mounts, and the host's has a line per
// sandbox: beside 500 sandboxes a bwrap spent ~35 ms of CPU on that alone.
// Everything is a slave of the host's mounts (nothing here propagates back;
// what the host unmounts leaves here too when its mounts are shared), but
// the two mounts put back are private: the workspaces mounted on the host
// later never reach this namespace. False on any failure after unshare:
// then the container must not start (a half-made namespace could keep other
// sandboxes' disks alive for this one's life).
bool DropOtherWorkspaces(const char* root, const char* ws) {
  if (unshare(CLONE_NEWNS) != 0) return false;
  if (mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0) return false;
  const int top =
      static_cast<int>(syscall(SYS_open_tree, AT_FDCWD, root, kOpenTreeClone | O_CLOEXEC));
  const int own =
      static_cast<int>(syscall(SYS_open_tree, AT_FDCWD, ws, kOpenTreeClone | O_CLOEXEC));
  // `root` without what is mounted below it, then this sandbox's workspace.
  const bool ok = top >= 0 && own >= 0 && umount2(root, MNT_DETACH) == 0 &&
                  syscall(SYS_move_mount, top, "", AT_FDCWD, root, kMoveMountFEmptyPath) == 0 &&
                  syscall(SYS_move_mount, own, "", AT_FDCWD, ws, kMoveMountFEmptyPath) == 0 &&
                  mount(nullptr, root, nullptr, MS_PRIVATE, nullptr) == 0 &&
                  mount(nullptr, ws, nullptr, MS_PRIVATE, nullptr) == 0;
  if (top >= 0) close(top);
  if (own >= 0) close(own);
  return ok;
}

// /etc entries programs need; the rest of /etc (and every config file of
// the broker) stays invisible.
const char* const kEtcAllowList[] = {
    "alternatives",   "ld.so.cache",  "ld.so.conf",      "ld.so.conf.d", "localtime",
    "timezone",       "ssl",          "ca-certificates", "mime.types",   "hosts",
    "host.conf",      "bash.bashrc",  "profile",         "inputrc",      "terminfo",
    "magic",          "locale.alias", "locale.gen",      "python3",      "python3.11",
    "debian_version", "os-release",   "protocols",       "services",     "matplotlibrc",
    "fonts"};

const char* const kTopLevelDirs[] = {"bin", "sbin", "lib", "lib32", "lib64", "libx32"};

std::string DefaultWorkspaceRoot() {
  if (geteuid() == 0) return "/var/lib/sandbox-broker/workspaces";
  const char* tmp = getenv("TMPDIR");
  return absl::StrCat(tmp && *tmp ? tmp : "/tmp", "/sandbox-broker-", geteuid(), "/workspaces");
}

absl::Status MakeDirs(const std::string& path, mode_t mode) {
  std::string cur;
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      cur = path.substr(0, i);
      if (mkdir(cur.c_str(), mode) != 0 && errno != EEXIST) {
        return absl::FailedPreconditionError(
            absl::StrCat("local: cannot create ", cur, ": ", strerror(errno)));
      }
    }
  }
  // Sandbox uids must be able to traverse to their workspace.
  chmod(path.c_str(), mode);
  return absl::OkStatus();
}

// Docker's masked /proc paths: kernel addresses, keys and timers of the
// whole host. Files get /dev/null, directories an empty read-only tmpfs.
const char* const kProcMaskFiles[] = {"kcore",      "keys",        "kallsyms",    "latency_stats",
                                      "timer_list", "timer_stats", "sched_debug", "sysrq-trigger",
                                      "kpagecount", "kpageflags",  "kpagecgroup", "config.gz",
                                      "modules",    "vmallocinfo", "slabinfo",    "pagetypeinfo"};
const char* const kProcMaskDirs[] = {"acpi", "asound", "scsi", "fs", "irq", "bus", "driver"};

// Reads what background processes write to a finished run's pipes, until
// they close them, so a server started by an earlier run never dies of
// SIGPIPE; rate-limited (below). The bytes are not part of any result.
void DrainOnLoop(EventLoop* loop, const std::vector<int>& fds);

// When a run's main process has exited, what is in its pipes is taken into
// the result: at most this many reads of 64 KiB per stream.
constexpr int kTakeAtEndReads = 16;

absl::StatusOr<int> MemFd(const std::string& data) {
  int fd = memfd_create("sandbox-input", MFD_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("memfd_create: ", strerror(errno)));
  size_t off = 0;
  while (off < data.size()) {
    ssize_t w = write(fd, data.data() + off, data.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      close(fd);
      return absl::InternalError(absl::StrCat("write memfd: ", strerror(errno)));
    }
    off += static_cast<size_t>(w);
  }
  lseek(fd, 0, SEEK_SET);
  return fd;
}

std::string ReadSmallFile(const std::string& path) {
  std::ifstream f(path);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (s.size() > 2000) s = s.substr(s.size() - 2000);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// lchown every entry of a tree (a re-attached workspace gets a new uid).
thread_local uid_t g_chown_uid;
int ChownEntry(const char* path, const struct stat*, int, struct FTW*) {
  (void)!lchown(path, g_chown_uid, g_chown_uid);
  return 0;
}
void ChownTree(const std::string& path, uid_t uid) {
  g_chown_uid = uid;
  nftw(path.c_str(), ChownEntry, 64, FTW_PHYS);
}

// ---- durable sessions: the owner marker of each sandbox -------------------
// <workspace_root>/.owners/<sandbox id> (JSON: deployment_id, attempt_id,
// tenant, session_id, created_at) tags a sandbox with the deployment and
// create attempt that made it. It lives outside <workspace_root>/<id>/ so it
// can be written before that directory exists and removed after it is gone:
// a crash at any point of a create or destroy leaves the sandbox (or what
// is left of it) findable by ListOwned and removable through Attach+Destroy.
// Sandboxes made without a deployment id (and the probe sandbox) have none.

std::string OwnerMarkerPath(const std::string& root, const std::string& id) {
  return absl::StrCat(root, "/.owners/", id);
}

absl::Status WriteOwnerMarker(const std::string& root, const std::string& id,
                              const SandboxSpec& spec) {
  nlohmann::json j = {{"deployment_id", spec.deployment_id},
                      {"attempt_id", spec.attempt_id},
                      {"tenant", spec.tenant},
                      {"session_id", spec.session_id},
                      {"created_at", absl::ToUnixSeconds(absl::Now())}};
  mkdir(absl::StrCat(root, "/.owners").c_str(), 0700);
  const std::string path = OwnerMarkerPath(root, id);
  const std::string tmp = path + ".new";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << j.dump();
    if (!out.flush()) {
      return absl::InternalError(absl::StrCat("local: cannot write ", tmp));
    }
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("local: cannot write ", path, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

// The sandbox's own /etc/passwd, /etc/group and /etc/nsswitch.conf, in its
// directory: root, the user code runs as (`name`, `uid`, home `home`) and
// nobody, looked up in those files only; none of the host's accounts, from
// files or from NSS modules such as systemd's. Without an entry for its uid,
// `whoami`, Python's getpass.getuser() and Node's os.userInfo() fail. Each
// file is replaced by rename(): a container still running from an earlier
// start keeps the copy it has bind-mounted, never a half-written one.
absl::Status WriteAccountFiles(const std::string& dir, const std::string& name, uint32_t uid,
                               uint32_t gid, const std::string& home) {
  // The user's own line first, and no root or nobody line with its id
  // (a broker run as a random uid with gid 0, or as nobody).
  std::string passwd =
      absl::StrCat(name, ":x:", uid, ":", gid, ":", name, ":", home, ":/bin/bash\n");
  if (uid != 0) passwd += "root:x:0:0:root:/root:/bin/bash\n";
  if (uid != 65534) passwd += "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
  std::string group = absl::StrCat(name, ":x:", gid, ":\n");
  if (gid != 0) group += "root:x:0:\n";
  if (gid != 65534) group += "nogroup:x:65534:\n";
  const std::string nsswitch =
      "passwd: files\ngroup: files\nshadow: files\ngshadow: files\nhosts: files dns\n"
      "networks: files\nprotocols: files\nservices: files\nethers: files\nrpc: files\n";
  // Bound only with network rules: the broker answers DNS there.
  const std::string resolv = "nameserver 127.0.0.1\noptions timeout:2 attempts:2\n";
  for (const auto& [file, text] :
       {std::pair<const char*, const std::string&>{"passwd", passwd},
        std::pair<const char*, const std::string&>{"group", group},
        std::pair<const char*, const std::string&>{"nsswitch.conf", nsswitch},
        std::pair<const char*, const std::string&>{"resolv.conf", resolv}}) {
    const std::string path = absl::StrCat(dir, "/", file);
    const std::string tmp = path + ".new";
    unlink(tmp.c_str());
    int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
      return absl::InternalError(absl::StrCat("local: create ", tmp, ": ", strerror(errno)));
    }
    const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    fchmod(fd, 0644);
    close(fd);
    if (!written || rename(tmp.c_str(), path.c_str()) != 0) {
      unlink(tmp.c_str());
      return absl::InternalError(absl::StrCat("local: write ", path));
    }
  }
  return absl::OkStatus();
}

void RemoveOwnerMarker(const std::string& root, const std::string& id) {
  unlink(OwnerMarkerPath(root, id).c_str());
}

// A sandbox id this provider makes for sessions: "local-" and hex (never a
// path, never the probe's "local-probe-...").
bool IsLocalSandboxId(const std::string& id) {
  if (!absl::StartsWith(id, "local-") || id.size() == 6 || id.size() > 64) return false;
  for (char c : id.substr(6)) {
    if (!absl::ascii_isxdigit(c)) return false;
  }
  return true;
}

// Runs going on a provider at most for a spare to be used or readied.
constexpr int kQuietRuns = 4;

// The largest shell script passed as `bash -c` (one argument may be 128 KiB).
constexpr size_t kMaxShellArg = 64 << 10;

// The most a context supervisor's answer may hold (an execution's output
// and its images).
constexpr size_t kMaxContextAnswer = 64 << 20;
// Idle connections to a sandbox's context supervisor kept for the next call.
constexpr size_t kIdleContextConnections = 4;

// One thread that readies sandboxes' spares (see sandbox_init.cc): their
// cgroup moves serialize in the kernel anyway.
WorkPool* SparePool() {
  static WorkPool* pool = new WorkPool("local-spares", 1);
  return pool;
}

// An upload into a container's /tmp: its rename and its cleanup run as the
// sandbox's uid too (there the host's root has no uid: EOVERFLOW).
class UploadAsOwner final : public FileUpload {
 public:
  using AsOwnerFn = std::function<absl::Status(const std::function<absl::Status()>&)>;
  UploadAsOwner(std::unique_ptr<FileUpload> inner, AsOwnerFn as_owner)
      : inner_(std::move(inner)), as_owner_(std::move(as_owner)) {}
  ~UploadAsOwner() override {
    (void)as_owner_([this] {
      inner_.reset();
      return absl::OkStatus();
    });
  }
  absl::Status Append(absl::string_view chunk) override { return inner_->Append(chunk); }
  absl::Status Commit() override {
    return as_owner_([this] { return inner_->Commit(); });
  }

 private:
  std::unique_ptr<FileUpload> inner_;
  const AsOwnerFn as_owner_;
};

class LocalSandbox final : public Sandbox {
 public:
  struct Parts {
    std::string id, dir, workspace;
    int uid = -1;
    LocalLimits limits;
    int ctl = -1;
    pid_t bwrap_pid = -1;
    pid_t init_pid = -1;
    // The container's /tmp, opened (O_PATH) once init is up: file calls go
    // through it, never again through /proc/<init_pid>, a pid the kernel
    // gives to another process once init is gone. -1 with isolation "none".
    int tmp_fd = -1;
    // The sandbox's egress point, when it has network rules.
    std::unique_ptr<EgressPoint> egress;
    // Its limits, reserved against the host's capacity.
    CapacityLedger::Hold capacity;
  };

  LocalSandbox(const LocalProvider* provider, std::shared_ptr<LocalProvider::UidPool> uids,
               const CgroupFs* cgroups, Parts parts, const SandboxSpec& spec)
      : provider_(provider),
        uids_(std::move(uids)),
        cg_(cgroups),
        p_(std::move(parts)),
        env_(SandboxEnv(spec, p_.egress != nullptr)),
        fs_(p_.workspace, provider->config().mount_point, p_.uid, p_.uid,
            static_cast<size_t>(provider->config().max_transfer_bytes)),
        tmp_fs_(TmpRoot(), "/tmp", p_.uid, p_.uid,
                static_cast<size_t>(provider->config().max_transfer_bytes)) {}

  ~LocalSandbox() override {
    (void)Destroy();
    if (p_.tmp_fd >= 0) close(p_.tmp_fd);
  }

  const std::string& id() const override { return p_.id; }

  // Proxy variables for tools that look for them (the egress is
  // transparent without them), under the session's own env.
  static std::map<std::string, std::string> SandboxEnv(const SandboxSpec& spec, bool egress) {
    std::map<std::string, std::string> env;
    if (egress) env = Egress::ProxyEnv();
    for (const auto& [k, v] : spec.env) env[k] = v;
    return env;
  }

  absl::Status UpdateNetwork(const NetworkPolicy& policy) override {
    absl::MutexLock l(&mu_);
    if (destroyed_) return absl::FailedPreconditionError("local: sandbox destroyed");
    if (p_.egress == nullptr) {
      return absl::FailedPreconditionError(
          "local: this session was started without network rules, so it has no egress point "
          "to change; start it with SessionSpec.network (or under a tenant network policy)");
    }
    p_.egress->SetPolicy(policy);
    return absl::OkStatus();
  }

  std::optional<SandboxResources> Resources() const override {
    SandboxResources r;
    if (cg_) {
      r.memory_bytes = p_.limits.memory_bytes;
      r.cpus = p_.limits.cpus;
      r.pids = p_.limits.pids;
    }
    if (provider_->enforcement().disk) r.disk_bytes = p_.limits.disk_bytes;
    return r;
  }

  std::optional<SandboxUsage> Usage() const override {
    SandboxUsage u;
    if (cg_) {
      CgroupUsage c = cg_->Usage(p_.id);
      u.memory_bytes = c.memory_bytes;
      u.cpu_seconds = c.cpu_seconds;
    }
    struct statvfs v;
    if (provider_->enforcement().disk && statvfs(p_.workspace.c_str(), &v) == 0) {
      u.disk_bytes = static_cast<int64_t>((v.f_blocks - v.f_bfree) * v.f_frsize);
    }
    return u;
  }

  // The workspace's free bytes and inodes (statvfs), for quota hits.
  struct QuotaRoom {
    bool known = false;
    uint64_t bytes = 0, total_bytes = 0, inodes = 0;
  };
  QuotaRoom Room() const {
    QuotaRoom q;
    struct statvfs v;
    if (!provider_->enforcement().disk || statvfs(p_.workspace.c_str(), &v) != 0) return q;
    q.known = true;
    q.bytes = static_cast<uint64_t>(v.f_bavail) * v.f_frsize;
    q.total_bytes = static_cast<uint64_t>(v.f_blocks) * v.f_frsize;
    q.inodes = v.f_favail;
    return q;
  }
  // Which quota a run used up: "disk" when it ends with under 1 MiB or 1% of
  // the byte quota left, whichever is more (ext4 holds some blocks back for
  // its metadata, so a write gets ENOSPC with a few hundred KiB still free),
  // "inodes" with under 16 inodes left; and either only if the run started
  // with more room than it left (it used the quota up, rather than finding it
  // used up). "" otherwise, or with no quota.
  static std::string QuotaUsedUp(const QuotaRoom& before, const QuotaRoom& after) {
    if (!before.known || !after.known) return "";
    const uint64_t floor = std::max<uint64_t>(uint64_t{1} << 20, after.total_bytes / 100);
    if (after.bytes < floor && after.bytes < before.bytes) return "disk";
    if (after.inodes < 16 && after.inodes < before.inodes) return "inodes";
    return "";
  }

  // One run between BeginRun and EndRun: its cgroup and the fds it is
  // collected from.
  struct RunStart {
    std::string run_cg;
    int64_t oom_before = 0;
    QuotaRoom room_before;  // the workspace's room when the run started
    int run_sock = -1;
    std::vector<int> readers;  // stdout (+ stderr when split)
  };

  absl::StatusOr<ExecResult> Exec(const ExecRequest& request) override {
    ASSIGN_OR_RETURN(RunStart st, BeginRun(request));
    absl::StatusOr<ExecResult> r = WaitRun(st, request);
    EndRun(st, &r);
    return r;
  }

  // The run waits on the shared event loop: its pipes, init's reply on the
  // run socket and its deadline are watches and timers, no thread.
  void ExecAsync(ExecRequest request, ExecDone done) override;

  // Code contexts: each call is one request to the session's context
  // supervisor (contexts.h), started on first use. Blocking (CodeAsync runs
  // it on the shared pool).
  absl::StatusOr<CodeOpResult> Code(const CodeOp& op) override;
  // An idle connection to the context supervisor, else a new one (starting
  // the supervisor first); back to the idle ones after a whole answer.
  absl::StatusOr<int> ContextConnection(int max_contexts, bool* reused);
  void KeepContextConnection(int fd);

  // Sends the run to init; on success the run counts in running_ until
  // EndRun.
  absl::StatusOr<RunStart> BeginRun(const ExecRequest& request) {
    const LocalConfig& cfg = provider_->config();
    std::vector<std::string> cmd;
    std::string stdin_data, fd3_data;
    bool has_fd3 = false;
    if (!request.argv.empty()) {
      cmd = request.argv;
      stdin_data = request.code;
    } else {
      switch (request.language) {
        case Language::kPython:
          cmd = {"python3", "-u", "-"};  // unbuffered: output keeps program order
          stdin_data = request.code;
          break;
        case Language::kNode:
          cmd = {"node", "-"};
          stdin_data = request.code;
          break;
        case Language::kShell:
          // `bash -c`, as the E2B adapter sends it: its last command
          // replaces bash (one process fewer per run). A script too large
          // for one argument (or with a NUL) is read from fd 3.
          if (request.code.size() <= kMaxShellArg && request.code.find('\0') == std::string::npos) {
            cmd = {"bash", "-c", request.code};
          } else {
            cmd = {"bash", "/dev/fd/3"};
            fd3_data = request.code;
            has_fd3 = true;
          }
          break;
      }
    }
    std::string cwd = request.cwd;
    if (!cwd.empty()) RETURN_IF_ERROR(CheckCwd(cwd));
    const bool none = cfg.isolation == Isolation::kNone;
    if (cwd.empty()) cwd = none ? p_.workspace : cfg.mount_point;
    const std::string home = none ? p_.workspace : cfg.mount_point;
    // SHELL as login(1) sets it: without it every bash looks its user up
    // (through NSS, which may load libnss_systemd where nsswitch.conf
    // names it): 0.6-0.8 ms of the 2.2-2.5 a `bash -c` took.
    std::map<std::string, std::string> env = {{"PATH", "/usr/local/bin:/usr/bin:/bin"},
                                              {"HOME", home},
                                              {"LANG", "C.UTF-8"},
                                              {"SHELL", "/bin/bash"}};
    if (!cfg.user_name.empty()) env["USER"] = cfg.user_name;
    for (const auto& [k, v] : env_) env[k] = v;
    for (const auto& [k, v] : request.env) {
      if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat("invalid env name \"", k, "\""));
      }
      env[k] = v;
    }

    // The message: NUL-terminated fields (see sandbox_init.cc).
    std::string msg;
    auto field = [&msg](const std::string& f) {
      msg.append(f.data(), strnlen(f.data(), f.size()));
      msg.push_back('\0');
    };
    field(cwd);
    field(absl::StrCat(cmd.size()));
    for (const auto& a : cmd) field(a);
    field(absl::StrCat(env.size()));
    for (const auto& [k, v] : env) field(absl::StrCat(k, "=", v));

    {
      absl::MutexLock l(&mu_);
      if (destroyed_) return absl::FailedPreconditionError("local: sandbox is closed");
      ++running_;
    }
    RunStart st;
    st.room_before = Room();
    absl::Cleanup undo = [this] {
      absl::MutexLock l(&mu_);
      --running_;
    };
    RETURN_IF_ERROR(SendRun(msg, has_fd3, stdin_data, has_fd3 ? &fd3_data : nullptr,
                            static_cast<bool>(request.on_output), &st));
    std::move(undo).Cancel();
    provider_->runs_in_flight().fetch_add(1);
    return st;
  }

  // After the run's main process exited (or the run failed): its OOM kills,
  // its cgroup back to the idle list when empty, running_ down.
  void EndRun(RunStart& st, absl::StatusOr<ExecResult>* r) {
    // A run that used up a quota the sandbox had room in when it started.
    if (r->ok()) (*r)->quota_exhausted = QuotaUsedUp(st.room_before, Room());
    if (cg_) {
      if (r->ok() && cg_->OomKills(p_.id, st.run_cg) > st.oom_before) (*r)->oom_killed = true;
      // Groups still holding background processes stay until Destroy.
      if (cg_->Empty(p_.id, st.run_cg)) {
        absl::MutexLock l(&mu_);
        idle_run_cgroups_.push_back(st.run_cg);
      }
      provider_->runs_in_flight().fetch_sub(1);
      // The next run's spare, after this run's answer and off the caller's
      // thread. running_ keeps the sandbox alive until it is made.
      ScheduleSpare();
      return;
    }
    provider_->runs_in_flight().fetch_sub(1);
    absl::MutexLock l(&mu_);
    --running_;
  }

  // Readies the next spare once few runs are going on this provider: a
  // cgroup move while many runs start and end would stall their forks and
  // exits (the kernel lets the move's writer go first), so during a burst
  // it waits, looking again every 20 ms. The caller's running_ count is
  // released when it is done or the sandbox closed.
  void ScheduleSpare() {
    bool closed;
    {
      absl::MutexLock l(&mu_);
      closed = destroyed_;
    }
    if (closed) {
      absl::MutexLock l(&mu_);
      --running_;
      return;
    }
    if (provider_->runs_in_flight().load() > kQuietRuns) {
      EventLoop::Shared()->After(absl::Milliseconds(20), [this] { ScheduleSpare(); });
      return;
    }
    SparePool()->Submit([this] {
      PrepareSpare();
      absl::MutexLock l(&mu_);
      --running_;
    });
  }

  // A run that ended without init's exit report: the sandbox is gone,
  // unless it was closed while the run ran (then the run was killed).
  absl::StatusOr<ExecResult> GoneOrKilled(OutputCollector& collector, bool timed_out,
                                          bool cancelled) {
    bool closed;
    {
      absl::MutexLock l(&mu_);
      closed = destroyed_;
    }
    if (!closed) return SandboxGoneError("local: the sandbox's container is gone");
    return FinishResult(collector, SIGKILL, timed_out, cancelled);
  }

  // Kills a run: tells init, and kills its cgroup.
  void KillRun(int run_sock, const std::string& run_cg) {
    (void)!send(run_sock, "K", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (cg_) cg_->Kill(p_.id, run_cg);
  }

  absl::Status WriteFile(absl::string_view path, absl::string_view data) override {
    RETURN_IF_ERROR(CheckOpen());
    const WorkspaceFs& fs = FsFor(path);
    if (&fs == &tmp_fs_) RETURN_IF_ERROR(CheckContainer());
    return AsOwner(fs, [&] { return fs.Write(path, data); });
  }

  absl::StatusOr<FileOpResult> Files(const FileOp& op) override {
    RETURN_IF_ERROR(CheckOpen());
    const WorkspaceFs& fs = FsFor(op.path);
    if (op.kind == FileOp::Kind::kMove && &FsFor(op.destination) != &fs) {
      return absl::InvalidArgumentError(absl::StrCat("cannot move \"", op.path, "\" to \"",
                                                     op.destination,
                                                     "\": /tmp and the workspace are apart"));
    }
    if (&fs == &tmp_fs_) RETURN_IF_ERROR(CheckContainer());
    return AsOwner(fs, [&] { return fs.Apply(op); });
  }

  absl::StatusOr<std::unique_ptr<FileUpload>> BeginUpload(const std::string& path, uint32_t mode,
                                                          uint64_t max_bytes) override {
    RETURN_IF_ERROR(CheckOpen());
    const WorkspaceFs& fs = FsFor(path);
    if (&fs == &tmp_fs_) RETURN_IF_ERROR(CheckContainer());
    absl::StatusOr<std::unique_ptr<FileUpload>> up =
        AsOwner(fs, [&] { return fs.BeginUpload(path, mode, max_bytes); });
    if (!up.ok() || &fs != &tmp_fs_) return up;
    return std::unique_ptr<FileUpload>(new UploadAsOwner(
        std::move(*up),
        [this](const std::function<absl::Status()>& step) { return AsOwner(tmp_fs_, step); }));
  }

  absl::StatusOr<std::unique_ptr<FileDownload>> BeginDownload(const std::string& path,
                                                              int64_t offset,
                                                              int64_t length) override {
    RETURN_IF_ERROR(CheckOpen());
    const WorkspaceFs& fs = FsFor(path);
    if (&fs == &tmp_fs_) RETURN_IF_ERROR(CheckContainer());
    return fs.BeginDownload(path, offset, length);
  }

  absl::StatusOr<std::optional<std::string>> ReadFile(absl::string_view path) override {
    RETURN_IF_ERROR(CheckOpen());
    const WorkspaceFs& fs = FsFor(path);
    if (&fs == &tmp_fs_) RETURN_IF_ERROR(CheckContainer());
    return fs.Read(path);
  }

  absl::Status Destroy() override {
    if (!Stop()) return absl::OkStatus();
    absl::Status s = provider_->RemoveSandbox(p_.id);
    // Last: a crash before it leaves the sandbox findable by ListOwned.
    if (s.ok()) RemoveOwnerMarker(provider_->config().workspace_root, p_.id);
    if (p_.uid >= 0 && uids_) uids_->Release(p_.uid);
    Log(LogLevel::kDebug, "local.sandbox_destroyed", {{"sandbox_id", p_.id}});
    return s;
  }

  // Graceful restart: the container and everything in it dies, the sandbox
  // directory (workspace, disk image, owner marker) stays for
  // LocalProvider::Attach in the next process, which remounts the image.
  void Detach() override {
    if (!Stop()) return;
    (void)UnmountDisk(p_.workspace);
    if (cg_) (void)cg_->Remove(p_.id);
    if (p_.uid >= 0 && uids_) uids_->Release(p_.uid);
    Log(LogLevel::kDebug, "local.sandbox_detached", {{"sandbox_id", p_.id}});
  }

 private:
  // Kills the container and waits for runs to return; false if it was
  // already stopped (destroyed or detached).
  bool Stop() {
    std::vector<int> conns;
    {
      absl::MutexLock l(&mu_);
      if (destroyed_) return false;
      destroyed_ = true;
      conns.swap(context_conns_);
    }
    for (int fd : conns) close(fd);
    // Everything in the container dies; init exits when its socket closes,
    // which takes the pid namespace (and any process left in it) along.
    if (cg_) cg_->Kill(p_.id);
    {
      absl::MutexLock l(&ctl_mu_);
      close(p_.ctl);
      p_.ctl = -1;
      spare_cg_.clear();
    }
    if (p_.bwrap_pid > 0) {
      kill(p_.bwrap_pid, SIGKILL);
      waitpid(p_.bwrap_pid, nullptr, 0);
      ChildReaper::Release(p_.bwrap_pid);
    }
    if (cg_) cg_->Kill(p_.id);
    std::unique_ptr<EgressPoint> egress;
    CapacityLedger::Hold capacity;  // returned to the host as Stop returns
    {
      absl::MutexLock l(&mu_);
      auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_ == 0; };
      mu_.Await(absl::Condition(&idle));
      egress = std::move(p_.egress);
      capacity = std::move(p_.capacity);
    }
    return true;
  }

  // A run cgroup nobody uses: an empty one of an earlier run (no mkdir or
  // rmdir per run), else a new name.
  std::string TakeRunCgroup() {
    absl::MutexLock l(&mu_);
    if (!idle_run_cgroups_.empty()) {
      std::string cg = std::move(idle_run_cgroups_.back());
      idle_run_cgroups_.pop_back();
      return cg;
    }
    return absl::StrCat("run-", ++run_seq_);
  }
  void ReturnRunCgroup(std::string cg) {
    absl::MutexLock l(&mu_);
    idle_run_cgroups_.push_back(std::move(cg));
  }

  // Has init fork the spare for the next run: a process that joins that
  // run's cgroup now, so the run does not wait for the kernel's cgroup move
  // (see sandbox_init.cc). Best effort: without a spare a run forks and
  // joins its cgroup itself.
  void PrepareSpareLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctl_mu_) {
    if (!cg_ || p_.ctl < 0 || !spare_cg_.empty()) return;
    std::string cg = TakeRunCgroup();
    absl::StatusOr<std::vector<int>> fds = cg_->CreateChild(p_.id, cg);
    if (!fds.ok()) {
      ReturnRunCgroup(std::move(cg));
      return;
    }
    const std::string token = absl::StrCat(++spare_seq_);
    std::string msg("spare", 6);
    msg.append(token).push_back('\0');
    msg.append(absl::StrCat(fds->size())).push_back('\0');
    if (SendCtl(msg, *fds) != 0) {
      for (int fd : *fds) close(fd);
      ReturnRunCgroup(std::move(cg));
      return;
    }
    for (int fd : *fds) close(fd);
    spare_cg_ = std::move(cg);
    spare_token_ = token;
  }

 public:
  // The first run's spare, once the container is up.
  void PrepareSpare() {
    absl::MutexLock l(&ctl_mu_);
    PrepareSpareLocked();
  }

 private:
  // One message on the control socket with `fds`; 0 or an errno.
  int SendCtl(const std::string& msg, const std::vector<int>& fds)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctl_mu_) {
    struct iovec iov = {const_cast<char*>(msg.data()), msg.size()};
    std::vector<char> cbuf(CMSG_SPACE(sizeof(int) * std::max<size_t>(fds.size(), 1)));
    struct msghdr mh = {};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    if (!fds.empty()) {
      mh.msg_control = cbuf.data();
      mh.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      struct cmsghdr* c = CMSG_FIRSTHDR(&mh);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    if (p_.ctl < 0) return EBADF;
    return sendmsg(p_.ctl, &mh, MSG_NOSIGNAL) < 0 ? errno : 0;
  }

  // Sends one run to init, in the spare's cgroup when there is one (EndRun
  // readies the next). The run's output is collected by
  // WaitRun or on the event loop. Background processes it leaves keep
  // their pipes (drained elsewhere) and never hold the run up.
  absl::Status SendRun(const std::string& body, bool has_fd3, const std::string& stdin_data,
                       const std::string* fd3_data, bool split, RunStart* st) {
    std::vector<int> to_close;
    absl::Cleanup close_all = [&to_close] {
      for (int fd : to_close) close(fd);
    };
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
      return absl::InternalError(absl::StrCat("socketpair: ", strerror(errno)));
    }
    const int run_sock = sv[0];
    absl::Cleanup close_run = [run_sock] { close(run_sock); };
    to_close.push_back(sv[1]);
    int in_fd;
    if (stdin_data.empty()) {
      in_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    } else {
      ASSIGN_OR_RETURN(in_fd, MemFd(stdin_data));
    }
    to_close.push_back(in_fd);
    int fd3 = -1;
    if (fd3_data) {
      ASSIGN_OR_RETURN(fd3, MemFd(*fd3_data));
      to_close.push_back(fd3);
    }
    // Without a per-stream consumer, stdout and stderr share one pipe: the
    // output is then in exact write order. Streaming needs them apart.
    int out[2], err[2] = {-1, -1};
    if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
    to_close.push_back(out[1]);
    if (split && pipe2(err, O_CLOEXEC) != 0) {
      close(out[0]);
      return absl::InternalError("pipe failed");
    }
    if (split) to_close.push_back(err[1]);
    std::vector<int> readers = {out[0]};
    if (split) readers.push_back(err[0]);
    absl::Cleanup close_readers = [&readers] {
      for (int fd : readers) close(fd);
    };

    std::vector<int> fds = {sv[1], in_fd, out[1], split ? err[1] : out[1]};
    if (fd3 >= 0) fds.push_back(fd3);
    {
      absl::MutexLock l(&ctl_mu_);
      if (p_.ctl < 0) return absl::FailedPreconditionError("local: sandbox is closed");
      std::string token = "0";
      std::vector<int> cg_fds;
      // The spare serves a run started while few are going (a run's
      // latency is then what the spare saves); in a burst runs fork, as
      // they start faster that way on the whole (measured: p50 of 500 at
      // once 1.17x the run vs 1.23x through spares).
      const bool spare =
          cg_ && !spare_cg_.empty() && provider_->runs_in_flight().load() <= kQuietRuns;
      if (spare) {
        st->run_cg = std::move(spare_cg_);
        token = spare_token_;
        spare_cg_.clear();
      } else if (cg_) {
        st->run_cg = TakeRunCgroup();
      }
      if (cg_) {
        // Also with a spare: init falls back on them if it died.
        absl::StatusOr<std::vector<int>> made = cg_->CreateChild(p_.id, st->run_cg);
        if (!made.ok()) {
          if (!spare) ReturnRunCgroup(std::move(st->run_cg));
          return made.status();
        }
        cg_fds = std::move(*made);
      }
      absl::Cleanup close_cg = [&cg_fds] {
        for (int fd : cg_fds) close(fd);
      };
      if (cg_) st->oom_before = cg_->OomKills(p_.id, st->run_cg);
      std::string msg("run", 4);
      msg.append(token).push_back('\0');
      msg.append(body);
      msg.append(absl::StrCat(cg_fds.size())).push_back('\0');
      msg.append(has_fd3 ? "1" : "0").push_back('\0');
      msg.append(absl::StrCat(provider_->config().open_files)).push_back('\0');
      fds.insert(fds.end(), cg_fds.begin(), cg_fds.end());
      if (int e = SendCtl(msg, fds); e != 0) {
        // The cgroup may hold a spare that never got its run: not reused.
        return SandboxGoneError(
            absl::StrCat("local: the sandbox's container is gone (", strerror(e), ")"));
      }
      std::move(close_cg).Invoke();
    }
    std::move(close_all).Invoke();
    std::move(close_run).Cancel();
    std::move(close_readers).Cancel();
    st->run_sock = run_sock;
    st->readers = std::move(readers);
    return absl::OkStatus();
  }

  // Collects a sent run's output until its main process exits, on the
  // calling thread. Closes the run socket.
  absl::StatusOr<ExecResult> WaitRun(RunStart& st, const ExecRequest& request) {
    const int run_sock = st.run_sock;
    absl::Cleanup close_run = [run_sock] { close(run_sock); };
    std::vector<int>& readers = st.readers;
    const std::string& run_cg = st.run_cg;
    Clock* clock = Clock::Real();  // a child process runs in real time
    const absl::Time deadline = clock->Monotonic() + request.timeout;
    OutputCollector collector(request.max_output_bytes, request.on_output);
    bool exited = false, killed = false, timed_out = false, cancelled = false, gone = false;
    absl::Time kill_deadline = absl::InfiniteFuture();
    int status = 0;
    char buf[64 * 1024];
    auto kill_run = [&] {
      if (killed) return;
      killed = true;
      KillRun(run_sock, run_cg);
      kill_deadline = clock->Monotonic() + absl::Seconds(10);
    };
    auto read_some = [&](size_t i, bool* eof) {
      ssize_t r = read(readers[i], buf, sizeof(buf));
      if (r > 0) {
        collector.Append(i == 0 ? OutputStream::kStdout : OutputStream::kStderr,
                         absl::string_view(buf, static_cast<size_t>(r)));
        return true;
      }
      if (r < 0 && (errno == EINTR || errno == EAGAIN)) return false;
      *eof = true;
      return false;
    };
    std::vector<bool> eof(readers.size(), false);
    while (!exited && !gone) {
      const absl::Time now = clock->Monotonic();
      if (!killed && now >= deadline) {
        timed_out = true;
        kill_run();
      }
      if (!killed && request.cancelled && request.cancelled()) {
        cancelled = true;
        kill_run();
      }
      if (killed && now >= kill_deadline) {
        gone = true;
        break;
      }
      absl::Duration wait = killed ? kill_deadline - now : deadline - now;
      if (request.cancelled) wait = std::min(wait, absl::Milliseconds(50));
      int wait_ms = static_cast<int>(
          std::max<int64_t>(0, absl::ToInt64Milliseconds(wait + absl::Microseconds(999))));
      std::vector<struct pollfd> pf;
      std::vector<size_t> which;
      for (size_t i = 0; i < readers.size(); ++i) {
        if (eof[i]) continue;
        pf.push_back({readers[i], POLLIN, 0});
        which.push_back(i);
      }
      pf.push_back({run_sock, POLLIN, 0});
      int pr = poll(pf.data(), pf.size(), wait_ms);
      if (pr < 0 && errno != EINTR) break;
      if (pr <= 0) continue;
      for (size_t k = 0; k + 1 < pf.size(); ++k) {
        if (pf[k].revents) {
          bool e = false;
          read_some(which[k], &e);
          if (e) eof[which[k]] = true;
        }
      }
      if (pf.back().revents) {
        char reply[64];
        ssize_t n = recv(run_sock, reply, sizeof(reply) - 1, MSG_DONTWAIT);
        if (n > 2 && reply[0] == 'X') {
          reply[n] = 0;
          status = atoi(reply + 2);
          exited = true;
        } else if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
          gone = true;
        }
      }
    }
    // What the main process wrote is in the pipes now: take it without
    // waiting for EOF, which background processes may hold off forever.
    std::vector<int> leftover;
    for (size_t i = 0; i < readers.size(); ++i) {
      if (!eof[i]) {
        fcntl(readers[i], F_SETFL, fcntl(readers[i], F_GETFL) | O_NONBLOCK);
        bool e = false;
        // At most a full pipe's worth (1 MiB, pipe-max-size's default): a
        // background writer refilling it must not keep this loop going.
        for (int reads = 0; reads < kTakeAtEndReads && read_some(i, &e); ++reads) {
        }
        if (!e) {
          leftover.push_back(readers[i]);
          continue;
        }
      }
      close(readers[i]);
    }
    if (!leftover.empty()) DrainOnLoop(EventLoop::Shared(), leftover);
    if (gone && !exited && !timed_out && !cancelled) {
      return GoneOrKilled(collector, timed_out, cancelled);
    }
    return FinishResult(collector, status, timed_out, cancelled);
  }

  // `change` on `fs`. The container's /tmp belongs to its user namespace,
  // where the host's root has no uid: there files are made as the sandbox's
  // uid (this thread only).
  template <typename Change>
  auto AsOwner(const WorkspaceFs& fs, Change change) -> decltype(change()) {
    if (&fs != &tmp_fs_ || p_.uid < 0 || provider_->config().isolation == Isolation::kNone) {
      return change();
    }
    syscall(SYS_setfsgid, p_.uid);
    syscall(SYS_setfsuid, p_.uid);
    auto result = change();
    syscall(SYS_setfsuid, 0);
    syscall(SYS_setfsgid, 0);
    return result;
  }

  // /tmp paths go to the container's /tmp.
  const WorkspaceFs& FsFor(absl::string_view path) const {
    if (path == "/tmp" || absl::StartsWith(path, "/tmp/")) return tmp_fs_;
    return fs_;
  }

  // The host path of the container's /tmp.
  std::string TmpRoot() const {
    if (provider_->config().isolation == Isolation::kNone) return p_.dir + "/tmp";
    // "/." so that the path names the directory, not the fd's magic link
    // (lstat of "/proc/self/fd/N" is the link).
    return absl::StrCat("/proc/self/fd/", p_.tmp_fd, "/.");
  }

  // A working directory must exist in the sandbox's view.
  absl::Status CheckCwd(const std::string& cwd) {
    auto missing = [&] {
      return absl::InvalidArgumentError(absl::StrCat("cwd '", cwd, "' does not exist"));
    };
    if (cwd.empty() || cwd.front() != '/' || cwd.find("/..") != std::string::npos) return missing();
    const std::string& mp = provider_->config().mount_point;
    std::string host;
    const std::string tmp_root = TmpRoot();
    if (cwd == mp || absl::StartsWith(cwd, mp + "/")) {
      host = p_.workspace + cwd.substr(mp.size());
    } else if (cwd == "/tmp" || absl::StartsWith(cwd, "/tmp/")) {
      host = tmp_root + cwd.substr(4);
    } else if (cwd == "/" || absl::StartsWith(cwd, "/usr/") || cwd == "/usr") {
      host = cwd;
    } else {
      return missing();
    }
    struct stat st;
    if (lstat(host.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return missing();
    return absl::OkStatus();
  }

  absl::Status CheckOpen() {
    absl::MutexLock l(&mu_);
    if (destroyed_) return absl::FailedPreconditionError("local: sandbox is closed");
    return absl::OkStatus();
  }

  // The container's /tmp lives only as long as its init: once init is gone
  // (its end of the control socket closed), our descriptor of /tmp would
  // reach a detached copy nobody runs in.
  absl::Status CheckContainer() {
    if (provider_->config().isolation == Isolation::kNone) return absl::OkStatus();
    absl::MutexLock l(&ctl_mu_);
    if (p_.ctl < 0) return absl::FailedPreconditionError("local: sandbox is closed");
    struct pollfd pf = {p_.ctl, POLLRDHUP, 0};
    if (poll(&pf, 1, 0) > 0 && (pf.revents & (POLLHUP | POLLRDHUP | POLLERR))) {
      return SandboxGoneError("local: the sandbox's container is gone");
    }
    return absl::OkStatus();
  }

  const LocalProvider* const provider_;
  const std::shared_ptr<LocalProvider::UidPool> uids_;
  const CgroupFs* const cg_;  // null when cgroups are not enforced
  Parts p_;
  const std::map<std::string, std::string> env_;
  const WorkspaceFs fs_;
  const WorkspaceFs tmp_fs_;

  absl::Mutex ctl_mu_;  // serializes sends on p_.ctl
  absl::Mutex mu_;
  bool destroyed_ ABSL_GUARDED_BY(mu_) = false;
  // Open connections to the context supervisor, idle (closed by Stop).
  std::vector<int> context_conns_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;  // inside Exec
  int run_seq_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> idle_run_cgroups_ ABSL_GUARDED_BY(mu_);
  // The spare init keeps for the next run: its cgroup and the token naming
  // it (empty cgroup: none).
  std::string spare_cg_ ABSL_GUARDED_BY(ctl_mu_);
  std::string spare_token_ ABSL_GUARDED_BY(ctl_mu_);
  uint64_t spare_seq_ ABSL_GUARDED_BY(ctl_mu_) = 0;
};

// Leftover pipes of a finished run (background processes still hold their
// write ends): read and dropped on the loop until EOF, then closed. At most
// kDrainBytesPerTick per pipe each kDrainTick: past that the pipe is watched
// for its end only until the next tick, so a background process writing
// without pause (`yes &`) blocks on its full pipe instead of making the
// broker burn CPU (outside the sandbox's limits) discarding its output.
constexpr size_t kDrainBytesPerTick = 256 << 10;
constexpr absl::Duration kDrainTick = absl::Seconds(1);

struct Drain {
  EventLoop* loop;
  int fd;
  size_t budget = kDrainBytesPerTick;
  bool closed = false;  // loop thread only (its callbacks and timers)
};

void DrainOnLoop(EventLoop* loop, const std::vector<int>& fds) {
  for (int fd : fds) {
    auto d = std::make_shared<Drain>(Drain{loop, fd});
    bool ok = loop->Watch(fd, EPOLLIN, [d](uint32_t events) {
      if (d->closed) return;
      if ((events & EPOLLIN) && d->budget > 0) {
        char buf[16384];
        ssize_t r = read(d->fd, buf, std::min(sizeof(buf), d->budget));
        if (r < 0 && (errno == EINTR || errno == EAGAIN)) return;
        if (r > 0) {
          d->budget -= static_cast<size_t>(r);
          if (d->budget == 0) {
            d->loop->Modify(d->fd, 0);  // EPOLLHUP/EPOLLERR only
            d->loop->After(kDrainTick, [d] {
              if (d->closed) return;
              d->budget = kDrainBytesPerTick;
              d->loop->Modify(d->fd, EPOLLIN);
            });
          }
          return;
        }
      } else if (!(events & (EPOLLHUP | EPOLLERR))) {
        return;
      }
      // EOF, or the writers are gone while paused.
      d->closed = true;
      d->loop->Unwatch(d->fd);
      close(d->fd);
    });
    if (!ok) close(fd);
  }
}

// One local run waiting on the event loop. After Arm, every member is
// touched on the loop's thread only; the watches' callbacks keep it alive
// until Finish removes them.
struct LocalAsyncRun : std::enable_shared_from_this<LocalAsyncRun> {
  LocalAsyncRun(LocalSandbox* sandbox, EventLoop* event_loop, ExecRequest r, Sandbox::ExecDone d,
                LocalSandbox::RunStart start)
      : sb(sandbox),
        loop(event_loop),
        req(std::move(r)),
        done(std::move(d)),
        st(std::move(start)),
        collector(req.max_output_bytes, req.on_output),
        eof(st.readers.size(), false) {}

  void Arm() {
    auto self = shared_from_this();
    for (size_t i = 0; i < st.readers.size(); ++i) {
      const int fd = st.readers[i];
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
      if (!loop->Watch(fd, EPOLLIN, [self, i](uint32_t) { self->OnReadable(i); })) {
        eof[i] = true;  // cannot happen for a pipe; then it is not read
      }
    }
    loop->Watch(st.run_sock, EPOLLIN, [self](uint32_t) { self->OnSocket(); });
    deadline = loop->After(req.timeout, [self] {
      if (self->finished || self->killed) return;
      self->timed_out = true;
      self->Kill();
    });
    if (req.cancelled) ScheduleCancelPoll();
  }

  // Every 50 ms, on the same ticks for all runs: the loop wakes once per
  // tick for all of them (500 runs polled on their own phases woke it about
  // 1,000 times a second).
  void ScheduleCancelPoll() {
    auto self = shared_from_this();
    cancel_poll = loop->After(EventLoop::UntilNextTick(absl::Milliseconds(50)), [self] {
      if (self->finished || self->killed) return;
      if (self->req.cancelled()) {
        self->cancelled = true;
        self->Kill();
        return;
      }
      self->ScheduleCancelPoll();
    });
  }

  void Kill() {
    killed = true;
    sb->KillRun(st.run_sock, st.run_cg);
    auto self = shared_from_this();
    // Not gone within 10 s of the kill: give up on init's report.
    kill_deadline = loop->After(absl::Seconds(10), [self] { self->Finish(true); });
  }

  void OnReadable(size_t i) {
    if (finished || paused) return;
    char buf[64 * 1024];
    ssize_t r = read(st.readers[i], buf, sizeof(buf));
    if (r > 0) {
      collector.Append(i == 0 ? OutputStream::kStdout : OutputStream::kStderr,
                       absl::string_view(buf, static_cast<size_t>(r)));
      if (req.output_ready) {
        std::weak_ptr<LocalAsyncRun> weak = shared_from_this();
        EventLoop* l = loop;
        bool ready = req.output_ready([weak, l] {
          l->Post([weak] {
            if (auto self = weak.lock()) self->Resume();
          });
        });
        if (!ready) Pause();
      }
      return;
    }
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) return;
    eof[i] = true;
    loop->Unwatch(st.readers[i]);
  }

  // A slow consumer: the program's pipes fill and it blocks on write.
  void Pause() {
    paused = true;
    for (size_t i = 0; i < st.readers.size(); ++i) {
      if (!eof[i]) loop->Modify(st.readers[i], 0);
    }
  }
  void Resume() {
    if (finished || !paused) return;
    paused = false;
    for (size_t i = 0; i < st.readers.size(); ++i) {
      if (!eof[i]) loop->Modify(st.readers[i], EPOLLIN);
    }
  }

  void OnSocket() {
    if (finished) return;
    char reply[64];
    ssize_t n = recv(st.run_sock, reply, sizeof(reply) - 1, MSG_DONTWAIT);
    if (n > 2 && reply[0] == 'X') {
      reply[n] = 0;
      status = atoi(reply + 2);
      exited = true;
      Finish(false);
    } else if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
      Finish(true);
    }
  }

  void Finish(bool gone) {
    if (finished) return;
    finished = true;
    loop->Cancel(deadline);
    loop->Cancel(kill_deadline);
    loop->Cancel(cancel_poll);
    loop->Unwatch(st.run_sock);
    close(st.run_sock);
    // What the main process wrote is in the pipes now: take it without
    // waiting for EOF, which background processes may hold off forever.
    std::vector<int> leftover;
    char buf[64 * 1024];
    for (size_t i = 0; i < st.readers.size(); ++i) {
      const int fd = st.readers[i];
      if (!eof[i]) {
        loop->Unwatch(fd);
        for (int reads = 0;; ++reads) {
          if (reads == kTakeAtEndReads) {  // as in the synchronous Exec
            leftover.push_back(fd);
            break;
          }
          ssize_t r = read(fd, buf, sizeof(buf));
          if (r > 0) {
            collector.Append(i == 0 ? OutputStream::kStdout : OutputStream::kStderr,
                             absl::string_view(buf, static_cast<size_t>(r)));
            continue;
          }
          if (r < 0 && errno == EINTR) continue;
          if (r < 0 && errno == EAGAIN) leftover.push_back(fd);
          break;
        }
        if (!leftover.empty() && leftover.back() == fd) continue;
      }
      close(fd);
    }
    DrainOnLoop(loop, leftover);
    absl::StatusOr<ExecResult> r =
        gone && !exited && !timed_out && !cancelled
            ? sb->GoneOrKilled(collector, timed_out, cancelled)
            : absl::StatusOr<ExecResult>(FinishResult(collector, status, timed_out, cancelled));
    sb->EndRun(st, &r);
    Sandbox::ExecDone d = std::move(done);
    d(std::move(r));
  }

  LocalSandbox* const sb;
  EventLoop* const loop;
  ExecRequest req;
  Sandbox::ExecDone done;
  LocalSandbox::RunStart st;
  OutputCollector collector;
  std::vector<bool> eof;
  bool exited = false, killed = false, timed_out = false, cancelled = false;
  bool finished = false, paused = false;
  int status = 0;
  EventLoop::TimerId deadline = 0, kill_deadline = 0, cancel_poll = 0;
};

// Debian's python3 packages (python3-ipykernel) serve this interpreter; a
// python3 earlier on PATH may be another one.
constexpr char kContextPython[] = "/usr/bin/python3";

absl::StatusOr<int> LocalSandbox::ContextConnection(int max_contexts, bool* reused) {
  *reused = false;
  while (true) {
    int idle = -1;
    {
      absl::MutexLock l(&mu_);
      if (context_conns_.empty()) break;
      idle = context_conns_.back();
      context_conns_.pop_back();
    }
    if (SupervisorConnectionOpen(idle)) {
      *reused = true;
      return idle;
    }
    close(idle);  // the supervisor died, or the sandbox's code killed it
  }
  const bool none = provider_->config().isolation == Isolation::kNone;
  // The supervisor's directory: in the container's /tmp, or beside the
  // workspace without a container.
  int parent = none ? open(p_.dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC) : p_.tmp_fd;
  if (parent < 0) return absl::FailedPreconditionError("local: the sandbox has no /tmp");
  absl::Cleanup close_parent = [parent, none] {
    if (none) close(parent);
  };
  const uid_t owner = p_.uid >= 0 ? static_cast<uid_t>(p_.uid) : geteuid();
  absl::StatusOr<int> fd = ConnectContextSupervisor(parent, kContextDirName, owner);
  if (!absl::IsNotFound(fd.status())) return fd;
  // First use (or the supervisor died): start it. Two calls racing here both
  // start one; the second finds the first's lock and waits for it to listen.
  ExecRequest start;
  start.argv = {kContextPython,
                "-c",
                kContextDriverSource,
                "serve",
                absl::StrCat(none ? p_.dir : "/tmp", "/", kContextDirName),
                absl::StrCat(max_contexts)};
  start.timeout = absl::Seconds(60);
  ASSIGN_OR_RETURN(ExecResult r, Exec(start));
  if (r.exit_code != 0) {
    return absl::FailedPreconditionError(absl::StrCat("local: code contexts cannot start here: ",
                                                      absl::StripAsciiWhitespace(r.output)));
  }
  return ConnectContextSupervisor(parent, kContextDirName, owner);
}

void LocalSandbox::KeepContextConnection(int fd) {
  {
    absl::MutexLock l(&mu_);
    if (!destroyed_ && context_conns_.size() < kIdleContextConnections) {
      context_conns_.push_back(fd);
      return;
    }
  }
  close(fd);
}

absl::StatusOr<CodeOpResult> LocalSandbox::Code(const CodeOp& op) {
  RETURN_IF_ERROR(CheckOpen());
  const int64_t oom_before = cg_ ? cg_->OomKills(p_.id, "") : 0;
  absl::StatusOr<std::string> answer;
  // An idle connection whose supervisor died since it was last used (the
  // sandbox's code may kill it) ends before any answer: the call goes again,
  // on the next idle connection or a new one (the last try).
  for (size_t tries = 0; tries <= kIdleContextConnections; ++tries) {
    bool reused = false;
    ASSIGN_OR_RETURN(int fd, ContextConnection(op.max_contexts, &reused));
    bool answered = false;
    answer = ExchangeWithSupervisor(fd, ContextRequest(op), absl::Now() + ContextCallBudget(op),
                                    kMaxContextAnswer, &answered);
    if (answer.ok()) {
      KeepContextConnection(fd);
      break;
    }
    close(fd);  // mid-answer: never reused
    if (!reused || answered || !absl::IsUnavailable(answer.status())) break;
  }
  if (!answer.ok()) return answer.status();
  ASSIGN_OR_RETURN(CodeOpResult out, ParseContextAnswer(op, *answer));
  if (out.execution.context_died && cg_ && cg_->OomKills(p_.id, "") > oom_before) {
    out.execution.oom_killed = true;
  }
  return out;
}

void LocalSandbox::ExecAsync(ExecRequest request, ExecDone done) {
  absl::StatusOr<RunStart> st = BeginRun(request);
  if (!st.ok()) {
    done(st.status());
    return;
  }
  auto run = std::make_shared<LocalAsyncRun>(this, EventLoop::Shared(), std::move(request),
                                             std::move(done), std::move(*st));
  run->loop->Post([run] { run->Arm(); });
}

LocalLimits ReadLimits(ConfigReader& parent, const std::string& key, const LocalLimits& def) {
  ConfigReader r(parent.Object(key), parent.KeyPath(key));
  LocalLimits l;
  l.memory_bytes = r.Int("memory_bytes", def.memory_bytes, 0);
  l.pids = r.Int("pids", def.pids, 0);
  l.disk_bytes = r.Int("disk_bytes", def.disk_bytes, 0);
  l.disk_inodes = r.Int("disk_inodes", def.disk_inodes, 0);
  l.tmp_bytes = r.Int("tmp_bytes", def.tmp_bytes, 0);
  l.cpus = r.Number("cpus", def.cpus, 0, 1024);
  if (l.memory_bytes != 0 && l.memory_bytes < (int64_t{32} << 20)) {
    r.Fail("memory_bytes", "must be 0 (unlimited) or at least 33554432 (32 MiB)");
  }
  if (l.pids != 0 && l.pids < 8) r.Fail("pids", "must be 0 (unlimited) or at least 8");
  if (l.disk_bytes != 0 && l.disk_bytes < (int64_t{16} << 20)) {
    r.Fail("disk_bytes", "must be 0 (no quota) or at least 16777216 (16 MiB)");
  }
  if (l.disk_inodes != 0 && l.disk_inodes < 1024) {
    r.Fail("disk_inodes", "must be 0 (the filesystem's default) or at least 1024");
  }
  absl::Status s = r.Finish();
  if (!s.ok()) parent.Fail(key, std::string(s.message()));
  return l;
}

// providers.local.capacity (-1 where absent: what the host has).
LocalCapacity ReadCapacity(ConfigReader& parent, const LocalCapacity& def) {
  ConfigReader r(parent.Object("capacity"), parent.KeyPath("capacity"));
  LocalCapacity c = def;
  c.memory_bytes = r.Int("memory_bytes", def.memory_bytes, 0);
  c.pids = r.Int("pids", def.pids, 0);
  c.disk_bytes = r.Int("disk_bytes", def.disk_bytes, 0);
  c.sandboxes = r.Int("sandboxes", def.sandboxes, 0);
  {
    ConfigReader o(r.Object("overcommit"), r.KeyPath("overcommit"));
    c.memory_overcommit = o.Number("memory", def.memory_overcommit, 1, 1000);
    c.pids_overcommit = o.Number("pids", def.pids_overcommit, 1, 1000);
    c.disk_overcommit = o.Number("disk", def.disk_overcommit, 1, 1000);
    absl::Status s = o.Finish();
    if (!s.ok()) r.Fail("overcommit", std::string(s.message()));
  }
  absl::Status s = r.Finish();
  if (!s.ok()) parent.Fail("capacity", std::string(s.message()));
  return c;
}

}  // namespace

absl::StatusOr<LocalConfig> ParseLocalConfig(const nlohmann::json& json) {
  LocalConfig c;
  ConfigReader r(json, "providers.local");
  // Per-process rlimits of the old per-run sandbox: the cgroup limits of
  // the whole sandbox replace them.
  const std::pair<const char*, const char*> retired[] = {
      {"memory_bytes", "limits.memory_bytes (memory of the whole sandbox)"},
      {"max_processes", "limits.pids (processes of the whole sandbox)"},
      {"cpu_seconds", "limits.cpus (a CPU share; runs end by their timeout)"},
      {"file_size_bytes", "limits.disk_bytes (the workspace quota)"}};
  for (const auto& [key, now] : retired) {
    if (r.Has(key)) {
      return absl::InvalidArgumentError(absl::StrCat("providers.local.", key,
                                                     ": retired; use providers.local.", now,
                                                     " (see docs/config.md)"));
    }
  }
  c.isolation = r.Enum("isolation", "bwrap", {"bwrap", "none"}) == "none" ? Isolation::kNone
                                                                          : Isolation::kBwrap;
  c.bwrap_path = r.String("bwrap_path", c.bwrap_path, false);
  c.workspace_root = r.String("workspace_root", c.workspace_root);
  c.mount_point = r.String("mount_point", c.mount_point, false);
  c.uid_base = r.Int("uid_base", c.uid_base, 1000, 2000000000);
  c.uid_count = r.Int("uid_count", c.uid_count, 1, 1000000);
  c.open_files = r.Int("open_files", c.open_files, 16);
  c.max_transfer_bytes = r.Int("max_transfer_bytes", c.max_transfer_bytes, 1);
  c.extra_ro_paths = r.StringList("extra_ro_paths");
  c.user_name = r.String("user_name", c.user_name);
  c.persistent_tmp = r.Bool("persistent_tmp", c.persistent_tmp);
  c.limits = ReadLimits(r, "limits", c.limits);
  c.max_limits = ReadLimits(r, "max_limits", c.max_limits);
  c.capacity = ReadCapacity(r, c.capacity);
  c.enforcement = r.Enum("enforcement", "strict", {"strict", "best_effort"}) == "best_effort"
                      ? Enforcement::kBestEffort
                      : Enforcement::kStrict;
  c.cgroup_root = r.String("cgroup_root", c.cgroup_root, false);
  c.cgroup_parent = r.String("cgroup_parent", c.cgroup_parent, false);
  c.cpu_weight = r.Int("cpu_weight", c.cpu_weight, 1, 10000);
  c.init_path = r.String("init_path", c.init_path);
  RETURN_IF_ERROR(r.Finish());
  if (c.mount_point.front() != '/' || c.mount_point == "/" ||
      c.mount_point.find("..") != std::string::npos) {
    return absl::InvalidArgumentError(
        "providers.local.mount_point: must be an absolute path below /");
  }
  for (char ch : c.user_name) {
    if (!(absl::ascii_islower(ch) || absl::ascii_isdigit(ch) || ch == '_' || ch == '-')) {
      return absl::InvalidArgumentError(
          "providers.local.user_name: must be a lower-case user name ([a-z0-9_-])");
    }
  }
  for (const auto& p : c.extra_ro_paths) {
    if (p.empty() || p.front() != '/') {
      return absl::InvalidArgumentError(
          "providers.local.extra_ro_paths: entries must be absolute paths");
    }
  }
  if (c.cgroup_parent.find("..") != std::string::npos || c.cgroup_parent.front() == '/') {
    return absl::InvalidArgumentError(
        "providers.local.cgroup_parent: must be a relative cgroup path without '..'");
  }
  // Defaults above an explicit maximum would fail every session.
  auto over = [&](const char* f, double v, double m) -> absl::Status {
    if (m > 0 && v > m) {
      return absl::InvalidArgumentError(absl::StrCat("providers.local.limits.", f, ": ", v,
                                                     " is above max_limits.", f, " (", m, ")"));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(over("memory_bytes", c.limits.memory_bytes, c.max_limits.memory_bytes));
  RETURN_IF_ERROR(over("cpus", c.limits.cpus, c.max_limits.cpus));
  RETURN_IF_ERROR(over("pids", c.limits.pids, c.max_limits.pids));
  RETURN_IF_ERROR(over("disk_bytes", c.limits.disk_bytes, c.max_limits.disk_bytes));
  return c;
}

LocalProvider::LocalProvider(LocalConfig config, std::shared_ptr<UidPool> uids)
    : config_(std::move(config)), uids_(std::move(uids)) {
  // Mirror the host's top level: merged-/usr symlinks stay symlinks.
  system_args_ = {"--ro-bind", "/usr", "/usr"};
  for (const char* d : kTopLevelDirs) {
    std::string host = absl::StrCat("/", d);
    char target[4096];
    ssize_t n = readlink(host.c_str(), target, sizeof(target) - 1);
    if (n > 0) {
      system_args_.insert(system_args_.end(),
                          {"--symlink", std::string(target, static_cast<size_t>(n)), host});
    } else {
      system_args_.insert(system_args_.end(), {"--ro-bind-try", host, host});
    }
  }
  for (const char* e : kEtcAllowList) {
    std::string p = absl::StrCat("/etc/", e);
    system_args_.insert(system_args_.end(), {"--ro-bind-try", p, p});
  }
  for (const auto& p : config_.extra_ro_paths) {
    system_args_.insert(system_args_.end(), {"--ro-bind-try", p, p});
  }
  if (!config_.user_name.empty()) user_args_ = {"--uid", "1000", "--gid", "1000"};
  // Only paths this kernel has: bwrap cannot create files in /proc.
  for (const char* f : kProcMaskFiles) {
    std::string p = absl::StrCat("/proc/", f);
    struct stat st;
    if (lstat(p.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
      proc_masks_.insert(proc_masks_.end(), {"--ro-bind", "/dev/null", p});
    }
  }
  for (const char* d : kProcMaskDirs) {
    std::string p = absl::StrCat("/proc/", d);
    struct stat st;
    if (lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      proc_masks_.insert(proc_masks_.end(), {"--tmpfs", p, "--remount-ro", p});
    }
  }
  // /proc/sys read-only by its mount, as Docker has it. Its entries answer
  // for the reading task's namespaces (net.*, kernel.hostname), so the
  // sandbox still reads its own values through the host's /proc/sys.
  proc_masks_.insert(proc_masks_.end(), {"--ro-bind", "/proc/sys", "/proc/sys"});
}

LocalProvider::~LocalProvider() {
  // The bind mount PrepareWorkspaceRoot made goes when nothing is mounted
  // below it (a crash leaves it, and the next start uses it as it is).
  if (made_root_mount_) umount2(root_mount_.c_str(), 0);
}

void LocalProvider::PrepareWorkspaceRoot() {
  // Only containers with a workspace disk (a mount each) gain from it.
  if (config_.isolation != Isolation::kBwrap || geteuid() != 0 || !enforcement_.disk) return;
  char resolved[PATH_MAX];
  if (!realpath(config_.workspace_root.c_str(), resolved)) return;
  const std::string root = resolved;
  auto off = [&](const std::string& why) {
    Log(LogLevel::kInfo, "local.workspace_mounts_shared",
        {{"workspace_root", root},
         {"message", absl::StrCat("new sandboxes start with every workspace mount in view (", why,
                                  "); creates slow down as sandboxes accumulate")}});
  };
  if (!IsMountPoint(root)) {
    // Workspaces mounted while it was not a mount (by an older version)
    // would be hidden under the bind: not while they exist.
    const std::vector<std::string> below = MountsBelow(root);
    if (!below.empty()) {
      return off(absl::StrCat(below.size(), " workspaces are mounted below ", root,
                              " from before; the first start after they are gone changes it"));
    }
    // Its propagation stays as it was: the containers' namespaces keep
    // their own copies private (DropOtherWorkspaces).
    if (mount(root.c_str(), root.c_str(), nullptr, MS_BIND, nullptr) != 0) {
      return off(absl::StrCat("cannot bind-mount it onto itself: ", strerror(errno)));
    }
    made_root_mount_ = true;
  }
  root_mount_ = root;
  own_mount_namespace_ = true;
}

std::vector<std::string> LocalProvider::WrapCommand(const std::string& workspace,
                                                    const std::vector<std::string>& command,
                                                    const std::string& tmp_dir,
                                                    const std::string& cwd) const {
  if (config_.isolation == Isolation::kNone) return command;
  std::vector<std::string> a = {config_.bwrap_path,
                                "--unshare-user",
                                "--unshare-pid",
                                "--unshare-net",
                                "--unshare-ipc",
                                "--unshare-uts",
                                "--unshare-cgroup-try",
                                "--die-with-parent",
                                "--new-session",
                                "--hostname",
                                "sandbox"};
  a.insert(a.end(), system_args_.begin(), system_args_.end());
  a.insert(a.end(), user_args_.begin(), user_args_.end());
  a.insert(a.end(), {"--proc", "/proc", "--dev", "/dev"});
  if (tmp_dir.empty()) {
    a.insert(a.end(), {"--tmpfs", "/tmp"});
  } else {
    a.insert(a.end(), {"--bind", tmp_dir, "/tmp"});
  }
  a.insert(a.end(), {"--bind", workspace, config_.mount_point, "--chdir",
                     cwd.empty() ? config_.mount_point : cwd, "--"});
  a.insert(a.end(), command.begin(), command.end());
  return a;
}

std::vector<std::string> LocalProvider::ContainerArgs(const std::string& dir,
                                                      const std::string& workspace,
                                                      const LocalLimits& limits,
                                                      bool egress) const {
  if (config_.isolation == Isolation::kNone) return {config_.init_path};
  std::vector<std::string> a = {
      config_.bwrap_path, "--unshare-user", "--disable-userns", "--unshare-pid",
      "--unshare-net",    "--unshare-ipc",  "--unshare-uts",    "--unshare-cgroup-try",
      "--as-pid-1",       "--new-session",  "--cap-drop",       "ALL",
      "--hostname",       "sandbox"};
  a.insert(a.end(), system_args_.begin(), system_args_.end());
  a.insert(a.end(), user_args_.begin(), user_args_.end());
  a.insert(a.end(),
           {"--ro-bind", dir + "/passwd", "/etc/passwd", "--ro-bind", dir + "/group", "/etc/group",
            "--ro-bind", dir + "/nsswitch.conf", "/etc/nsswitch.conf", "--proc", "/proc"});
  if (egress) {
    // The namespace the egress point made (joined before bwrap starts),
    // and a resolver there: the broker's.
    a.erase(std::find(a.begin(), a.end(), "--unshare-net"));
    a.insert(a.end(), {"--ro-bind", dir + "/resolv.conf", "/etc/resolv.conf"});
  }
  a.insert(a.end(), proc_masks_.begin(), proc_masks_.end());
  a.insert(a.end(), {"--dev", "/dev"});
  // /tmp and /dev/shm: tmpfs whose pages count against the memory limit;
  // together at most tmp_bytes (3/4 for /tmp, 1/4 for /dev/shm).
  if (limits.tmp_bytes > 0) {
    a.insert(a.end(), {"--size", absl::StrCat(limits.tmp_bytes - limits.tmp_bytes / 4), "--perms",
                       "1777", "--tmpfs", "/tmp", "--size", absl::StrCat(limits.tmp_bytes / 4),
                       "--perms", "1777", "--tmpfs", "/dev/shm"});
  } else {
    a.insert(a.end(), {"--perms", "1777", "--tmpfs", "/tmp"});
  }
  a.insert(a.end(),
           {"--bind", workspace, config_.mount_point, "--ro-bind", init_copy_, "/.sandbox-init",
            "--seccomp", "4", "--chdir", config_.mount_point, "--", "/.sandbox-init"});
  return a;
}

absl::StatusOr<LocalLimits> LocalProvider::LimitsFor(const SandboxResources& req,
                                                     const SandboxResources& ceiling) const {
  LocalLimits l = config_.limits;
  const LocalLimits& m = config_.max_limits;
  auto check = [](const char* field, double v, double max) -> absl::Status {
    if (v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("resources.", field, ": must not be negative"));
    }
    if (max > 0 && v > max) {
      auto num = [](double d) {
        return d == static_cast<double>(static_cast<int64_t>(d))
                   ? absl::StrCat(static_cast<int64_t>(d))
                   : absl::StrCat(d);
      };
      return absl::InvalidArgumentError(absl::StrCat("resources.", field, ": ", num(v),
                                                     " is above the maximum ", num(max),
                                                     " (providers.local.max_limits.", field, ")"));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(check("memory_bytes", static_cast<double>(req.memory_bytes),
                        static_cast<double>(m.memory_bytes)));
  RETURN_IF_ERROR(check("cpus", req.cpus, m.cpus));
  RETURN_IF_ERROR(check("pids", static_cast<double>(req.pids), static_cast<double>(m.pids)));
  RETURN_IF_ERROR(
      check("disk_bytes", static_cast<double>(req.disk_bytes), static_cast<double>(m.disk_bytes)));
  if (req.memory_bytes > 0) {
    if (req.memory_bytes < (int64_t{32} << 20)) {
      return absl::InvalidArgumentError(
          "resources.memory_bytes: must be at least 33554432 (32 MiB)");
    }
    l.memory_bytes = req.memory_bytes;
  }
  if (req.cpus > 0) l.cpus = req.cpus;
  if (req.pids > 0) {
    if (req.pids < 8) return absl::InvalidArgumentError("resources.pids: must be at least 8");
    l.pids = req.pids;
  }
  if (req.disk_bytes > 0) {
    if (req.disk_bytes < (int64_t{16} << 20)) {
      return absl::InvalidArgumentError("resources.disk_bytes: must be at least 16777216 (16 MiB)");
    }
    l.disk_bytes = req.disk_bytes;
  }
  // The tenant's cap also bounds a default (the asked values are already
  // checked against it).
  if (ceiling.memory_bytes > 0) l.memory_bytes = std::min(l.memory_bytes, ceiling.memory_bytes);
  if (ceiling.cpus > 0) l.cpus = std::min(l.cpus, ceiling.cpus);
  if (ceiling.pids > 0) l.pids = std::min(l.pids, ceiling.pids);
  if (ceiling.disk_bytes > 0) l.disk_bytes = std::min(l.disk_bytes, ceiling.disk_bytes);
  return l;
}

std::string LocalProvider::SandboxDir(const std::string& id) const {
  return absl::StrCat(config_.workspace_root, "/", id);
}

std::vector<std::string> LocalProvider::ListSandboxIds() const {
  std::vector<std::string> out;
  if (DIR* d = opendir(config_.workspace_root.c_str())) {
    while (struct dirent* e = readdir(d)) {
      if (absl::StartsWith(e->d_name, "local-")) out.push_back(e->d_name);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::Status LocalProvider::RemoveSandbox(const std::string& id) const {
  if (id.empty() || id.find('/') != std::string::npos || id[0] == '.') {
    return absl::InvalidArgumentError(absl::StrCat("local: bad sandbox id \"", id, "\""));
  }
  const std::string dir = SandboxDir(id);
  absl::Status s;
  if (cgroups_) {
    cgroups_->Kill(id);
    s = cgroups_->Remove(id);
  }
  absl::Status u = UnmountDisk(dir + "/workspace");
  if (s.ok()) s = u;
  if (!u.ok()) return s;  // never delete through a mount we could not detach
  absl::Status t = RemoveTree(dir);
  if (s.ok()) s = t;
  return s;
}

absl::StatusOr<std::unique_ptr<Sandbox>> LocalProvider::Attach(const std::string& id,
                                                               const SandboxSpec& spec) {
  if (!IsLocalSandboxId(id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("local: \"", id, "\" is not a local sandbox id"));
  }
  struct stat st;
  if (stat((SandboxDir(id) + "/workspace").c_str(), &st) != 0) {
    // A create (or destroy) that died before its workspace existed (after it
    // was gone): only its leftovers (directory, cgroup, marker) remain.
    RETURN_IF_ERROR(RemoveSandbox(id));
    RemoveOwnerMarker(config_.workspace_root, id);
    return SandboxGoneError(absl::StrCat("local: workspace of ", id, " is gone"));
  }
  // Whatever a killed broker left running in it dies first.
  if (cgroups_ && cgroups_->Exists(id)) {
    cgroups_->Kill(id);
    (void)cgroups_->Remove(id);
  }
  return Start(id, spec, /*fresh=*/false);
}

absl::StatusOr<std::unique_ptr<Sandbox>> LocalProvider::Start(const std::string& id,
                                                              const SandboxSpec& spec, bool fresh) {
  ASSIGN_OR_RETURN(LocalLimits limits, LimitsFor(spec.resources, spec.ceiling));
  LocalSandbox::Parts parts;
  // Host-wide admission first: a refusal leaves nothing to undo. A sandbox
  // that exists already (an attach) is counted whether or not it fits.
  const CapacityAsk ask{limits.memory_bytes, limits.pids, limits.disk_bytes};
  if (fresh) {
    ASSIGN_OR_RETURN(parts.capacity, capacity_->Reserve(ask));
  } else {
    parts.capacity = capacity_->Force(ask);
  }
  parts.id = id;
  parts.dir = SandboxDir(id);
  parts.workspace = parts.dir + "/workspace";
  parts.limits = limits;
  int uid = -1;
  if (uids_) {
    ASSIGN_OR_RETURN(uid, uids_->Acquire());
  }
  parts.uid = uid;
  // On any failure below, nothing is left behind (a fresh sandbox) or the
  // workspace stays as it was (an attach).
  bool ok = false;
  absl::Cleanup undo = [&] {
    if (ok) return;
    if (cgroups_) {
      cgroups_->Kill(id);
      (void)cgroups_->Remove(id);
    }
    if (fresh) {
      (void)RemoveSandbox(id);
    } else {
      (void)UnmountDisk(parts.workspace);
    }
    if (uid >= 0) uids_->Release(uid);
  };
  auto fail = [&](absl::string_view what, int err) {
    return absl::InternalError(absl::StrCat("local: ", what, ": ", strerror(err)));
  };
  if (fresh) {
    if (mkdir(parts.dir.c_str(), 0711) != 0) return fail("create sandbox directory", errno);
    if (mkdir(parts.workspace.c_str(), 0700) != 0) return fail("create workspace", errno);
  }
  const bool disk = enforcement_.disk && limits.disk_bytes > 0;
  const std::string image = parts.dir + "/disk.img";
  if (disk) {
    struct stat st;
    // Only a new image is sure to be on no loop device yet.
    const bool new_image = fresh || stat(image.c_str(), &st) != 0;
    if (new_image) {
      absl::Status s = CreateDiskImage(image, limits.disk_bytes, limits.disk_inodes, uid);
      if (!s.ok()) return s;
    }
    if (!IsMountPoint(parts.workspace)) {
      absl::Status s = MountDiskImage(image, parts.workspace, new_image);
      if (!s.ok()) return s;
    }
    if (fresh) rmdir((parts.workspace + "/lost+found").c_str());
  }
  if (uid >= 0) {
    if (fresh) {
      if (chown(parts.workspace.c_str(), static_cast<uid_t>(uid), static_cast<gid_t>(uid)) != 0) {
        return fail("chown workspace", errno);
      }
    } else {
      ChownTree(parts.workspace, static_cast<uid_t>(uid));
    }
  }
  chmod(parts.workspace.c_str(), 0700);
  if (config_.isolation == Isolation::kNone) {
    const std::string tmp = parts.dir + "/tmp";
    if (mkdir(tmp.c_str(), 01777) != 0 && errno != EEXIST) return fail("create tmp", errno);
  }

  std::vector<int> init_cg;
  absl::Cleanup close_cg = [&init_cg] {
    for (int fd : init_cg) close(fd);
  };
  if (cgroups_) {
    CgroupLimits cl;
    cl.memory_bytes = limits.memory_bytes;
    cl.cpus = limits.cpus;
    cl.pids = limits.pids;
    RETURN_IF_ERROR(cgroups_->CreateSandbox(id, cl));
    ASSIGN_OR_RETURN(init_cg, cgroups_->CreateChild(id, "init"));
  }

  // Spawn the container with init's control socket on fd 3 and the seccomp
  // program on fd 4.
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    return fail("socketpair", errno);
  int one = 1;
  setsockopt(sv[0], SOL_SOCKET, SO_PASSCRED, &one, sizeof(one));
  parts.ctl = sv[0];
  absl::Cleanup close_ctl = [&] {
    if (!ok) close(sv[0]);
  };
  absl::Cleanup close_remote = [&] { close(sv[1]); };
  int seccomp_fd = -1;
  if (config_.isolation != Isolation::kNone) {
    ASSIGN_OR_RETURN(seccomp_fd, MemFd(seccomp_bpf_));
  }
  absl::Cleanup close_seccomp = [seccomp_fd] {
    if (seccomp_fd >= 0) close(seccomp_fd);
  };
  const std::string log_path = parts.dir + "/container.log";
  int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (log_fd < 0) return fail("create container.log", errno);
  absl::Cleanup close_log = [log_fd] { close(log_fd); };
  if (config_.isolation != Isolation::kNone) {
    // Inside the container code runs as the pool's uid (user namespace
    // maps it to itself), as 1000 with user_name, or as the broker's uid.
    const bool named = !config_.user_name.empty();
    const uint32_t in_uid = named ? 1000 : uid >= 0 ? static_cast<uint32_t>(uid) : geteuid();
    const uint32_t in_gid = named ? 1000 : uid >= 0 ? static_cast<uint32_t>(uid) : getegid();
    RETURN_IF_ERROR(WriteAccountFiles(parts.dir, named ? config_.user_name : "sandbox", in_uid,
                                      in_gid, config_.mount_point));
  }
  if (!spec.network.IsDefault()) {
    if (egress_ == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("local: spec.network cannot be enforced on this host (", no_egress_,
                       "); sessions here have no network at all"));
    }
    ASSIGN_OR_RETURN(parts.egress, egress_->Open({spec.tenant, spec.session_id, id}, spec.network));
  }
  const int netns_fd = parts.egress != nullptr ? parts.egress->netns_fd() : -1;
  const std::vector<std::string> args =
      ContainerArgs(parts.dir, parts.workspace, limits, netns_fd >= 0);
  std::vector<char*> argv;
  for (const auto& s : args) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  char path_env[] = "PATH=/usr/local/bin:/usr/bin:/bin";
  char* envp[] = {path_env, nullptr};
  const std::string ws = parts.workspace;
  const std::string root = root_mount_;
  const bool none = config_.isolation == Isolation::kNone;
  const bool own_ns = own_mount_namespace_ && !none;
  // Claimed: the daemon's reaper of orphans never takes this child's status.
  pid_t pid = ChildReaper::ForkClaimed();
  if (pid < 0) return fail("fork", errno);
  if (pid == 0) {
    // Async-signal-safe calls only.
    if (netns_fd >= 0 && setns(netns_fd, CLONE_NEWNET) != 0) _exit(126);
    for (int fd : init_cg) {
      if (write(fd, "0", 1) != 1) _exit(126);
    }
    sigset_t none_set;
    sigemptyset(&none_set);
    sigprocmask(SIG_SETMASK, &none_set, nullptr);
    setsid();
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    dup2(log_fd, 1);
    dup2(log_fd, 2);
    if (dup2(sv[1], 3) < 0) _exit(126);
    if (seccomp_fd >= 0 && dup2(seccomp_fd, 4) < 0) _exit(126);
    syscall(SYS_close_range, seccomp_fd >= 0 ? 5 : 4, ~0U, 0);
    fcntl(3, F_SETFD, 0);
    if (seccomp_fd >= 0) fcntl(4, F_SETFD, 0);
    if (own_ns && !DropOtherWorkspaces(root.c_str(), ws.c_str())) {
      static const char kMsg[] = "sandbox: cannot make the container's mount namespace\n";
      (void)!write(2, kMsg, sizeof(kMsg) - 1);
      _exit(126);
    }
    if (uid >= 0) {
      if (setgroups(0, nullptr) != 0 || setgid(static_cast<gid_t>(uid)) != 0 ||
          setuid(static_cast<uid_t>(uid)) != 0) {
        _exit(126);
      }
    }
    if (none && chdir(ws.c_str()) != 0) _exit(126);
    execve(argv[0], argv.data(), envp);
    _exit(127);
  }
  parts.bwrap_pid = pid;
  std::move(close_remote).Invoke();
  // Ready: "R" from init, whose credentials carry its pid as we see it.
  struct pollfd pf = {sv[0], POLLIN, 0};
  int pr;
  do {
    pr = poll(&pf, 1, 30000);
  } while (pr < 0 && errno == EINTR);
  char c = 0;
  alignas(struct cmsghdr) char cbuf[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(sizeof(int))];
  struct iovec iov = {&c, 1};
  struct msghdr mh = {};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = cbuf;
  mh.msg_controllen = sizeof(cbuf);
  ssize_t n = pr > 0 ? recvmsg(sv[0], &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC) : -1;
  for (struct cmsghdr* cm = CMSG_FIRSTHDR(&mh); n == 1 && cm; cm = CMSG_NXTHDR(&mh, cm)) {
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_CREDENTIALS) {
      struct ucred cr;
      memcpy(&cr, CMSG_DATA(cm), sizeof(cr));
      parts.init_pid = cr.pid;
    } else if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS &&
               cm->cmsg_len == CMSG_LEN(sizeof(int)) && parts.tmp_fd < 0) {
      // init's /tmp (see sandbox_init.cc); with isolation "none" the host's.
      memcpy(&parts.tmp_fd, CMSG_DATA(cm), sizeof(int));
      if (config_.isolation == Isolation::kNone) {
        close(parts.tmp_fd);
        parts.tmp_fd = -1;
      }
    }
  }
  const bool no_tmp = config_.isolation != Isolation::kNone && parts.tmp_fd < 0;
  if (n != 1 || c != 'R' || parts.init_pid <= 0 || no_tmp) {
    if (parts.tmp_fd >= 0) close(parts.tmp_fd);
    parts.tmp_fd = -1;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    ChildReaper::Release(pid);
    std::string why = ReadSmallFile(log_path);
    return absl::FailedPreconditionError(absl::StrCat(
        "local: the sandbox container did not start (", why.empty() ? "no output" : why, ")"));
  }
  ok = true;
  auto sandbox =
      std::make_unique<LocalSandbox>(this, uids_, cgroups_.get(), std::move(parts), spec);
  sandbox->PrepareSpare();
  return std::unique_ptr<Sandbox>(std::move(sandbox));
}

absl::Status LocalProvider::ProbeEnforcement() {
  std::vector<std::string> missing;
  if (config_.isolation == Isolation::kNone) {
    missing.push_back("isolation is \"none\"");
  } else {
    auto cg = CgroupFs::Detect(config_.cgroup_root, config_.cgroup_parent);
    if (!cg.ok()) {
      missing.push_back(std::string(cg.status().message()));
    } else {
      // Prove we can create and limit a group.
      const std::string probe = absl::StrCat(".probe-", RandomHex(6));
      CgroupLimits l;
      l.memory_bytes = 64 << 20;
      l.pids = 16;
      l.cpus = 1;
      absl::Status s = cg->CreateSandbox(probe, l);
      (void)cg->Remove(probe);
      if (s.ok()) s = cg->SetTreeCpuWeight(config_.cpu_weight);
      // The host's capacity as the whole tree's limits: the kernel holds
      // the line admission draws, whatever the sandboxes' own limits.
      if (s.ok()) s = cg->SetTreeLimits(config_.capacity.memory_bytes, config_.capacity.pids);
      if (s.ok()) {
        cgroups_ = std::make_unique<CgroupFs>(*cg);
        enforcement_.cgroups = true;
      } else {
        missing.push_back(absl::StrCat(cg->Describe(), " is not writable: ", s.message()));
      }
    }
    // Disk quotas: a loop-mounted ext4 image needs root, mkfs.ext4 and loop.
    const std::string dir = absl::StrCat(config_.workspace_root, "/.probe-disk-", RandomHex(6));
    absl::Status d;
    if (geteuid() != 0) {
      d = absl::FailedPreconditionError("not running as root");
    } else if (access("/usr/sbin/mkfs.ext4", X_OK) != 0) {
      d = absl::FailedPreconditionError("mkfs.ext4 missing (install e2fsprogs)");
    } else if (mkdir(dir.c_str(), 0700) != 0 || mkdir((dir + "/mnt").c_str(), 0700) != 0) {
      d = absl::FailedPreconditionError(absl::StrCat("cannot create ", dir));
    } else {
      d = CreateDiskImage(dir + "/img", 16 << 20, 1024, -1);
      if (d.ok()) d = MountDiskImage(dir + "/img", dir + "/mnt", true);
      (void)UnmountDisk(dir + "/mnt");
    }
    (void)RemoveTree(dir);
    if (d.ok()) {
      enforcement_.disk = true;
    } else {
      missing.push_back(absl::StrCat("no disk quota (loop-mounted ext4): ", d.message()));
    }
  }
  enforcement_.detail =
      missing.empty() ? absl::StrCat("limits enforced: ", cgroups_->Describe(), ", cpu weight ",
                                     config_.cpu_weight, "; workspace quota: loop-mounted ext4")
                      : absl::StrCat("limits NOT enforced: ", absl::StrJoin(missing, "; "));
  if (missing.empty()) return absl::OkStatus();
  if (config_.enforcement == Enforcement::kBestEffort || config_.isolation == Isolation::kNone) {
    Log(LogLevel::kWarning, "local.enforcement_best_effort",
        {{"message",
          absl::StrCat("providers.local.enforcement is \"best_effort\": sandboxes run WITHOUT "
                       "some kernel-enforced limits (",
                       enforcement_.detail,
                       "); one sandbox can take the host's memory, CPU or disk")}});
    return absl::OkStatus();
  }
  if (geteuid() != 0) {
    // The usual cause, said in one line: what to do, and what the other
    // way gives up.
    return absl::FailedPreconditionError(
        "local: per-sandbox limits (cgroups, the workspace disk quota) need root: run "
        "sandbox-brokerd as root (sudo), or set providers.local.enforcement to "
        "\"best_effort\", which runs sandboxes isolated but WITHOUT memory, CPU, process "
        "and disk limits");
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "local: cannot enforce sandbox limits here: ", absl::StrJoin(missing, "; "),
      ". Fix that, or set providers.local.enforcement to \"best_effort\" to run without them"));
}

std::string LocalProvider::Degraded() const {
  if (enforcement_.cgroups && enforcement_.disk) return "";
  return absl::StrCat("best_effort: ", enforcement_.detail);
}

absl::Status LocalProvider::ProbeSandbox() {
  // One real sandbox, the way sessions will use it.
  SandboxSpec spec;
  spec.resources.disk_bytes = enforcement_.disk ? (16 << 20) : 0;
  auto sb = Start(absl::StrCat("local-probe-", RandomHex(8)), spec, true);
  absl::StatusOr<ExecResult> r = sb.ok() ? (*sb)->Exec([] {
    ExecRequest q;
    q.language = Language::kShell;
    q.code = "exit 0";
    q.timeout = absl::Seconds(30);
    return q;
  }())
                                         : absl::StatusOr<ExecResult>(sb.status());
  if (sb.ok()) (void)(*sb)->Destroy();
  if (!r.ok()) return absl::UnavailableError(std::string(r.status().message()));
  if (r->exit_code != 0) {
    std::string why = r->output;
    while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
    return absl::UnavailableError(absl::StrCat("probe exited with ", r->exit_code, ": ", why));
  }
  return absl::OkStatus();
}

absl::Status LocalProvider::CheckHealth() {
  absl::Status s = ProbeSandbox();
  if (s.ok()) return s;
  return absl::UnavailableError(absl::StrCat("local: cannot start a sandbox: ", s.message()));
}

absl::Status LocalProvider::Probe() {
  if (config_.isolation == Isolation::kNone) {
    Log(LogLevel::kWarning, "local.isolation_none",
        {{"message",
          "providers.local.isolation is \"none\": sandboxed code runs WITHOUT "
          "isolation, with the broker's view of the machine; development only"}});
  } else if (access(config_.bwrap_path.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("local: bubblewrap not found at ", config_.bwrap_path,
                     " (install the bubblewrap package, or set providers.local.bwrap_path)"));
  }
  if (access(config_.init_path.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("local: sandbox-init not found at ", config_.init_path,
                     " (install it next to the broker, or set providers.local.init_path)"));
  }
  if (config_.isolation != Isolation::kNone) {
    ASSIGN_OR_RETURN(init_copy_,
                     CopyInitIntoWorkspaceRoot(config_.init_path, config_.workspace_root));
    ASSIGN_OR_RETURN(seccomp_bpf_, BuildSeccompBpf());
  }
  RETURN_IF_ERROR(ProbeEnforcement());
  // A broker killed during a health probe leaves the probe's sandbox (dir,
  // cgroup, mount). It never belongs to a session and no marker names it, so
  // the orphan sweep never sees it: remove such leftovers here.
  for (const std::string& id : ListSandboxIds()) {
    if (!absl::StartsWith(id, "local-probe-")) continue;
    absl::Status s = RemoveSandbox(id);
    Log(s.ok() ? LogLevel::kInfo : LogLevel::kWarning, "local.stale_probe_removed",
        {{"sandbox_id", id}, {"result", s.ok() ? std::string("ok") : std::string(s.message())}});
  }
  PrepareWorkspaceRoot();
  absl::Status probed = ProbeSandbox();
  if (!probed.ok() && own_mount_namespace_) {
    // Something here refuses the namespace the containers start in: do
    // without it rather than refuse to start.
    own_mount_namespace_ = false;
    Log(LogLevel::kWarning, "local.workspace_mounts_shared",
        {{"workspace_root", root_mount_},
         {"message",
          absl::StrCat("a container in a mount namespace of its own failed (", probed.message(),
                       "); new sandboxes start with every "
                       "workspace mount in view, and creates slow down as "
                       "sandboxes accumulate")}});
    probed = ProbeSandbox();
  }
  if (absl::Status s = probed; !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "local: bubblewrap cannot create the sandbox container here (", s.message(), "); ",
        geteuid() == 0 ? "the kernel must allow user namespaces (sysctl user.max_user_namespaces)"
                       : "enable unprivileged user namespaces (sysctl "
                         "kernel.unprivileged_userns_clone=1), or run as root",
        "; providers.local.isolation \"none\" runs code unisolated, for development only"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LocalProvider>> LocalProvider::Create(LocalConfig config) {
  if (config.workspace_root.empty()) config.workspace_root = DefaultWorkspaceRoot();
  if (config.init_path.empty()) config.init_path = DefaultInitPath();
  RETURN_IF_ERROR(MakeDirs(config.workspace_root, 0711));
  // Left by versions that shared one passwd and group among sandboxes.
  for (const char* f : {"/.etc/passwd", "/.etc/group"}) {
    unlink((config.workspace_root + f).c_str());
  }
  rmdir((config.workspace_root + "/.etc").c_str());
  std::shared_ptr<UidPool> uids;
  if (geteuid() == 0 && config.isolation == Isolation::kBwrap) {
    uids = std::make_shared<UidPool>(config.uid_base, config.uid_count);
    // Each sandbox runs as a uid of its own, which must reach its workspace.
    if (std::string closed = FirstDirClosedToOthers(config.workspace_root); !closed.empty()) {
      struct stat st {};
      stat(closed.c_str(), &st);
      char mode[8];
      snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
      return absl::FailedPreconditionError(absl::StrCat(
          "local: sandboxes run as uids of their own and cannot reach "
          "providers.local.workspace_root ",
          config.workspace_root, ": ", closed, " is mode ", mode,
          ", closed to other users; set workspace_root under a directory all can search "
          "(the default is /var/lib/sandbox-broker/workspaces), or chmod o+x ",
          closed));
    }
  }
  {
    // What the host has, where the config leaves it (-1).
    const LocalCapacity host = HostCapacity("/proc", config.workspace_root);
    LocalCapacity& c = config.capacity;
    if (c.memory_bytes < 0) c.memory_bytes = host.memory_bytes;
    if (c.pids < 0) c.pids = host.pids;
    if (c.disk_bytes < 0) c.disk_bytes = host.disk_bytes;
    Log(LogLevel::kInfo, "local.capacity",
        {{"memory_bytes", c.memory_bytes},
         {"pids", c.pids},
         {"disk_bytes", c.disk_bytes},
         {"sandboxes", c.sandboxes},
         {"memory_overcommit", c.memory_overcommit},
         {"pids_overcommit", c.pids_overcommit},
         {"disk_overcommit", c.disk_overcommit}});
  }
  std::unique_ptr<LocalProvider> p(new LocalProvider(std::move(config), std::move(uids)));
  p->capacity_ = std::make_unique<CapacityLedger>(p->config_.capacity);
  if (geteuid() == 0 && p->config_.isolation == Isolation::kBwrap) {
    absl::StatusOr<std::unique_ptr<Egress>> egress = Egress::Start();
    if (egress.ok()) {
      p->egress_ = *std::move(egress);
    } else {
      p->no_egress_ = std::string(egress.status().message());
    }
  } else {
    p->no_egress_ = "network rules need root and isolation \"bwrap\"";
  }
  if (p->egress_ == nullptr) {
    Log(LogLevel::kInfo, "local.no_egress",
        {{"message", absl::StrCat("sessions with network rules are refused: ", p->no_egress_)}});
  }
  RETURN_IF_ERROR(p->Probe());
  return p;
}

void LocalProvider::SetHooks(ProviderHooks hooks) {
  if (hooks.on_capacity) capacity_->SetReport(hooks.on_capacity);
  if (egress_ != nullptr) egress_->SetHooks(std::move(hooks));
}

absl::StatusOr<std::unique_ptr<Sandbox>> LocalProvider::Create(const SandboxSpec& spec) {
  for (const auto& [k, v] : spec.env) {
    if (k.empty() || k.find_first_of("=\0", 0, 2) != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("invalid env name \"", k, "\""));
    }
  }
  const std::string id = absl::StrCat("local-", RandomHex(12));
  // The marker first, so a crash at any later point leaves the sandbox
  // findable (durable sessions); a failed start removes it again.
  if (!spec.deployment_id.empty()) {
    RETURN_IF_ERROR(WriteOwnerMarker(config_.workspace_root, id, spec));
  }
  absl::StatusOr<std::unique_ptr<Sandbox>> sb = Start(id, spec, /*fresh=*/true);
  if (!sb.ok()) RemoveOwnerMarker(config_.workspace_root, id);
  return sb;
}

absl::StatusOr<std::vector<OwnedSandbox>> LocalProvider::ListOwned(
    const std::string& deployment_id) {
  std::vector<OwnedSandbox> out;
  const std::string owners = absl::StrCat(config_.workspace_root, "/.owners");
  DIR* dir = opendir(owners.c_str());
  if (dir == nullptr) {
    if (errno == ENOENT) return out;  // nothing was ever tagged here
    return absl::UnavailableError(
        absl::StrCat("local: cannot list ", owners, ": ", strerror(errno)));
  }
  while (struct dirent* e = readdir(dir)) {
    const std::string id = e->d_name;
    if (!IsLocalSandboxId(id)) continue;  // also skips "*.new" half-written markers
    std::ifstream in(absl::StrCat(owners, "/", id));
    std::stringstream ss;
    ss << in.rdbuf();
    nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
    if (!j.is_object() || j.value("deployment_id", "") != deployment_id) continue;
    OwnedSandbox o;
    o.sandbox_id = id;
    o.attempt_id = j.value("attempt_id", "");
    o.tenant = j.value("tenant", "");
    o.session_id = j.value("session_id", "");
    if (j.contains("created_at") && j["created_at"].is_number_integer()) {
      o.created_at = absl::FromUnixSeconds(j["created_at"].get<int64_t>());
    }
    out.push_back(std::move(o));
  }
  closedir(dir);
  std::sort(out.begin(), out.end(), [](const OwnedSandbox& a, const OwnedSandbox& b) {
    return a.sandbox_id < b.sandbox_id;
  });
  return out;
}

}  // namespace sandbox
