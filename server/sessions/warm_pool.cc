#include "server/sessions/warm_pool.h"

#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "common/event_loop.h"
#include "common/log.h"
#include "common/text.h"

namespace sandbox {
namespace {

WarmPool::Options OptionsOf(const PoolConfig& c) {
  WarmPool::Options o;
  o.size = c.size;
  o.template_name = c.template_name;
  o.max_age = absl::Seconds(c.max_age_seconds);
  o.max_concurrent_creates = static_cast<int>(c.max_concurrent_creates);
  return o;
}

}  // namespace

WarmPool::WarmPool(std::unique_ptr<Provider> inner, Options options)
    : inner_(std::move(inner)), options_(std::move(options)) {}

WarmPool::WarmPool(std::unique_ptr<Provider> inner, const PoolConfig& config)
    : WarmPool(std::move(inner), OptionsOf(config)) {}

WarmPool::~WarmPool() { Stop(); }

void WarmPool::Start(const std::string& deployment_id, const std::string& instance_id,
                     Metrics* metrics, bool thread) {
  {
    absl::MutexLock l(&mu_);
    if (started_ || stopping_) return;
    started_ = true;
    deployment_id_ = deployment_id;
    instance_id_ = instance_id.empty() ? absl::StrCat("pool-", RandomHex(6)) : instance_id;
    metrics_ = metrics;
    PublishSizeLocked();
  }
  Log(LogLevel::kInfo, "pool.started",
      {{"provider", name()},
       {"size", options_.size},
       {"template", options_.template_name},
       {"max_age_seconds", absl::ToInt64Seconds(options_.max_age)},
       {"max_concurrent_creates", options_.max_concurrent_creates}});
  if (thread) thread_ = std::thread([this] { Loop(); });
}

SandboxSpec WarmPool::MemberSpec(const std::string& attempt_id) const {
  SandboxSpec s;
  s.broker_instance_id = instance_id_;
  s.template_name = options_.template_name;
  s.language = Language::kPython;
  s.deployment_id = deployment_id_;
  s.attempt_id = attempt_id;
  s.pool = instance_id_;
  s.keep_unclaimed = options_.max_age;
  return s;
}

void WarmPool::PublishSizeLocked() {
  if (metrics_ != nullptr) {
    metrics_->PoolSize(std::string(name()), static_cast<int64_t>(ready_.size()));
  }
}

void WarmPool::Miss(const char* reason) {
  Metrics* m;
  {
    absl::MutexLock l(&mu_);
    m = metrics_;
  }
  if (m != nullptr) m->PoolMiss(std::string(name()), reason);
}

int64_t WarmPool::ready() const {
  absl::MutexLock l(&mu_);
  return static_cast<int64_t>(ready_.size());
}

void WarmPool::DestroyAll(std::vector<std::unique_ptr<Sandbox>> sandboxes, const char* why) {
  if (sandboxes.empty()) return;
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next++) < sandboxes.size();) {
      const std::string id = sandboxes[i]->id();
      const absl::Status st = sandboxes[i]->Destroy();
      Log(st.ok() ? LogLevel::kInfo : LogLevel::kWarning, "pool.member_destroyed",
          {{"provider", name()},
           {"sandbox_id", id},
           {"why", why},
           {"result", st.ok() ? std::string("ok") : std::string(st.message())}});
      sandboxes[i].reset();
    }
  };
  const size_t n = std::min<size_t>(sandboxes.size(), options_.max_concurrent_creates);
  std::vector<std::thread> threads;
  for (size_t i = 1; i < n; ++i) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
}

bool WarmPool::Refill() {
  absl::MutexLock refill(&refill_mu_);
  std::vector<std::unique_ptr<Sandbox>> old;
  size_t workers = 0;
  {
    absl::MutexLock l(&mu_);
    if (!started_ || stopping_) return true;
    const absl::Time now = options_.clock->Monotonic();
    while (!ready_.empty() && now - ready_.front().created >= options_.max_age) {
      old.push_back(std::move(ready_.front().sandbox));
      ready_.pop_front();
    }
    if (!old.empty()) PublishSizeLocked();
    const int64_t deficit = options_.size - static_cast<int64_t>(ready_.size() + creating_.size());
    workers = static_cast<size_t>(std::clamp<int64_t>(deficit, 0, options_.max_concurrent_creates));
  }
  std::atomic<bool> failed{false};
  auto work = [this, &failed] {
    while (true) {
      std::string attempt;
      SandboxSpec spec;
      {
        absl::MutexLock l(&mu_);
        if (stopping_ || failed.load() ||
            static_cast<int64_t>(ready_.size() + creating_.size()) >= options_.size) {
          return;
        }
        attempt = absl::StrCat("pool-", RandomHex(8));
        creating_.insert(attempt);
        spec = MemberSpec(attempt);
      }
      absl::StatusOr<std::unique_ptr<Sandbox>> sb = inner_->Create(spec);
      std::unique_ptr<Sandbox> discard;
      {
        absl::MutexLock l(&mu_);
        creating_.erase(attempt);
        if (sb.ok() && stopping_) {
          discard = std::move(*sb);
        } else if (sb.ok()) {
          ready_.push_back({std::move(*sb), attempt, options_.clock->Monotonic()});
          PublishSizeLocked();
        }
      }
      if (discard) (void)discard->Destroy();
      if (!sb.ok()) {
        failed = true;
        Log(LogLevel::kWarning, "pool.create_failed",
            {{"provider", name()},
             {"code", absl::StatusCodeToString(sb.status().code())},
             {"error", sb.status().message()}});
        return;
      }
    }
  };
  // The old members are destroyed while their replacements are created.
  std::thread destroyer;
  if (!old.empty()) {
    destroyer = std::thread([this, &old] { DestroyAll(std::move(old), "max_age"); });
  }
  std::vector<std::thread> threads;
  for (size_t i = 1; i < workers; ++i) threads.emplace_back(work);
  if (workers > 0) work();
  for (auto& t : threads) t.join();
  if (destroyer.joinable()) destroyer.join();
  return !failed.load();
}

void WarmPool::Loop() {
  Clock* real = Clock::Real();
  absl::Duration backoff = absl::ZeroDuration();
  while (true) {
    const bool ok = Refill();
    backoff = ok ? absl::ZeroDuration()
                 : std::min(std::max(backoff * 2, absl::Seconds(1)), absl::Seconds(60));
    absl::MutexLock l(&mu_);
    if (backoff > absl::ZeroDuration()) {
      // The provider failed: wait it out, whatever is taken meanwhile.
      const absl::Time until = real->Monotonic() + backoff;
      while (!stopping_ && real->Monotonic() < until) {
        wake_.WaitWithTimeout(&mu_, until - real->Monotonic());
      }
    } else {
      // Until a member is taken, the oldest ages out, or Stop.
      while (!stopping_ && !kick_) {
        absl::Duration wait = absl::Seconds(60);
        if (!ready_.empty()) {
          wait = std::min(wait,
                          ready_.front().created + options_.max_age - options_.clock->Monotonic());
        }
        if (wait <= absl::ZeroDuration()) break;
        wake_.WaitWithTimeout(&mu_, std::max(wait, absl::Milliseconds(10)));
      }
    }
    kick_ = false;
    if (stopping_) return;
  }
}

void WarmPool::Stop() {
  absl::MutexLock stop(&stop_mu_);
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    wake_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
  { absl::MutexLock refill(&refill_mu_); }  // a Refill elsewhere has finished
  std::vector<std::unique_ptr<Sandbox>> left;
  {
    absl::MutexLock l(&mu_);
    for (Member& m : ready_) left.push_back(std::move(m.sandbox));
    ready_.clear();
    PublishSizeLocked();
    metrics_ = nullptr;  // may not outlive the pool's owner's Shutdown
  }
  DestroyAll(std::move(left), "shutdown");
}

absl::StatusOr<std::unique_ptr<Sandbox>> WarmPool::Create(const SandboxSpec& spec) {
  if (auto claimed = TakeMember(spec)) return std::move(*claimed);
  return inner_->Create(spec);
}

void WarmPool::CreateAsync(SandboxSpec spec, SandboxDone done) {
  bool may_claim;
  {
    absl::MutexLock l(&mu_);
    may_claim = spec.pool.empty() && started_ && !stopping_ && !ready_.empty();
  }
  if (may_claim) {
    // A claim is a short provider call (or two): on the blocking pool.
    WorkPool::Shared()->Submit([this, spec = std::move(spec), done = std::move(done)]() mutable {
      if (auto claimed = TakeMember(spec)) return done(std::move(*claimed));
      inner_->CreateAsync(std::move(spec), std::move(done));
    });
    return;
  }
  if (auto claimed = TakeMember(spec)) return done(std::move(*claimed));  // never blocks here
  inner_->CreateAsync(std::move(spec), std::move(done));
}

std::optional<absl::StatusOr<std::unique_ptr<Sandbox>>> WarmPool::TakeMember(
    const SandboxSpec& spec) {
  if (!spec.pool.empty()) return std::nullopt;
  SandboxSpec member;
  Metrics* metrics = nullptr;
  bool serving;
  {
    absl::MutexLock l(&mu_);
    serving = started_ && !stopping_ && options_.size > 0;
    if (serving) {
      member = MemberSpec("");
      metrics = metrics_;
    }
  }
  // Not started yet, or shutting down: as without a pool.
  if (!serving) return std::nullopt;
  if (!inner_->CanClaim(member, spec)) {
    Miss("mismatch");
    return std::nullopt;
  }
  while (true) {
    Member m;
    bool expired = false;
    {
      absl::MutexLock l(&mu_);
      if (ready_.empty() || stopping_) break;
      m = std::move(ready_.front());
      ready_.pop_front();
      expired = options_.clock->Monotonic() - m.created >= options_.max_age;
      if (!expired) {
        claimed_[m.sandbox->id()] = {spec.attempt_id, spec.tenant, spec.session_id, ++claims_};
      }
      kick_ = true;
      wake_.SignalAll();
      PublishSizeLocked();
    }
    const std::string id = m.sandbox->id();
    if (expired) {
      std::vector<std::unique_ptr<Sandbox>> one;
      one.push_back(std::move(m.sandbox));
      DestroyAll(std::move(one), "max_age");
      continue;
    }
    absl::StatusOr<std::unique_ptr<Sandbox>> claimed = inner_->Claim(m.sandbox.get(), spec);
    if (claimed.ok()) {
      if (metrics != nullptr) metrics->PoolHit(std::string(name()));
      Log(LogLevel::kInfo, "pool.claimed",
          {{"provider", name()},
           {"sandbox_id", id},
           {"tenant", spec.tenant},
           {"session_id", spec.session_id}});
      return claimed;
    }
    Log(LogLevel::kWarning, "pool.claim_failed",
        {{"provider", name()}, {"sandbox_id", id}, {"error", claimed.status().message()}});
    {
      absl::MutexLock l(&mu_);
      claimed_.erase(id);
    }
    std::vector<std::unique_ptr<Sandbox>> one;
    one.push_back(std::move(m.sandbox));
    DestroyAll(std::move(one), "claim_failed");
  }
  Miss("empty");
  return std::nullopt;
}

absl::StatusOr<std::vector<OwnedSandbox>> WarmPool::ListOwned(const std::string& deployment_id) {
  int64_t listed_after;
  {
    absl::MutexLock l(&mu_);
    listed_after = claims_;
  }
  absl::StatusOr<std::vector<OwnedSandbox>> all = inner_->ListOwned(deployment_id);
  if (!all.ok()) return all;
  absl::MutexLock l(&mu_);
  std::set<std::string> ready_ids;
  for (const Member& m : ready_) ready_ids.insert(m.sandbox->id());
  std::set<std::string> seen;
  std::vector<OwnedSandbox> out;
  for (OwnedSandbox& o : *all) {
    // Ours and unclaimed, or being created: never an orphan.
    if (ready_ids.count(o.sandbox_id) || creating_.count(o.attempt_id)) continue;
    seen.insert(o.sandbox_id);
    if (auto c = claimed_.find(o.sandbox_id); c != claimed_.end()) {
      // Claimed here: its session's, whatever its tags still say.
      o.attempt_id = c->second.attempt_id;
      o.tenant = c->second.tenant;
      o.session_id = c->second.session_id;
    }
    out.push_back(std::move(o));
  }
  // Claims the provider no longer lists are done with (claims made after
  // the list began may not be in it yet).
  for (auto it = claimed_.begin(); it != claimed_.end();) {
    if (it->second.seq <= listed_after && !seen.count(it->first)) {
      it = claimed_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

}  // namespace sandbox
