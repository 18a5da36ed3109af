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
#include "server/store/usage_store.h"

namespace sandbox {

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

  // Totals since the store was created, of one tenant or (empty) all; empty
  // without a store.
  UsageTotals StoreTotals(const std::string& tenant = "") const;
  // When the store began counting (InfinitePast without a store).
  absl::Time store_since() const;
  bool has_store() const { return store_ != nullptr; }

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

#include "server/sessions/session_manager.h"
#include "server/telemetry/audit.h"

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
