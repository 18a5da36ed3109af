#pragma once

// What the MCP protocol layer (protocol/mcp_server.h) needs from a broker:
// auth, the tools and tool calls. Two implementations: the daemon's, over
// BrokerCore (server/transport/mcp/mcp_core_backend.h), and sandboxctl's, over gRPC to a
// remote broker (client/mcp_grpc_backend.h).

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sandboxbroker/v1/broker.pb.h"

namespace sandbox {

namespace pb = ::sandboxbroker::v1;

struct McpCall {
  std::string tenant;
  // True once the caller has gone away or cancelled; the run is killed.
  std::function<bool()> cancelled;
  // run/shell: output as it is produced (null: not wanted), and its flow
  // control (ExecRequest::output_ready; null: none): false = the client's
  // buffer is full, call `resume` (from any thread) once it drains.
  std::function<void(absl::string_view)> on_output;
  std::function<bool(std::function<void()> resume)> output_ready;
};

struct McpToolOutcome {
  pb::CallToolResponse response;
  // Set when a run/shell ran to a result.
  std::optional<pb::RunResult> run;
  // Set by read_file.
  std::optional<bool> found;
};

// Thread-safe.
class McpBackend {
 public:
  virtual ~McpBackend() = default;
  // The tenant of an `Authorization` header value (nullptr: absent), or
  // UNAUTHENTICATED.
  virtual absl::StatusOr<std::string> Authenticate(const std::string* authorization) = 0;
  virtual absl::StatusOr<std::vector<pb::Tool>> ListTools(const std::string& tenant) = 0;
  // CallTool's contract: failures the model should see are
  // response.is_error; a non-OK status is the platform's.
  virtual absl::StatusOr<McpToolOutcome> CallTool(const McpCall& call,
                                                  const pb::CallToolRequest& req) = 0;
  // CallTool without holding the caller's thread while the tool runs:
  // `done` is called exactly once, maybe before this returns, maybe on
  // another thread; `call.on_output` likewise (it must not block).
  // sandboxctl's stdio backend runs CallTool on a pool it owns; the
  // daemon's holds no thread while a run or transfer waits.
  using ToolDone = std::function<void(absl::StatusOr<McpToolOutcome>)>;
  virtual void CallToolAsync(McpCall call, pb::CallToolRequest req, ToolDone done) = 0;
  virtual void CloseSession(const std::string& tenant, const std::string& session_id) = 0;
};

}  // namespace sandbox
