#pragma once

#include <functional>
#include <string>

#include "sandboxbroker/v1/admin.grpc.pb.h"
#include "server/config/auth.h"
#include "server/config/policy.h"
#include "server/core/broker_core.h"
#include "server/operators/reload.h"
#include "server/operators/usage.h"
#include "server/sessions/session_manager.h"
#include "server/telemetry/audit.h"
#include "server/telemetry/metrics.h"

namespace sandbox {

// sandboxbroker.v1.Admin: the operator's view across tenants. Authorized by
// auth.admin_tokens (a tenant token is PERMISSION_DENIED); every call gets an
// `rpc` log line and an `admin.<Method>` audit line.
//
// Thread-safe.
class AdminService final : public pb::Admin::Service {
 public:
  struct Deps {
    SessionManager* sessions = nullptr;
    BrokerCore* core = nullptr;  // formats SessionInfo
    PolicyEngine* policy = nullptr;
    UsageMeter* usage = nullptr;
    AuditLog* audit = nullptr;  // may be null
    Reloader* reloader = nullptr;
    Clock* clock = nullptr;
    Metrics* metrics = nullptr;  // may be null
  };
  explicit AdminService(Deps deps) : d_(deps) {}

  grpc::Status ListAllSessions(grpc::ServerContext* ctx, const pb::ListAllSessionsRequest* req,
                               pb::ListAllSessionsResponse* resp) override;
  grpc::Status GetSessionAdmin(grpc::ServerContext* ctx, const pb::GetSessionAdminRequest* req,
                               pb::SessionInfo* resp) override;
  grpc::Status CloseSessions(grpc::ServerContext* ctx, const pb::CloseSessionsRequest* req,
                             pb::CloseSessionsResponse* resp) override;
  grpc::Status SetTenantDisabled(grpc::ServerContext* ctx, const pb::SetTenantDisabledRequest* req,
                                 pb::SetTenantDisabledResponse* resp) override;
  grpc::Status GetUsage(grpc::ServerContext* ctx, const pb::GetUsageRequest* req,
                        pb::GetUsageResponse* resp) override;
  grpc::Status ReloadConfig(grpc::ServerContext* ctx, const pb::ReloadConfigRequest* req,
                            pb::ReloadConfigResponse* resp) override;

 private:
  // Authenticates the admin, runs `fn(admin_name)`, logs and audits.
  // `target` names what the call acted on (for the audit line).
  grpc::Status Handle(
      grpc::ServerContext* ctx, absl::string_view method, const std::string& tenant,
      const std::string& session_id,
      const std::function<absl::Status(const std::string& admin,
                                       std::map<std::string, std::string>* audit)>& fn);

  const Deps d_;
};

}  // namespace sandbox
