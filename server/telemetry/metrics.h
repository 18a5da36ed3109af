#pragma once

#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace sandbox {

// The broker's Prometheus metrics (names follow Prometheus conventions:
// base units, _total for counters). No session ids as label values: label
// sets stay bounded by tenants x providers x methods x codes.
//
// Thread-safe.
class Metrics {
 public:
  ~Metrics();
  Metrics();
  // A process-wide sink that nothing exposes: for parts built without the
  // broker's metrics (tests, tools), so no caller checks for null.
  static Metrics* Discard();

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  void SessionCreated(const std::string& provider, const std::string& tenant, absl::Duration took);
  void SessionCreateFailed(const std::string& provider, const std::string& code);
  // A session loaded from the store at startup (counts as live).
  void SessionRecovered(const std::string& provider, const std::string& tenant);
  void SessionClosed(const std::string& provider, const std::string& tenant,
                     absl::string_view reason);
  // One RPC. `provider` may be empty (calls without a session).
  void CallStarted(const std::string& method);
  void CallFinished(const std::string& method, const std::string& provider, const std::string& code,
                    absl::Duration took);
  void ProviderError(const std::string& provider, const std::string& code);
  void RunFinished(const std::string& provider, size_t output_bytes, bool timed_out);
  // A provider running in a weaker mode (gauge = 1, reason as a label).
  void ProviderDegraded(const std::string& provider, const std::string& reason);
  // A run's process killed by its sandbox's memory limit.
  void OomKilled(const std::string& provider);
  // A write refused by a sandbox quota (`what`: "disk").
  void QuotaHit(const std::string& provider, const std::string& what);
  // Backpressure (docs/operations.md): a call refused by `limit` (its config
  // key), and a limit's current slots in use and calls queued.
  void LimitRefused(const std::string& limit);
  void LimitState(const std::string& limit, int64_t in_use, int64_t queued);
  // max_concurrent_runs_per_tenant, per tenant: runs holding a slot and
  // calls waiting for one (LimitState has the sums), and refusals.
  void TenantRunLimit(const std::string& tenant, int64_t in_use, int64_t queued);
  void TenantRunRefused(const std::string& tenant);
  // Warm pools (server/sessions/warm_pool.h): ready members now; a session that took
  // one; a session that created instead (`reason`: "empty" or "mismatch").
  void PoolSize(const std::string& provider, int64_t ready);
  // A provider's host-wide capacity (0 = no limit) and what its sandboxes
  // reserve of it (providers.local.capacity).
  void Capacity(const std::string& provider, const std::string& resource, int64_t capacity,
                int64_t in_use);
  void PoolHit(const std::string& provider);
  void PoolMiss(const std::string& provider, const std::string& reason);
  // Network policies (docs/network.md).
  void EgressDecision(const std::string& provider, bool allowed, bool dns);
  void EgressBytes(const std::string& provider, int64_t out, int64_t in);

 private:
  // Cached handles, keyed by their label values joined with '\x1f': the
  // per-call path looks one up instead of building a label map each time.
  prometheus::Counter& CallCounter(const std::string& method, const std::string& code);
  prometheus::Histogram& CallHistogram(const std::string& provider, const std::string& method);
  prometheus::Gauge& InFlight(const std::string& method);
  struct Cache;
  std::unique_ptr<Cache> cache_;

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Gauge>& sessions_;
  prometheus::Family<prometheus::Counter>& creates_;
  prometheus::Family<prometheus::Counter>& create_failures_;
  prometheus::Family<prometheus::Counter>& closes_;
  prometheus::Family<prometheus::Histogram>& create_seconds_;
  prometheus::Family<prometheus::Counter>& calls_;
  prometheus::Family<prometheus::Histogram>& call_seconds_;
  prometheus::Family<prometheus::Gauge>& in_flight_;
  prometheus::Family<prometheus::Counter>& provider_errors_;
  prometheus::Family<prometheus::Counter>& output_bytes_;
  prometheus::Family<prometheus::Counter>& timeouts_;
  prometheus::Family<prometheus::Counter>& oom_kills_;
  prometheus::Family<prometheus::Counter>& quota_hits_;
  prometheus::Family<prometheus::Counter>& limit_refusals_;
  prometheus::Family<prometheus::Gauge>& limit_in_use_;
  prometheus::Family<prometheus::Gauge>& limit_queued_;
  prometheus::Family<prometheus::Gauge>& tenant_runs_in_use_;
  prometheus::Family<prometheus::Gauge>& tenant_runs_queued_;
  prometheus::Family<prometheus::Counter>& tenant_run_refusals_;
  prometheus::Family<prometheus::Gauge>& degraded_;
  prometheus::Family<prometheus::Gauge>& pool_size_;
  prometheus::Family<prometheus::Gauge>& capacity_;
  prometheus::Family<prometheus::Gauge>& capacity_in_use_;
  prometheus::Family<prometheus::Counter>& pool_hits_;
  prometheus::Family<prometheus::Counter>& pool_misses_;
  prometheus::Family<prometheus::Counter>& egress_connections_;
  prometheus::Family<prometheus::Counter>& egress_bytes_;
};

}  // namespace sandbox
