#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "common/event_loop.h"
#include "common/limiter.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "sandboxbroker/v1/broker.grpc.pb.h"
#include "server/cluster/cluster.h"
#include "server/config/auth.h"
#include "server/core/broker_core.h"
#include "server/telemetry/metrics.h"

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
  // More than one broker: calls for sessions another replica owns are
  // forwarded to it over gRPC with `peer_credentials` (server/cluster/cluster.h).
  // Set before serving; not owned.
  void SetCluster(Cluster* cluster, std::shared_ptr<grpc::ChannelCredentials> peer_credentials);

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
  // The call's raw request and response, for forwarding (cluster mode).
  struct Raw {
    const grpc::ByteBuffer* in = nullptr;
    grpc::ByteBuffer* out = nullptr;
    std::string provider;     // the spec's
    bool may_create = false;  // the request has a spec
  };
  template <typename Resp, typename AsyncFn>
  grpc::ServerUnaryReactor* UnaryAsync(grpc::CallbackServerContext* ctx, absl::string_view method,
                                       const std::string& session_id, Store<Resp> store, AsyncFn fn,
                                       Raw raw);
  grpc::ServerWriteReactor<grpc::ByteBuffer>* RunStream(grpc::CallbackServerContext* ctx,
                                                        const grpc::ByteBuffer* request);
  // Streamed transfers (transfers.cc).
  grpc::ServerReadReactor<grpc::ByteBuffer>* UploadFile(grpc::CallbackServerContext* ctx,
                                                        grpc::ByteBuffer* response);
  grpc::ServerWriteReactor<grpc::ByteBuffer>* DownloadFile(grpc::CallbackServerContext* ctx,
                                                           const grpc::ByteBuffer* request);
  // Admission (drain, max_calls_in_flight, authentication); then `go` with
  // the call's context, or `fail` with why not. Either is called once.
  void Begin(const std::shared_ptr<Call>& call, std::function<void(const CallContext&)> go,
             std::function<void(absl::Status)> fail);
  // The log line and metrics; returns the status to send.
  grpc::Status End(Call& call, const absl::Status& status);

  // Where a session's call runs (cluster mode): `local` here, or `forward`
  // to the owner; `fail` when neither can be known (etcd unreachable).
  void Route(const std::shared_ptr<Call>& call, const CallContext& cc,
             const std::string& requested_provider, bool may_create, std::function<void()> local,
             std::function<void(const ClusterRoute&)> forward,
             std::function<void(absl::Status)> fail);
  // The unary call's request bytes to the owner; its answer into `out`.
  void ForwardUnary(const std::shared_ptr<Call>& call, const std::string& tenant,
                    const ClusterRoute& route, const grpc::ByteBuffer* in, grpc::ByteBuffer* out,
                    std::function<void(absl::Status)> finish);
  std::shared_ptr<grpc::GenericStub> PeerStub(const std::string& address);

  BrokerCore* const core_;
  const Authenticator* const auth_;
  Clock* const clock_;
  Metrics* const metrics_;
  Limiter calls_;
  mutable absl::Mutex mu_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  Cluster* cluster_ = nullptr;
  std::shared_ptr<grpc::ChannelCredentials> peer_credentials_;
  absl::Mutex peers_mu_;
  std::map<std::string, std::shared_ptr<grpc::GenericStub>> peers_ ABSL_GUARDED_BY(peers_mu_);
};

// One call's bookkeeping (grpc_service.cc, transfers.cc).
struct BrokerService::Call {
  grpc::CallbackServerContext* ctx = nullptr;
  std::string method;
  std::string session_id;
  std::string request_id;
  absl::Time start;
  std::string tenant = "-";
  std::string provider;    // CallContext::provider points here
  bool counted = false;    // in in_flight_
  LimitSlot slot;          // max_calls_in_flight
  bool forwarded = false;  // from another replica (never forwarded again)
};

// Metadata of a call one replica forwards to another: the cluster token
// (the only proof; a client cannot present it), and the caller's tenant.
inline constexpr char kClusterTokenHeader[] = "x-sandbox-broker-cluster-token";
inline constexpr char kClusterTenantHeader[] = "x-sandbox-broker-tenant";
inline constexpr char kClusterFromHeader[] = "x-sandbox-broker-forwarded-by";

// Longest status message sent (longer ones are cut; see ToGrpcStatus).
inline constexpr size_t kMaxStatusMessageBytes = 1024;
grpc::Status ToGrpcStatus(const absl::Status& s);

// The call's request id: the caller's x-request-id when sane (`from_client`
// then true: echo it back), else a fresh one.
std::string RequestId(const grpc::ServerContextBase* ctx, bool* from_client);

}  // namespace sandbox
