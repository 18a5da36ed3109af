#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base64.h"  // DecodeBase64Strict
#include "common/event_loop.h"
#include "common/limiter.h"
#include "protocol/tools.h"
#include "sandboxbroker/v1/broker.pb.h"
#include "server/cluster/cluster.h"
#include "server/config/config.h"
#include "server/config/policy.h"
#include "server/operators/usage.h"
#include "server/sessions/run_ledger.h"
#include "server/sessions/session_manager.h"
#include "server/telemetry/audit.h"

namespace sandbox {

namespace pb = ::sandboxbroker::v1;

// What the transport knows about one call.
struct CallContext {
  std::string tenant;
  // True once the client has gone away or its deadline passed.
  std::function<bool()> cancelled;
  // If set, receives the provider of the session the call used.
  std::string* provider = nullptr;
  // For the audit log (empty: none).
  std::string request_id;
  // The session the call names, for the audit log (empty: none; at most
  // 128 bytes, an unvalidated id longer than that is "(invalid)").
  std::string session_id;
  // The operator snapshot the transport authenticated with; null = the
  // current one. Read once per call, so a reload never splits a call.
  std::shared_ptr<const OperatorSnapshot> snapshot;
};

// A session id as logs and the audit log show it: an unvalidated id longer
// than 128 bytes is "(invalid)".
inline std::string AuditableSessionId(const std::string& id) {
  return id.size() <= 128 ? id : std::string("(invalid)");
}

// What CallTool can also report, for transports that show more than the
// tool's text (MCP: structured results, output as it is produced).
struct CallToolExtras {
  // run/shell: each output chunk as it is produced (on the calling thread).
  std::function<void(OutputStream, absl::string_view)> on_output;
  // Set when a run/shell ran to a result.
  pb::RunResult* run = nullptr;
  // Set by read_file: whether the file existed.
  bool* found = nullptr;
};

// The broker's API without a transport: validates requests, maps them to
// sessions and provider calls, and builds responses. The gRPC service is a
// thin shell over this, so tests can drive it directly.
//
// Thread-safe.
class BrokerCore {
 public:
  // `metrics` may be null.
  BrokerCore(const BrokerConfig& config, const ProviderRegistry* providers,
             SessionManager* sessions, Clock* clock, Metrics* metrics = nullptr);

  absl::StatusOr<pb::SessionInfo> StartSession(const CallContext& ctx,
                                               const pb::StartSessionRequest& req);
  absl::StatusOr<pb::CloseSessionResponse> CloseSession(const CallContext& ctx,
                                                        const pb::CloseSessionRequest& req);
  absl::StatusOr<pb::SessionInfo> GetSession(const CallContext& ctx,
                                             const pb::GetSessionRequest& req);
  absl::StatusOr<pb::ListSessionsResponse> ListSessions(const CallContext& ctx,
                                                        const pb::ListSessionsRequest& req);
  absl::StatusOr<pb::RunResult> Run(const CallContext& ctx, const pb::RunRequest& req);
  absl::StatusOr<pb::RunResult> Shell(const CallContext& ctx, const pb::ShellRequest& req);
  absl::StatusOr<pb::WriteFileResponse> WriteFile(const CallContext& ctx,
                                                  const pb::WriteFileRequest& req);
  absl::StatusOr<pb::ReadFileResponse> ReadFile(const CallContext& ctx,
                                                const pb::ReadFileRequest& req);
  // Run, with each output chunk passed to `on_chunk` as it is produced (on
  // the calling thread). The returned result's output is empty.
  absl::StatusOr<pb::RunResult> RunStream(
      const CallContext& ctx, const pb::RunRequest& req,
      const std::function<void(OutputStream, absl::string_view)>& on_chunk);

  // Asynchronous Run, Shell and RunStream: `done` is called exactly once,
  // maybe before these return, maybe on another thread (the provider's event
  // loop, the blocking pool). While the program runs no thread is held
  // (providers with ExecAsync); a call that must create or attach the
  // session's sandbox, or that carries a run_id, runs on the blocking pool.
  // `ctx` is copied; `req` must stay valid until `done`.
  using RunDone = std::function<void(absl::StatusOr<pb::RunResult>)>;
  void RunAsync(const CallContext& ctx, const pb::RunRequest& req, RunDone done);
  void ShellAsync(const CallContext& ctx, const pb::ShellRequest& req, RunDone done);
  // `on_chunk` is called on the provider's thread and must not block;
  // `output_ready` is ExecRequest::output_ready (flow control; may be null).
  void RunStreamAsync(const CallContext& ctx, const pb::RunRequest& req,
                      std::function<void(OutputStream, absl::string_view)> on_chunk,
                      std::function<bool(std::function<void()>)> output_ready, RunDone done);
  // For StartSession (whose answer is built on a thread that may block):
  // when `session_id` has no sandbox yet, creates it first the way Run does
  // (holding no thread while the provider works), then calls `then` with
  // OK (call the blocking method now: the session is ready, or the request
  // is invalid and the method says why) or the create's error (the answer;
  // do not call the method). `valid` is the method's own checks before it
  // would create, so an invalid request never creates anything.
  void EnsureSessionAsync(const CallContext& ctx, const std::string& session_id,
                          const pb::SessionSpec& spec, const std::function<bool()>& valid,
                          std::function<void(absl::Status)> then);
  // The pool for work that blocks (set before serving; default
  // WorkPool::Shared()).
  void SetBlockingPool(WorkPool* pool) { blocking_ = pool; }
  WorkPool* blocking_pool() const { return blocking_; }
  int64_t max_message_bytes() const { return config_.max_message_bytes; }
  // Publishes the per-tenant run limits' state to the metrics.
  void PublishLimits();

  // WriteFile, ReadFile and KeepAlive holding no thread while they wait: a
  // new session's create, another call's create, and the provider's
  // transfer (Sandbox::WriteFileAsync...) are callbacks. `done` as RunAsync:
  // exactly once, maybe on another thread; `ctx` and `req` are copied.
  template <typename T>
  using Done = std::function<void(absl::StatusOr<T>)>;
  void WriteFileAsync(const CallContext& ctx, const pb::WriteFileRequest& req,
                      Done<pb::WriteFileResponse> done);
  void ReadFileAsync(const CallContext& ctx, const pb::ReadFileRequest& req,
                     Done<pb::ReadFileResponse> done);
  void KeepAliveAsync(const CallContext& ctx, const pb::KeepAliveRequest& req,
                      Done<pb::KeepAliveResponse> done);
  // network.cc (docs/network.md).
  // After a policy reload: the running sessions of each tenant whose
  // network rule changed and says apply_to_running get the new rule.
  // Returns how many did.
  int ApplyNetworkReload(const OperatorSnapshot& before, const OperatorSnapshot& after);
  void UpdateSessionNetworkAsync(const CallContext& ctx, const pb::UpdateSessionNetworkRequest& req,
                                 Done<pb::SessionInfo> done);
  void CloseSessionAsync(const CallContext& ctx, const pb::CloseSessionRequest& req,
                         Done<pb::CloseSessionResponse> done);
  // Streamed transfers (docs/api.md#streamed-transfers; transfers.h): the
  // session's lease and the provider's transfer, or why not. `done` as
  // RunAsync.
  class Upload;
  class Download;
  void BeginUploadAsync(const CallContext& ctx, const pb::UploadFileHeader& header,
                        Done<std::unique_ptr<Upload>> done);
  void BeginDownloadAsync(const CallContext& ctx, const pb::DownloadFileRequest& req,
                          Done<std::unique_ptr<Download>> done);
  // The file API (docs/api.md#files; server/core/files.cc).
  void ListFilesAsync(const CallContext& ctx, const pb::ListFilesRequest& req,
                      Done<pb::ListFilesResponse> done);
  void StatFileAsync(const CallContext& ctx, const pb::StatFileRequest& req,
                     Done<pb::StatFileResponse> done);
  void MakeDirAsync(const CallContext& ctx, const pb::MakeDirRequest& req,
                    Done<pb::MakeDirResponse> done);
  void RemoveFileAsync(const CallContext& ctx, const pb::RemoveFileRequest& req,
                       Done<pb::RemoveFileResponse> done);
  void MoveFileAsync(const CallContext& ctx, const pb::MoveFileRequest& req,
                     Done<pb::MoveFileResponse> done);
  // Code contexts (docs/api.md#code-contexts; server/core/contexts.cc).
  void CreateContextAsync(const CallContext& ctx, const pb::CreateContextRequest& req,
                          Done<pb::Context> done);
  void ListContextsAsync(const CallContext& ctx, const pb::ListContextsRequest& req,
                         Done<pb::ListContextsResponse> done);
  void RestartContextAsync(const CallContext& ctx, const pb::RestartContextRequest& req,
                           Done<pb::Context> done);
  void DeleteContextAsync(const CallContext& ctx, const pb::DeleteContextRequest& req,
                          Done<pb::DeleteContextResponse> done);
  void RunCodeAsync(const CallContext& ctx, const pb::RunCodeRequest& req,
                    Done<pb::Execution> done);
  absl::StatusOr<pb::ListToolsResponse> ListTools(const CallContext& ctx,
                                                  const pb::ListToolsRequest& req);
  absl::StatusOr<pb::CallToolResponse> CallTool(const CallContext& ctx,
                                                const pb::CallToolRequest& req);
  absl::StatusOr<pb::CallToolResponse> CallTool(const CallContext& ctx,
                                                const pb::CallToolRequest& req,
                                                const CallToolExtras& extras);
  // CallTool holding no thread while the tool's run or transfer waits
  // (the gRPC method; no extras). `done` as RunAsync; `req` is copied.
  void CallToolAsync(const CallContext& ctx, const pb::CallToolRequest& req,
                     Done<pb::CallToolResponse> done);
  // CallToolAsync for transports that show more than the tool's text (MCP):
  // run/shell output as it is produced (`on_output`: on the provider's
  // thread, must not block; null: not wanted) with its flow control
  // (`output_ready`: ExecRequest::output_ready, may be null), the run's
  // result and read_file's found flag beside the answer. `done` as RunAsync.
  struct ToolOutcome {
    pb::CallToolResponse response;
    // Set when a run/shell ran to a result.
    std::optional<pb::RunResult> run;
    // Set by read_file.
    std::optional<bool> found;
  };
  void CallToolAsync(const CallContext& ctx, const pb::CallToolRequest& req,
                     std::function<void(OutputStream, absl::string_view)> on_output,
                     std::function<bool(std::function<void()>)> output_ready,
                     Done<ToolOutcome> done);

  // Operators' control (server/config/policy.h, usage.h, audit.h). Set before
  // serving; each may be null (then: no tenant policy / metering / audit).
  struct OperatorHooks {
    PolicyEngine* policy = nullptr;
    UsageMeter* usage = nullptr;
    AuditLog* audit = nullptr;
  };
  void SetOperatorHooks(OperatorHooks hooks) { ops_ = hooks; }
  // A session as the API shows it (the Admin API adds the tenant).
  void Describe(const SessionView& v, pb::SessionInfo* info) const {
    ToInfo(v, info);
    info->set_tenant(v.tenant);
  }

  // Retry-safe runs (run_id / call_id); without a ledger those ids are
  // accepted and ignored. Not owned; set before serving.
  void SetRunLedger(RunLedger* runs) { runs_ = runs; }

  // More than one broker: sessions live on several replicas (set before
  // serving; null = this broker is alone). ListSessions then lists every
  // replica's sessions, and SessionInfo.owner names the owner.
  void SetCluster(Cluster* cluster) { cluster_ = cluster; }
  Cluster* cluster() const { return cluster_; }
  // The provider a new session of this call would get: `requested` (the
  // spec's), else the tenant's default, else the broker's.
  std::string ProviderFor(const CallContext& ctx, const std::string& requested) const;

 private:
  // One call's admission: the snapshot it reads and its tenant's rules.
  struct Admission {
    std::shared_ptr<const OperatorSnapshot> snapshot;
    const TenantRules* rules = nullptr;  // null without a policy engine
  };
  // Reads the snapshot once; PERMISSION_DENIED for a disabled tenant.
  absl::StatusOr<Admission> Admit(const CallContext& ctx);
  // Audits a policy refusal (and counts a quota one), then returns it.
  absl::Status Refused(const CallContext& ctx, absl::Status status, absl::string_view rule,
                       const std::string& provider = "");
  // ToCreateOptions plus the tenant's rules (provider, template, resources,
  // quotas and timeouts for a new session).
  absl::StatusOr<CreateOptions> CreateOptionsFor(const CallContext& ctx, const Admission& a,
                                                 const pb::SessionSpec& spec);
  // Acquire, auditing a max_sessions refusal.
  absl::StatusOr<Lease> AcquireFor(const CallContext& ctx, const std::string& session_id,
                                   const CreateOptions* o);
  // An acquire's max_sessions refusal, audited and named; else as given.
  absl::StatusOr<Lease> RefusedIfMaxSessions(const CallContext& ctx, const CreateOptions* o,
                                             absl::StatusOr<Lease> lease);
  void RecordUsage(const CallContext& ctx, const std::string& provider, const UsageCounters& d);

  // Run/Shell through the ledger when the request carries a run_id.
  // One tool call, parsed: the nested call's context and request.
  struct ToolCall {
    CallContext inner;
    ToolOp op = ToolOp::kRun;
    pb::RunRequest run;
    pb::WriteFileRequest write;
    pb::ReadFileRequest read;
  };
  absl::StatusOr<std::optional<pb::CallToolResponse>> PrepareTool(const CallContext& ctx,
                                                                  const pb::CallToolRequest& req,
                                                                  ToolCall* call);
  // A tool's result as the tool call's answer.
  static absl::StatusOr<pb::CallToolResponse> ToolAnswer(const pb::CallToolRequest& req,
                                                         absl::StatusOr<pb::RunResult> r,
                                                         pb::RunResult* run_out);
  static pb::CallToolResponse ToolAnswer(absl::StatusOr<pb::WriteFileResponse> r);
  static pb::CallToolResponse ToolAnswer(absl::StatusOr<pb::ReadFileResponse> r, bool* found);

  absl::StatusOr<pb::RunResult> Once(
      const CallContext& ctx, const std::string& session_id, const std::string& run_id,
      const google::protobuf::Message& req,
      const std::function<absl::StatusOr<pb::RunResult>(const RunLedger::Started& started)>& fn);
  struct ExecPlan;
  // A run's timeout (0 = the default) and output cap under the broker's and
  // the tenant's limits; INVALID_ARGUMENT or the refusing rule.
  struct RunLimits {
    int64_t timeout_seconds = 0;
    int64_t max_output_bytes = 0;
  };
  absl::StatusOr<RunLimits> RunLimitsFor(const CallContext& ctx, const Admission& adm,
                                         int32_t timeout_seconds);
  static absl::Status CheckEnv(const google::protobuf::Map<std::string, std::string>& env);
  // A run's checks and policy admission (no provider call, no wait).
  absl::StatusOr<std::unique_ptr<ExecPlan>> AdmitRun(
      const CallContext& ctx, const std::string& session_id, const pb::SessionSpec& spec,
      Language language, bool language_given, const std::string& code, int32_t timeout_seconds,
      const google::protobuf::Map<std::string, std::string>& env);
  // Acquires the session (may create: blocks), then Ready.
  absl::Status AcquireLease(ExecPlan& plan);
  // Builds the ExecRequest once the lease is held.
  absl::Status Ready(ExecPlan& plan);
  absl::StatusOr<pb::RunResult> Finish(ExecPlan& plan, absl::StatusOr<ExecResult> exec);
  void ExecAsync(std::unique_ptr<ExecPlan> plan, RunDone done);
  // The session's lease without a thread when it is ready or being created
  // by another call; else on the blocking pool. Then Start.
  void AcquireAsync(std::shared_ptr<ExecPlan> plan, RunDone done);
  // The session's lease holding no thread while a sandbox is made: at once
  // when it is ready; as a callback when another call is creating it (that
  // creation's failure is this call's answer too); else a create or attach
  // of its own, whose short blocking steps (store rows) run on the blocking
  // pool and whose provider work holds no thread. `create` null = never
  // create. A max_sessions refusal is audited and named.
  using LeaseDone = std::function<void(absl::StatusOr<Lease>)>;
  void LeaseAsync(const CallContext& ctx, const std::string& session_id,
                  std::shared_ptr<const CreateOptions> create, LeaseDone then);
  // A file call's start: admission, the session id, `check` (the method's
  // own: paths, encodings), the create options, then the lease.
  using FileLeaseDone = std::function<void(absl::StatusOr<std::shared_ptr<Lease>>)>;
  void FileLeaseAsync(const CallContext& ctx, const std::string& session_id,
                      const pb::SessionSpec& spec, const std::function<absl::Status()>& check,
                      FileLeaseDone then);
  // A provider's failure of a file call under `lease`: UNIMPLEMENTED names
  // the provider (the provider has no such call: not its failure), else
  // FailAsync.
  void FileCallFailed(const CallContext& ctx, const std::string& session_id,
                      std::shared_ptr<Lease> lease, absl::Status status,
                      std::function<void(absl::Status)> done);
  // The one path of the file API and the code contexts: FileLeaseAsync,
  // then `call` on the lease's sandbox (a provider's FilesAsync or
  // CodeAsync), then FileCallFailed or the answer with the lease released.
  template <typename R>
  using SandboxCall = std::function<void(Sandbox*, std::function<void(absl::StatusOr<R>)>)>;
  template <typename R>
  void LeasedCallAsync(const CallContext& ctx, const std::string& session_id,
                       const pb::SessionSpec& spec, const std::function<absl::Status()>& check,
                       SandboxCall<R> call, Done<R> done);
  void FilesAsync(const CallContext& ctx, const std::string& session_id,
                  const pb::SessionSpec& spec, FileOp op,
                  const std::function<absl::Status()>& check, Done<FileOpResult> done);
  void ContextsAsync(const CallContext& ctx, const std::string& session_id,
                     const pb::SessionSpec& spec, CodeOp op,
                     const std::function<absl::Status()>& check, Done<CodeOpResult> done);
  // A provider call's failure under a held lease: DropIfGone, on the
  // blocking pool when it closes the session (never on a provider thread).
  void FailAsync(const CallContext& ctx, const std::string& session_id,
                 std::shared_ptr<Lease> lease, absl::Status status,
                 std::function<void(absl::Status)> done);
  void Start(std::shared_ptr<ExecPlan> plan, RunDone done);
  Limiter* TenantRunLimiter(const std::string& tenant);

  absl::StatusOr<pb::RunResult> Exec(
      const CallContext& ctx, const std::string& session_id, const pb::SessionSpec& spec,
      Language language, bool language_given, const std::string& code, int32_t timeout_seconds,
      const google::protobuf::Map<std::string, std::string>& env,
      std::function<void(OutputStream, absl::string_view)> on_output = nullptr,
      RunLedger::Started on_lease = nullptr);
  ToolLimits Limits(const TenantRules* rules = nullptr) const;
  // Returns `status`; when it says the provider lost the sandbox, closes the
  // session first.
  absl::Status DropIfGone(const CallContext& ctx, const std::string& session_id, Lease lease,
                          absl::Status status);
  absl::StatusOr<CreateOptions> ToCreateOptions(const pb::SessionSpec& spec) const;
  void ToInfo(const SessionView& v, pb::SessionInfo* info) const;

  const BrokerConfig config_;
  const ProviderRegistry* const providers_;
  SessionManager* const sessions_;
  Clock* const clock_;
  Metrics* const metrics_;
  OperatorHooks ops_;
  RunLedger* runs_ = nullptr;
  Cluster* cluster_ = nullptr;
  WorkPool* blocking_ = WorkPool::Shared();
  // LeaseAsync: sessions whose acquire task is queued or running, and the
  // calls waiting for it to begin the create.
  absl::Mutex acquiring_mu_;
  std::map<std::pair<std::string, std::string>, std::vector<std::function<void()>>> acquiring_
      ABSL_GUARDED_BY(acquiring_mu_);
  absl::Mutex limiters_mu_;
  std::map<std::string, std::unique_ptr<Limiter>> tenant_runs_ ABSL_GUARDED_BY(limiters_mu_);
};

// 1-128 characters of [A-Za-z0-9._:-].
absl::Status ValidateSessionId(const std::string& id);

// A protobuf Timestamp from an absl::Time (wall clock).
void SetTime(absl::Time t, google::protobuf::Timestamp* ts);
// The proto form of a language.
pb::Language FromLanguage(Language l);
// Network policies (network.cc): the proto form, and back (INVALID_ARGUMENT
// naming `where`).
void NetworkToProto(const NetworkPolicy& p, pb::NetworkPolicy* out);
absl::StatusOr<NetworkPolicy> NetworkFromProto(const pb::NetworkPolicy& p, absl::string_view where);
// What a new session may reach: `asked` (SessionSpec.network, if set)
// narrowed within the ceiling, which is the tenant's `network` rule if it
// has one, else the provider's default (providers.<name>.network), else
// nothing. A wider request is PERMISSION_DENIED naming the rule.
absl::StatusOr<NetworkPolicy> SessionNetwork(const pb::SessionSpec& spec, const TenantRules* rules,
                                             const BrokerConfig& config,
                                             const std::string& provider);

}  // namespace sandbox
