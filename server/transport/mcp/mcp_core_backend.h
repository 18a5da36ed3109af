#pragma once

#include <map>
#include <memory>

#include "absl/synchronization/mutex.h"
#include "grpcpp/security/credentials.h"
#include "protocol/mcp_backend.h"
#include "sandboxbroker/v1/broker.grpc.pb.h"
#include "server/config/auth.h"
#include "server/core/broker_core.h"
#include "server/telemetry/metrics.h"

namespace sandbox {

// The daemon's MCP backend: the same BrokerCore and Authenticator as gRPC,
// so tenants, quotas, limits, reaping and errors are the same.
//
// Thread-safe.
class McpCoreBackend final : public McpBackend {
 public:
  // `metrics` may be null. Tool calls are logged ("mcp.call") and counted
  // (method "mcp.tools/call") as the gRPC service does for RPCs.
  McpCoreBackend(BrokerCore* core, const Authenticator* auth, Clock* clock = Clock::Real(),
                 Metrics* metrics = nullptr)
      : core_(core),
        auth_(auth),
        clock_(clock),
        metrics_(metrics != nullptr ? metrics : Metrics::Discard()) {}

  absl::StatusOr<std::string> Authenticate(const std::string* authorization) override;
  absl::StatusOr<std::vector<pb::Tool>> ListTools(const std::string& tenant) override;
  absl::StatusOr<McpToolOutcome> CallTool(const McpCall& call,
                                          const pb::CallToolRequest& req) override;
  // Runs, shells and file transfers hold no thread while they wait (the
  // core's CallToolAsync); a call for a session another replica may own
  // resolves and forwards on the core's blocking pool.
  void CallToolAsync(McpCall call, pb::CallToolRequest req, ToolDone done) override;
  void CloseSession(const std::string& tenant, const std::string& session_id) override;

  // More than one broker: a tool call for a session another replica owns
  // is sent to it as a CallTool RPC (its answer, without output streamed as
  // it comes). Set before serving; not owned.
  void SetCluster(Cluster* cluster, std::shared_ptr<grpc::ChannelCredentials> peer) {
    cluster_ = cluster;
    peer_ = std::move(peer);
  }

 private:
  // Cluster mode: null when the call runs here, else a stub to the owner;
  // an error when the owner cannot be known (etcd unreachable).
  absl::StatusOr<pb::SandboxBroker::Stub*> OwnerStub(const std::string& tenant,
                                                     const std::string& session_id,
                                                     const std::string& provider, bool may_create);
  std::unique_ptr<grpc::ClientContext> PeerContext(const std::string& tenant) const;
  // Logs ("mcp.call") and counts a finished tool call.
  void Finished(const McpCall& call, const pb::CallToolRequest& req, const std::string& provider,
                absl::Time start, const absl::Status& status, bool is_error);
  Cluster* cluster_ = nullptr;
  std::shared_ptr<grpc::ChannelCredentials> peer_;
  absl::Mutex stubs_mu_;
  std::map<std::string, std::unique_ptr<pb::SandboxBroker::Stub>> stubs_ ABSL_GUARDED_BY(stubs_mu_);
  BrokerCore* const core_;
  const Authenticator* const auth_;
  Clock* const clock_;
  Metrics* const metrics_;
};

}  // namespace sandbox
