#include "adapters/local/local_provider.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "adapters/local/workspace_fs.h"
#include "common/config_reader.h"
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

// /etc entries programs need; the rest of /etc (and every config file of
// the broker) stays invisible.
const char* const kEtcAllowList[] = {
    "alternatives",    "ld.so.cache",   "ld.so.conf", "ld.so.conf.d",   "passwd",
    "group",           "nsswitch.conf", "localtime",  "timezone",       "ssl",
    "ca-certificates", "mime.types",    "hosts",      "host.conf",      "bash.bashrc",
    "profile",         "inputrc",       "terminfo",   "magic",          "locale.alias",
    "locale.gen",      "python3",       "python3.11", "debian_version", "os-release",
    "protocols",       "services"};

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

// ---- durable sessions: the owner marker beside each workspace ------------
// <workspace_root>/.owners/<sandbox id> (JSON: deployment_id, attempt_id,
// tenant, session_id, created_at) tags a workspace with the deployment and
// create attempt that made it. Written before the workspace exists, removed
// after it is gone, so a crash at any point leaves it findable.

std::string OwnerMarkerPath(const std::string& workspace) {
  const size_t slash = workspace.rfind('/');
  return absl::StrCat(workspace.substr(0, slash), "/.owners", workspace.substr(slash));
}

absl::Status WriteOwnerMarker(const std::string& workspace, const SandboxSpec& spec) {
  nlohmann::json j = {{"deployment_id", spec.deployment_id},
                      {"attempt_id", spec.attempt_id},
                      {"tenant", spec.tenant},
                      {"session_id", spec.session_id},
                      {"created_at", absl::ToUnixSeconds(absl::Now())}};
  const std::string path = OwnerMarkerPath(workspace);
  mkdir(path.substr(0, path.rfind('/')).c_str(), 0700);
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

void RemoveOwnerMarker(const std::string& workspace) { unlink(OwnerMarkerPath(workspace).c_str()); }

// A sandbox id this provider makes: "local-" and hex (never a path).
bool IsLocalSandboxId(const std::string& id) {
  if (!absl::StartsWith(id, "local-") || id.size() == 6 || id.size() > 64) return false;
  for (char c : id.substr(6)) {
    if (!absl::ascii_isxdigit(c)) return false;
  }
  return true;
}

class LocalSandbox final : public Sandbox {
 public:
  LocalSandbox(const LocalProvider* provider, std::shared_ptr<LocalProvider::UidPool> uids,
               std::string id, std::string workspace, std::string tmp_dir, int uid,
               const SandboxSpec& spec)
      : provider_(provider),
        uids_(std::move(uids)),
        id_(std::move(id)),
        workspace_(std::move(workspace)),
        tmp_dir_(std::move(tmp_dir)),
        uid_(uid),
        env_(spec.env),
        fs_(workspace_, provider->config().mount_point, uid, uid,
            static_cast<size_t>(provider->config().max_transfer_bytes)),
        tmp_fs_(tmp_dir_, "/tmp", uid, uid,
                static_cast<size_t>(provider->config().max_transfer_bytes)) {}

  ~LocalSandbox() override { (void)Destroy(); }

  const std::string& id() const override { return id_; }

  absl::StatusOr<ExecResult> Exec(const ExecRequest& request) override {
    const LocalConfig& cfg = provider_->config();
    ProcessSpec p;
    std::vector<std::string> cmd;
    if (!request.argv.empty()) {
      cmd = request.argv;
      p.stdin_data = request.code;
    } else
      switch (request.language) {
        case Language::kPython:
          cmd = {"python3", "-u", "-"};  // unbuffered: output keeps program order
          p.stdin_data = request.code;
          break;
        case Language::kNode:
          cmd = {"node", "-"};
          p.stdin_data = request.code;
          break;
        case Language::kShell:
          cmd = {"bash", "/dev/fd/3"};
          p.fd3_data = request.code;
          break;
      }
    std::string cwd = request.cwd;
    if (!cwd.empty()) RETURN_IF_ERROR(CheckCwd(cwd));
    p.argv = provider_->WrapCommand(workspace_, cmd, tmp_dir_, cwd);
    const std::string home = cfg.isolation == "none" ? workspace_ : cfg.mount_point;
    std::map<std::string, std::string> env = {
        {"PATH", "/usr/local/bin:/usr/bin:/bin"}, {"HOME", home}, {"LANG", "C.UTF-8"}};
    if (!cfg.user_name.empty()) env["USER"] = cfg.user_name;
    for (const auto& [k, v] : env_) env[k] = v;
    for (const auto& [k, v] : request.env) env[k] = v;
    for (const auto& [k, v] : env) p.env.push_back(absl::StrCat(k, "=", v));
    if (cfg.isolation == "none") {
      // Without bwrap there is no PATH lookup by a wrapper.
      p.argv[0] = cmd[0] == "python3" ? "/usr/bin/python3"
                  : cmd[0] == "node"  ? "/usr/bin/node"
                                      : "/bin/bash";
      p.cwd = workspace_;
      if (!request.argv.empty()) {
        return absl::FailedPreconditionError("local: argv runs need isolation \"bwrap\"");
      }
    }
    p.uid = uid_;
    p.gid = uid_;
    p.limits.cpu_seconds = static_cast<uint64_t>(cfg.cpu_seconds);
    p.limits.address_space_bytes = static_cast<uint64_t>(cfg.memory_bytes);
    // RLIMIT_NPROC counts every process of the uid: only meaningful when the
    // sandbox has a uid of its own.
    p.limits.max_processes = uid_ >= 0 ? static_cast<uint64_t>(cfg.max_processes) : 0;
    p.limits.file_size_bytes = static_cast<uint64_t>(cfg.file_size_bytes);
    p.limits.open_files = static_cast<uint64_t>(cfg.open_files);
    p.timeout = request.timeout;
    p.max_output_bytes = request.max_output_bytes;
    p.on_output = request.on_output;
    p.cancelled = request.cancelled;
    p.on_pid = [this](pid_t pid) {
      absl::MutexLock l(&mu_);
      if (pid > 0) {
        ++running_;
        pids_.insert(pid);
        if (destroyed_) kill(-pid, SIGKILL);
      } else {
        --running_;
      }
    };
    {
      absl::MutexLock l(&mu_);
      if (destroyed_) {
        return absl::FailedPreconditionError("local: sandbox is closed");
      }
      ++starting_;
    }
    absl::StatusOr<ExecResult> r = RunProcess(p);
    {
      absl::MutexLock l(&mu_);
      --starting_;
    }
    return r;
  }

  absl::Status WriteFile(absl::string_view path, absl::string_view data) override {
    RETURN_IF_ERROR(CheckOpen());
    return FsFor(path).Write(path, data);
  }

  absl::StatusOr<std::optional<std::string>> ReadFile(absl::string_view path) override {
    RETURN_IF_ERROR(CheckOpen());
    return FsFor(path).Read(path);
  }

  absl::Status Destroy() override {
    if (!Stop()) return absl::OkStatus();
    absl::Status s = RemoveTree(workspace_);
    if (!tmp_dir_.empty()) {
      absl::Status t = RemoveTree(tmp_dir_);
      if (s.ok()) s = t;
    }
    if (s.ok()) RemoveOwnerMarker(workspace_);  // last: a crash before leaves it findable
    if (uid_ >= 0 && uids_) uids_->Release(uid_);
    Log(LogLevel::kDebug, "local.sandbox_destroyed", {{"sandbox_id", id_}});
    return s;
  }

  // Graceful restart: running processes die, the workspace stays on disk
  // for LocalProvider::Attach in the next process.
  void Detach() override {
    if (Stop() && uid_ >= 0 && uids_) uids_->Release(uid_);
  }

 private:
  // Kills what runs and waits for it; false if already stopped.
  bool Stop() {
    absl::MutexLock l(&mu_);
    if (destroyed_) return false;
    destroyed_ = true;
    for (pid_t pid : pids_) kill(-pid, SIGKILL);
    // Runs reap their own children; wait until every one has.
    auto idle = [this]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_ == 0 && starting_ == 0; };
    mu_.Await(absl::Condition(&idle));
    return true;
  }

  // /tmp paths go to the persistent /tmp when the sandbox has one.
  const WorkspaceFs& FsFor(absl::string_view path) const {
    if (!tmp_dir_.empty() && (path == "/tmp" || absl::StartsWith(path, "/tmp/"))) return tmp_fs_;
    return fs_;
  }

  // A working directory must exist in the sandbox's view.
  absl::Status CheckCwd(const std::string& cwd) {
    auto missing = [&] {
      return absl::InvalidArgumentError(absl::StrCat("cwd '", cwd, "' does not exist"));
    };
    if (cwd.empty() || cwd.front() != '/' || cwd.find("/..") != std::string::npos) return missing();
    const std::string& mp = provider_->config().mount_point;
    std::string host;
    if (cwd == mp || absl::StartsWith(cwd, mp + "/")) {
      host = workspace_ + cwd.substr(mp.size());
    } else if (!tmp_dir_.empty() && (cwd == "/tmp" || absl::StartsWith(cwd, "/tmp/"))) {
      host = tmp_dir_ + cwd.substr(4);
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

  const LocalProvider* const provider_;
  const std::shared_ptr<LocalProvider::UidPool> uids_;
  const std::string id_;
  const std::string workspace_;
  const std::string tmp_dir_;  // persistent /tmp on the host, or empty
  const int uid_;
  const std::map<std::string, std::string> env_;
  const WorkspaceFs fs_;
  const WorkspaceFs tmp_fs_;

  absl::Mutex mu_;
  bool destroyed_ ABSL_GUARDED_BY(mu_) = false;
  int running_ ABSL_GUARDED_BY(mu_) = 0;   // started, not yet reaped
  int starting_ ABSL_GUARDED_BY(mu_) = 0;  // inside Exec
  std::set<pid_t> pids_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<LocalConfig> ParseLocalConfig(const nlohmann::json& json) {
  LocalConfig c;
  ConfigReader r(json, "providers.local");
  c.isolation = r.Enum("isolation", c.isolation, {"bwrap", "none"});
  c.bwrap_path = r.String("bwrap_path", c.bwrap_path, false);
  c.workspace_root = r.String("workspace_root", c.workspace_root);
  c.mount_point = r.String("mount_point", c.mount_point, false);
  c.uid_base = r.Int("uid_base", c.uid_base, 1000, 2000000000);
  c.uid_count = r.Int("uid_count", c.uid_count, 1, 1000000);
  c.cpu_seconds = r.Int("cpu_seconds", c.cpu_seconds, 1);
  c.memory_bytes = r.Int("memory_bytes", c.memory_bytes, 64 << 20);
  c.max_processes = r.Int("max_processes", c.max_processes, 1);
  c.file_size_bytes = r.Int("file_size_bytes", c.file_size_bytes, 1);
  c.open_files = r.Int("open_files", c.open_files, 16);
  c.max_transfer_bytes = r.Int("max_transfer_bytes", c.max_transfer_bytes, 1);
  c.extra_ro_paths = r.StringList("extra_ro_paths");
  c.user_name = r.String("user_name", c.user_name);
  c.persistent_tmp = r.Bool("persistent_tmp", c.persistent_tmp);
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
}

std::vector<std::string> LocalProvider::WrapCommand(const std::string& workspace,
                                                    const std::vector<std::string>& command,
                                                    const std::string& tmp_dir,
                                                    const std::string& cwd) const {
  if (config_.isolation == "none") return command;
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
  if (!config_.user_name.empty()) {
    const std::string etc = absl::StrCat(config_.workspace_root, "/.etc");
    a.insert(a.end(), {"--uid", "1000", "--gid", "1000", "--ro-bind", etc + "/passwd",
                       "/etc/passwd", "--ro-bind", etc + "/group", "/etc/group"});
  }
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

absl::Status LocalProvider::Probe() {
  if (config_.isolation == "none") {
    Log(LogLevel::kWarning, "local.isolation_none",
        {{"message",
          "providers.local.isolation is \"none\": sandboxed code runs WITHOUT "
          "isolation, with the broker's view of the machine; development only"}});
    return absl::OkStatus();
  }
  if (access(config_.bwrap_path.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("local: bubblewrap not found at ", config_.bwrap_path,
                     " (install the bubblewrap package, or set providers.local.bwrap_path)"));
  }
  // One real sandbox, the way runs will use it.
  std::string ws = absl::StrCat(config_.workspace_root, "/.probe-", RandomHex(8));
  if (mkdir(ws.c_str(), 0700) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("local: cannot create ", ws, ": ", strerror(errno)));
  }
  int uid = -1;
  if (uids_) {
    auto u = uids_->Acquire();
    if (!u.ok()) return u.status();
    uid = *u;
    (void)!chown(ws.c_str(), static_cast<uid_t>(uid), static_cast<gid_t>(uid));
  }
  ProcessSpec p;
  p.argv = WrapCommand(ws, {"/bin/sh", "-c", "exit 0"});
  p.env = {"PATH=/usr/bin:/bin"};
  p.uid = uid;
  p.gid = uid;
  p.timeout = absl::Seconds(30);
  auto r = RunProcess(p);
  (void)RemoveTree(ws);
  if (uid >= 0) uids_->Release(uid);
  if (!r.ok() || r->exit_code != 0) {
    std::string why = r.ok() ? r->output : std::string(r.status().message());
    while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
    return absl::FailedPreconditionError(
        absl::StrCat("local: bubblewrap cannot create namespaces here (", why,
                     "); enable unprivileged user namespaces, or set "
                     "providers.local.isolation to \"none\" for development only"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LocalProvider>> LocalProvider::Create(LocalConfig config) {
  if (config.workspace_root.empty()) config.workspace_root = DefaultWorkspaceRoot();
  RETURN_IF_ERROR(MakeDirs(config.workspace_root, 0711));
  std::shared_ptr<UidPool> uids;
  if (geteuid() == 0 && config.isolation == "bwrap") {
    uids = std::make_shared<UidPool>(config.uid_base, config.uid_count);
  }
  if (!config.user_name.empty()) {
    const std::string etc = absl::StrCat(config.workspace_root, "/.etc");
    RETURN_IF_ERROR(MakeDirs(etc, 0755));
    const std::string& u = config.user_name;
    std::ofstream(etc + "/passwd") << "root:x:0:0:root:/root:/bin/bash\n"
                                   << u << ":x:1000:1000:" << u << ":" << config.mount_point
                                   << ":/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:"
                                      "/usr/sbin/nologin\n";
    std::ofstream(etc + "/group") << "root:x:0:\n" << u << ":x:1000:\nnogroup:x:65534:\n";
    chmod((etc + "/passwd").c_str(), 0644);
    chmod((etc + "/group").c_str(), 0644);
  }
  std::unique_ptr<LocalProvider> p(new LocalProvider(std::move(config), std::move(uids)));
  RETURN_IF_ERROR(p->Probe());
  return p;
}

absl::StatusOr<std::unique_ptr<Sandbox>> LocalProvider::Create(const SandboxSpec& spec) {
  for (const auto& [k, v] : spec.env) {
    if (k.empty() || k.find_first_of("=\0", 0, 2) != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("invalid env name \"", k, "\""));
    }
  }
  std::string id = absl::StrCat("local-", RandomHex(12));
  std::string ws = absl::StrCat(config_.workspace_root, "/", id);
  if (!spec.deployment_id.empty()) RETURN_IF_ERROR(WriteOwnerMarker(ws, spec));
  int uid = -1;
  if (uids_) {
    absl::StatusOr<int> u = uids_->Acquire();
    if (!u.ok()) RemoveOwnerMarker(ws);
    ASSIGN_OR_RETURN(uid, std::move(u));
  }
  if (mkdir(ws.c_str(), 0700) != 0 ||
      (uid >= 0 && chown(ws.c_str(), static_cast<uid_t>(uid), static_cast<gid_t>(uid)) != 0)) {
    int err = errno;
    rmdir(ws.c_str());
    RemoveOwnerMarker(ws);
    if (uid >= 0) uids_->Release(uid);
    return absl::InternalError(absl::StrCat("local: create workspace: ", strerror(err)));
  }
  std::string tmp;
  if (config_.persistent_tmp) {
    tmp = absl::StrCat(ws, ".tmp");
    if (mkdir(tmp.c_str(), 01777) != 0 || chmod(tmp.c_str(), 01777) != 0 ||
        (uid >= 0 && chown(tmp.c_str(), static_cast<uid_t>(uid), static_cast<gid_t>(uid)) != 0)) {
      int err = errno;
      (void)RemoveTree(ws);
      (void)RemoveTree(tmp);
      RemoveOwnerMarker(ws);
      if (uid >= 0) uids_->Release(uid);
      return absl::InternalError(absl::StrCat("local: create tmp: ", strerror(err)));
    }
  }
  return std::unique_ptr<Sandbox>(
      new LocalSandbox(this, uids_, std::move(id), std::move(ws), std::move(tmp), uid, spec));
}

// ---- durable sessions ------------------------------------------------------

absl::StatusOr<std::unique_ptr<Sandbox>> LocalProvider::Attach(const std::string& sandbox_id,
                                                               const SandboxSpec& spec) {
  if (!IsLocalSandboxId(sandbox_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("local: \"", sandbox_id, "\" is not a local sandbox id"));
  }
  std::string ws = absl::StrCat(config_.workspace_root, "/", sandbox_id);
  struct stat st;
  if (lstat(ws.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    if (access(OwnerMarkerPath(ws).c_str(), F_OK) == 0) {
      // A create that died before its workspace existed: only the marker.
      RemoveOwnerMarker(ws);
    }
    return SandboxGoneError(absl::StrCat("local: workspace of ", sandbox_id, " is gone"));
  }
  int uid = -1;
  if (uids_) {
    ASSIGN_OR_RETURN(uid, uids_->Acquire());
    // A new process may hand out another uid: the workspace follows it.
    const std::string cmd = absl::StrCat("chown -R ", uid, ":", uid, " '", ws, "'");
    if (system(cmd.c_str()) != 0) {
      uids_->Release(uid);
      return absl::InternalError(absl::StrCat("local: cannot chown ", ws));
    }
  }
  std::string tmp;
  if (config_.persistent_tmp) {
    tmp = absl::StrCat(ws, ".tmp");
    mkdir(tmp.c_str(), 01777);
    chmod(tmp.c_str(), 01777);
    if (uid >= 0) (void)!chown(tmp.c_str(), static_cast<uid_t>(uid), static_cast<gid_t>(uid));
  }
  return std::unique_ptr<Sandbox>(
      new LocalSandbox(this, uids_, sandbox_id, std::move(ws), std::move(tmp), uid, spec));
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
    if (!IsLocalSandboxId(id)) continue;
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
  return out;
}

}  // namespace sandbox
