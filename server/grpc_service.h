#pragma once

#include "absl/synchronization/mutex.h"
#include "sandboxbroker/v1/broker.grpc.pb.h"
#include "server/auth.h"
#include "server/broker_core.h"
#include "server/metrics.h"

namespace sandbox {

// The gRPC face of BrokerCore: authenticates, converts statuses, logs one
// line per call (method, tenant, session, code, duration; never payloads).
// Synchronous API; the server's thread cap bounds concurrency.
//
// Thread-safe.
class BrokerService final : public pb::SandboxBroker::Service {
 public:
  // `metrics` may be null.
  BrokerService(BrokerCore* core, const Authenticator* auth, Clock* clock,
                Metrics* metrics = nullptr);

  // From now on new calls fail with UNAVAILABLE; calls already running go on.
  void StartDraining();
  bool draining() const;
  // Waits until no call is running, at most `timeout`; true if none is.
  bool WaitForIdle(absl::Duration timeout);
  int calls_in_flight() const;

  grpc::Status StartSession(grpc::ServerContext* ctx, const pb::StartSessionRequest* req,
                            pb::SessionInfo* resp) override;
  grpc::Status CloseSession(grpc::ServerContext* ctx, const pb::CloseSessionRequest* req,
                            pb::CloseSessionResponse* resp) override;
  grpc::Status GetSession(grpc::ServerContext* ctx, const pb::GetSessionRequest* req,
                          pb::SessionInfo* resp) override;
  grpc::Status ListSessions(grpc::ServerContext* ctx, const pb::ListSessionsRequest* req,
                            pb::ListSessionsResponse* resp) override;
  grpc::Status Run(grpc::ServerContext* ctx, const pb::RunRequest* req,
                   pb::RunResult* resp) override;
  grpc::Status Shell(grpc::ServerContext* ctx, const pb::ShellRequest* req,
                     pb::RunResult* resp) override;
  grpc::Status WriteFile(grpc::ServerContext* ctx, const pb::WriteFileRequest* req,
                         pb::WriteFileResponse* resp) override;
  grpc::Status ReadFile(grpc::ServerContext* ctx, const pb::ReadFileRequest* req,
                        pb::ReadFileResponse* resp) override;
  grpc::Status RunStream(grpc::ServerContext* ctx, const pb::RunRequest* req,
                         grpc::ServerWriter<pb::RunEvent>* writer) override;
  grpc::Status KeepAlive(grpc::ServerContext* ctx, const pb::KeepAliveRequest* req,
                         pb::KeepAliveResponse* resp) override;
  grpc::Status ListTools(grpc::ServerContext* ctx, const pb::ListToolsRequest* req,
                         pb::ListToolsResponse* resp) override;
  grpc::Status CallTool(grpc::ServerContext* ctx, const pb::CallToolRequest* req,
                        pb::CallToolResponse* resp) override;

 private:
  template <typename Resp, typename Fn>
  grpc::Status Handle(grpc::ServerContext* ctx, absl::string_view method,
                      const std::string& session_id, Resp* resp, Fn&& fn);

  BrokerCore* const core_;
  const Authenticator* const auth_;
  Clock* const clock_;
  Metrics* const metrics_;

  mutable absl::Mutex mu_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

// Longest status message sent (longer ones are cut; see ToGrpcStatus).
inline constexpr size_t kMaxStatusMessageBytes = 1024;
grpc::Status ToGrpcStatus(const absl::Status& s);

// The call's request id: the caller's x-request-id when sane (`from_client`
// then true: echo it back), else a fresh one.
std::string RequestId(const grpc::ServerContext* ctx, bool* from_client);

}  // namespace sandbox
