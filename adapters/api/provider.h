#pragma once

// The provider interface: what the broker needs from a sandbox backend
// (local namespaces, E2B, Daytona, ...). Plain types, no I/O, no gRPC.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "adapters/api/network_policy.h"

namespace sandbox {

enum class Language { kPython, kNode, kShell };

// A provider sandbox that no longer exists (expired, killed behind our back)
// is reported with this payload on its status, so the broker can drop the
// session and let the next call create a new sandbox. Branch on the payload,
// never on message text.
inline constexpr char kSandboxGonePayload[] = "type.sandbox-broker.dev/sandbox-gone";
inline absl::Status SandboxGoneError(absl::string_view message) {
  absl::Status s = absl::UnavailableError(message);
  s.SetPayload(kSandboxGonePayload, absl::Cord("1"));
  return s;
}
inline bool IsSandboxGone(const absl::Status& s) {
  return s.GetPayload(kSandboxGonePayload).has_value();
}

// "python", "node" or "shell".
absl::string_view LanguageName(Language language);

enum class OutputStream { kStdout, kStderr };

// Resources a session asks for (SessionSpec.resources); 0 = the provider's
// default.
struct SandboxResources {
  int64_t memory_bytes = 0;
  double cpus = 0;
  int64_t pids = 0;
  int64_t disk_bytes = 0;
  bool empty() const { return memory_bytes == 0 && cpus == 0 && pids == 0 && disk_bytes == 0; }
};

// What a sandbox uses now (SessionInfo.usage).
struct SandboxUsage {
  int64_t memory_bytes = 0;
  int64_t disk_bytes = 0;
  double cpu_seconds = 0;
};

// What a new sandbox is for. Identity fields let a provider tag its remote
// sandboxes so they can be traced back and reconciled.
struct SandboxSpec {
  std::string tenant;
  std::string session_id;
  std::string broker_instance_id;
  std::string template_name;  // empty = the provider's default
  Language language = Language::kPython;
  std::map<std::string, std::string> env;  // applied to every exec
  std::map<std::string, std::string> labels;
  SandboxResources resources;
  // The most this session may get (the tenant's policy), also when it asks
  // for the provider's default (0): a provider applies min(what it would
  // give, ceiling) per nonzero field. 0 = no ceiling.
  SandboxResources ceiling;
  // Durable sessions: the broker deployment that owns the sandbox and the
  // create attempt that made it. A provider tags what it creates with both
  // (E2B metadata, Daytona labels, a marker beside a local workspace) so
  // ListOwned can find it after a crash. Empty = untagged.
  std::string deployment_id;
  std::string attempt_id;
  // Warm pools (server/sessions/warm_pool.h): non-empty = a pool member of this pool
  // instance, for no session yet. The provider tags it kPoolTag = pool
  // (instead of tenant and session tags) and keeps it alive unused for at
  // least `keep_unclaimed` (E2B timeout, Daytona auto-stop).
  std::string pool;
  absl::Duration keep_unclaimed = absl::ZeroDuration();
  // What the sandbox may reach (docs/network.md); the default is nothing.
  // A provider that cannot enforce a non-default policy refuses the create
  // (FAILED_PRECONDITION naming the rule), never drops it.
  NetworkPolicy network;
};

// One egress decision of a sandbox (docs/network.md): metered, and audited
// when denied. Never carries a secret.
struct NetworkEvent {
  std::string tenant;
  std::string session_id;
  std::string sandbox_id;
  enum class Kind { kConnection, kDns, kClosed };
  Kind kind = Kind::kConnection;
  bool allowed = false;
  std::string destination;  // the name, else the address
  int port = 0;
  std::string rule;  // NetDecision::rule
  // kClosed: the bytes an allowed connection moved.
  int64_t bytes_out = 0;
  int64_t bytes_in = 0;
};

// What the broker tells its providers once, before serving.
struct ProviderHooks {
  // Its own listeners, which no sandbox may reach.
  std::vector<int> broker_ports;
  // Called from the provider's threads; must not block.
  std::function<void(const NetworkEvent&)> on_network_event;
  // A host-wide resource's capacity (0 = no limit) and what sandboxes
  // reserve of it, after each change (local provider: capacity.h). Must
  // not block or call back into the provider.
  std::function<void(const std::string& resource, int64_t capacity, int64_t in_use)> on_capacity;
};

// Tags (E2B metadata, Daytona labels) that name a sandbox's owner.
inline constexpr char kDeploymentTag[] = "sandbox-broker.deployment-id";
inline constexpr char kAttemptTag[] = "sandbox-broker.attempt-id";
// The tag of warm-pool members: the pool instance (a broker process) that
// made it. On E2B it stays after a claim (E2B metadata is fixed at create).
inline constexpr char kPoolTag[] = "sandbox-broker.pool";

// A sandbox this deployment created, as the provider lists it.
struct OwnedSandbox {
  std::string sandbox_id;
  std::string attempt_id;
  std::string tenant;
  std::string session_id;
  absl::Time created_at = absl::InfinitePast();  // InfinitePast = unknown
};

struct ExecRequest {
  Language language = Language::kPython;
  // The program text (python/node source, or a bash script). Any bytes.
  std::string code;
  absl::Duration timeout = absl::Seconds(30);
  // Merged over the sandbox's env.
  std::map<std::string, std::string> env;
  size_t max_output_bytes = 64 * 1024;
  // Optional: called with each chunk as it is produced, in order, before the
  // call returns. The chunks together are the (capped) output.
  std::function<void(OutputStream, absl::string_view)> on_output;
  // Optional: polled while the process runs; true kills it (the whole tree).
  std::function<bool()> cancelled;
  // Optional flow control for on_output (a slow stream reader): asked after
  // each chunk; false = the consumer's buffer is full, and a provider that
  // supports it stops reading the program's output (the program blocks on
  // its full pipe) until `resume` is called, from any thread. Without
  // support, the consumer still gets at most max_output_bytes.
  std::function<bool(std::function<void()> resume)> output_ready;
  // Optional: run exactly this command (argv[0] looked up on PATH) instead of
  // `code` in `language`. For providers that expose a process API.
  std::vector<std::string> argv;
  // Optional: working directory inside the sandbox (default: its home).
  // INVALID_ARGUMENT if it does not exist.
  std::string cwd;
};

struct ExecResult {
  // stdout+stderr in arrival order, raw bytes, at most max_output_bytes.
  std::string output;
  // The process's exit code; 128+N when killed by signal N; 124 on timeout.
  int exit_code = 0;
  bool timed_out = false;
  bool truncated = false;
  // Killed because `cancelled` returned true.
  bool cancelled = false;
  // A process of the run was killed by the sandbox's memory limit.
  bool oom_killed = false;
  // The run used up a workspace quota ("disk" or "inodes") that had room
  // when it started: its writes past it failed with ENOSPC. "" otherwise.
  std::string quota_exhausted;
};

// The file API (docs/api.md#files): one call, as a provider gets it.
enum class FileType { kFile, kDir, kSymlink, kOther };

struct FileEntry {
  std::string path;  // as the sandbox sees it (absolute)
  std::string name;
  FileType type = FileType::kFile;
  int64_t size = 0;
  uint32_t mode = 0;  // permission bits (07777)
  absl::Time mtime = absl::UnixEpoch();
  std::string symlink_target;  // kSymlink only; never followed
};

struct FileOp {
  enum class Kind { kList, kStat, kMakeDir, kRemove, kMove };
  Kind kind = Kind::kStat;
  // Relative paths resolve in the workspace; kList and kStat take "" for
  // the workspace itself.
  std::string path;
  std::string destination;  // kMove
  int depth = 1;            // kList: 1 = the directory's own entries
  bool parents = false;     // kMakeDir: create missing parents, exists is fine
  bool recursive = false;   // kRemove: a directory and everything in it
  bool overwrite = false;   // kMove: replace what is at destination
  // kList paging: only entries after `after` in listing order (ListingLess;
  // "" = from the start), at most `limit` of them (0 = all). A provider may
  // ignore both: the core pages what it returns.
  std::string after;
  size_t limit = 0;
};

// The listing order: depth first, names sorted bytewise within each
// directory ("a", "a/x", "a-b"): paths compared component by component.
inline bool ListingLess(const std::string& a, const std::string& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (a[i] == b[i]) continue;
    if (a[i] == '/') return true;
    if (b[i] == '/') return false;
    return static_cast<unsigned char>(a[i]) < static_cast<unsigned char>(b[i]);
  }
  return a.size() < b.size();
}

struct FileOpResult {
  // kList, kStat: the path exists; kRemove: it existed. A missing path is
  // an answer, not an error (as ReadFile).
  bool found = true;
  // kList: the entries down to `depth`, in listing order (ListingLess);
  // kStat: the one.
  std::vector<FileEntry> entries;
  // kList with a limit: more entries follow the last one.
  bool more = false;
};

// A listing stops here (RESOURCE_EXHAUSTED naming it).
inline constexpr size_t kMaxListedEntries = 100000;
inline constexpr int kMaxListDepth = 10;

// A streamed upload (UploadFile): Append the bytes in order, then Commit.
// The file appears whole under its name at Commit, or not at all: an upload
// destroyed uncommitted (cancelled, failed) leaves nothing behind. Blocking;
// one caller at a time.
class FileUpload {
 public:
  virtual ~FileUpload() = default;
  // RESOURCE_EXHAUSTED past the workspace's quota or the upload's limit.
  virtual absl::Status Append(absl::string_view chunk) = 0;
  virtual absl::Status Commit() = 0;
};

// A streamed download: what the file is, then its bytes in order.
// Blocking; one caller at a time.
class FileDownload {
 public:
  virtual ~FileDownload() = default;
  virtual const FileEntry& entry() const = 0;
  // The next bytes, at most `max`, into *out; empty at the end.
  virtual absl::Status Read(size_t max, std::string* out) = 0;
};

// Code contexts (docs/api.md#code-contexts): live interpreters in a sandbox.
struct CodeContext {
  std::string id;
  Language language = Language::kPython;
  std::string cwd;
  absl::Time created_at = absl::UnixEpoch();
};

// One displayed value: its forms by MIME type (image/png and image/jpeg as
// bytes, the rest UTF-8 text).
struct CodeResult {
  std::map<std::string, std::string> data;
  bool is_main_result = false;
};

struct CodeError {
  std::string name, value;
  std::vector<std::string> traceback;
};

struct Execution {
  std::vector<CodeResult> results;
  std::string stdout_text, stderr_text;
  std::optional<CodeError> error;
  int execution_count = 0;
  bool timed_out = false;
  int64_t duration_ms = 0;
  bool context_died = false;
  bool oom_killed = false;
  bool context_restarted = false;
  CodeContext context;
};

struct CodeOp {
  enum class Kind { kCreate, kList, kRestart, kDelete, kRun };
  Kind kind = Kind::kRun;
  // kRestart, kDelete, kRun ("" = the default context for `language`).
  std::string context_id;
  Language language = Language::kPython;
  std::string cwd;                         // kCreate
  std::map<std::string, std::string> env;  // kCreate: the context's; kRun: set before the code
  std::string code;                        // kRun
  absl::Duration timeout = absl::Seconds(60);
  size_t max_output_bytes = 0;  // kRun: stdout + stderr kept (0 = no limit)
  int max_contexts = 8;         // kCreate and a default context's creation
};

struct CodeOpResult {
  std::vector<CodeContext> contexts;  // kCreate, kRestart: one; kList: all
  bool existed = false;               // kDelete
  Execution execution;                // kRun
};

// One provider sandbox. Owned by exactly one session.
//
// Thread-safe: Exec, WriteFile and ReadFile may run concurrently. After
// Destroy, every method fails with FAILED_PRECONDITION.
class Sandbox {
 public:
  virtual ~Sandbox() = default;

  // Unique per sandbox; never reused.
  virtual const std::string& id() const = 0;

  // Runs a program. A nonzero exit, a timeout or a cancellation is a result.
  // Errors: INVALID_ARGUMENT (bad env), UNAVAILABLE (provider unreachable),
  // FAILED_PRECONDITION (destroyed), INTERNAL. Not idempotent.
  virtual absl::StatusOr<ExecResult> Exec(const ExecRequest& request) = 0;

  // Exec without holding the caller's thread: `done` is called exactly once
  // with what Exec would return, possibly before ExecAsync returns and
  // possibly on another thread. `on_output` and `cancelled` are called on
  // the thread that does the work and must not block. The caller keeps the
  // sandbox alive until `done` runs. Providers that can wait without a
  // thread (an event loop over pipes, libcurl's multi interface, a timer)
  // override it; the default runs Exec on WorkPool::Shared(), a bounded
  // pool of threads.
  using ExecDone = std::function<void(absl::StatusOr<ExecResult>)>;
  virtual void ExecAsync(ExecRequest request, ExecDone done);

  // Writes `data` at `path` (relative paths resolve in the sandbox's working
  // directory), creating parents. Errors: INVALID_ARGUMENT (bad path, a
  // directory), PERMISSION_DENIED (escapes the workspace), RESOURCE_EXHAUSTED,
  // UNAVAILABLE. Idempotent.
  virtual absl::Status WriteFile(absl::string_view path, absl::string_view data) = 0;

  // Reads the file at `path`; nullopt when it does not exist. Errors as
  // WriteFile. Idempotent.
  virtual absl::StatusOr<std::optional<std::string>> ReadFile(absl::string_view path) = 0;

  // Tells the provider the sandbox is still in use (for providers with their
  // own idle timers). Idempotent.
  virtual absl::Status KeepAlive() { return absl::OkStatus(); }

  // WriteFile, ReadFile and KeepAlive without holding the caller's thread,
  // under ExecAsync's contract: `done` is called exactly once, maybe before
  // the call returns, maybe on another thread (a provider's HTTP thread: it
  // must not block), and the caller keeps the sandbox alive until then.
  // Remote providers send them on their HTTP client's multi handle; the
  // defaults run the blocking method on WorkPool::Shared().
  using StatusDone = std::function<void(absl::Status)>;
  using ReadDone = std::function<void(absl::StatusOr<std::optional<std::string>>)>;
  virtual void WriteFileAsync(std::string path, std::string data, StatusDone done);
  virtual void ReadFileAsync(std::string path, ReadDone done);
  virtual void KeepAliveAsync(StatusDone done);

  // The file API: list, stat, mkdir, remove, move (FileOp). Errors as
  // WriteFile, plus NOT_FOUND (a move's source, a mkdir's missing parent),
  // ALREADY_EXISTS (mkdir, a move without overwrite), FAILED_PRECONDITION
  // (a non-empty directory without recursive). Default: UNIMPLEMENTED.
  virtual absl::StatusOr<FileOpResult> Files(const FileOp& op) {
    return absl::UnimplementedError("this provider has no file API beyond WriteFile and ReadFile");
  }
  // Files under ExecAsync's contract (default: Files on WorkPool::Shared()).
  using FilesDone = std::function<void(absl::StatusOr<FileOpResult>)>;
  virtual void FilesAsync(FileOp op, FilesDone done);
  // Streamed transfers (blocking). An upload of `path` with permission bits
  // `mode`, refused past `max_bytes`; a download of `length` bytes (0 = to
  // the end) from `offset`, or null when the file does not exist.
  // Default: UNIMPLEMENTED.
  virtual absl::StatusOr<std::unique_ptr<FileUpload>> BeginUpload(const std::string& path,
                                                                  uint32_t mode,
                                                                  uint64_t max_bytes) {
    return absl::UnimplementedError("this provider has no streamed uploads");
  }
  virtual absl::StatusOr<std::unique_ptr<FileDownload>> BeginDownload(const std::string& path,
                                                                      int64_t offset,
                                                                      int64_t length) {
    return absl::UnimplementedError("this provider has no streamed downloads");
  }

  // Code contexts (CodeOp). Errors: NOT_FOUND (an unknown context),
  // RESOURCE_EXHAUSTED (max_contexts), FAILED_PRECONDITION (what the
  // provider cannot run, e.g. no IPython on the host), UNAVAILABLE.
  // Default: UNIMPLEMENTED.
  virtual absl::StatusOr<CodeOpResult> Code(const CodeOp& op) {
    return absl::UnimplementedError("this provider has no code contexts");
  }
  // Code under ExecAsync's contract (default: Code on WorkPool::Shared()).
  using CodeDone = std::function<void(absl::StatusOr<CodeOpResult>)>;
  virtual void CodeAsync(CodeOp op, CodeDone done);

  // The limits applied to this sandbox, and what it uses now; nullopt when
  // the provider does not know.
  virtual std::optional<SandboxResources> Resources() const { return std::nullopt; }
  virtual std::optional<SandboxUsage> Usage() const { return std::nullopt; }

  // Replaces the rules in force (UpdateSessionNetwork): new connections
  // follow them within a second; open ones keep going. Default:
  // FAILED_PRECONDITION (the provider cannot change a running sandbox's).
  virtual absl::Status UpdateNetwork(const NetworkPolicy& policy) {
    return absl::FailedPreconditionError(
        "this provider cannot change a running sandbox's network rules; start a new session");
  }

  // Destroys the sandbox: kills what runs in it and frees its resources.
  // Idempotent; a sandbox that is already gone is success.
  virtual absl::Status Destroy() = 0;
  // Destroy under ExecAsync's contract (remote providers: on the multi
  // handle; the default runs Destroy on WorkPool::Shared()).
  virtual void DestroyAsync(StatusDone done);

  // Lets go of the sandbox without destroying it (graceful restart with a
  // durable store): afterwards the destructor leaves it alive at the
  // provider, for Provider::Attach in the next process. Processes running
  // in it may be killed. Default: nothing to let go of.
  virtual void Detach() {}
};

// A sandbox backend. Thread-safe.
class Provider {
 public:
  virtual ~Provider() = default;
  virtual absl::string_view name() const = 0;
  // Creates a sandbox. Errors: FAILED_PRECONDITION (misconfigured, e.g. a
  // missing API key), RESOURCE_EXHAUSTED (provider capacity), UNAVAILABLE
  // (unreachable; retryable), INVALID_ARGUMENT (bad template/spec). A failed
  // create leaves nothing behind. Not idempotent.
  virtual absl::StatusOr<std::unique_ptr<Sandbox>> Create(const SandboxSpec& spec) = 0;

  // Create without holding the caller's thread while the provider works:
  // `done` is called exactly once with what Create would return, possibly
  // before CreateAsync returns and possibly on another thread (a provider's
  // HTTP thread: it must not block). Providers with an asynchronous API
  // (libcurl's multi interface) override it; the default runs Create on
  // WorkPool::Shared(). AttachAsync is the same for Attach.
  using SandboxDone = std::function<void(absl::StatusOr<std::unique_ptr<Sandbox>>)>;
  virtual void CreateAsync(SandboxSpec spec, SandboxDone done);
  virtual void AttachAsync(std::string sandbox_id, SandboxSpec spec, SandboxDone done);
  // Non-empty when the provider runs in a weaker mode the operator chose
  // (e.g. local limits not enforced): why, for health and metrics.
  virtual std::string Degraded() const { return ""; }
  // Called once, before the broker serves (ProviderHooks).
  virtual void SetHooks(ProviderHooks hooks) {}
  // Whether the provider can run code now, for the periodic health probe:
  // the local provider runs a probe sandbox, remote ones call their API.
  // The error says why not. Must not create anything that outlives it.
  virtual absl::Status CheckHealth() { return absl::OkStatus(); }

  // Durable sessions. Both have defaults for providers that lack them:
  // UNIMPLEMENTED, so sessions on such a provider are not adopted after a
  // restart (they are dropped and recreated) and are never swept.

  // A sandbox object on an existing sandbox, by id (the next process after a
  // restart). `spec` is what it was created from (env, language). Brings a
  // paused/stopped sandbox back and extends provider-side timers. Errors:
  // SandboxGoneError (UNAVAILABLE + payload) when it no longer exists;
  // INVALID_ARGUMENT for an id this provider never makes; UNAVAILABLE
  // (unreachable; retryable). Idempotent.
  virtual absl::StatusOr<std::unique_ptr<Sandbox>> Attach(const std::string& sandbox_id,
                                                          const SandboxSpec& spec) {
    return absl::UnimplementedError(absl::StrCat(name(), ": cannot attach to sandboxes"));
  }

  // Every live sandbox tagged with `deployment_id` (never untagged ones or
  // another deployment's). Errors: UNAVAILABLE (unreachable). Idempotent.
  virtual absl::StatusOr<std::vector<OwnedSandbox>> ListOwned(const std::string& deployment_id) {
    return absl::UnimplementedError(absl::StrCat(name(), ": cannot list sandboxes"));
  }

  // Warm pools (server/sessions/warm_pool.h). Defaults: no pools.

  // Whether a pool member made by Create(`member`) can serve `session` once
  // claimed: everything `session` asks for that is fixed at creation (the
  // template, resources, a Daytona sandbox's language) is what `member` got.
  virtual bool CanClaim(const SandboxSpec& member, const SandboxSpec& session) const {
    return false;
  }
  // Makes a pool member `session`'s sandbox: its provider-side timers become
  // a session's, its tags the session's where the provider can change them,
  // and the object returned applies `session` (env, language). On success
  // `member` is let go of (Detach); on failure it is left as it was. Errors:
  // SandboxGoneError when it no longer exists; UNAVAILABLE. Not idempotent.
  virtual absl::StatusOr<std::unique_ptr<Sandbox>> Claim(Sandbox* member,
                                                         const SandboxSpec& session) {
    return absl::UnimplementedError(absl::StrCat(name(), ": has no warm pools"));
  }
};

}  // namespace sandbox
