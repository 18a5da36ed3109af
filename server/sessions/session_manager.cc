#include "server/sessions/session_manager.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/failpoint.h"
#include "common/log.h"
#include "common/refusal.h"
#include "common/text.h"
#include "nlohmann/json.hpp"
#include "server/telemetry/audit.h"

namespace sandbox {
namespace {

// A session is marked dirty at most this often for the lazy activity flush.
constexpr absl::Duration kFlushEvery = absl::Seconds(1);

Language LanguageFromName(const std::string& n) {
  if (n == "node") return Language::kNode;
  if (n == "shell") return Language::kShell;
  return Language::kPython;
}

}  // namespace

absl::string_view CloseReasonName(CloseReason r) {
  switch (r) {
    case CloseReason::kClient:
      return "client";
    case CloseReason::kIdle:
      return "idle";
    case CloseReason::kLifetime:
      return "lifetime";
    case CloseReason::kShutdown:
      return "shutdown";
    case CloseReason::kGone:
      return "gone";
    case CloseReason::kAdmin:
      return "admin";
  }
  return "client";
}

struct SessionManager::Session {
  // Constant after construction.
  std::string tenant;
  std::string session_id;
  std::string provider;
  std::string template_name;
  Language language = Language::kPython;
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> env;
  SandboxResources resources;
  SandboxResources ceiling;  // the tenant's maximum when created (kept for adoption)
  absl::Time created_wall;
  absl::Time created_mono;
  absl::Duration idle_timeout;
  absl::Duration max_lifetime;  // zero = none
  std::string attempt_id;       // tags this session's sandbox at the provider
  int64_t generation = 1;

  // Guarded by SessionManager::mu_.
  NetworkPolicy network;  // the rules in force (UpdateSessionNetwork changes them)
  SessionStateKind state = SessionStateKind::kCreating;
  bool gone = false;  // removed from the table (closed or failed creation)
  absl::Status create_status;
  std::shared_ptr<Sandbox> sandbox;
  std::string sandbox_id;
  int inflight = 0;
  absl::Time last_active_wall;
  absl::Time last_active_mono;
  absl::Time idle_key = absl::InfiniteFuture();      // key in idle_, if indexed
  absl::Time lifetime_key = absl::InfiniteFuture();  // key in lifetime_
  // Recovered from the store: the sandbox (sandbox_id) is attached on first
  // use. `recovered` marks creating/closing rows waiting for ResolvePending.
  bool adopt_pending = false;
  bool recovered = false;
  // A recovered creating row whose provider could not be listed: kept (its
  // sandbox may exist) and resolved by a later ResolvePending; calls on it
  // are answered UNAVAILABLE meanwhile instead of waiting.
  bool resolve_deferred = false;
  bool dirty = false;  // in dirty_
  absl::Time flushed_mono = absl::InfinitePast();
  // WaitForCreation's callers, woken when the creation settles.
  std::vector<std::function<void(absl::Status)>> waiters;
};

namespace {
// A recovered creating row ResolvePending could not settle yet.
absl::Status DeferredError(const std::string& session_id, const std::string& provider) {
  return absl::UnavailableError(
      absl::StrCat("session \"", session_id,
                   "\": whether its sandbox was created before the broker restarted is not "
                   "known yet (provider \"",
                   provider, "\" could not be listed); retry shortly"));
}
}  // namespace

absl::Status SessionManager::ProviderConflict(const Session& s, const CreateOptions* create) {
  if (create == nullptr || create->provider.empty() || create->provider == s.provider) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("session \"", s.session_id, "\" runs on provider \"", s.provider, "\", not \"",
                   create->provider, "\"; close it first or use another session id"));
}

absl::Status SessionManager::TemplateConflict(const Session& s, const CreateOptions* create) {
  if (create == nullptr || create->template_name.empty() ||
      create->template_name == s.template_name) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("session \"", s.session_id, "\" was created with template \"", s.template_name,
                   "\", not \"", create->template_name, "\""));
}

namespace {
nlohmann::json ResourcesJson(const SandboxResources& r) {
  return {{"memory_bytes", r.memory_bytes},
          {"cpus", r.cpus},
          {"pids", r.pids},
          {"disk_bytes", r.disk_bytes}};
}
}  // namespace

SessionRecord SessionManager::RecordOf(const Session& s, StoredState state) const {
  SessionRecord r;
  r.tenant = s.tenant;
  r.session_id = s.session_id;
  r.provider = s.provider;
  r.attempt_id = s.attempt_id;
  r.sandbox_id = s.sandbox_id;
  r.state = state;
  r.generation = s.generation;
  nlohmann::json spec = {{"template", s.template_name},
                         {"language", std::string(LanguageName(s.language))},
                         {"env", s.env},
                         {"labels", s.labels},
                         // Per-tenant policy and resources, for adoption.
                         {"idle_timeout_ms", absl::ToInt64Milliseconds(s.idle_timeout)},
                         {"max_lifetime_ms", absl::ToInt64Milliseconds(s.max_lifetime)},
                         {"resources", ResourcesJson(s.resources)},
                         // The tenant's ceiling applied at create: an adopted
                         // sandbox keeps the limits it was made with.
                         {"ceiling", ResourcesJson(s.ceiling)},
                         {"network", NetworkPolicyJson(s.network)}};
  r.spec_json = spec.dump();
  r.created_at = s.created_wall;
  r.last_active_at = s.last_active_wall;
  return r;
}

namespace {

SandboxSpec SpecOf(const std::string& tenant, const std::string& session_id,
                   const std::string& instance_id, const std::string& deployment_id,
                   const std::string& attempt_id, const std::string& template_name,
                   Language language, const std::map<std::string, std::string>& env,
                   const std::map<std::string, std::string>& labels) {
  SandboxSpec spec;
  spec.tenant = tenant;
  spec.session_id = session_id;
  spec.broker_instance_id = instance_id;
  spec.deployment_id = deployment_id;
  spec.attempt_id = attempt_id;
  spec.template_name = template_name;
  spec.language = language;
  spec.env = env;
  spec.labels = labels;
  return spec;
}

}  // namespace

void SessionManager::StoreWrite(const char* what, const absl::Status& st) {
  if (st.ok()) return;
  Log(LogLevel::kError, "state.write_failed",
      {{"what", what}, {"code", absl::StatusCodeToString(st.code())}, {"error", st.message()}});
}

Lease& Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    Release();
    manager_ = o.manager_;
    session_ = std::move(o.session_);
    sandbox_ = std::move(o.sandbox_);
    language_ = o.language_;
    provider_ = std::move(o.provider_);
    generation_ = o.generation_;
    o.manager_ = nullptr;
  }
  return *this;
}

void Lease::Release() {
  if (manager_ != nullptr) {
    manager_->ReleaseLease(static_cast<SessionManager::Session*>(session_.get()));
    manager_ = nullptr;
  }
  sandbox_.reset();
  session_.reset();
}

SessionManager::SessionManager(const ProviderRegistry* providers, Clock* clock,
                               SessionLimits limits, std::string default_provider,
                               std::string broker_instance_id, Metrics* metrics,
                               SessionStore* store)
    : providers_(providers),
      clock_(clock),
      limits_(limits),
      default_provider_(std::move(default_provider)),
      instance_id_(std::move(broker_instance_id)),
      metrics_(metrics != nullptr ? metrics : Metrics::Discard()),
      store_(store),
      deployment_id_(store ? store->deployment_id() : std::string()) {}

SessionManager::~SessionManager() {
  if (detach_on_shutdown_) {
    DetachAll();
  } else {
    CloseAll();
  }
}

void SessionManager::SetDetachOnShutdown(bool detach) { detach_on_shutdown_ = detach; }

void SessionManager::RemoveLocked(Session* s) {
  if (s->gone) return;
  UnindexLocked(s);
  auto t = tenants_.find(s->tenant);
  if (t != tenants_.end()) {
    auto it = t->second.find(s->session_id);
    if (it != t->second.end() && it->second.get() == s) {
      t->second.erase(it);
      --total_;
    }
    if (t->second.empty()) tenants_.erase(t);
  }
  s->gone = true;
}

void SessionManager::MarkActiveLocked(Session* s) {
  if (store_ == nullptr || s->dirty || s->gone) return;
  s->dirty = true;
  dirty_.emplace_back(s->tenant, s->session_id);
}

int64_t SessionManager::size() const {
  absl::MutexLock l(&mu_);
  return total_;
}

void SessionManager::UnindexLocked(Session* s) {
  if (s->idle_key != absl::InfiniteFuture()) {
    idle_.erase({s->idle_key, s});
    s->idle_key = absl::InfiniteFuture();
  }
  if (s->lifetime_key != absl::InfiniteFuture()) {
    lifetime_.erase({s->lifetime_key, s});
    s->lifetime_key = absl::InfiniteFuture();
  }
}

void SessionManager::IndexIdleLocked(Session* s) {
  if (s->idle_key != absl::InfiniteFuture()) idle_.erase({s->idle_key, s});
  s->idle_key = s->last_active_mono + s->idle_timeout;
  idle_.insert({s->idle_key, s});
}

Lease SessionManager::MakeLeaseLocked(const std::shared_ptr<Session>& s) {
  ++s->inflight;
  if (s->idle_key != absl::InfiniteFuture()) {
    idle_.erase({s->idle_key, s.get()});
    s->idle_key = absl::InfiniteFuture();
  }
  Lease lease;
  lease.manager_ = this;
  lease.session_ = s;
  lease.sandbox_ = s->sandbox;
  lease.language_ = s->language;
  lease.provider_ = s->provider;
  lease.generation_ = s->generation;
  return lease;
}

void SessionManager::ReleaseLease(Session* s) {
  absl::MutexLock l(&mu_);
  --s->inflight;
  s->last_active_mono = clock_->Monotonic();
  s->last_active_wall = clock_->Now();
  if (s->inflight == 0 && s->state == SessionStateKind::kReady && !s->gone) {
    IndexIdleLocked(s);
  }
  MarkActiveLocked(s);
}

absl::StatusOr<Lease> SessionManager::Acquire(const std::string& tenant,
                                              const std::string& session_id,
                                              const CreateOptions* create) {
  std::shared_ptr<Session> fresh;
  Provider* provider = nullptr;
  absl::StatusOr<Lease> lease =
      AcquireOrBegin(tenant, session_id, create, &fresh, &provider, nullptr, nullptr);
  if (fresh == nullptr) return lease;
  return CreateAndLease(fresh, provider, *create);
}

void SessionManager::AcquireAsync(const std::string& tenant, const std::string& session_id,
                                  const CreateOptions* create, LeaseDone done) {
  std::shared_ptr<Session> fresh;
  Provider* provider = nullptr;
  // Another call's creation in progress: look again once it settles (its
  // failure is our answer), holding no thread meanwhile.
  std::function<void(absl::Status)> wake = [this, tenant, session_id, create,
                                            done](absl::Status settled) {
    if (!settled.ok()) return done(settled);
    AcquireAsync(tenant, session_id, create, done);
  };
  bool waiting = false;
  absl::StatusOr<Lease> lease =
      AcquireOrBegin(tenant, session_id, create, &fresh, &provider, &wake, &waiting);
  if (waiting) return;
  if (fresh == nullptr) return done(std::move(lease));
  CreateAndLeaseAsync(fresh, provider, *create, std::move(done));
}

absl::StatusOr<Lease> SessionManager::AcquireOrBegin(
    const std::string& tenant, const std::string& session_id, const CreateOptions* create,
    std::shared_ptr<Session>* fresh, Provider** fresh_provider,
    std::function<void(absl::Status)>* wake, bool* waiting) {
  Provider* provider = nullptr;
  std::string provider_name;
  if (create != nullptr) {
    provider_name = !create->provider.empty()           ? create->provider
                    : !create->default_provider.empty() ? create->default_provider
                                                        : default_provider_;
  }
  absl::MutexLock l(&mu_);
  while (true) {
    auto& sessions = tenants_[tenant];
    auto it = sessions.find(session_id);
    if (it == sessions.end()) {
      if (create == nullptr) {
        if (sessions.empty()) tenants_.erase(tenant);
        return absl::NotFoundError(absl::StrCat("session \"", session_id, "\" not found"));
      }
      if (provider == nullptr) {
        auto p = providers_->Find(provider_name);
        if (!p.ok()) {
          if (sessions.empty()) tenants_.erase(tenant);
          return p.status();
        }
        provider = *p;
      }
      if (create->max_sessions > 0 &&
          static_cast<int64_t>(sessions.size()) >= create->max_sessions) {
        return RefusedBy(absl::ResourceExhaustedError(absl::StrCat(
                             "tenant ", tenant, ": max_sessions (", create->max_sessions,
                             ") reached: close a session first")),
                         "max_sessions");
      }
      if (static_cast<int64_t>(sessions.size()) >= limits_.max_sessions_per_tenant) {
        return absl::ResourceExhaustedError(absl::StrCat("max_sessions_per_tenant (",
                                                         limits_.max_sessions_per_tenant,
                                                         ") reached: close a session first"));
      }
      auto s = std::make_shared<Session>();
      s->tenant = tenant;
      s->session_id = session_id;
      s->provider = provider_name;
      s->template_name = create->template_name;
      s->language = create->language;
      s->labels = create->labels;
      s->env = create->env;
      s->resources = create->resources;
      s->ceiling = create->resources_ceiling;
      s->network = create->network;
      s->attempt_id = RandomHex(8);
      if (auto g = next_generation_.find({tenant, session_id}); g != next_generation_.end()) {
        s->generation = g->second;
        next_generation_.erase(g);
      }
      s->created_wall = clock_->Now();
      s->created_mono = clock_->Monotonic();
      s->last_active_wall = s->created_wall;
      s->last_active_mono = s->created_mono;
      s->idle_timeout =
          create->idle_timeout > absl::ZeroDuration() ? create->idle_timeout : limits_.idle_timeout;
      s->max_lifetime =
          create->max_lifetime > absl::ZeroDuration() ? create->max_lifetime : limits_.max_lifetime;
      sessions.emplace(session_id, s);
      ++total_;
      // The caller creates it (CreateAndLease), without mu_.
      *fresh = std::move(s);
      *fresh_provider = provider;
      return absl::UnavailableError("the session is being created");
    }
    std::shared_ptr<Session> s = it->second;
    if (s->state == SessionStateKind::kCreating && wake != nullptr && !s->recovered) {
      s->waiters.push_back(std::move(*wake));
      *waiting = true;
      return absl::UnavailableError("waiting for the session's creation");
    }
    if (s->state == SessionStateKind::kCreating && s->recovered && s->resolve_deferred) {
      return DeferredError(s->session_id, s->provider);
    }
    if (s->state == SessionStateKind::kCreating || s->state == SessionStateKind::kClosing) {
      const SessionStateKind was = s->state;
      auto changed = [&s, was]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return s->gone || s->state != was || s->resolve_deferred;
      };
      mu_.Await(absl::Condition(&changed));
      if (was == SessionStateKind::kCreating && s->gone && !s->create_status.ok()) {
        // We waited on that creation; its failure is our answer.
        return s->create_status;
      }
      continue;  // look again: ready, or gone (then create anew)
    }
    // Ready.
    if (absl::Status c = ProviderConflict(*s, create); !c.ok()) return c;
    if (s->adopt_pending && wake != nullptr) {
      // The sandbox is attached holding no thread; this call looks again
      // once that settles.
      s->waiters.push_back(std::move(*wake));
      *waiting = true;
      StartAdoptLocked(s);
      return absl::UnavailableError("waiting for the session's sandbox to be attached");
    }
    if (s->adopt_pending) {
      absl::Status adopted = AdoptLocked(s);
      if (IsSandboxGone(adopted)) continue;  // dropped: create anew, or NOT_FOUND
      if (!adopted.ok()) return adopted;
      continue;  // look again: the observer ran unlocked
    }
    if (absl::Status c = TemplateConflict(*s, create); !c.ok()) return c;
    return MakeLeaseLocked(s);
  }
}

absl::StatusOr<Lease> SessionManager::TryAcquire(const std::string& tenant,
                                                 const std::string& session_id,
                                                 const CreateOptions* create, bool* would_block) {
  *would_block = false;
  absl::MutexLock l(&mu_);
  auto t = tenants_.find(tenant);
  std::shared_ptr<Session> s;
  if (t != tenants_.end()) {
    auto it = t->second.find(session_id);
    if (it != t->second.end()) s = it->second;
  }
  if (s == nullptr && create == nullptr) {
    return absl::NotFoundError(absl::StrCat("session \"", session_id, "\" not found"));
  }
  if (s == nullptr || s->state != SessionStateKind::kReady || s->adopt_pending) {
    *would_block = true;
    return absl::UnavailableError("the session needs a provider call first");
  }
  if (absl::Status c = ProviderConflict(*s, create); !c.ok()) return c;
  if (absl::Status c = TemplateConflict(*s, create); !c.ok()) return c;
  return MakeLeaseLocked(s);
}

bool SessionManager::WaitForCreation(const std::string& tenant, const std::string& session_id,
                                     std::function<void(absl::Status)> wake) {
  absl::MutexLock l(&mu_);
  auto t = tenants_.find(tenant);
  if (t == tenants_.end()) return false;
  auto it = t->second.find(session_id);
  if (it == t->second.end() || it->second->state != SessionStateKind::kCreating ||
      it->second->recovered) {
    return false;
  }
  it->second->waiters.push_back(std::move(wake));
  return true;
}

SandboxSpec SessionManager::CreateSpecOf(const Session& s, const CreateOptions& o) const {
  SandboxSpec spec;
  spec.tenant = s.tenant;
  spec.session_id = s.session_id;
  spec.broker_instance_id = instance_id_;
  spec.template_name = o.template_name;
  spec.language = o.language;
  spec.env = o.env;
  spec.labels = o.labels;
  spec.resources = o.resources;
  spec.deployment_id = deployment_id_;
  spec.attempt_id = s.attempt_id;
  spec.ceiling = o.resources_ceiling;
  spec.network = o.network;
  return spec;
}

absl::Status SessionManager::BeginCreate(const Session& s) {
  // Write-ahead: the intent is durable before the provider creates anything.
  absl::Status status =
      store_ ? store_->PutSession(RecordOf(s, StoredState::kCreating)) : absl::OkStatus();
  if (status.ok()) Failpoint("create.after_intent");
  return status;
}

absl::StatusOr<Lease> SessionManager::CreateAndLease(const std::shared_ptr<Session>& s,
                                                     Provider* provider, const CreateOptions& o) {
  const absl::Time start = clock_->Monotonic();
  const SandboxSpec spec = CreateSpecOf(*s, o);
  absl::Status status = BeginCreate(*s);
  // max_concurrent_creates: wait (bounded) for a create slot.
  LimitSlot create_slot;
  if (status.ok()) {
    if (Limiter* lim = CreateLimiter(s->provider)) {
      status = lim->AcquireBlocking();
      if (status.ok()) create_slot = LimitSlot(lim);
      if (!status.ok() && metrics_) metrics_->LimitRefused(lim->name());
    }
  }
  absl::StatusOr<std::unique_ptr<Sandbox>> created =
      status.ok() ? provider->Create(spec) : absl::StatusOr<std::unique_ptr<Sandbox>>(status);
  create_slot.Release();
  return FinishCreate(s, o, std::move(created), start);
}

void SessionManager::CreateAndLeaseAsync(const std::shared_ptr<Session>& s, Provider* provider,
                                         const CreateOptions& o, LeaseDone done) {
  // Not the serving pool: its threads may wait (Acquire) on this very
  // creation, and a bounded pool full of them would never run its end.
  WorkPool* pool = WorkPool::Shared();
  const absl::Time start = clock_->Monotonic();
  SandboxSpec spec = CreateSpecOf(*s, o);
  if (absl::Status status = BeginCreate(*s); !status.ok()) {
    return done(FinishCreate(s, o, status, start));
  }
  const CreateOptions* opts = &o;
  Limiter* lim = CreateLimiter(s->provider);
  // Each step after the provider's answer may block (seed files, the ready
  // row): on `pool`, never on the provider's HTTP thread. The call's request
  // id goes with each step (common/request_id.h).
  auto after_slot = WithRequestId([this, s, provider, opts, pool, lim, start,
                                   spec = std::move(spec), done](absl::Status slot) mutable {
    if (!slot.ok()) {
      if (lim != nullptr) metrics_->LimitRefused(lim->name());
      pool->Submit(
          [this, s, opts, start, slot, done] { done(FinishCreate(s, *opts, slot, start)); });
      return;
    }
    provider->CreateAsync(
        std::move(spec), WithRequestId([this, s, opts, pool, lim, start,
                                        done](absl::StatusOr<std::unique_ptr<Sandbox>> created) {
          auto held =
              std::make_shared<absl::StatusOr<std::unique_ptr<Sandbox>>>(std::move(created));
          pool->Submit([this, s, opts, lim, start, done, held] {
            if (lim != nullptr) lim->Release();  // the next create starts on this thread
            done(FinishCreate(s, *opts, std::move(*held), start));
          });
        }));
  });
  if (lim == nullptr) return after_slot(absl::OkStatus());
  lim->Acquire(std::move(after_slot));
}

Limiter* SessionManager::CreateLimiter(const std::string& provider) const {
  auto lim = create_limiters_.find(provider);
  return lim == create_limiters_.end() ? nullptr : lim->second;
}

absl::StatusOr<Lease> SessionManager::FinishCreate(const std::shared_ptr<Session>& s,
                                                   const CreateOptions& o,
                                                   absl::StatusOr<std::unique_ptr<Sandbox>> created,
                                                   absl::Time start) {
  absl::Status status = created.status();
  std::shared_ptr<Sandbox> sandbox;
  if (created.ok()) {
    sandbox = std::move(*created);
    for (const auto& [path, data] : o.files) {
      status = sandbox->WriteFile(path, data);
      if (!status.ok()) {
        status = absl::Status(status.code(),
                              absl::StrCat("seed file \"", path, "\": ", status.message()));
        (void)sandbox->Destroy();
        sandbox.reset();
        break;
      }
    }
  }
  if (status.ok()) Failpoint("create.before_ready");
  if (status.ok() && store_) {
    SessionRecord ready = RecordOf(*s, StoredState::kReady);
    ready.sandbox_id = sandbox->id();
    status = store_->PutSession(ready);
    if (!status.ok()) {
      (void)sandbox->Destroy();
      sandbox.reset();
    }
  }
  if (!status.ok() && store_) {
    // Nothing was created (or it was destroyed): forget the intent, keeping
    // only the generation a vanished predecessor left.
    SessionRecord tomb = RecordOf(*s, StoredState::kGone);
    tomb.generation = s->generation - 1;
    StoreWrite("forget failed create", s->generation > 1
                                           ? store_->PutSession(tomb)
                                           : store_->DeleteSession(s->tenant, s->session_id));
  }
  mu_.Lock();
  if (!status.ok()) {
    RemoveLocked(s.get());
    if (s->generation > 1) next_generation_[{s->tenant, s->session_id}] = s->generation;
    s->create_status = status;
    metrics_->SessionCreateFailed(s->provider, absl::StatusCodeToString(status.code()));
    Log(LogLevel::kWarning, "session.create_failed",
        {{"tenant", s->tenant},
         {"session_id", s->session_id},
         {"provider", s->provider},
         {"code", absl::StatusCodeToString(status.code())}});
    std::vector<std::function<void(absl::Status)>> waiters;
    waiters.swap(s->waiters);
    mu_.Unlock();
    for (auto& w : waiters) w(status);
    return status;
  }
  s->sandbox = sandbox;
  s->sandbox_id = sandbox->id();
  s->state = SessionStateKind::kReady;
  s->last_active_mono = clock_->Monotonic();
  s->last_active_wall = clock_->Now();
  if (s->max_lifetime > absl::ZeroDuration()) {
    s->lifetime_key = s->created_mono + s->max_lifetime;
    lifetime_.insert({s->lifetime_key, s.get()});
  }
  metrics_->SessionCreated(s->provider, s->tenant, clock_->Monotonic() - start);
  Log(LogLevel::kInfo, "session.created",
      {{"tenant", s->tenant},
       {"session_id", s->session_id},
       {"provider", s->provider},
       {"sandbox_id", s->sandbox_id},
       {"duration_ms", absl::ToInt64Milliseconds(clock_->Monotonic() - start)}});
  Lease lease = MakeLeaseLocked(s);
  SessionView view = ViewLocked(*s);
  std::vector<std::function<void(absl::Status)>> waiters;
  waiters.swap(s->waiters);
  mu_.Unlock();
  if (observer_ != nullptr) observer_->SessionCreated(view);
  for (auto& w : waiters) w(absl::OkStatus());
  return lease;
}

// A close's first step, before the destroy: the store's closing row.
SessionManager::Closing SessionManager::BeginDestroy(const std::shared_ptr<Session>& s,
                                                     CloseReason reason) {
  Closing c;
  {
    absl::MutexLock l(&mu_);
    c.rec = RecordOf(*s, StoredState::kClosing);
    c.pending = s->adopt_pending && !s->sandbox_id.empty();
  }
  // Write-ahead: a crash from here on finishes the destroy at next start.
  // With a shared store the write is fenced, the owner's re-check right
  // before the destroy: refused, another replica owns the session now and
  // its sandbox is theirs, so this one lets go of it instead.
  if (store_ && reason != CloseReason::kGone) {
    const absl::Status w = store_->PutSession(c.rec);
    if (IsOwnershipLost(w)) c.owned = false;
    StoreWrite("closing", w);
  }
  if (c.owned && reason != CloseReason::kGone) Failpoint("close.before_destroy");
  return c;
}

void SessionManager::FinishClose(const std::shared_ptr<Session>& s,
                                 std::shared_ptr<Sandbox> sandbox, CloseReason reason) {
  FinishCloseFrom(s, std::move(sandbox), BeginDestroy(s, reason), reason);
}

// The destroy (or the let-go), then EndClose.
void SessionManager::FinishCloseFrom(const std::shared_ptr<Session>& s,
                                     std::shared_ptr<Sandbox> sandbox, Closing c,
                                     CloseReason reason) {
  const SessionRecord& rec = c.rec;
  const bool owned = c.owned, pending = c.pending;
  // What the sandbox used, read just before it is destroyed (usage metering
  // counts its CPU seconds at close).
  std::optional<SandboxUsage>& final_usage = c.final_usage;
  absl::Status st = absl::OkStatus();
  if (!owned) {
    if (sandbox) sandbox->Detach();
    st = absl::FailedPreconditionError("not destroyed: another replica owns the session now");
  } else if (sandbox) {
    final_usage = sandbox->Usage();
    st = sandbox->Destroy();
  } else if (pending && reason != CloseReason::kGone) {
    // Recovered and never used: attach only to destroy it.
    absl::StatusOr<Provider*> p = providers_->Find(rec.provider);
    absl::StatusOr<std::unique_ptr<Sandbox>> att =
        p.ok() ? (*p)->Attach(rec.sandbox_id,
                              SpecOf(rec.tenant, rec.session_id, instance_id_, deployment_id_,
                                     rec.attempt_id, "", Language::kPython, {}, {}))
               : absl::StatusOr<std::unique_ptr<Sandbox>>(p.status());
    if (att.ok()) {
      st = (*att)->Destroy();
    } else if (!IsSandboxGone(att.status())) {
      st = att.status();
    }
  }
  EndClose(s, std::move(c), reason, st);
}

// A close's last step, after the destroy: the store's row, the table.
void SessionManager::EndClose(const std::shared_ptr<Session>& s, Closing c, CloseReason reason,
                              const absl::Status& st) {
  SessionRecord& rec = c.rec;
  const bool owned = c.owned;
  const std::optional<SandboxUsage>& final_usage = c.final_usage;
  if (store_ && owned) {
    if (reason == CloseReason::kGone) {
      rec.state = StoredState::kGone;  // a tombstone keeping the generation
      StoreWrite("gone", store_->PutSession(rec));
    } else if (st.ok()) {
      StoreWrite("closed", store_->DeleteSession(rec.tenant, rec.session_id));
    }  // else: the closing row stays, so the next start retries the destroy
  }
  mu_.Lock();
  RemoveLocked(s.get());
  if (reason == CloseReason::kGone) {
    next_generation_[{s->tenant, s->session_id}] = s->generation + 1;
  }
  metrics_->SessionClosed(s->provider, s->tenant, CloseReasonName(reason));
  Log(st.ok() ? LogLevel::kInfo : LogLevel::kWarning, "session.closed",
      {{"tenant", s->tenant},
       {"session_id", s->session_id},
       {"provider", s->provider},
       {"sandbox_id", s->sandbox_id},
       {"reason", CloseReasonName(reason)},
       {"destroy", st.ok() ? std::string("ok") : std::string(st.message())}});
  SessionView view = ViewLocked(*s);
  if (final_usage) view.usage = final_usage;
  const absl::Duration age = clock_->Monotonic() - s->created_mono;
  mu_.Unlock();
  if (observer_ != nullptr) observer_->SessionClosed(view, reason, age);
}

absl::StatusOr<bool> SessionManager::Close(const std::string& tenant, const std::string& session_id,
                                           CloseReason reason) {
  std::shared_ptr<Session> s;
  std::shared_ptr<Sandbox> sandbox;
  {
    absl::MutexLock l(&mu_);
    while (true) {
      auto t = tenants_.find(tenant);
      if (t == tenants_.end()) return false;
      auto it = t->second.find(session_id);
      if (it == t->second.end()) return false;
      s = it->second;
      if (s->state == SessionStateKind::kCreating) {
        if (s->recovered && s->resolve_deferred) return DeferredError(s->session_id, s->provider);
        auto done = [&s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return s->gone || s->state != SessionStateKind::kCreating || s->resolve_deferred;
        };
        mu_.Await(absl::Condition(&done));
        continue;
      }
      if (s->state == SessionStateKind::kClosing) {
        // Someone else is closing it; wait for them to finish.
        auto gone = [&s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return s->gone; };
        mu_.Await(absl::Condition(&gone));
        return true;
      }
      break;
    }
    s->state = SessionStateKind::kClosing;
    UnindexLocked(s.get());
    auto idle = [&s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return s->inflight == 0; };
    // Bounded: calls still running after this are cut short by Destroy.
    mu_.AwaitWithTimeout(absl::Condition(&idle), limits_.close_wait);
    sandbox = std::move(s->sandbox);
  }
  FinishClose(s, std::move(sandbox), reason);
  return true;
}

void SessionManager::CloseAsync(const std::string& tenant, const std::string& session_id,
                                CloseReason reason, CloseDone done) {
  std::shared_ptr<Session> s;
  std::shared_ptr<Sandbox> sandbox;
  {
    absl::MutexLock l(&mu_);
    auto t = tenants_.find(tenant);
    if (t == tenants_.end()) return done(false);
    auto it = t->second.find(session_id);
    if (it == t->second.end()) return done(false);
    s = it->second;
    if (s->state != SessionStateKind::kReady || s->inflight > 0) {
      s = nullptr;  // waits first: Close's path, on this thread
    } else {
      s->state = SessionStateKind::kClosing;
      UnindexLocked(s.get());
      sandbox = std::move(s->sandbox);
    }
  }
  if (s == nullptr) return done(Close(tenant, session_id, reason));
  Closing c = BeginDestroy(s, reason);
  if (!c.owned || sandbox == nullptr) {
    // Nothing for the provider to do, or an attach first: Close's path.
    FinishCloseFrom(s, std::move(sandbox), std::move(c), reason);
    return done(true);
  }
  c.final_usage = sandbox->Usage();
  Sandbox* raw = sandbox.get();
  auto closing = std::make_shared<Closing>(std::move(c));
  raw->DestroyAsync(WithRequestId([this, s, sandbox = std::move(sandbox), closing, reason,
                                   done](absl::Status st) mutable {
    // The store's rows block: not on the provider's thread. The sandbox
    // object goes with it.
    WorkPool::Shared()->Submit([this, s, sandbox = std::move(sandbox), closing, reason, done, st] {
      EndClose(s, std::move(*closing), reason, st);
      done(true);
    });
  }));
}

SessionView SessionManager::ViewLocked(const Session& s, std::shared_ptr<Sandbox>* sandbox) const {
  SessionView v;
  v.tenant = s.tenant;
  v.session_id = s.session_id;
  v.provider = s.provider;
  v.sandbox_id = s.sandbox_id;
  v.state = s.state;
  v.created_at = s.created_wall;
  v.last_active_at = s.last_active_wall;
  const absl::Time now_mono = clock_->Monotonic();
  const absl::Time now_wall = clock_->Now();
  if (s.state == SessionStateKind::kReady && s.inflight == 0) {
    v.idle_expires_at = now_wall + (s.last_active_mono + s.idle_timeout - now_mono);
  }
  if (s.max_lifetime > absl::ZeroDuration()) {
    v.expires_at = s.created_wall + s.max_lifetime;
  }
  v.language = s.language;
  v.template_name = s.template_name;
  v.labels = s.labels;
  v.calls_in_flight = s.inflight;
  v.network = s.network;
  if (s.sandbox) v.resources = s.sandbox->Resources();
  if (sandbox != nullptr) *sandbox = s.sandbox;
  v.generation = s.generation;
  return v;
}

std::vector<SessionView> SessionManager::WithUsage(
    std::vector<std::pair<SessionView, std::shared_ptr<Sandbox>>> rows) {
  std::vector<SessionView> out;
  out.reserve(rows.size());
  for (auto& [view, sandbox] : rows) {
    if (sandbox) view.usage = sandbox->Usage();
    out.push_back(std::move(view));
  }
  return out;
}

absl::StatusOr<SessionView> SessionManager::Get(const std::string& tenant,
                                                const std::string& session_id) {
  std::vector<std::pair<SessionView, std::shared_ptr<Sandbox>>> row(1);
  {
    absl::MutexLock l(&mu_);
    const Session* s = nullptr;
    if (auto t = tenants_.find(tenant); t != tenants_.end()) {
      if (auto it = t->second.find(session_id); it != t->second.end()) s = it->second.get();
    }
    if (s == nullptr) {
      return absl::NotFoundError(absl::StrCat("session \"", session_id, "\" not found"));
    }
    row[0].first = ViewLocked(*s, &row[0].second);
  }
  return std::move(WithUsage(std::move(row))[0]);
}

std::vector<SessionView> SessionManager::List(const std::string& tenant, const std::string& after,
                                              int limit, bool* more) {
  std::vector<std::pair<SessionView, std::shared_ptr<Sandbox>>> rows;
  *more = false;
  {
    absl::MutexLock l(&mu_);
    auto t = tenants_.find(tenant);
    if (t == tenants_.end()) return {};
    for (auto it = t->second.upper_bound(after); it != t->second.end(); ++it) {
      if (static_cast<int>(rows.size()) == limit) {
        *more = true;
        break;
      }
      rows.emplace_back();
      rows.back().first = ViewLocked(*it->second, &rows.back().second);
    }
  }
  return WithUsage(std::move(rows));
}

absl::StatusOr<absl::Time> SessionManager::KeepAlive(const std::string& tenant,
                                                     const std::string& session_id) {
  absl::MutexLock l(&mu_);
  auto t = tenants_.find(tenant);
  if (t != tenants_.end()) {
    auto it = t->second.find(session_id);
    if (it != t->second.end() && it->second->state == SessionStateKind::kReady) {
      Session* s = it->second.get();
      s->last_active_mono = clock_->Monotonic();
      s->last_active_wall = clock_->Now();
      if (s->inflight == 0) IndexIdleLocked(s);
      MarkActiveLocked(s);
      return s->last_active_wall + s->idle_timeout;
    }
  }
  return absl::NotFoundError(absl::StrCat("session \"", session_id, "\" not found"));
}

absl::Status SessionManager::SetNetwork(const std::string& tenant, const std::string& session_id,
                                        const NetworkPolicy& network) {
  SessionRecord rec;
  {
    absl::MutexLock l(&mu_);
    Session* s = nullptr;
    if (auto t = tenants_.find(tenant); t != tenants_.end()) {
      auto it = t->second.find(session_id);
      if (it != t->second.end() && it->second->state == SessionStateKind::kReady) {
        s = it->second.get();
      }
    }
    if (s == nullptr) {
      return absl::NotFoundError(absl::StrCat("session \"", session_id, "\" not found"));
    }
    s->network = network;
    rec = RecordOf(*s, StoredState::kReady);
  }
  return store_ ? store_->PutSession(rec) : absl::OkStatus();
}

int SessionManager::RunOnce() {
  std::vector<std::pair<std::shared_ptr<Session>, std::shared_ptr<Sandbox>>> idle;
  std::vector<std::shared_ptr<Session>> lifetime;
  {
    absl::MutexLock l(&mu_);
    const absl::Time now = clock_->Monotonic();
    while (!idle_.empty() && idle_.begin()->first <= now) {
      Session* s = idle_.begin()->second;
      auto t = tenants_.find(s->tenant);
      std::shared_ptr<Session> sp = t->second.at(s->session_id);
      s->state = SessionStateKind::kClosing;
      UnindexLocked(s);
      idle.emplace_back(sp, std::move(s->sandbox));
    }
    while (!lifetime_.empty() && lifetime_.begin()->first <= now) {
      Session* s = lifetime_.begin()->second;
      lifetime_.erase(lifetime_.begin());
      s->lifetime_key = absl::InfiniteFuture();
      lifetime.push_back(tenants_.find(s->tenant)->second.at(s->session_id));
    }
  }
  for (auto& [s, sandbox] : idle) FinishClose(s, std::move(sandbox), CloseReason::kIdle);
  int n = static_cast<int>(idle.size());
  for (auto& s : lifetime) {
    auto r = Close(s->tenant, s->session_id, CloseReason::kLifetime);
    if (r.ok() && *r) ++n;
  }
  return n;
}

void SessionManager::CloseAll() {
  std::vector<std::pair<std::string, std::string>> keys;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [tenant, sessions] : tenants_) {
      for (const auto& [id, s] : sessions) keys.emplace_back(tenant, id);
    }
  }
  for (const auto& [tenant, id] : keys) (void)Close(tenant, id, CloseReason::kShutdown);
}

// ---- durable sessions ------------------------------------------------------

SessionManager::AdoptPlan SessionManager::BeginAdoptLocked(const std::shared_ptr<Session>& s) {
  s->state = SessionStateKind::kCreating;  // callers wait: single flight
  UnindexLocked(s.get());
  AdoptPlan plan;
  plan.spec = SpecOf(s->tenant, s->session_id, instance_id_, deployment_id_, s->attempt_id,
                     s->template_name, s->language, s->env, s->labels);
  plan.spec.resources = s->resources;
  plan.spec.ceiling = s->ceiling;
  plan.spec.network = s->network;
  plan.provider = s->provider;
  plan.sandbox_id = s->sandbox_id;
  return plan;
}

bool SessionManager::AdoptGone(const Session& s, const absl::Status& attached) {
  const bool gone = !attached.ok() && (IsSandboxGone(attached) ||
                                       attached.code() == absl::StatusCode::kUnimplemented ||
                                       attached.code() == absl::StatusCode::kNotFound);
  if (gone && store_) {
    SessionRecord tomb = RecordOf(s, StoredState::kGone);
    StoreWrite("adopt gone", store_->PutSession(tomb));
  }
  return gone;
}

absl::Status SessionManager::FinishAdoptLocked(const std::shared_ptr<Session>& s,
                                               absl::StatusOr<std::unique_ptr<Sandbox>> att,
                                               bool gone) {
  absl::Status out;
  if (att.ok()) {
    s->sandbox = std::move(*att);
    s->adopt_pending = false;
    s->state = SessionStateKind::kReady;
    if (s->max_lifetime > absl::ZeroDuration()) {
      s->lifetime_key = s->created_mono + s->max_lifetime;
      lifetime_.insert({s->lifetime_key, s.get()});
    }
    Log(LogLevel::kInfo, "session.adopted",
        {{"tenant", s->tenant},
         {"session_id", s->session_id},
         {"provider", s->provider},
         {"sandbox_id", s->sandbox_id},
         {"generation", s->generation}});
    if (observer_ != nullptr) {
      const SessionView view = ViewLocked(*s);
      mu_.Unlock();
      observer_->SessionAdopted(view);
      mu_.Lock();
    }
  } else if (gone) {
    RemoveLocked(s.get());
    metrics_->SessionClosed(s->provider, s->tenant, CloseReasonName(CloseReason::kGone));
    next_generation_[{s->tenant, s->session_id}] = s->generation + 1;
    Log(LogLevel::kInfo, "session.adopt_gone",
        {{"tenant", s->tenant},
         {"session_id", s->session_id},
         {"sandbox_id", s->sandbox_id},
         {"reason", att.status().message()}});
    out = SandboxGoneError(att.status().message());
  } else {
    // Retryable (provider unreachable): stays recovered; the next call retries.
    s->state = SessionStateKind::kReady;
    if (s->inflight == 0) IndexIdleLocked(s.get());
    out = att.status();
  }
  // Calls that waited for this adoption look again: ready, or gone (then
  // they create anew, or get NOT_FOUND); a retryable failure is their
  // answer too.
  std::vector<std::function<void(absl::Status)>> waiters;
  waiters.swap(s->waiters);
  if (!waiters.empty()) {
    const absl::Status for_waiters = att.ok() || gone ? absl::OkStatus() : out;
    mu_.Unlock();
    for (auto& w : waiters) w(for_waiters);
    mu_.Lock();
  }
  return out;
}

absl::Status SessionManager::AdoptLocked(const std::shared_ptr<Session>& s) {
  AdoptPlan plan = BeginAdoptLocked(s);
  mu_.Unlock();
  absl::StatusOr<Provider*> p = providers_->Find(plan.provider);
  absl::StatusOr<std::unique_ptr<Sandbox>> att =
      p.ok() ? (*p)->Attach(plan.sandbox_id, plan.spec)
             : absl::StatusOr<std::unique_ptr<Sandbox>>(p.status());
  const bool gone = AdoptGone(*s, att.status());
  mu_.Lock();
  return FinishAdoptLocked(s, std::move(att), gone);
}

void SessionManager::StartAdoptLocked(const std::shared_ptr<Session>& s) {
  AdoptPlan plan = BeginAdoptLocked(s);
  // Not under mu_: a provider may answer before AttachAsync returns. Its
  // answer moves to the pool too (the tombstone write and the observer may
  // block; the provider's own thread must not).
  WorkPool* pool = WorkPool::Shared();
  pool->Submit([this, s, plan = std::move(plan), pool]() mutable {
    auto finish = WithRequestId([this, s, pool](absl::StatusOr<std::unique_ptr<Sandbox>> att) {
      auto held = std::make_shared<absl::StatusOr<std::unique_ptr<Sandbox>>>(std::move(att));
      pool->Submit([this, s, held] {
        const bool gone = AdoptGone(*s, held->status());
        absl::MutexLock l(&mu_);
        (void)FinishAdoptLocked(s, std::move(*held), gone);
      });
    });
    absl::StatusOr<Provider*> p = providers_->Find(plan.provider);
    if (!p.ok()) return finish(p.status());
    (*p)->AttachAsync(plan.sandbox_id, std::move(plan.spec), std::move(finish));
  });
}

namespace {

// A stored row's spec_json, read defensively: rows come from disk or from
// other replicas through etcd, and a malformed one must not throw.
struct StoredSpec {
  std::string template_name;
  Language language = Language::kPython;
  std::map<std::string, std::string> env, labels;
  SandboxResources resources, ceiling;
  NetworkPolicy network;  // a malformed one: no network
  int64_t idle_ms = 0;
  int64_t life_ms = -1;
};

StoredSpec ParseStoredSpec(const std::string& text) {
  StoredSpec out;
  nlohmann::json spec = nlohmann::json::parse(text, nullptr, false);
  if (!spec.is_object()) return out;
  auto str = [&](const char* k, const std::string& def) {
    auto it = spec.find(k);
    return it != spec.end() && it->is_string() ? it->get<std::string>() : def;
  };
  auto num = [](const nlohmann::json& o, const char* k, auto def) {
    auto it = o.find(k);
    return it != o.end() && it->is_number() ? it->get<decltype(def)>() : def;
  };
  auto strings = [&](const char* k, std::map<std::string, std::string>* into) {
    auto it = spec.find(k);
    if (it == spec.end() || !it->is_object()) return;
    for (const auto& [key, val] : it->items()) {
      if (val.is_string()) (*into)[key] = val.get<std::string>();
    }
  };
  out.template_name = str("template", "");
  out.language = LanguageFromName(str("language", "python"));
  strings("env", &out.env);
  strings("labels", &out.labels);
  out.idle_ms = num(spec, "idle_timeout_ms", int64_t{0});
  out.life_ms = num(spec, "max_lifetime_ms", int64_t{-1});
  auto resources = [&](const char* k, SandboxResources* into) {
    auto res = spec.find(k);
    if (res == spec.end() || !res->is_object()) return;
    into->memory_bytes = num(*res, "memory_bytes", int64_t{0});
    into->cpus = num(*res, "cpus", 0.0);
    into->pids = num(*res, "pids", int64_t{0});
    into->disk_bytes = num(*res, "disk_bytes", int64_t{0});
  };
  resources("resources", &out.resources);
  resources("ceiling", &out.ceiling);
  if (auto n = spec.find("network"); n != spec.end()) {
    absl::StatusOr<NetworkPolicy> network = ParseNetworkPolicy(*n, "network");
    if (network.ok()) out.network = *std::move(network);
  }
  return out;
}

}  // namespace

std::shared_ptr<SessionManager::Session> SessionManager::FromRecordLocked(const SessionRecord& r,
                                                                          absl::Time now_wall,
                                                                          absl::Time now_mono) {
  auto s = std::make_shared<Session>();
  s->tenant = r.tenant;
  s->session_id = r.session_id;
  s->provider = r.provider;
  s->idle_timeout = limits_.idle_timeout;  // unless the row says otherwise
  s->max_lifetime = limits_.max_lifetime;
  s->attempt_id = r.attempt_id;
  s->sandbox_id = r.sandbox_id;
  s->generation = r.generation;
  const StoredSpec spec = ParseStoredSpec(r.spec_json);
  s->template_name = spec.template_name;
  s->language = spec.language;
  s->env = spec.env;
  s->labels = spec.labels;
  s->resources = spec.resources;
  s->ceiling = spec.ceiling;
  s->network = spec.network;
  if (spec.idle_ms > 0) s->idle_timeout = absl::Milliseconds(spec.idle_ms);
  if (spec.life_ms >= 0) s->max_lifetime = absl::Milliseconds(spec.life_ms);
  // Deadlines continue by wall clock: time spent down counts.
  s->created_wall = r.created_at;
  s->created_mono = now_mono - (now_wall - r.created_at);
  s->last_active_wall = r.last_active_at;
  s->last_active_mono = now_mono - (now_wall - r.last_active_at);
  switch (r.state) {
    case StoredState::kReady:
      s->state = SessionStateKind::kReady;
      s->adopt_pending = true;
      IndexIdleLocked(s.get());
      if (s->max_lifetime > absl::ZeroDuration()) {
        s->lifetime_key = s->created_mono + s->max_lifetime;
        lifetime_.insert({s->lifetime_key, s.get()});
      }
      break;
    case StoredState::kCreating:
      s->state = SessionStateKind::kCreating;
      s->recovered = true;
      break;
    case StoredState::kClosing:
      s->state = SessionStateKind::kClosing;
      s->recovered = true;
      s->adopt_pending = !s->sandbox_id.empty();
      break;
    case StoredState::kGone:
      break;
  }
  return s;
}

absl::StatusOr<int64_t> SessionManager::LoadFromStore() {
  if (store_ == nullptr) return 0;
  absl::StatusOr<std::vector<SessionRecord>> rows = store_->LoadSessions();
  if (!rows.ok()) return rows.status();
  const absl::Time now_wall = clock_->Now();
  const absl::Time now_mono = clock_->Monotonic();
  int64_t n = 0;
  absl::MutexLock l(&mu_);
  for (SessionRecord& r : *rows) {
    if (r.state == StoredState::kGone) {
      next_generation_[{r.tenant, r.session_id}] = r.generation + 1;
      continue;
    }
    std::shared_ptr<Session> s = FromRecordLocked(r, now_wall, now_mono);
    auto& sessions = tenants_[r.tenant];
    if (sessions.emplace(r.session_id, s).second) {
      ++total_;
      ++n;
      metrics_->SessionRecovered(s->provider, s->tenant);
    }
  }
  return n;
}

absl::Status SessionManager::AdoptRecord(const SessionRecord& r) {
  std::shared_ptr<Session> closing;
  {
    absl::MutexLock l(&mu_);
    const std::pair<std::string, std::string> key{r.tenant, r.session_id};
    auto& sessions = tenants_[r.tenant];
    if (sessions.count(r.session_id) != 0) return absl::OkStatus();  // already here
    switch (r.state) {
      case StoredState::kGone:
        next_generation_[key] = r.generation + 1;
        break;
      case StoredState::kCreating:
        // A creation its replica never finished (or never recorded): this
        // session starts over, with the same generation. A sandbox that
        // creation made is no session's any more: the orphan sweep's.
        if (r.generation > 1) next_generation_[key] = r.generation;
        break;
      case StoredState::kReady:
      case StoredState::kClosing: {
        std::shared_ptr<Session> s = FromRecordLocked(r, clock_->Now(), clock_->Monotonic());
        s->recovered = false;
        sessions.emplace(r.session_id, s);
        ++total_;
        metrics_->SessionRecovered(s->provider, s->tenant);
        if (r.state == StoredState::kClosing) closing = s;
        break;
      }
    }
    if (sessions.empty()) tenants_.erase(r.tenant);
  }
  Log(LogLevel::kInfo, "session.taken_over",
      {{"tenant", r.tenant},
       {"session_id", r.session_id},
       {"provider", r.provider},
       {"sandbox_id", r.sandbox_id},
       {"generation", r.generation},
       {"stored_state", static_cast<int64_t>(r.state)}});
  // A close its replica did not finish: finish it (the sandbox is destroyed).
  if (closing) FinishClose(closing, nullptr, CloseReason::kShutdown);
  return absl::OkStatus();
}

SessionView SessionManager::ViewOfRecord(const SessionRecord& r) {
  SessionView v;
  v.tenant = r.tenant;
  v.session_id = r.session_id;
  v.provider = r.provider;
  v.sandbox_id = r.sandbox_id;
  v.state = r.state == StoredState::kReady     ? SessionStateKind::kReady
            : r.state == StoredState::kClosing ? SessionStateKind::kClosing
                                               : SessionStateKind::kCreating;
  v.created_at = r.created_at;
  v.last_active_at = r.last_active_at;
  v.generation = r.generation;
  const StoredSpec spec = ParseStoredSpec(r.spec_json);
  v.template_name = spec.template_name;
  v.language = spec.language;
  v.labels = spec.labels;
  return v;
}

int SessionManager::GiveUp(const std::function<bool(const std::string& provider)>& destroy) {
  std::vector<std::pair<std::string, std::shared_ptr<Sandbox>>> sandboxes;
  int n = 0;
  {
    absl::MutexLock l(&mu_);
    for (auto& [tenant, sessions] : tenants_) {
      for (auto& [id, s] : sessions) {
        ++n;
        if (s->sandbox) sandboxes.emplace_back(s->provider, std::move(s->sandbox));
        s->gone = true;
        s->idle_key = s->lifetime_key = absl::InfiniteFuture();
        metrics_->SessionClosed(s->provider, s->tenant, CloseReasonName(CloseReason::kGone));
      }
    }
    tenants_.clear();
    idle_.clear();
    lifetime_.clear();
    dirty_.clear();
    total_ = 0;
  }
  int destroyed = 0;
  for (auto& [provider, sb] : sandboxes) {
    if (destroy(provider)) {
      destroyed += sb->Destroy().ok() ? 1 : 0;
    } else {
      sb->Detach();
    }
  }
  Log(LogLevel::kWarning, "sessions.given_up",
      {{"sessions", static_cast<int64_t>(n)},
       {"destroyed", static_cast<int64_t>(destroyed)},
       {"message", "this replica lost its cluster lease: its sessions belong to others now"}});
  return n;
}

int SessionManager::ResolvePending() {
  std::vector<std::shared_ptr<Session>> creating, closing;
  {
    absl::MutexLock l(&mu_);
    for (auto& [tenant, sessions] : tenants_) {
      for (auto& [id, s] : sessions) {
        if (!s->recovered) continue;
        (s->state == SessionStateKind::kCreating ? creating : closing).push_back(s);
      }
    }
  }
  // One list call per provider resolves every creating row on it.
  std::map<std::string, std::map<std::string, std::string>>
      by_attempt;  // provider -> attempt -> id
  std::map<std::string, bool> listed;
  for (auto& s : creating) {
    if (listed.count(s->provider)) continue;
    absl::StatusOr<Provider*> p = providers_->Find(s->provider);
    absl::StatusOr<std::vector<OwnedSandbox>> owned =
        p.ok() ? (*p)->ListOwned(deployment_id_)
               : absl::StatusOr<std::vector<OwnedSandbox>>(p.status());
    // A provider no longer configured, or one that cannot list at all, has
    // nothing to adopt from: forgotten (as AdoptGone treats UNIMPLEMENTED).
    listed[s->provider] =
        owned.ok() || !p.ok() || owned.status().code() == absl::StatusCode::kUnimplemented;
    if (!owned.ok()) {
      Log(LogLevel::kWarning, "state.resolve_list_failed",
          {{"provider", s->provider}, {"error", owned.status().message()}});
      continue;
    }
    for (const OwnedSandbox& o : *owned) by_attempt[s->provider][o.attempt_id] = o.sandbox_id;
  }
  int deferred = 0;
  for (auto& s : creating) {
    if (!listed[s->provider]) {
      // Not listed is not "not there": the sandbox may exist. The row stays
      // (the orphan sweep spares its attempt) until a later call resolves it.
      absl::MutexLock l(&mu_);
      if (!s->resolve_deferred) {
        s->resolve_deferred = true;  // wakes Acquire's waiters: UNAVAILABLE
        Log(LogLevel::kWarning, "session.resolve_deferred",
            {{"tenant", s->tenant}, {"session_id", s->session_id}, {"provider", s->provider}});
      }
      ++deferred;
      continue;
    }
    auto it = by_attempt[s->provider].find(s->attempt_id);
    const bool found = it != by_attempt[s->provider].end();
    SessionRecord rec;
    {
      absl::MutexLock l(&mu_);
      if (found) s->sandbox_id = it->second;
      rec = RecordOf(*s, found ? StoredState::kReady : StoredState::kGone);
    }
    if (store_) {
      if (found) {
        StoreWrite("resolve ready", store_->PutSession(rec));
      } else if (rec.generation > 1) {
        rec.generation -= 1;
        StoreWrite("resolve forget", store_->PutSession(rec));
      } else {
        StoreWrite("resolve forget", store_->DeleteSession(rec.tenant, rec.session_id));
      }
    }
    absl::MutexLock l(&mu_);
    s->recovered = false;
    s->resolve_deferred = false;
    if (found) {
      s->state = SessionStateKind::kReady;
      s->adopt_pending = true;
      IndexIdleLocked(s.get());
      if (s->max_lifetime > absl::ZeroDuration()) {
        s->lifetime_key = s->created_mono + s->max_lifetime;
        lifetime_.insert({s->lifetime_key, s.get()});
      }
    } else {
      RemoveLocked(s.get());
      metrics_->SessionClosed(s->provider, s->tenant, CloseReasonName(CloseReason::kGone));
      if (s->generation > 1) next_generation_[{s->tenant, s->session_id}] = s->generation;
    }
    Log(LogLevel::kInfo, "session.resolved",
        {{"tenant", s->tenant},
         {"session_id", s->session_id},
         {"outcome", found ? "adopted" : "forgotten"},
         {"sandbox_id", s->sandbox_id}});
  }
  for (auto& s : closing) {
    {
      absl::MutexLock l(&mu_);
      s->recovered = false;
    }
    FinishClose(s, nullptr, CloseReason::kShutdown);
  }
  return deferred;
}

int SessionManager::SweepOrphans(absl::Duration grace) {
  if (store_ == nullptr) return 0;
  int destroyed = 0;
  for (const std::string& name : providers_->Names()) {
    absl::StatusOr<Provider*> p = providers_->Find(name);
    if (!p.ok()) continue;
    absl::StatusOr<std::vector<OwnedSandbox>> listed = (*p)->ListOwned(deployment_id_);
    if (!listed.ok()) {
      if (listed.status().code() != absl::StatusCode::kUnimplemented) {
        Log(LogLevel::kWarning, "sweep.list_failed",
            {{"provider", name}, {"error", listed.status().message()}});
      }
      continue;
    }
    std::vector<OwnedSandbox> orphans;
    std::set<std::string> owned_ids, owned_attempts;
    if (store_->shared()) {
      // Every replica's sessions count (read after the listing: a sandbox
      // created meanwhile has its intent row by now). A read error spares
      // everything.
      absl::StatusOr<std::vector<SessionRecord>> all = store_->LoadAllSessions();
      if (!all.ok()) {
        Log(LogLevel::kWarning, "sweep.store_read_failed",
            {{"provider", name}, {"error", all.status().message()}});
        return destroyed;
      }
      for (const SessionRecord& r : *all) {
        if (!r.sandbox_id.empty()) owned_ids.insert(r.sandbox_id);
        owned_attempts.insert(r.attempt_id);
      }
    }
    {
      absl::MutexLock l(&mu_);
      for (const auto& [tenant, sessions] : tenants_) {
        for (const auto& [id, s] : sessions) {
          if (!s->sandbox_id.empty()) owned_ids.insert(s->sandbox_id);
          owned_attempts.insert(s->attempt_id);
        }
      }
      const absl::Time now = clock_->Now();
      std::map<std::string, absl::Time> seen;
      for (const OwnedSandbox& o : *listed) {
        if (owned_ids.count(o.sandbox_id) || owned_attempts.count(o.attempt_id)) continue;
        absl::Time born = o.created_at;
        if (born == absl::InfinitePast()) {
          auto f = first_seen_.find(o.sandbox_id);
          born = f == first_seen_.end() ? now : f->second;
          seen[o.sandbox_id] = born;
        }
        if (now - born >= grace) orphans.push_back(o);
      }
      first_seen_ = std::move(seen);
    }
    for (const OwnedSandbox& o : orphans) {
      SandboxSpec spec = SpecOf(o.tenant, o.session_id, instance_id_, deployment_id_, o.attempt_id,
                                "", Language::kPython, {}, {});
      absl::StatusOr<std::unique_ptr<Sandbox>> att = (*p)->Attach(o.sandbox_id, spec);
      absl::Status st = att.ok() ? (*att)->Destroy() : att.status();
      if (!att.ok() && IsSandboxGone(st)) continue;
      Log(st.ok() ? LogLevel::kInfo : LogLevel::kWarning, "sweep.orphan_destroyed",
          {{"provider", name},
           {"sandbox_id", o.sandbox_id},
           {"session_id", o.session_id},
           {"result", st.ok() ? std::string("ok") : std::string(st.message())}});
      if (st.ok()) {
        ++destroyed;
        Failpoint("sweep.after_destroy");
      }
    }
  }
  return destroyed;
}

void SessionManager::FlushActivity() {
  if (store_ == nullptr) return;
  std::vector<SessionStore::Touch> touches;
  {
    absl::MutexLock l(&mu_);
    if (dirty_.empty()) return;
    const absl::Time now = clock_->Monotonic();
    std::vector<std::pair<std::string, std::string>> keep;
    for (auto& key : dirty_) {
      auto t = tenants_.find(key.first);
      if (t == tenants_.end()) continue;
      auto it = t->second.find(key.second);
      if (it == t->second.end()) continue;
      Session* s = it->second.get();
      if (s->flushed_mono + kFlushEvery > now) {
        keep.push_back(std::move(key));
        continue;
      }
      s->dirty = false;
      s->flushed_mono = now;
      touches.push_back({s->tenant, s->session_id, s->last_active_wall});
    }
    dirty_ = std::move(keep);
  }
  StoreWrite("activity", store_->TouchSessions(touches));
}

void SessionManager::DetachAll() {
  std::vector<std::shared_ptr<Sandbox>> sandboxes;
  std::vector<SessionStore::Touch> touches;
  {
    absl::MutexLock l(&mu_);
    for (auto& [tenant, sessions] : tenants_) {
      for (auto& [id, s] : sessions) {
        touches.push_back({s->tenant, s->session_id, s->last_active_wall});
        if (s->sandbox) sandboxes.push_back(std::move(s->sandbox));
        s->gone = true;
        s->idle_key = s->lifetime_key = absl::InfiniteFuture();
      }
    }
    tenants_.clear();
    idle_.clear();
    lifetime_.clear();
    dirty_.clear();
    total_ = 0;
  }
  if (store_) StoreWrite("activity", store_->TouchSessions(touches));
  for (auto& sb : sandboxes) sb->Detach();
  if (!sandboxes.empty()) {
    Log(LogLevel::kInfo, "sessions.detached",
        {{"sandboxes", static_cast<int64_t>(sandboxes.size())}});
  }
}

}  // namespace sandbox

namespace sandbox {

bool SessionManager::MatchesLocked(const Session& s, const SessionFilter& f) const {
  if (!f.tenant.empty() && s.tenant != f.tenant) return false;
  if (!f.provider.empty() && s.provider != f.provider) return false;
  if (f.state.has_value() && s.state != *f.state) return false;
  for (const auto& [k, v] : f.labels) {
    auto it = s.labels.find(k);
    if (it == s.labels.end() || it->second != v) return false;
  }
  return true;
}

std::vector<SessionView> SessionManager::ListAll(const SessionFilter& f,
                                                 const std::pair<std::string, std::string>& after,
                                                 int limit, bool* more) {
  std::vector<std::pair<SessionView, std::shared_ptr<Sandbox>>> rows;
  *more = false;
  {
    absl::MutexLock l(&mu_);
    ListAllLocked(f, after, limit, more, &rows);
  }
  return WithUsage(std::move(rows));
}

void SessionManager::ListAllLocked(
    const SessionFilter& f, const std::pair<std::string, std::string>& after, int limit, bool* more,
    std::vector<std::pair<SessionView, std::shared_ptr<Sandbox>>>* rows) {
  std::vector<const std::string*> names;
  for (const auto& [tenant, sessions] : tenants_) {
    if (f.tenant.empty() ? tenant >= after.first : tenant == f.tenant) names.push_back(&tenant);
  }
  std::sort(names.begin(), names.end(),
            [](const std::string* a, const std::string* b) { return *a < *b; });
  for (const std::string* tenant : names) {
    const auto& sessions = tenants_.find(*tenant)->second;
    auto it = *tenant == after.first ? sessions.upper_bound(after.second) : sessions.begin();
    if (*tenant < after.first) continue;
    for (; it != sessions.end(); ++it) {
      if (!MatchesLocked(*it->second, f)) continue;
      if (static_cast<int>(rows->size()) == limit) {
        *more = true;
        return;
      }
      rows->emplace_back();
      rows->back().first = ViewLocked(*it->second, &rows->back().second);
    }
  }
}

int SessionManager::CloseMatching(const SessionFilter& f, CloseReason reason) {
  std::vector<std::pair<std::string, std::string>> keys;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [tenant, sessions] : tenants_) {
      if (!f.tenant.empty() && tenant != f.tenant) continue;
      for (const auto& [id, s] : sessions) {
        if (MatchesLocked(*s, f)) keys.emplace_back(tenant, id);
      }
    }
  }
  int n = 0;
  for (const auto& [tenant, id] : keys) {
    auto r = Close(tenant, id, reason);
    if (r.ok() && *r) ++n;
  }
  return n;
}

}  // namespace sandbox
