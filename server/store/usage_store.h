#pragma once

// Usage counters and where they are kept beyond the process. Free of
// Prometheus and gRPC so the session store can speak it.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace sandbox {

class SessionStore;

// What a tenant used on a provider (totals, or one event's increment).
struct UsageCounters {
  int64_t sessions_created = 0;
  int64_t runs = 0;
  double run_seconds = 0;      // wall time of runs
  double sandbox_seconds = 0;  // create -> destroy, counted at close
  double cpu_seconds = 0;      // where the provider reports it
  int64_t output_bytes = 0;
  int64_t file_transfer_bytes = 0;
  int64_t oom_kills = 0;
  int64_t quota_refusals = 0;
  int64_t egress_bytes = 0;  // through a sandbox's egress point, both ways

  void Add(const UsageCounters& d) {
    sessions_created += d.sessions_created;
    runs += d.runs;
    run_seconds += d.run_seconds;
    sandbox_seconds += d.sandbox_seconds;
    cpu_seconds += d.cpu_seconds;
    output_bytes += d.output_bytes;
    file_transfer_bytes += d.file_transfer_bytes;
    oom_kills += d.oom_kills;
    quota_refusals += d.quota_refusals;
    egress_bytes += d.egress_bytes;
  }
};

using UsageKey = std::pair<std::string, std::string>;  // (tenant, provider)
using UsageTotals = std::map<UsageKey, UsageCounters>;

// Where usage is kept beyond the process: Add() is called with each
// increment as it happens (it must be cheap: it is on the request path);
// Totals() gives the totals since the store was created.
class UsageStore {
 public:
  virtual ~UsageStore() = default;
  virtual void Add(const std::string& tenant, const std::string& provider,
                   const UsageCounters& delta) = 0;
  virtual UsageTotals Totals() = 0;
  // When the store began counting.
  virtual absl::Time created_at() const = 0;
};

// The UsageStore over a SessionStore: Add() only adds to memory; Flush()
// writes what was added since the last flush in one store transaction (the
// SQLite store upserts, adding each delta to its row). The broker calls
// Flush() on its once-a-second reaper tick and at shutdown, so a kill -9
// loses at most the increments of the last tick. A failed flush keeps the
// deltas for the next one. Thread-safe.
class BufferedUsageStore final : public UsageStore {
 public:
  // Loads the totals `store` holds. `store` must outlive the result.
  static absl::StatusOr<std::unique_ptr<BufferedUsageStore>> Open(SessionStore* store);

  void Add(const std::string& tenant, const std::string& provider,
           const UsageCounters& delta) override ABSL_LOCKS_EXCLUDED(mu_);
  // Persisted totals plus what is still buffered.
  UsageTotals Totals() override ABSL_LOCKS_EXCLUDED(mu_);
  absl::Time created_at() const override { return created_at_; }

  // Writes the buffered deltas (none: no write). Serialized with itself.
  absl::Status Flush() ABSL_LOCKS_EXCLUDED(mu_, flush_mu_);
  // Rows buffered and not yet written (for tests and logs).
  size_t pending() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  BufferedUsageStore(SessionStore* store, absl::Time created_at, UsageTotals totals)
      : store_(store), created_at_(created_at), totals_(std::move(totals)) {}

  SessionStore* const store_;
  const absl::Time created_at_;
  absl::Mutex flush_mu_;  // one flush at a time, so deltas are written once
  mutable absl::Mutex mu_ ABSL_ACQUIRED_AFTER(flush_mu_);
  UsageTotals totals_ ABSL_GUARDED_BY(mu_);
  UsageTotals pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sandbox
