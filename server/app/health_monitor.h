#pragma once

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "adapters/api/registry.h"
#include "common/clock.h"

namespace sandbox {

// Probes each usable provider (Provider::CheckHealth) every `interval` and
// remembers whether it can run code, so health tells the truth: a local
// provider that can no longer fork or create namespaces, or a remote API
// that is down, turns its health service NOT_SERVING within one interval,
// and back when it recovers. Each change is logged with its reason.
//
// Time comes from the injected clock: RunOnce probes only the providers
// whose last probe is at least `interval` old, so tests drive it with a
// FakeClock and explicit RunOnce calls. Thread-safe.
class HealthMonitor {
 public:
  HealthMonitor(ProviderRegistry* providers, Clock* clock, absl::Duration interval);

  // Probes every provider that is due (all of them on the first call).
  // Returns true when any provider's state changed.
  bool RunOnce();

  // The last probe's verdict; true before the first probe (a provider has
  // just passed its startup checks). Unknown names: false.
  bool Healthy(const std::string& provider) const;
  // Why the last probe failed ("" when healthy).
  std::string Reason(const std::string& provider) const;

  absl::Duration interval() const { return interval_; }

 private:
  struct State {
    bool healthy = true;
    std::string reason;
    absl::Time last_probe = absl::InfinitePast();
  };

  ProviderRegistry* const providers_;
  Clock* const clock_;
  const absl::Duration interval_;
  // Serializes probes (RunOnce from the probe thread and from tests).
  absl::Mutex probe_mu_;
  mutable absl::Mutex mu_;
  std::map<std::string, State> state_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sandbox
