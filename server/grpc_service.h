#pragma once

#include <atomic>
#include <memory>

#include "absl/synchronization/mutex.h"
#include "common/event_loop.h"
#include "common/limiter.h"
#include "sandboxbroker/v1/broker.grpc.pb.h"
#include "server/auth.h"
#include "server/broker_core.h"
#include "server/metrics.h"

namespace sandbox {

// The gRPC face of BrokerCore: authenticates, converts statuses, logs one
// line per call (method, tenant, session, code, duration; never payloads).
//
// The callback API: a call holds no thread while it waits. Run, Shell and
// RunStream go to BrokerCore's asynchronous runs (the program's wait is a
// watch on an event loop); calls that must block (file transfers, creates,
// closes, keep-alives, tool calls) run on the core's bounded blocking pool;
// quick reads (GetSession, ListSessions, ListTools) answer inline.
// limits.max_calls_in_flight bounds the calls admitted at once; past it a
// call waits in a bounded queue, then gets RESOURCE_EXHAUSTED naming it.
//
// Thread-safe.
class BrokerService final : public pb::SandboxBroker::CallbackService {
 public:
  // `metrics` may be null.
  BrokerService(BrokerCore* core, const Authenticator* auth, Clock* clock,
                Metrics* metrics = nullptr, const BrokerConfig::Limits& limits = {});
  // From now on new calls fail with UNAVAILABLE; calls already running go on.
  void StartDraining();
  bool draining() const;
  // Waits until no call is running, at most `timeout`; true if none is.
  bool WaitForIdle(absl::Duration timeout);
  int calls_in_flight() const;
  Limiter* call_limiter() { return &calls_; }

  grpc::ServerUnaryReactor* StartSession(grpc::CallbackServerContext* ctx,
                                         const pb::StartSessionRequest* req,
                                         pb::SessionInfo* resp) override;
  grpc::ServerUnaryReactor* CloseSession(grpc::CallbackServerContext* ctx,
                                         const pb::CloseSessionRequest* req,
                                         pb::CloseSessionResponse* resp) override;
  grpc::ServerUnaryReactor* GetSession(grpc::CallbackServerContext* ctx,
                                       const pb::GetSessionRequest* req,
                                       pb::SessionInfo* resp) override;
  grpc::ServerUnaryReactor* ListSessions(grpc::CallbackServerContext* ctx,
                                         const pb::ListSessionsRequest* req,
                                         pb::ListSessionsResponse* resp) override;
  grpc::ServerUnaryReactor* Run(grpc::CallbackServerContext* ctx, const pb::RunRequest* req,
                                pb::RunResult* resp) override;
  grpc::ServerUnaryReactor* Shell(grpc::CallbackServerContext* ctx, const pb::ShellRequest* req,
                                  pb::RunResult* resp) override;
  grpc::ServerUnaryReactor* WriteFile(grpc::CallbackServerContext* ctx,
                                      const pb::WriteFileRequest* req,
                                      pb::WriteFileResponse* resp) override;
  grpc::ServerUnaryReactor* ReadFile(grpc::CallbackServerContext* ctx,
                                     const pb::ReadFileRequest* req,
                                     pb::ReadFileResponse* resp) override;
  grpc::ServerWriteReactor<pb::RunEvent>* RunStream(grpc::CallbackServerContext* ctx,
                                                    const pb::RunRequest* req) override;
  grpc::ServerUnaryReactor* KeepAlive(grpc::CallbackServerContext* ctx,
                                      const pb::KeepAliveRequest* req,
                                      pb::KeepAliveResponse* resp) override;
  grpc::ServerUnaryReactor* ListTools(grpc::CallbackServerContext* ctx,
                                      const pb::ListToolsRequest* req,
                                      pb::ListToolsResponse* resp) override;
  grpc::ServerUnaryReactor* CallTool(grpc::CallbackServerContext* ctx,
                                     const pb::CallToolRequest* req,
                                     pb::CallToolResponse* resp) override;

  // One call's bookkeeping from admission to its log line (internal).
  struct Call;

 private:
  // How a handler runs: inline, on the blocking pool, or asynchronously.
  enum class Mode { kInline, kBlocking };
  template <typename Resp, typename Fn>
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, absl::string_view method,
                                  const std::string& session_id, Resp* resp, Mode mode, Fn fn);
  template <typename Resp, typename AsyncFn>
  grpc::ServerUnaryReactor* UnaryAsync(grpc::CallbackServerContext* ctx, absl::string_view method,
                                       const std::string& session_id, Resp* resp, AsyncFn fn);
  // Admission (drain, max_calls_in_flight, authentication); then `go` with
  // the call's context, or `fail` with why not. Either is called once.
  void Begin(const std::shared_ptr<Call>& call,
             std::function<void(const CallContext&)> go,
             std::function<void(absl::Status)> fail);
  // The log line and metrics; returns the status to send.
  grpc::Status End(Call& call, const absl::Status& status);

  BrokerCore* const core_;
  const Authenticator* const auth_;
  Clock* const clock_;
  Metrics* const metrics_;
  Limiter calls_;
  mutable absl::Mutex mu_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

// Longest status message sent (longer ones are cut; see ToGrpcStatus).
inline constexpr size_t kMaxStatusMessageBytes = 1024;
grpc::Status ToGrpcStatus(const absl::Status& s);

// The call's request id: the caller's x-request-id when sane (`from_client`
// then true: echo it back), else a fresh one.
std::string RequestId(const grpc::ServerContextBase* ctx, bool* from_client);

}  // namespace sandbox
