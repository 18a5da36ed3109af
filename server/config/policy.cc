#include "server/config/policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config_reader.h"
#include "common/refusal.h"
#include "common/status_macros.h"

namespace sandbox {
namespace {

bool Contains(const std::vector<std::string>& v, absl::string_view s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::string Allowed(const std::vector<std::string>& v) {
  return v.empty() ? std::string("none") : absl::StrJoin(v, ", ");
}

absl::StatusOr<TenantPolicyConfig> ParseOne(const nlohmann::json& j, const std::string& path,
                                            const std::vector<std::string>& configured) {
  TenantPolicyConfig p;
  ConfigReader r(j, path);
  auto int_opt = [&r](const char* key, int64_t min, int64_t max) -> std::optional<int64_t> {
    if (!r.Has(key)) return std::nullopt;
    return r.Int(key, 0, min, max);
  };
  constexpr int64_t kDay = 86400;
  if (r.Has("providers")) {
    std::vector<std::string> v = r.StringList("providers");
    for (const auto& name : v) {
      if (!Contains(configured, name)) {
        r.Fail("providers", absl::StrCat("unknown provider \"", name,
                                         "\" (configured: ", Allowed(configured), ")"));
      }
    }
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    p.providers = std::move(v);
  }
  if (r.Has("default_provider")) p.default_provider = r.String("default_provider", "", false);
  if (r.Has("templates")) {
    const nlohmann::json& t = r.Object("templates");
    std::map<std::string, std::vector<std::string>> m;
    if (t.is_object()) {
      ConfigReader tr(t, absl::StrCat(path, ".templates"));
      for (auto it = t.begin(); it != t.end(); ++it) {
        if (!Contains(configured, it.key())) {
          tr.Fail(it.key(),
                  absl::StrCat("unknown provider (configured: ", Allowed(configured), ")"));
        }
        m[it.key()] = tr.StringList(it.key());
      }
      RETURN_IF_ERROR(tr.Finish());
    }
    p.templates = std::move(m);
  }
  p.max_sessions = int_opt("max_sessions", 1, 100000000);
  p.max_concurrent_runs = int_opt("max_concurrent_runs", 1, 1000000);
  p.max_timeout_seconds = int_opt("max_timeout_seconds", 1, 7 * kDay);
  p.idle_timeout_seconds = int_opt("idle_timeout_seconds", 1, 30 * kDay);
  p.max_lifetime_seconds = int_opt("max_lifetime_seconds", 1, 365 * kDay);
  p.max_output_bytes = int_opt("max_output_bytes", 1, int64_t{1} << 30);
  p.run_rate = int_opt("run_rate", 1, 1000000);
  if (r.Has("disabled")) p.disabled = r.Bool("disabled", false);
  if (r.Has("network")) {
    ASSIGN_OR_RETURN(p.network, ParseNetworkPolicy(r.Object("network"), path + ".network"));
  }
  if (r.Has("resources")) {
    const nlohmann::json& res = r.Object("resources");
    if (res.is_object()) {
      const std::string rpath = absl::StrCat(path, ".resources");
      ConfigReader rr(res, rpath);
      if (rr.Has("cpus")) {
        const nlohmann::json& c = res["cpus"];
        if (!c.is_number() || c.get<double>() <= 0 || !std::isfinite(c.get<double>())) {
          return absl::InvalidArgumentError(
              absl::StrCat(rpath, ".cpus: must be a positive number"));
        }
        p.res_cpus = rr.Number("cpus", 0, 0, std::numeric_limits<double>::max());
      }
      if (rr.Has("memory_bytes")) p.res_memory_bytes = rr.Int("memory_bytes", 0, 1);
      if (rr.Has("pids")) p.res_pids = rr.Int("pids", 0, 1);
      if (rr.Has("disk_bytes")) p.res_disk_bytes = rr.Int("disk_bytes", 0, 1);
      RETURN_IF_ERROR(rr.Finish());
    }
  }
  RETURN_IF_ERROR(r.Finish());
  return p;
}

template <typename T>
T Pick(const std::optional<T>& tenant, const std::optional<T>& def, T fallback) {
  if (tenant) return *tenant;
  if (def) return *def;
  return fallback;
}

// The tighter of the broker's maximum and a policy's value (0 = unset).
int64_t Tighter(int64_t broker, int64_t policy) {
  if (policy <= 0) return broker;
  if (broker <= 0) return policy;
  return std::min(broker, policy);
}

}  // namespace

bool PolicyConfig::empty() const {
  return tenants.empty() && !defaults.providers && !defaults.default_provider &&
         !defaults.templates && !defaults.max_sessions && !defaults.max_concurrent_runs &&
         !defaults.max_timeout_seconds && !defaults.idle_timeout_seconds &&
         !defaults.max_lifetime_seconds && !defaults.max_output_bytes && !defaults.run_rate &&
         !defaults.res_memory_bytes && !defaults.res_cpus && !defaults.res_pids &&
         !defaults.res_disk_bytes && !defaults.disabled && !defaults.network;
}

absl::StatusOr<PolicyConfig> ParsePolicyConfig(const nlohmann::json& tenant_defaults,
                                               const nlohmann::json& tenants,
                                               const std::vector<std::string>& configured,
                                               const std::string& broker_default_provider) {
  PolicyConfig pc;
  ASSIGN_OR_RETURN(pc.defaults, ParseOne(tenant_defaults, "tenant_defaults", configured));
  if (!tenants.is_null()) {
    if (!tenants.is_object()) return absl::InvalidArgumentError("tenants: must be a JSON object");
    for (auto it = tenants.begin(); it != tenants.end(); ++it) {
      const std::string& name = it.key();
      bool valid = !name.empty() && name.size() <= 64;
      for (char c : name) {
        valid =
            valid && (isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-');
      }
      if (!valid) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tenants: tenant \"", name, "\" must be 1-64 characters of [A-Za-z0-9._-]"));
      }
      ASSIGN_OR_RETURN(TenantPolicyConfig p,
                       ParseOne(it.value(), absl::StrCat("tenants.", name), configured));
      pc.tenants.emplace(name, std::move(p));
    }
  }
  // Each tenant's default provider must be one it may use.
  BrokerMaxima m;
  m.providers = configured;
  std::sort(m.providers.begin(), m.providers.end());
  m.default_provider = broker_default_provider;
  auto check = [&](const std::string& path, const std::string& tenant) -> absl::Status {
    TenantRules r = ResolveTenantRules(pc, m, tenant);
    if (!r.AllowsProvider(r.default_provider)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": default provider \"", r.default_provider, "\" is not in providers (",
          Allowed(r.providers), "); set default_provider"));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(check("tenant_defaults", ""));
  for (const auto& [name, p] : pc.tenants) {
    RETURN_IF_ERROR(check(absl::StrCat("tenants.", name), name));
  }
  return pc;
}

bool TenantRules::AllowsProvider(absl::string_view provider) const {
  return Contains(providers, provider);
}

TenantRules ResolveTenantRules(const PolicyConfig& policy, const BrokerMaxima& maxima,
                               const std::string& tenant) {
  static const TenantPolicyConfig kNone;
  auto it = policy.tenants.find(tenant);
  const TenantPolicyConfig& t = it == policy.tenants.end() ? kNone : it->second;
  const TenantPolicyConfig& d = policy.defaults;
  TenantRules r;
  r.providers = Pick(t.providers, d.providers, maxima.providers);
  r.default_provider = Pick(t.default_provider, d.default_provider, maxima.default_provider);
  r.templates = Pick(t.templates, d.templates, std::map<std::string, std::vector<std::string>>());
  const int64_t sessions = Pick<int64_t>(t.max_sessions, d.max_sessions, -1);
  r.max_sessions = sessions < 0 ? maxima.max_sessions : std::min(sessions, maxima.max_sessions);
  r.max_concurrent_runs = Pick<int64_t>(t.max_concurrent_runs, d.max_concurrent_runs, 0);
  r.max_timeout_seconds = Tighter(maxima.max_timeout_seconds,
                                  Pick<int64_t>(t.max_timeout_seconds, d.max_timeout_seconds, 0));
  r.idle_timeout_seconds =
      Tighter(maxima.idle_timeout_seconds,
              Pick<int64_t>(t.idle_timeout_seconds, d.idle_timeout_seconds, 0));
  r.max_lifetime_seconds =
      Tighter(maxima.max_lifetime_seconds,
              Pick<int64_t>(t.max_lifetime_seconds, d.max_lifetime_seconds, 0));
  r.max_output_bytes =
      Tighter(maxima.max_output_bytes, Pick<int64_t>(t.max_output_bytes, d.max_output_bytes, 0));
  r.run_rate = Pick<int64_t>(t.run_rate, d.run_rate, 0);
  r.resources.memory_bytes = Pick<int64_t>(t.res_memory_bytes, d.res_memory_bytes, 0);
  r.resources.cpus = Pick<double>(t.res_cpus, d.res_cpus, 0);
  r.resources.pids = Pick<int64_t>(t.res_pids, d.res_pids, 0);
  r.resources.disk_bytes = Pick<int64_t>(t.res_disk_bytes, d.res_disk_bytes, 0);
  r.disabled = Pick<bool>(t.disabled, d.disabled, false);
  r.network = t.network ? t.network : d.network;
  return r;
}

const TenantRules& OperatorSnapshot::For(absl::string_view tenant) const {
  auto it = rules.find(tenant);
  return it == rules.end() ? other_rules : it->second;
}

std::set<std::string> OperatorSnapshot::KnownTenants() const {
  std::set<std::string> out;
  for (const auto& [token, tenant] : tokens) out.insert(tenant);
  for (const auto& [tenant, p] : policy.tenants) out.insert(tenant);
  if (tokens.empty()) out.insert("default");
  return out;
}

std::shared_ptr<const OperatorSnapshot> MakeOperatorSnapshot(
    std::map<std::string, std::string> tokens, std::map<std::string, std::string> admin_tokens,
    PolicyConfig policy, BrokerMaxima maxima, std::string tokens_file, int64_t generation) {
  auto s = std::make_shared<OperatorSnapshot>();
  s->generation = generation;
  s->tokens.insert(tokens.begin(), tokens.end());
  s->admin_tokens.insert(admin_tokens.begin(), admin_tokens.end());
  s->policy = std::move(policy);
  std::sort(maxima.providers.begin(), maxima.providers.end());
  s->maxima = std::move(maxima);
  s->tokens_file = std::move(tokens_file);
  for (const std::string& t : s->KnownTenants()) {
    s->rules.emplace(t, ResolveTenantRules(s->policy, s->maxima, t));
  }
  s->other_rules = ResolveTenantRules(s->policy, s->maxima, "");
  return s;
}

// ---- PolicyEngine ---------------------------------------------------------

PolicyEngine::PolicyEngine(Clock* clock, std::shared_ptr<const OperatorSnapshot> initial)
    : clock_(clock), current_(std::move(initial)) {}

std::shared_ptr<const OperatorSnapshot> PolicyEngine::Current() const {
  absl::MutexLock l(&mu_);
  return current_;
}

void PolicyEngine::Swap(std::shared_ptr<const OperatorSnapshot> next) {
  absl::MutexLock l(&mu_);
  current_ = std::move(next);
}

void PolicyEngine::SetDisabled(const std::string& tenant, bool disabled) {
  absl::MutexLock l(&mu_);
  admin_disabled_[tenant] = disabled;
}

absl::Status PolicyEngine::CheckEnabled(const TenantRules& rules, const std::string& tenant) const {
  std::optional<bool> admin;
  {
    absl::MutexLock l(&mu_);
    auto it = admin_disabled_.find(tenant);
    if (it != admin_disabled_.end()) admin = it->second;
  }
  if (admin.has_value() ? *admin : rules.disabled) {
    return absl::PermissionDeniedError(
        absl::StrCat("tenant ", tenant, ": disabled (",
                     admin.has_value() ? "by an operator" : "disabled: true in the config", ")"));
  }
  return absl::OkStatus();
}

absl::Status PolicyEngine::CheckSpec(const TenantRules& rules, const std::string& tenant,
                                     const std::string& provider, const std::string& template_name,
                                     const ResourceLimits& asked, bool known) {
  if (known && !rules.AllowsProvider(provider)) {
    return RefusedBy(absl::PermissionDeniedError(
                         absl::StrCat("tenant ", tenant, ": provider \"", provider,
                                      "\" not allowed (allowed: ", Allowed(rules.providers), ")")),
                     "providers");
  }
  auto t = rules.templates.find(provider);
  if (!template_name.empty() && t != rules.templates.end() && !Contains(t->second, template_name)) {
    return RefusedBy(
        absl::PermissionDeniedError(absl::StrCat("tenant ", tenant, ": template \"", template_name,
                                                 "\" not allowed on provider \"", provider,
                                                 "\" (allowed: ", Allowed(t->second), ")")),
        "templates");
  }
  auto over = [&](const char* field, double value, double max) -> absl::Status {
    if (max > 0 && value > max) {
      return RefusedBy(absl::InvalidArgumentError(
                           absl::StrCat("tenant ", tenant, ": spec.resources.", field, " ", value,
                                        " exceeds resources.", field, " (", max, ")")),
                       "resources");
    }
    return absl::OkStatus();
  };
  const ResourceLimits& m = rules.resources;
  RETURN_IF_ERROR(over("memory_bytes", static_cast<double>(asked.memory_bytes),
                       static_cast<double>(m.memory_bytes)));
  RETURN_IF_ERROR(over("cpus", asked.cpus, m.cpus));
  RETURN_IF_ERROR(over("pids", static_cast<double>(asked.pids), static_cast<double>(m.pids)));
  RETURN_IF_ERROR(
      over("disk_bytes", static_cast<double>(asked.disk_bytes), static_cast<double>(m.disk_bytes)));
  return absl::OkStatus();
}

absl::Status PolicyEngine::CheckTimeout(const TenantRules& rules, const std::string& tenant,
                                        int64_t timeout_seconds) {
  if (timeout_seconds > rules.max_timeout_seconds) {
    return absl::InvalidArgumentError(
        absl::StrCat("tenant ", tenant, ": timeout_seconds ", timeout_seconds,
                     " exceeds max_timeout_seconds (", rules.max_timeout_seconds, ")"));
  }
  return absl::OkStatus();
}

PolicyEngine::RunSlot& PolicyEngine::RunSlot::operator=(RunSlot&& o) noexcept {
  if (this != &o) {
    if (engine_ != nullptr) engine_->EndRun(tenant_);
    engine_ = o.engine_;
    tenant_ = std::move(o.tenant_);
    o.engine_ = nullptr;
  }
  return *this;
}

PolicyEngine::RunSlot::~RunSlot() {
  if (engine_ != nullptr) engine_->EndRun(tenant_);
}

void PolicyEngine::EndRun(const std::string& tenant) {
  absl::MutexLock l(&mu_);
  auto it = running_.find(tenant);
  if (it != running_.end() && --it->second <= 0) running_.erase(it);
}

int PolicyEngine::running(const std::string& tenant) const {
  absl::MutexLock l(&mu_);
  auto it = running_.find(tenant);
  return it == running_.end() ? 0 : it->second;
}

absl::StatusOr<PolicyEngine::RunSlot> PolicyEngine::BeginRun(const TenantRules& rules,
                                                             const std::string& tenant) {
  const absl::Time now = clock_->Monotonic();
  absl::MutexLock l(&mu_);
  int& running = running_[tenant];
  if (rules.max_concurrent_runs > 0 && running >= rules.max_concurrent_runs) {
    if (running == 0) running_.erase(tenant);
    return RefusedBy(absl::ResourceExhaustedError(absl::StrCat(
                         "tenant ", tenant, ": max_concurrent_runs (", rules.max_concurrent_runs,
                         ") reached: wait for a run to finish")),
                     "max_concurrent_runs");
  }
  if (rules.run_rate > 0) {
    // A bucket of run_rate tokens, refilled at run_rate per minute.
    Bucket& b = buckets_[tenant];
    const double capacity = static_cast<double>(rules.run_rate);
    if (!b.started) {
      b.started = true;
      b.tokens = capacity;
    } else {
      b.tokens += absl::ToDoubleMinutes(now - b.refilled) * capacity;
    }
    b.tokens = std::min(b.tokens, capacity);
    b.refilled = now;
    if (b.tokens < 1.0 - 1e-9) {  // (tolerate rounding of the refill)
      if (running == 0) running_.erase(tenant);
      const double wait_s = (1.0 - b.tokens) * 60.0 / capacity;
      return RefusedBy(
          absl::ResourceExhaustedError(absl::StrCat(
              "tenant ", tenant, ": run_rate (", rules.run_rate, " per minute) exceeded: retry in ",
              static_cast<int64_t>(std::ceil(wait_s)), "s")),
          "run_rate");
    }
    b.tokens -= 1.0;
  }
  ++running;
  RunSlot slot;
  slot.engine_ = this;
  slot.tenant_ = tenant;
  return slot;
}

}  // namespace sandbox
