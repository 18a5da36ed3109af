#include "server/mcp_core_backend.h"

#include "common/log.h"

namespace sandbox {

absl::StatusOr<std::string> McpCoreBackend::Authenticate(const std::string* authorization) {
  if (authorization == nullptr) return auth_->Authenticate(nullptr);
  absl::string_view v = *authorization;
  return auth_->Authenticate(&v);
}

absl::StatusOr<std::vector<pb::Tool>> McpCoreBackend::ListTools(const std::string& tenant) {
  CallContext ctx;
  ctx.tenant = tenant;
  absl::StatusOr<pb::ListToolsResponse> r = core_->ListTools(ctx, pb::ListToolsRequest());
  if (!r.ok()) return r.status();
  return std::vector<pb::Tool>(r->tools().begin(), r->tools().end());
}

absl::StatusOr<McpToolOutcome> McpCoreBackend::CallTool(const McpCall& call,
                                                        const pb::CallToolRequest& req) {
  constexpr char kMethod[] = "mcp.tools/call";
  if (metrics_) metrics_->CallStarted(kMethod);
  const absl::Time start = clock_->Monotonic();
  std::string provider;
  CallContext ctx;
  ctx.tenant = call.tenant;
  ctx.cancelled = call.cancelled;
  ctx.provider = &provider;
  McpToolOutcome out;
  pb::RunResult run;
  bool found = false;
  CallToolExtras extras;
  extras.run = &run;
  extras.found = &found;
  if (call.on_output) {
    extras.on_output = [&call](OutputStream, absl::string_view chunk) { call.on_output(chunk); };
  }
  absl::StatusOr<pb::CallToolResponse> r = core_->CallTool(ctx, req, extras);
  const absl::Duration took = clock_->Monotonic() - start;
  const std::string code = absl::StatusCodeToString(r.status().code());
  const LogLevel level = r.ok() ? LogLevel::kInfo : LogLevel::kWarning;
  if (LogEnabled(level)) {
    Log(level, "mcp.call",
        {{"tenant", call.tenant},
         {"tool", req.name().size() <= 128 ? req.name() : std::string("(long)")},
         {"session_id", req.session_id().size() <= 128 ? req.session_id() : std::string("(invalid)")},
         {"provider", provider.empty() ? std::string("-") : provider},
         {"code", code},
         {"is_error", r.ok() && r->is_error()},
         {"duration_ms", absl::ToInt64Milliseconds(took)}});
  }
  if (metrics_) metrics_->CallFinished(kMethod, provider, code, took);
  if (!r.ok()) return r.status();
  out.response = std::move(*r);
  out.run = run;  // read only for a run/shell that succeeded
  out.found = found;
  return out;
}

void McpCoreBackend::CloseSession(const std::string& tenant, const std::string& session_id) {
  CallContext ctx;
  ctx.tenant = tenant;
  pb::CloseSessionRequest req;
  req.set_session_id(session_id);
  (void)core_->CloseSession(ctx, req);
}

}  // namespace sandbox
