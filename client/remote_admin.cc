#include "client/remote_admin.h"

#include <chrono>

#include "client/remote_sandbox.h"

namespace sandbox {

RemoteAdmin::RemoteAdmin(std::shared_ptr<pb::Admin::StubInterface> stub, std::string admin_token)
    : stub_(std::move(stub)), token_(std::move(admin_token)) {}

std::unique_ptr<RemoteAdmin> RemoteAdmin::Connect(const std::shared_ptr<grpc::Channel>& channel,
                                                  const std::string& admin_token) {
  return std::make_unique<RemoteAdmin>(pb::Admin::NewStub(channel), admin_token);
}

void RemoteAdmin::Prepare(grpc::ClientContext* ctx) const {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  if (!token_.empty()) ctx->AddMetadata("authorization", "Bearer " + token_);
}

absl::StatusOr<std::vector<pb::SessionInfo>> RemoteAdmin::ListAllSessions(
    pb::ListAllSessionsRequest req) {
  std::vector<pb::SessionInfo> out;
  while (true) {
    grpc::ClientContext ctx;
    Prepare(&ctx);
    pb::ListAllSessionsResponse resp;
    grpc::Status s = stub_->ListAllSessions(&ctx, req, &resp);
    if (!s.ok()) return FromGrpcStatus(s);
    for (auto& i : *resp.mutable_sessions()) out.push_back(std::move(i));
    if (resp.next_page_token().empty()) return out;
    req.set_page_token(resp.next_page_token());
  }
}

absl::StatusOr<pb::SessionInfo> RemoteAdmin::GetSession(const std::string& tenant,
                                                        const std::string& session_id) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  pb::GetSessionAdminRequest req;
  req.set_tenant(tenant);
  req.set_session_id(session_id);
  pb::SessionInfo resp;
  grpc::Status s = stub_->GetSessionAdmin(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::StatusOr<int> RemoteAdmin::CloseSessions(const pb::CloseSessionsRequest& req) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  pb::CloseSessionsResponse resp;
  grpc::Status s = stub_->CloseSessions(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp.closed();
}

absl::StatusOr<int> RemoteAdmin::SetTenantDisabled(const std::string& tenant, bool disabled,
                                                   bool close_sessions) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  pb::SetTenantDisabledRequest req;
  req.set_tenant(tenant);
  req.set_disabled(disabled);
  req.set_close_sessions(close_sessions);
  pb::SetTenantDisabledResponse resp;
  grpc::Status s = stub_->SetTenantDisabled(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp.sessions_closed();
}

absl::StatusOr<pb::GetUsageResponse> RemoteAdmin::GetUsage(const std::string& tenant) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  pb::GetUsageRequest req;
  req.set_tenant(tenant);
  pb::GetUsageResponse resp;
  grpc::Status s = stub_->GetUsage(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::StatusOr<pb::ReloadConfigResponse> RemoteAdmin::ReloadConfig() {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  pb::ReloadConfigResponse resp;
  grpc::Status s = stub_->ReloadConfig(&ctx, pb::ReloadConfigRequest(), &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

}  // namespace sandbox
