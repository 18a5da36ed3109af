#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "adapters/api/pool_config.h"
#include "adapters/api/provider.h"
#include "common/clock.h"
#include "server/telemetry/metrics.h"

namespace sandbox {

// A warm pool (providers.<name>.pool): a Provider that wraps a remote one
// and keeps `size` ready sandboxes ("members") made from a pool spec: this
// deployment's tag, kPoolTag = this pool instance, a pool attempt id, the
// pool's template, python. Registered under the wrapped provider's name.
//
// Create(spec) for a session hands out the oldest member when the wrapped
// provider says it can serve the spec (Provider::CanClaim: same template,
// no resources, on Daytona the same language) and Claim succeeds (the
// session's timeout, and tags where the provider can change them); else
// it creates as usual. A member serves at most one session and is never
// given back: the session destroys it like any sandbox.
//
// Refill() replaces members older than max_age and creates until `size`
// members are ready, at most max_concurrent_creates at once; the
// background thread (Start with `thread`) calls it whenever a member is
// taken or ages out. Tests call Refill() themselves with an injected clock.
//
// The orphan sweep (SessionManager::SweepOrphans) sees this pool through
// ListOwned: ready members and members being created are left out; members
// claimed by this process are listed as their session's (its attempt id),
// so the window between a claim and the session's ready row is covered.
// Another pool instance's members (a dead process's) are listed as they are
// and swept like any orphan.
//
// Stop() (and the destructor) destroys the unclaimed members.
//
// Thread-safe.
class WarmPool final : public Provider {
 public:
  struct Options {
    int64_t size = 0;
    std::string template_name;  // empty = the provider's default
    absl::Duration max_age = absl::Hours(1);
    int max_concurrent_creates = 4;
    Clock* clock = Clock::Real();  // members' ages
  };
  WarmPool(std::unique_ptr<Provider> inner, Options options);
  WarmPool(std::unique_ptr<Provider> inner, const PoolConfig& config);
  ~WarmPool() override;

  // Who the members belong to; before the first Refill. `metrics` may be
  // null. With `thread`, a background thread keeps the pool full.
  void Start(const std::string& deployment_id, const std::string& instance_id, Metrics* metrics,
             bool thread);
  // Replaces members past max_age, then creates until full (or a create
  // fails, or Stop). Blocks until done; one Refill at a time. False when a
  // create failed.
  bool Refill();
  // Stops refilling and destroys the unclaimed members. Idempotent.
  void Stop();

  // Ready members now.
  int64_t ready() const;
  const Options& options() const { return options_; }
  Provider* inner() const { return inner_.get(); }

  // ---- Provider ----
  absl::string_view name() const override { return inner_->name(); }
  absl::StatusOr<std::unique_ptr<Sandbox>> Create(const SandboxSpec& spec) override;
  // A claim on the blocking pool (a short provider call); a miss creates
  // with the wrapped provider's CreateAsync (no thread waits).
  void CreateAsync(SandboxSpec spec, SandboxDone done) override;
  void AttachAsync(std::string sandbox_id, SandboxSpec spec, SandboxDone done) override {
    inner_->AttachAsync(std::move(sandbox_id), std::move(spec), std::move(done));
  }
  std::string Degraded() const override { return inner_->Degraded(); }
  void SetHooks(ProviderHooks hooks) override { inner_->SetHooks(std::move(hooks)); }
  absl::Status CheckHealth() override { return inner_->CheckHealth(); }
  absl::StatusOr<std::unique_ptr<Sandbox>> Attach(const std::string& sandbox_id,
                                                  const SandboxSpec& spec) override {
    return inner_->Attach(sandbox_id, spec);
  }
  absl::StatusOr<std::vector<OwnedSandbox>> ListOwned(const std::string& deployment_id) override;
  bool CanClaim(const SandboxSpec& member, const SandboxSpec& session) const override {
    return inner_->CanClaim(member, session);
  }
  absl::StatusOr<std::unique_ptr<Sandbox>> Claim(Sandbox* member,
                                                 const SandboxSpec& session) override {
    return inner_->Claim(member, session);
  }

 private:
  struct Member {
    std::unique_ptr<Sandbox> sandbox;
    std::string attempt_id;
    absl::Time created;  // options_.clock->Monotonic()
  };
  // A member handed to a session: how ListOwned shows it.
  struct Claimed {
    std::string attempt_id;
    std::string tenant;
    std::string session_id;
    int64_t seq = 0;  // claims_ when it was claimed
  };

  // A member claimed for `spec` (or the claim's error), or nullopt (a miss,
  // counted) when no member serves it. Blocks only to claim or destroy.
  std::optional<absl::StatusOr<std::unique_ptr<Sandbox>>> TakeMember(const SandboxSpec& spec);
  SandboxSpec MemberSpec(const std::string& attempt_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishSizeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Miss(const char* reason);
  void Loop();
  // Destroys them, up to max_concurrent_creates at once.
  void DestroyAll(std::vector<std::unique_ptr<Sandbox>> sandboxes, const char* why);

  const std::unique_ptr<Provider> inner_;
  const Options options_;
  absl::Mutex stop_mu_;    // one Stop at a time
  absl::Mutex refill_mu_;  // one Refill at a time

  mutable absl::Mutex mu_;
  absl::CondVar wake_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool kick_ ABSL_GUARDED_BY(mu_) = false;  // a member was taken: refill
  std::string deployment_id_ ABSL_GUARDED_BY(mu_);
  std::string instance_id_ ABSL_GUARDED_BY(mu_);
  Metrics* metrics_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::deque<Member> ready_ ABSL_GUARDED_BY(mu_);                // oldest first
  std::set<std::string> creating_ ABSL_GUARDED_BY(mu_);          // attempt ids
  std::map<std::string, Claimed> claimed_ ABSL_GUARDED_BY(mu_);  // by sandbox id
  int64_t claims_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace sandbox
