#include "server/operators/usage.h"

namespace sandbox {

struct UsageMeter::Families {
  explicit Families(prometheus::Registry& r)
      : sessions(Build(r, "sandbox_broker_tenant_sessions_created_total",
                       "Sessions created, per tenant and provider")),
        runs(Build(r, "sandbox_broker_tenant_runs_total", "Runs, per tenant and provider")),
        run_seconds(Build(r, "sandbox_broker_tenant_run_seconds_total",
                          "Wall seconds of runs, per tenant and provider")),
        sandbox_seconds(
            Build(r, "sandbox_broker_tenant_sandbox_seconds_total",
                  "Sandbox lifetime seconds (create to destroy), per tenant and provider")),
        cpu_seconds(Build(r, "sandbox_broker_tenant_cpu_seconds_total",
                          "CPU seconds where the provider reports them, per tenant and provider")),
        output_bytes(Build(r, "sandbox_broker_tenant_output_bytes_total",
                           "Run output bytes, per tenant and provider")),
        file_bytes(Build(r, "sandbox_broker_tenant_file_transfer_bytes_total",
                         "WriteFile/ReadFile bytes, per tenant and provider")),
        oom_kills(Build(r, "sandbox_broker_tenant_oom_kills_total",
                        "Runs hit by the memory limit, per tenant and provider")),
        quota_refusals(Build(r, "sandbox_broker_tenant_quota_refusals_total",
                             "Calls refused by a quota or rate, per tenant and provider")),
        egress_bytes(Build(r, "sandbox_broker_tenant_egress_bytes_total",
                           "Bytes through sandboxes' egress points (both ways), per tenant and "
                           "provider")) {}
  static prometheus::Family<prometheus::Counter>& Build(prometheus::Registry& r, const char* name,
                                                        const char* help) {
    return prometheus::BuildCounter().Name(name).Help(help).Register(r);
  }
  prometheus::Family<prometheus::Counter>& sessions;
  prometheus::Family<prometheus::Counter>& runs;
  prometheus::Family<prometheus::Counter>& run_seconds;
  prometheus::Family<prometheus::Counter>& sandbox_seconds;
  prometheus::Family<prometheus::Counter>& cpu_seconds;
  prometheus::Family<prometheus::Counter>& output_bytes;
  prometheus::Family<prometheus::Counter>& file_bytes;
  prometheus::Family<prometheus::Counter>& oom_kills;
  prometheus::Family<prometheus::Counter>& quota_refusals;
  prometheus::Family<prometheus::Counter>& egress_bytes;
};

UsageMeter::UsageMeter(prometheus::Registry* registry, UsageStore* store, absl::Time since)
    : store_(store), since_(since) {
  if (registry != nullptr) families_ = std::make_unique<Families>(*registry);
}

UsageMeter::~UsageMeter() = default;

void UsageMeter::SetKnownTenants(std::set<std::string> tenants) {
  absl::MutexLock l(&mu_);
  known_ = std::move(tenants);
}

std::string UsageMeter::LabelFor(const std::string& tenant) const {
  return known_.count(tenant) != 0 ? tenant : std::string(kOtherTenant);
}

void UsageMeter::Record(const std::string& tenant, const std::string& provider,
                        const UsageCounters& d) {
  const std::string p = provider.empty() ? std::string("-") : provider;
  std::string label;
  {
    absl::MutexLock l(&mu_);
    totals_[{tenant, p}].Add(d);
    label = LabelFor(tenant);
  }
  if (store_ != nullptr) store_->Add(tenant, p, d);
  if (families_ == nullptr) return;
  const std::map<std::string, std::string> labels{{"tenant", label}, {"provider", p}};
  auto inc = [&labels](prometheus::Family<prometheus::Counter>& f, double v) {
    if (v > 0) f.Add(labels).Increment(v);
  };
  inc(families_->sessions, static_cast<double>(d.sessions_created));
  inc(families_->runs, static_cast<double>(d.runs));
  inc(families_->run_seconds, d.run_seconds);
  inc(families_->sandbox_seconds, d.sandbox_seconds);
  inc(families_->cpu_seconds, d.cpu_seconds);
  inc(families_->output_bytes, static_cast<double>(d.output_bytes));
  inc(families_->file_bytes, static_cast<double>(d.file_transfer_bytes));
  inc(families_->oom_kills, static_cast<double>(d.oom_kills));
  inc(families_->quota_refusals, static_cast<double>(d.quota_refusals));
  inc(families_->egress_bytes, static_cast<double>(d.egress_bytes));
}

namespace {
UsageTotals OfTenant(const UsageTotals& all, const std::string& tenant) {
  if (tenant.empty()) return all;
  UsageTotals out;
  for (auto it = all.lower_bound({tenant, ""}); it != all.end() && it->first.first == tenant;
       ++it) {
    out.insert(*it);
  }
  return out;
}
}  // namespace

std::map<UsageKey, UsageCounters> UsageMeter::Totals(const std::string& tenant) const {
  absl::MutexLock l(&mu_);
  return OfTenant(totals_, tenant);
}

UsageTotals UsageMeter::StoreTotals(const std::string& tenant) const {
  if (store_ == nullptr) return {};
  return OfTenant(store_->Totals(), tenant);
}

absl::Time UsageMeter::store_since() const {
  return store_ != nullptr ? store_->created_at() : absl::InfinitePast();
}

}  // namespace sandbox

namespace sandbox {

void SessionAccounting::Audit(const char* event, const SessionView& v, const char* reason) {
  if (audit_ == nullptr) return;
  AuditEvent e;
  e.event = event;
  e.tenant = v.tenant;
  e.session_id = v.session_id;
  e.provider = v.provider;
  e.sandbox_id = v.sandbox_id;
  if (reason != nullptr) e.fields["reason"] = reason;
  audit_->Record(e);
}

void SessionAccounting::SessionCreated(const SessionView& v) {
  if (usage_ != nullptr) {
    UsageCounters d;
    d.sessions_created = 1;
    usage_->Record(v.tenant, v.provider, d);
  }
  Audit("session.created", v, nullptr);
}

void SessionAccounting::SessionAdopted(const SessionView& v) {
  Audit("session.adopted", v, nullptr);
}

void SessionAccounting::SessionClosed(const SessionView& v, CloseReason reason,
                                      absl::Duration age) {
  if (usage_ != nullptr) {
    UsageCounters d;
    d.sandbox_seconds = absl::ToDoubleSeconds(age);
    // The sandbox's own accounting (local: cgroup cpu.stat), read just
    // before destroy; providers that report none count 0.
    if (v.usage) d.cpu_seconds = v.usage->cpu_seconds;
    usage_->Record(v.tenant, v.provider, d);
  }
  Audit("session.closed", v, std::string(CloseReasonName(reason)).c_str());
}

}  // namespace sandbox
