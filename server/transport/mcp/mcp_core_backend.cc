#include "server/transport/mcp/mcp_core_backend.h"

#include "common/log.h"
#include "common/status_macros.h"
#include "grpcpp/create_channel.h"
#include "server/transport/grpc/grpc_service.h"

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
  metrics_->CallStarted("mcp.tools/call");
  const absl::Time start = clock_->Monotonic();
  std::string provider;
  CallContext ctx;
  ctx.tenant = call.tenant;
  ctx.session_id = AuditableSessionId(req.session_id());
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
  absl::StatusOr<pb::CallToolResponse> r;
  absl::StatusOr<pb::SandboxBroker::Stub*> owner =
      OwnerStub(call.tenant, req.session_id(), core_->ProviderFor(ctx, req.spec().provider()),
                /*may_create=*/true);
  if (!owner.ok()) {
    r = owner.status();
  } else if (*owner != nullptr) {
    std::unique_ptr<grpc::ClientContext> c = PeerContext(call.tenant);
    pb::CallToolResponse resp;
    grpc::Status s = (*owner)->CallTool(c.get(), req, &resp);
    if (s.ok()) {
      // What the owner ran: run/shell's text is FormatRunResult's JSON.
      // What it read: the typed `found` (the text is the file's contents).
      absl::StatusOr<ToolName> name = ParseToolName(req.name());
      if (!resp.is_error() && name.ok() &&
          (name->op == ToolOp::kRun || name->op == ToolOp::kShell)) {
        (void)ParseRunResult(resp.content(), &run);
      }
      found = resp.found();
      r = std::move(resp);
    } else {
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
        cluster_->ForgetRoute(call.tenant, req.session_id());
      }
      r = absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    }
  } else {
    r = core_->CallTool(ctx, req, extras);
  }
  Finished(call, req, provider, start, r.status(), r.ok() && r->is_error());
  if (!r.ok()) return r.status();
  out.response = std::move(*r);
  out.run = run;  // read only for a run/shell that succeeded
  out.found = found;
  return out;
}

void McpCoreBackend::Finished(const McpCall& call, const pb::CallToolRequest& req,
                              const std::string& provider, absl::Time start,
                              const absl::Status& status, bool is_error) {
  const absl::Duration took = clock_->Monotonic() - start;
  const std::string code = absl::StatusCodeToString(status.code());
  const LogLevel level = status.ok() ? LogLevel::kInfo : LogLevel::kWarning;
  if (LogEnabled(level)) {
    Log(level, "mcp.call",
        {{"tenant", call.tenant},
         {"tool", req.name().size() <= 128 ? req.name() : std::string("(long)")},
         {"session_id", AuditableSessionId(req.session_id())},
         {"provider", provider.empty() ? std::string("-") : provider},
         {"code", code},
         {"is_error", is_error},
         {"duration_ms", absl::ToInt64Milliseconds(took)}});
  }
  metrics_->CallFinished("mcp.tools/call", provider, code, took);
}

void McpCoreBackend::CallToolAsync(McpCall call, pb::CallToolRequest req, ToolDone done) {
  if (cluster_ != nullptr && ValidateSessionId(req.session_id()).ok() &&
      !cluster_->ServesLocally(call.tenant, req.session_id())) {
    // Resolving the owner (etcd) and the forwarded RPC block.
    core_->blocking_pool()->Submit([this, call = std::move(call), req = std::move(req),
                                    done = std::move(done)] { done(CallTool(call, req)); });
    return;
  }
  metrics_->CallStarted("mcp.tools/call");
  struct State {
    McpCall call;
    pb::CallToolRequest req;
    std::string provider;
    absl::Time start;
  };
  auto st = std::make_shared<State>();
  st->call = std::move(call);
  st->req = std::move(req);
  st->start = clock_->Monotonic();
  CallContext ctx;
  ctx.tenant = st->call.tenant;
  ctx.session_id = AuditableSessionId(st->req.session_id());
  ctx.cancelled = st->call.cancelled;
  ctx.provider = &st->provider;
  std::function<void(OutputStream, absl::string_view)> on_output;
  if (st->call.on_output) {
    on_output = [st](OutputStream, absl::string_view chunk) { st->call.on_output(chunk); };
  }
  std::function<bool(std::function<void()>)> output_ready;
  if (on_output) output_ready = st->call.output_ready;
  core_->CallToolAsync(
      ctx, st->req, std::move(on_output), std::move(output_ready),
      [this, st, done = std::move(done)](absl::StatusOr<BrokerCore::ToolOutcome> r) {
        Finished(st->call, st->req, st->provider, st->start, r.status(),
                 r.ok() && r->response.is_error());
        if (!r.ok()) return done(r.status());
        McpToolOutcome out;
        out.response = std::move(r->response);
        out.run = std::move(r->run);
        out.found = r->found;
        done(std::move(out));
      });
}

void McpCoreBackend::CloseSession(const std::string& tenant, const std::string& session_id) {
  CallContext ctx;
  ctx.tenant = tenant;
  pb::CloseSessionRequest req;
  req.set_session_id(session_id);
  absl::StatusOr<pb::SandboxBroker::Stub*> owner =
      OwnerStub(tenant, session_id, "", /*may_create=*/false);
  if (owner.ok() && *owner != nullptr) {
    std::unique_ptr<grpc::ClientContext> c = PeerContext(tenant);
    pb::CloseSessionResponse resp;
    (void)(*owner)->CloseSession(c.get(), req, &resp);
    return;
  }
  (void)core_->CloseSession(ctx, req);
}

absl::StatusOr<pb::SandboxBroker::Stub*> McpCoreBackend::OwnerStub(const std::string& tenant,
                                                                   const std::string& session_id,
                                                                   const std::string& provider,
                                                                   bool may_create) {
  if (cluster_ == nullptr || !ValidateSessionId(session_id).ok() ||
      cluster_->ServesLocally(tenant, session_id)) {
    return nullptr;
  }
  ASSIGN_OR_RETURN(ClusterRoute route,
                   cluster_->Resolve(tenant, session_id, provider, may_create, false));
  if (route.local) return nullptr;
  absl::MutexLock l(&stubs_mu_);
  auto& stub = stubs_[route.address];
  if (!stub) {
    // No size caps of its own: the owner applies max_message_bytes (a
    // default channel would refuse answers over 4 MiB the owner sends).
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    stub = pb::SandboxBroker::NewStub(grpc::CreateCustomChannel(
        route.address, peer_ ? peer_ : grpc::InsecureChannelCredentials(), args));
  }
  return stub.get();
}

std::unique_ptr<grpc::ClientContext> McpCoreBackend::PeerContext(const std::string& tenant) const {
  auto c = std::make_unique<grpc::ClientContext>();
  c->AddMetadata(kClusterTokenHeader, cluster_->token());
  c->AddMetadata(kClusterTenantHeader, tenant);
  c->AddMetadata(kClusterFromHeader, cluster_->member_id());
  c->set_deadline(absl::ToChronoTime(absl::Now() + absl::Hours(1)));
  return c;
}

}  // namespace sandbox
