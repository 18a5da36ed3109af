#include "server/transport/grpc/admin_service.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "server/core/broker_core.h"
#include "server/transport/grpc/grpc_service.h"

namespace sandbox {
namespace {

constexpr int kDefaultPageSize = 100;
constexpr int kMaxPageSize = 1000;

absl::Status ValidTenant(const std::string& tenant, bool required) {
  if (tenant.empty() && !required) return absl::OkStatus();
  if (!IsValidTenant(tenant)) {
    return absl::InvalidArgumentError("tenant must be 1-64 characters of [A-Za-z0-9._-]");
  }
  return absl::OkStatus();
}

}  // namespace

grpc::Status AdminService::Handle(
    grpc::ServerContext* ctx, absl::string_view method, const std::string& tenant,
    const std::string& session_id,
    const std::function<absl::Status(const std::string&, std::map<std::string, std::string>*)>&
        fn) {
  const absl::Time start = d_.clock->Monotonic();
  const std::string method_name = absl::StrCat("Admin.", method);
  bool echo_id = false;
  const std::string request_id = RequestId(ctx, &echo_id);
  if (echo_id) ctx->AddInitialMetadata("x-request-id", request_id);
  RequestIdScope scope(request_id);
  if (d_.metrics) d_.metrics->CallStarted(method_name);
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  absl::string_view value;
  if (it != md.end()) value = absl::string_view(it->second.data(), it->second.size());
  absl::StatusOr<std::string> admin =
      Authenticator::AuthenticateAdmin(*d_.policy->Current(), it != md.end() ? &value : nullptr);
  std::map<std::string, std::string> fields;
  absl::Status status = admin.ok() ? fn(*admin, &fields) : admin.status();
  const std::string code = absl::StatusCodeToString(status.code());
  const absl::Duration took = d_.clock->Monotonic() - start;
  const std::string who = admin.ok() ? *admin : std::string("-");
  const std::string sid = session_id.size() <= 128 ? session_id : std::string("(invalid)");
  const std::string ten = tenant.size() <= 64 ? tenant : std::string("(invalid)");
  Log(status.ok() ? LogLevel::kInfo : LogLevel::kWarning, "rpc",
      {{"request_id", request_id},
       {"method", method_name},
       {"admin", who},
       {"tenant", ten.empty() ? std::string("-") : ten},
       {"session_id", sid.empty() ? std::string("-") : sid},
       {"code", code},
       {"duration_ms", absl::ToInt64Milliseconds(took)}});
  if (d_.audit != nullptr) {
    AuditEvent e;
    e.event = absl::StrCat("admin.", method);
    e.tenant = ten;
    e.session_id = sid;
    e.request_id = request_id;
    e.fields = std::move(fields);
    e.fields["admin"] = who;
    e.fields["code"] = code;
    if (!status.ok()) e.fields["message"] = std::string(status.message());
    d_.audit->Record(e);
  }
  if (d_.metrics) d_.metrics->CallFinished(method_name, "", code, took);
  return ToGrpcStatus(status);
}

grpc::Status AdminService::ListAllSessions(grpc::ServerContext* ctx,
                                           const pb::ListAllSessionsRequest* req,
                                           pb::ListAllSessionsResponse* resp) {
  return Handle(ctx, "ListAllSessions", req->tenant(), "", [&](const std::string&, auto*) {
    if (absl::Status s = ValidTenant(req->tenant(), false); !s.ok()) return s;
    if (req->page_size() < 0) return absl::InvalidArgumentError("page_size must be >= 0");
    const int size =
        req->page_size() == 0 ? kDefaultPageSize : std::min(req->page_size(), kMaxPageSize);
    std::pair<std::string, std::string> after;
    if (!req->page_token().empty()) {
      std::string raw;
      const size_t slash =
          absl::WebSafeBase64Unescape(req->page_token(), &raw) ? raw.find('/') : std::string::npos;
      if (slash == std::string::npos || !IsValidTenant(raw.substr(0, slash)) ||
          !ValidateSessionId(raw.substr(slash + 1)).ok()) {
        return absl::InvalidArgumentError("invalid page_token");
      }
      after = {raw.substr(0, slash), raw.substr(slash + 1)};
    }
    SessionFilter f;
    f.tenant = req->tenant();
    f.provider = req->provider();
    switch (req->state()) {
      case pb::SESSION_STATE_UNSPECIFIED:
        break;
      case pb::SESSION_STATE_CREATING:
        f.state = SessionStateKind::kCreating;
        break;
      case pb::SESSION_STATE_READY:
        f.state = SessionStateKind::kReady;
        break;
      case pb::SESSION_STATE_CLOSING:
        f.state = SessionStateKind::kClosing;
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("unknown state ", static_cast<int>(req->state())));
    }
    f.labels.insert(req->labels().begin(), req->labels().end());
    bool more = false;
    std::vector<SessionView> views = d_.sessions->ListAll(f, after, size, &more);
    for (const auto& v : views) {
      pb::SessionInfo* info = resp->add_sessions();
      d_.core->Describe(v, info);
    }
    if (more && !views.empty()) {
      resp->set_next_page_token(absl::WebSafeBase64Escape(
          absl::StrCat(views.back().tenant, "/", views.back().session_id)));
    }
    return absl::OkStatus();
  });
}

grpc::Status AdminService::GetSessionAdmin(grpc::ServerContext* ctx,
                                           const pb::GetSessionAdminRequest* req,
                                           pb::SessionInfo* resp) {
  return Handle(
      ctx, "GetSessionAdmin", req->tenant(), req->session_id(), [&](const std::string&, auto*) {
        if (absl::Status s = ValidTenant(req->tenant(), true); !s.ok()) return s;
        if (absl::Status s = ValidateSessionId(req->session_id()); !s.ok()) return s;
        absl::StatusOr<SessionView> v = d_.sessions->Get(req->tenant(), req->session_id());
        if (!v.ok()) return v.status();
        d_.core->Describe(*v, resp);
        return absl::OkStatus();
      });
}

grpc::Status AdminService::CloseSessions(grpc::ServerContext* ctx,
                                         const pb::CloseSessionsRequest* req,
                                         pb::CloseSessionsResponse* resp) {
  return Handle(ctx, "CloseSessions", req->tenant(), req->session_id(),
                [&](const std::string&, std::map<std::string, std::string>* audit) {
                  if (absl::Status s = ValidTenant(req->tenant(), false); !s.ok()) return s;
                  if (req->tenant().empty() && req->labels().empty()) {
                    return absl::InvalidArgumentError(
                        "select sessions by tenant, tenant and session_id, or labels");
                  }
                  if (!req->session_id().empty()) {
                    if (req->tenant().empty()) {
                      return absl::InvalidArgumentError("session_id needs tenant");
                    }
                    if (absl::Status s = ValidateSessionId(req->session_id()); !s.ok()) return s;
                  }
                  int closed = 0;
                  if (!req->session_id().empty() && req->labels().empty()) {
                    absl::StatusOr<bool> r =
                        d_.sessions->Close(req->tenant(), req->session_id(), CloseReason::kAdmin);
                    if (!r.ok()) return r.status();
                    closed = *r ? 1 : 0;
                  } else {
                    SessionFilter f;
                    f.tenant = req->tenant();
                    f.labels.insert(req->labels().begin(), req->labels().end());
                    if (!req->session_id().empty()) {
                      // An id with labels: close it only if the labels match.
                      bool more = false;
                      auto v = d_.sessions->ListAll(f, {req->tenant(), ""}, kMaxPageSize, &more);
                      for (const auto& s : v) {
                        if (s.session_id != req->session_id()) continue;
                        auto r = d_.sessions->Close(s.tenant, s.session_id, CloseReason::kAdmin);
                        closed += r.ok() && *r ? 1 : 0;
                      }
                    } else {
                      closed = d_.sessions->CloseMatching(f, CloseReason::kAdmin);
                    }
                  }
                  resp->set_closed(closed);
                  (*audit)["closed"] = absl::StrCat(closed);
                  return absl::OkStatus();
                });
}

grpc::Status AdminService::SetTenantDisabled(grpc::ServerContext* ctx,
                                             const pb::SetTenantDisabledRequest* req,
                                             pb::SetTenantDisabledResponse* resp) {
  return Handle(ctx, "SetTenantDisabled", req->tenant(), "",
                [&](const std::string&, std::map<std::string, std::string>* audit) {
                  if (absl::Status s = ValidTenant(req->tenant(), true); !s.ok()) return s;
                  d_.policy->SetDisabled(req->tenant(), req->disabled());
                  (*audit)["disabled"] = req->disabled() ? "true" : "false";
                  if (req->disabled() && req->close_sessions()) {
                    SessionFilter f;
                    f.tenant = req->tenant();
                    const int n = d_.sessions->CloseMatching(f, CloseReason::kAdmin);
                    resp->set_sessions_closed(n);
                    (*audit)["closed"] = absl::StrCat(n);
                  }
                  return absl::OkStatus();
                });
}

grpc::Status AdminService::GetUsage(grpc::ServerContext* ctx, const pb::GetUsageRequest* req,
                                    pb::GetUsageResponse* resp) {
  return Handle(ctx, "GetUsage", req->tenant(), "", [&](const std::string&, auto*) {
    if (absl::Status s = ValidTenant(req->tenant(), false); !s.ok()) return s;
    auto fill = [](const UsageTotals& totals,
                   google::protobuf::RepeatedPtrField<pb::TenantUsage>* list) {
      for (const auto& [key, c] : totals) {
        pb::TenantUsage* u = list->Add();
        u->set_tenant(key.first);
        u->set_provider(key.second);
        u->set_sessions_created(c.sessions_created);
        u->set_runs(c.runs);
        u->set_run_seconds(c.run_seconds);
        u->set_sandbox_seconds(c.sandbox_seconds);
        u->set_cpu_seconds(c.cpu_seconds);
        u->set_output_bytes(c.output_bytes);
        u->set_file_transfer_bytes(c.file_transfer_bytes);
        u->set_oom_kills(c.oom_kills);
        u->set_quota_refusals(c.quota_refusals);
        u->set_egress_bytes(c.egress_bytes);
      }
    };
    fill(d_.usage->Totals(req->tenant()), resp->mutable_usage());
    if (d_.usage->has_store()) {
      fill(d_.usage->StoreTotals(req->tenant()), resp->mutable_since_store());
      SetTime(d_.usage->store_since(), resp->mutable_store_created());
    }
    SetTime(d_.usage->since(), resp->mutable_since());
    return absl::OkStatus();
  });
}

grpc::Status AdminService::ReloadConfig(grpc::ServerContext* ctx,
                                        const pb::ReloadConfigRequest* req,
                                        pb::ReloadConfigResponse* resp) {
  return Handle(ctx, "ReloadConfig", "", "", [&](const std::string& admin, auto*) {
    absl::StatusOr<ReloadResult> r = d_.reloader->Reload(absl::StrCat("admin:", admin));
    if (!r.ok()) return r.status();
    resp->set_generation(r->generation);
    for (const auto& k : r->needs_restart) resp->add_needs_restart(k);
    return absl::OkStatus();
  });
}

}  // namespace sandbox
