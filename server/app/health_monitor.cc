#include "server/app/health_monitor.h"

#include "common/log.h"

namespace sandbox {

HealthMonitor::HealthMonitor(ProviderRegistry* providers, Clock* clock, absl::Duration interval)
    : providers_(providers), clock_(clock), interval_(interval) {
  absl::MutexLock l(&mu_);
  for (const auto& name : providers_->Names()) state_[name] = State{};
}

bool HealthMonitor::RunOnce() {
  absl::MutexLock probing(&probe_mu_);
  bool changed = false;
  for (const auto& name : providers_->Names()) {
    const absl::Time now = clock_->Monotonic();
    {
      absl::MutexLock l(&mu_);
      if (now - state_[name].last_probe < interval_) continue;
    }
    absl::StatusOr<Provider*> p = providers_->Find(name);
    absl::Status s = p.ok() ? (*p)->CheckHealth() : p.status();
    absl::MutexLock l(&mu_);
    State& st = state_[name];
    st.last_probe = now;
    if (s.ok() != st.healthy) {
      changed = true;
      if (s.ok()) {
        Log(LogLevel::kInfo, "provider.healthy",
            {{"provider", name}, {"message", "health probe passes again: SERVING"}});
      } else {
        Log(LogLevel::kError, "provider.unhealthy",
            {{"provider", name},
             {"code", absl::StatusCodeToString(s.code())},
             {"reason", s.message()},
             {"message", "health probe failed: NOT_SERVING until it passes"}});
      }
    } else if (!s.ok() && std::string(s.message()) != st.reason) {
      Log(LogLevel::kWarning, "provider.still_unhealthy",
          {{"provider", name}, {"reason", s.message()}});
    }
    st.healthy = s.ok();
    st.reason = s.ok() ? "" : std::string(s.message());
  }
  return changed;
}

bool HealthMonitor::Healthy(const std::string& provider) const {
  absl::MutexLock l(&mu_);
  auto it = state_.find(provider);
  return it != state_.end() && it->second.healthy;
}

std::string HealthMonitor::Reason(const std::string& provider) const {
  absl::MutexLock l(&mu_);
  auto it = state_.find(provider);
  return it == state_.end() ? "unknown provider" : it->second.reason;
}

}  // namespace sandbox
