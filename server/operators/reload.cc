#include "server/operators/reload.h"

#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace sandbox {

Reloader::Reloader(std::string config_path, std::string listen_override, BrokerConfig running,
                   std::vector<std::string> providers, PolicyEngine* policy, UsageMeter* usage,
                   AuditLog* audit)
    : config_path_(std::move(config_path)),
      listen_override_(std::move(listen_override)),
      running_(std::move(running)),
      providers_(std::move(providers)),
      policy_(policy),
      usage_(usage),
      audit_(audit) {
  absl::MutexLock l(&mu_);
  tokens_seen_ = ReadTokensFile(running_.tokens_file);
}

Reloader::~Reloader() { Stop(); }

std::string Reloader::ReadTokensFile(const std::string& path) const {
  if (path.empty()) return "";
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::string("\0unreadable", 11);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<std::shared_ptr<const OperatorSnapshot>> Reloader::SnapshotOf(
    const BrokerConfig& config, const BrokerConfig& running,
    const std::vector<std::string>& providers, int64_t generation) {
  BrokerMaxima m;
  m.providers = providers;
  m.default_provider = running.default_provider;
  m.max_sessions = running.max_sessions_per_tenant;
  m.max_timeout_seconds = running.max_timeout_seconds;
  m.idle_timeout_seconds = running.idle_timeout_seconds;
  m.max_lifetime_seconds = running.max_lifetime_seconds;
  m.max_output_bytes = running.max_output_bytes;
  auto snap = MakeOperatorSnapshot(config.tokens, config.admin_tokens, config.policy, m,
                                   config.tokens_file, generation);
  // A policy may only name providers the broker runs (new ones need a restart).
  auto check = [&](const std::string& where, const TenantRules& r) -> absl::Status {
    for (const auto& p : r.providers) {
      if (std::find(providers.begin(), providers.end(), p) == providers.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ".providers: provider \"", p,
                         "\" is not running (a new provider needs a restart)"));
      }
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(check("tenant_defaults", snap->other_rules));
  for (const auto& [tenant, rules] : snap->rules) {
    RETURN_IF_ERROR(check(absl::StrCat("tenants.", tenant), rules));
  }
  return snap;
}

std::vector<std::string> Reloader::RestartKeys(const nlohmann::json& before,
                                               const nlohmann::json& after) {
  static const std::set<std::string> kReloadable = {"tenant_defaults", "tenants"};
  static const std::set<std::string> kReloadableAuth = {"tokens", "tokens_file", "admin_tokens"};
  std::vector<std::string> out;
  std::set<std::string> keys;
  for (auto it = before.begin(); it != before.end(); ++it) keys.insert(it.key());
  for (auto it = after.begin(); it != after.end(); ++it) keys.insert(it.key());
  auto at = [](const nlohmann::json& j, const std::string& k) {
    return j.contains(k) ? j.at(k) : nlohmann::json();
  };
  for (const std::string& k : keys) {
    if (kReloadable.count(k) != 0) continue;
    nlohmann::json b = at(before, k), a = at(after, k);
    if (k == "auth") {
      for (const auto& r : kReloadableAuth) {
        if (b.is_object()) b.erase(r);
        if (a.is_object()) a.erase(r);
      }
      if (b.is_object() && b.empty()) b = nullptr;
      if (a.is_object() && a.empty()) a = nullptr;
    }
    if (k == "providers" && (a.is_object() || b.is_object())) {
      std::set<std::string> names;
      for (auto it = b.begin(); b.is_object() && it != b.end(); ++it) names.insert(it.key());
      for (auto it = a.begin(); a.is_object() && it != a.end(); ++it) names.insert(it.key());
      for (const auto& n : names) {
        if (at(b.is_object() ? b : nlohmann::json::object(), n) !=
            at(a.is_object() ? a : nlohmann::json::object(), n)) {
          out.push_back(absl::StrCat("providers.", n));
        }
      }
      continue;
    }
    if (a != b) out.push_back(k);
  }
  return out;
}

absl::StatusOr<ReloadResult> Reloader::Reload(const std::string& source) {
  std::shared_ptr<const OperatorSnapshot> before;
  absl::StatusOr<ReloadResult> result = ReloadLocked(source, &before);
  if (result.ok() && before != nullptr && swap_hook_) swap_hook_(*before, *policy_->Current());
  return result;
}

absl::StatusOr<ReloadResult> Reloader::ReloadLocked(
    const std::string& source, std::shared_ptr<const OperatorSnapshot>* before_out) {
  absl::MutexLock l(&mu_);
  AuditEvent audit;
  audit.event = "config.reload";
  audit.fields["source"] = source;
  auto reject = [&](const absl::Status& s) -> absl::Status {
    Log(LogLevel::kWarning, "config.reload_rejected",
        {{"source", source}, {"reason", s.message()}});
    audit.fields["result"] = "rejected";
    audit.fields["reason"] = std::string(s.message());
    if (audit_ != nullptr) audit_->Record(audit);
    return s;
  };
  if (config_path_.empty()) {
    return reject(absl::FailedPreconditionError(
        "no config file to reload (the broker was started without --config)"));
  }
  absl::StatusOr<BrokerConfig> next = LoadConfigFile(config_path_);
  tokens_seen_ = ReadTokensFile(next.ok() ? next->tokens_file : running_.tokens_file);
  if (!next.ok()) {
    return reject(absl::InvalidArgumentError(
        absl::StrCat("config rejected, the old one stays: ", next.status().message())));
  }
  const int64_t generation = policy_->Current()->generation + 1;
  absl::StatusOr<std::shared_ptr<const OperatorSnapshot>> snap =
      SnapshotOf(*next, running_, providers_, generation);
  if (!snap.ok()) {
    return reject(absl::InvalidArgumentError(
        absl::StrCat("config rejected, the old one stays: ", snap.status().message())));
  }
  nlohmann::json before = running_.raw, after = next->raw;
  if (!listen_override_.empty()) {
    before.erase("listen");
    after.erase("listen");
  }
  ReloadResult result;
  result.generation = generation;
  result.needs_restart = RestartKeys(before, after);
  if (usage_ != nullptr) usage_->SetKnownTenants((*snap)->KnownTenants());
  *before_out = policy_->Current();
  policy_->Swap(*snap);
  const std::string restart = absl::StrJoin(result.needs_restart, ",");
  Log(LogLevel::kInfo, "config.reloaded",
      {{"source", source},
       {"generation", generation},
       {"tenants", (*snap)->KnownTenants().size()},
       {"needs_restart", restart.empty() ? std::string("-") : restart}});
  if (!result.needs_restart.empty()) {
    Log(LogLevel::kWarning, "config.needs_restart",
        {{"keys", restart}, {"message", "these changed keys need a restart; they were ignored"}});
  }
  audit.fields["result"] = "applied";
  audit.fields["generation"] = absl::StrCat(generation);
  if (!restart.empty()) audit.fields["needs_restart"] = restart;
  if (audit_ != nullptr) audit_->Record(audit);
  return result;
}

bool Reloader::CheckTokensFile() {
  {
    absl::MutexLock l(&mu_);
    const std::string path = policy_->Current()->tokens_file;
    if (path.empty()) return false;
    std::string now = ReadTokensFile(path);
    if (now == tokens_seen_) return false;
    tokens_seen_ = now;
  }
  (void)Reload("tokens_file");
  return true;
}

void Reloader::StartWatching(absl::Duration every) {
  absl::MutexLock l(&watch_mu_);
  if (watcher_.joinable()) return;
  watcher_ = std::thread([this, every] {
    while (!stop_.WaitForNotificationWithTimeout(every)) CheckTokensFile();
  });
}

void Reloader::Stop() {
  absl::MutexLock l(&watch_mu_);
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (watcher_.joinable()) watcher_.join();
}

}  // namespace sandbox
