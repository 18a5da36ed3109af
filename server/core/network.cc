// Network policies at the API (docs/network.md): SessionSpec.network and
// SessionInfo.network, and which policy a new session gets.

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "server/core/broker_core.h"

namespace sandbox {

void NetworkToProto(const NetworkPolicy& p, pb::NetworkPolicy* out) {
  out->set_allow_all(p.allow_all);
  for (const NetRule& r : p.allow_out) out->add_allow_out(r.text);
  for (const NetRule& r : p.deny_out) out->add_deny_out(r.text);
  out->mutable_hosts()->insert(p.hosts.begin(), p.hosts.end());
  out->set_max_connections(p.max_connections);
  out->set_max_bytes_per_second(p.max_bytes_per_second);
}

absl::StatusOr<NetworkPolicy> NetworkFromProto(const pb::NetworkPolicy& p,
                                               absl::string_view where) {
  // One parser for config and requests: the proto goes through its JSON.
  nlohmann::json j = nlohmann::json::object();
  j["allow_all"] = p.allow_all();
  j["allow_out"] = std::vector<std::string>(p.allow_out().begin(), p.allow_out().end());
  j["deny_out"] = std::vector<std::string>(p.deny_out().begin(), p.deny_out().end());
  j["hosts"] = nlohmann::json::object();
  for (const auto& entry : p.hosts()) j["hosts"][entry.first] = entry.second;
  if (p.max_connections() < 0 || p.max_bytes_per_second() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": max_connections and max_bytes_per_second must be >= 0 (0 = no cap)"));
  }
  j["max_connections"] = p.max_connections();
  j["max_bytes_per_second"] = p.max_bytes_per_second();
  return ParseNetworkPolicy(j, where);
}

absl::StatusOr<NetworkPolicy> SessionNetwork(const pb::SessionSpec& spec, const TenantRules* rules,
                                             const BrokerConfig& config,
                                             const std::string& provider) {
  NetworkPolicy ceiling;
  if (rules != nullptr && rules->network) {
    ceiling = *rules->network;
  } else if (auto it = config.provider_network.find(provider);
             it != config.provider_network.end()) {
    ceiling = it->second;
  }
  ceiling.apply_to_running = false;
  if (!spec.has_network()) return ceiling;
  ASSIGN_OR_RETURN(NetworkPolicy asked, NetworkFromProto(spec.network(), "spec.network"));
  return NarrowNetworkPolicy(asked, ceiling);
}

int BrokerCore::ApplyNetworkReload(const OperatorSnapshot& before, const OperatorSnapshot& after) {
  int applied = 0;
  bool more = true;
  std::pair<std::string, std::string> cursor;
  while (more) {
    const std::vector<SessionView> page = sessions_->ListAll({}, cursor, 500, &more);
    for (const SessionView& v : page) {
      cursor = {v.tenant, v.session_id};
      const std::optional<NetworkPolicy>& now = after.For(v.tenant).network;
      if (v.state != SessionStateKind::kReady || !now || !now->apply_to_running) continue;
      const std::optional<NetworkPolicy>& was = before.For(v.tenant).network;
      if (was && NetworkPolicyJson(*was) == NetworkPolicyJson(*now)) continue;
      NetworkPolicy rules = *now;
      rules.apply_to_running = false;
      absl::StatusOr<Lease> lease = sessions_->Acquire(v.tenant, v.session_id, nullptr);
      if (!lease.ok()) continue;  // closed meanwhile
      absl::Status s = lease->sandbox()->UpdateNetwork(rules);
      lease->Release();
      if (s.ok()) s = sessions_->SetNetwork(v.tenant, v.session_id, rules);
      Log(s.ok() ? LogLevel::kInfo : LogLevel::kWarning, "network.reload_applied",
          {{"tenant", v.tenant},
           {"session_id", v.session_id},
           {"result", s.ok() ? std::string("applied") : std::string(s.message())}});
      if (s.ok()) ++applied;
    }
  }
  return applied;
}

void BrokerCore::UpdateSessionNetworkAsync(const CallContext& ctx,
                                           const pb::UpdateSessionNetworkRequest& req,
                                           Done<pb::SessionInfo> done) {
  absl::StatusOr<Admission> adm = Admit(ctx);
  if (!adm.ok()) return done(adm.status());
  if (absl::Status s = ValidateSessionId(req.session_id()); !s.ok()) return done(s);
  absl::StatusOr<SessionView> view = sessions_->Get(ctx.tenant, req.session_id());
  if (!view.ok()) return done(view.status());
  // Within what the tenant allows now (its policy may have been reloaded).
  pb::SessionSpec asked;
  *asked.mutable_network() = req.network();
  absl::StatusOr<NetworkPolicy> network =
      SessionNetwork(asked, adm->rules, config_, view->provider);
  if (!network.ok()) {
    if (network.status().code() != absl::StatusCode::kPermissionDenied) {
      return done(network.status());
    }
    return done(Refused(ctx, network.status(), "network", view->provider));
  }
  LeaseAsync(ctx, req.session_id(), nullptr,
             [this, ctx, session_id = req.session_id(), network = *std::move(network),
              done](absl::StatusOr<Lease> lease) {
               if (!lease.ok()) return done(lease.status());
               // Local: a swap of the rules its egress point reads; a remote
               // provider: an HTTP call, so on the blocking pool.
               auto held = std::make_shared<Lease>(*std::move(lease));
               blocking_pool()->Submit([this, ctx, session_id, network, done, held] {
                 absl::Status s = held->sandbox()->UpdateNetwork(network);
                 held->Release();
                 if (s.ok()) s = sessions_->SetNetwork(ctx.tenant, session_id, network);
                 if (!s.ok()) return done(s);
                 absl::StatusOr<SessionView> v = sessions_->Get(ctx.tenant, session_id);
                 if (!v.ok()) return done(v.status());
                 pb::SessionInfo info;
                 ToInfo(*v, &info);
                 done(std::move(info));
               });
             });
}

}  // namespace sandbox
