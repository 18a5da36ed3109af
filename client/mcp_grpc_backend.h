#pragma once

#include <memory>
#include <string>

#include "common/event_loop.h"
#include "protocol/mcp_backend.h"
#include "sandboxbroker/v1/broker.grpc.pb.h"

namespace sandbox {

// `sandboxctl mcp`'s backend: MCP tool calls forwarded to a broker over
// gRPC (CallTool; RunStream when the client asked for progress), so the
// remote broker applies its own tenants, limits and errors.
//
// Thread-safe.
class McpGrpcBackend final : public McpBackend {
 public:
  McpGrpcBackend(std::shared_ptr<pb::SandboxBroker::StubInterface> stub, std::string token)
      : stub_(std::move(stub)), token_(std::move(token)) {}

  // The broker authenticates each call; stdio has no caller to tell apart.
  absl::StatusOr<std::string> Authenticate(const std::string*) override { return std::string(); }
  absl::StatusOr<std::vector<pb::Tool>> ListTools(const std::string& tenant) override;
  absl::StatusOr<McpToolOutcome> CallTool(const McpCall& call,
                                          const pb::CallToolRequest& req) override;
  // CallTool on this backend's own pool (gRPC's blocking client).
  void CallToolAsync(McpCall call, pb::CallToolRequest req, ToolDone done) override {
    calls_.Submit([this, call = std::move(call), req = std::move(req), done = std::move(done)] {
      done(CallTool(call, req));
    });
  }
  void CloseSession(const std::string& tenant, const std::string& session_id) override;

 private:
  void Prepare(grpc::ClientContext* ctx) const;
  absl::StatusOr<McpToolOutcome> Stream(const McpCall& call, const pb::CallToolRequest& req,
                                        const pb::RunRequest& run);

  const std::shared_ptr<pb::SandboxBroker::StubInterface> stub_;
  const std::string token_;
  // Last: joined before the stub its tasks use goes.
  WorkPool calls_{"mcp-grpc-calls", 64};
};

}  // namespace sandbox
