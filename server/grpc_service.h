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
class BrokerService final : public pb::SandboxBroker::Service {
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

  // One call's bookkeeping from admission to its log line (internal).
  struct Call;

 private:
  // Every method is registered raw (bytes in, bytes out) and parsed here,
  // so a request that is not a valid message (invalid UTF-8 in a string
  // field, a truncated field) gets INVALID_ARGUMENT naming the message, not
  // gRPC's generic answer.
  template <typename Req, typename Resp, typename Handler>
  void RegisterUnary(int index, const char* method, Handler handler);

  // How a handler runs: inline, or on the blocking pool.
  enum class Mode { kInline, kBlocking };
  template <typename Resp>
  using Store = std::function<void(Resp&&)>;
  template <typename Resp, typename AsyncFn>
  grpc::ServerUnaryReactor* UnaryAsync(grpc::CallbackServerContext* ctx, absl::string_view method,
                                       const std::string& session_id, Store<Resp> store,
                                       AsyncFn fn);
  grpc::ServerWriteReactor<grpc::ByteBuffer>* RunStream(grpc::CallbackServerContext* ctx,
                                                        const grpc::ByteBuffer* request);
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
