#pragma once

#include "server/auth.h"
#include "server/broker_core.h"
#include "server/mcp_backend.h"
#include "server/metrics.h"

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
      : core_(core), auth_(auth), clock_(clock), metrics_(metrics) {}

  absl::StatusOr<std::string> Authenticate(const std::string* authorization) override;
  absl::StatusOr<std::vector<pb::Tool>> ListTools(const std::string& tenant) override;
  absl::StatusOr<McpToolOutcome> CallTool(const McpCall& call,
                                          const pb::CallToolRequest& req) override;
  void CloseSession(const std::string& tenant, const std::string& session_id) override;

 private:
  BrokerCore* const core_;
  const Authenticator* const auth_;
  Clock* const clock_;
  Metrics* const metrics_;
};

}  // namespace sandbox
