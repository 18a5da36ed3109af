#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "sandboxbroker/v1/admin.grpc.pb.h"

namespace sandbox {

namespace pb = ::sandboxbroker::v1;

// A client of the broker's Admin service (admin token required). RPC
// failures come back as absl::Status with the broker's code and message.
//
// Thread-safe.
class RemoteAdmin {
 public:
  RemoteAdmin(std::shared_ptr<pb::Admin::StubInterface> stub, std::string admin_token);
  static std::unique_ptr<RemoteAdmin> Connect(const std::shared_ptr<grpc::Channel>& channel,
                                              const std::string& admin_token);

  // Every page.
  absl::StatusOr<std::vector<pb::SessionInfo>> ListAllSessions(pb::ListAllSessionsRequest filter);
  absl::StatusOr<pb::SessionInfo> GetSession(const std::string& tenant,
                                             const std::string& session_id);
  absl::StatusOr<int> CloseSessions(const pb::CloseSessionsRequest& req);
  absl::StatusOr<int> SetTenantDisabled(const std::string& tenant, bool disabled,
                                        bool close_sessions);
  absl::StatusOr<pb::GetUsageResponse> GetUsage(const std::string& tenant = "");
  absl::StatusOr<pb::ReloadConfigResponse> ReloadConfig();

 private:
  void Prepare(grpc::ClientContext* ctx) const;
  const std::shared_ptr<pb::Admin::StubInterface> stub_;
  const std::string token_;
};

}  // namespace sandbox
