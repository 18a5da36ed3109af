#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/registry.h"

namespace sandbox {

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

  void Add(const UsageCounters& d);
};

using UsageKey = std::pair<std::string, std::string>;  // (tenant, provider)

// Where usage is kept beyond the process: the seam for the durable session
// store. Add() is called with each increment as it happens; Totals() gives
// the totals since the store was created.
class UsageStore {
 public:
  virtual ~UsageStore() = default;
  virtual void Add(const std::string& tenant, const std::string& provider,
                   const UsageCounters& delta) = 0;
  virtual std::map<UsageKey, UsageCounters> Totals() = 0;
};

// Usage metering per tenant and provider, counted as it happens: totals since
// start for GetUsage, and the same as Prometheus counters whose `tenant`
// label is bounded by the configured tenants (others fold into "other").
//
// Thread-safe.
class UsageMeter {
 public:
  // `registry` and `store` may be null.
  UsageMeter(prometheus::Registry* registry, UsageStore* store, absl::Time since);
  ~UsageMeter();

  // The tenants that get their own label value (the rest are "other").
  void SetKnownTenants(std::set<std::string> tenants);

  void Record(const std::string& tenant, const std::string& provider, const UsageCounters& delta);

  // Totals since start, of one tenant or (empty) all, by (tenant, provider).
  std::map<UsageKey, UsageCounters> Totals(const std::string& tenant = "") const;
  absl::Time since() const { return since_; }

  static constexpr char kOtherTenant[] = "other";

 private:
  struct Families;
  std::string LabelFor(const std::string& tenant) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  UsageStore* const store_;
  const absl::Time since_;
  std::unique_ptr<Families> families_;
  mutable absl::Mutex mu_;
  std::set<std::string> known_ ABSL_GUARDED_BY(mu_);
  std::map<UsageKey, UsageCounters> totals_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sandbox

#include "server/audit.h"
#include "server/session_manager.h"

namespace sandbox {

// Meters and audits session lifecycle events: sessions created, sandbox
// seconds at close, and one audit line per created/adopted/closed session.
class SessionAccounting final : public SessionObserver {
 public:
  // Either may be null.
  SessionAccounting(UsageMeter* usage, AuditLog* audit) : usage_(usage), audit_(audit) {}
  void SessionCreated(const SessionView& v) override;
  void SessionAdopted(const SessionView& v) override;
  void SessionClosed(const SessionView& v, CloseReason reason, absl::Duration age) override;

 private:
  void Audit(const char* event, const SessionView& v, const char* reason);
  UsageMeter* const usage_;
  AuditLog* const audit_;
};

}  // namespace sandbox
