// The memory store: the same contract as the SQLite store, nothing durable.

#include <map>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/text.h"
#include "server/store/session_store.h"

namespace sandbox {

namespace {
constexpr absl::string_view kOwnershipLostUrl = "type.sandbox-broker.dev/ownership-lost";
}  // namespace

absl::Status OwnershipLost(std::string message) {
  absl::Status s = absl::FailedPreconditionError(std::move(message));
  s.SetPayload(kOwnershipLostUrl, absl::Cord());
  return s;
}

bool IsOwnershipLost(const absl::Status& status) {
  return status.GetPayload(kOwnershipLostUrl).has_value();
}
namespace {

class MemoryStore final : public SessionStore {
 public:
  explicit MemoryStore(std::string deployment_id)
      : deployment_id_(deployment_id.empty() ? absl::StrCat("dep-", RandomHex(8))
                                             : std::move(deployment_id)),
        created_at_(absl::Now()) {}

  std::string backend() const override { return "memory"; }
  bool durable() const override { return false; }

  std::string deployment_id() const override {
    absl::MutexLock l(&mu_);
    return deployment_id_;
  }
  absl::Status SetDeploymentId(const std::string& id) override {
    absl::MutexLock l(&mu_);
    deployment_id_ = id;
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<SessionRecord>> LoadSessions() override {
    absl::MutexLock l(&mu_);
    std::vector<SessionRecord> out;
    for (const auto& [k, r] : sessions_) out.push_back(r);
    return out;
  }
  absl::Status PutSession(const SessionRecord& r) override {
    absl::MutexLock l(&mu_);
    sessions_[{r.tenant, r.session_id}] = r;
    return absl::OkStatus();
  }
  absl::Status PutSessions(const std::vector<SessionRecord>& records) override {
    absl::MutexLock l(&mu_);
    for (const SessionRecord& r : records) sessions_[{r.tenant, r.session_id}] = r;
    return absl::OkStatus();
  }
  absl::Status DeleteSession(const std::string& tenant, const std::string& id) override {
    absl::MutexLock l(&mu_);
    sessions_.erase({tenant, id});
    auto it = runs_.lower_bound({tenant, id, ""});
    while (it != runs_.end() && std::get<0>(it->first) == tenant && std::get<1>(it->first) == id) {
      it = runs_.erase(it);
    }
    return absl::OkStatus();
  }
  absl::Status TouchSessions(const std::vector<Touch>& touches) override {
    absl::MutexLock l(&mu_);
    for (const Touch& t : touches) {
      auto it = sessions_.find({t.tenant, t.session_id});
      if (it != sessions_.end()) it->second.last_active_at = t.last_active_at;
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<RunRecord>> LoadRuns() override {
    absl::MutexLock l(&mu_);
    std::vector<RunRecord> out;
    for (const auto& [k, r] : runs_) out.push_back(r);
    return out;
  }
  absl::Status PutRun(const RunRecord& r) override {
    absl::MutexLock l(&mu_);
    runs_[{r.tenant, r.session_id, r.run_id}] = r;
    return absl::OkStatus();
  }
  absl::Status DeleteRun(const std::string& tenant, const std::string& id,
                         const std::string& run_id) override {
    absl::MutexLock l(&mu_);
    runs_.erase({tenant, id, run_id});
    return absl::OkStatus();
  }
  absl::Status AddUsage(const std::vector<UsageRow>& deltas) override {
    absl::MutexLock l(&mu_);
    for (const UsageRow& d : deltas) usage_[{d.tenant, d.provider}].Add(d.counters);
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<UsageRow>> LoadUsage() override {
    absl::MutexLock l(&mu_);
    std::vector<UsageRow> out;
    for (const auto& [k, c] : usage_) out.push_back(UsageRow{k.first, k.second, c});
    return out;
  }
  absl::Time created_at() const override { return created_at_; }

 private:
  mutable absl::Mutex mu_;
  std::string deployment_id_ ABSL_GUARDED_BY(mu_);
  const absl::Time created_at_;
  UsageTotals usage_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>, SessionRecord> sessions_ ABSL_GUARDED_BY(mu_);
  std::map<std::tuple<std::string, std::string, std::string>, RunRecord> runs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<SessionStore> NewMemoryStore(std::string deployment_id) {
  return std::make_unique<MemoryStore>(std::move(deployment_id));
}

}  // namespace sandbox
