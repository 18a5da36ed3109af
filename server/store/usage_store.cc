#include "server/store/usage_store.h"

#include <vector>

#include "server/store/session_store.h"

namespace sandbox {

absl::StatusOr<std::unique_ptr<BufferedUsageStore>> BufferedUsageStore::Open(SessionStore* store) {
  absl::StatusOr<std::vector<UsageRow>> rows = store->LoadUsage();
  if (!rows.ok()) return rows.status();
  UsageTotals totals;
  for (const UsageRow& r : *rows) totals[{r.tenant, r.provider}].Add(r.counters);
  return std::unique_ptr<BufferedUsageStore>(
      new BufferedUsageStore(store, store->created_at(), std::move(totals)));
}

void BufferedUsageStore::Add(const std::string& tenant, const std::string& provider,
                             const UsageCounters& delta) {
  absl::MutexLock l(&mu_);
  const UsageKey key{tenant, provider};
  totals_[key].Add(delta);
  pending_[key].Add(delta);
}

UsageTotals BufferedUsageStore::Totals() {
  absl::MutexLock l(&mu_);
  return totals_;
}

size_t BufferedUsageStore::pending() const {
  absl::MutexLock l(&mu_);
  return pending_.size();
}

absl::Status BufferedUsageStore::Flush() {
  absl::MutexLock f(&flush_mu_);
  UsageTotals batch;
  {
    absl::MutexLock l(&mu_);
    batch.swap(pending_);
  }
  if (batch.empty()) return absl::OkStatus();
  std::vector<UsageRow> rows;
  rows.reserve(batch.size());
  for (const auto& [key, c] : batch) rows.push_back(UsageRow{key.first, key.second, c});
  // The write runs outside mu_: Add() never waits on the disk.
  absl::Status s = store_->AddUsage(rows);
  if (!s.ok()) {
    absl::MutexLock l(&mu_);
    for (const auto& [key, c] : batch) pending_[key].Add(c);  // next tick retries
  }
  return s;
}

}  // namespace sandbox
