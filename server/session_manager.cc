#include "server/session_manager.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace sandbox {

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
  absl::Time created_wall;
  absl::Time created_mono;
  absl::Duration idle_timeout;
  absl::Duration max_lifetime;  // zero = none

  // Guarded by SessionManager::mu_.
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
};

Lease& Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    Release();
    manager_ = o.manager_;
    session_ = std::move(o.session_);
    sandbox_ = std::move(o.sandbox_);
    language_ = o.language_;
    provider_ = std::move(o.provider_);
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
                               std::string broker_instance_id, Metrics* metrics)
    : providers_(providers),
      clock_(clock),
      limits_(limits),
      default_provider_(std::move(default_provider)),
      instance_id_(std::move(broker_instance_id)),
      metrics_(metrics) {}

SessionManager::~SessionManager() { CloseAll(); }

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
}

absl::StatusOr<Lease> SessionManager::Acquire(const std::string& tenant,
                                              const std::string& session_id,
                                              const CreateOptions* create) {
  Provider* provider = nullptr;
  std::string provider_name;
  if (create != nullptr) {
    provider_name = !create->provider.empty()         ? create->provider
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
        return absl::ResourceExhaustedError(absl::StrCat("tenant ", tenant, ": max_sessions (",
                                                         create->max_sessions,
                                                         ") reached: close a session first"));
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
      mu_.Unlock();
      absl::StatusOr<Lease> lease = CreateAndLease(s, provider, *create);
      mu_.Lock();
      return lease;
    }
    std::shared_ptr<Session> s = it->second;
    if (s->state == SessionStateKind::kCreating || s->state == SessionStateKind::kClosing) {
      const SessionStateKind was = s->state;
      auto changed = [&s, was]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return s->gone || s->state != was; };
      mu_.Await(absl::Condition(&changed));
      if (was == SessionStateKind::kCreating && s->gone && !s->create_status.ok()) {
        // We waited on that creation; its failure is our answer.
        return s->create_status;
      }
      continue;  // look again: ready, or gone (then create anew)
    }
    // Ready.
    if (create != nullptr && !create->provider.empty() && create->provider != s->provider) {
      return absl::FailedPreconditionError(absl::StrCat(
          "session \"", session_id, "\" runs on provider \"", s->provider, "\", not \"",
          create->provider, "\"; close it first or use another session id"));
    }
    if (create != nullptr && !create->template_name.empty() &&
        create->template_name != s->template_name) {
      return absl::FailedPreconditionError(
          absl::StrCat("session \"", session_id, "\" was created with template \"",
                       s->template_name, "\", not \"", create->template_name, "\""));
    }
    return MakeLeaseLocked(s);
  }
}

absl::StatusOr<Lease> SessionManager::CreateAndLease(const std::shared_ptr<Session>& s,
                                                     Provider* provider, const CreateOptions& o) {
  SandboxSpec spec;
  spec.tenant = s->tenant;
  spec.session_id = s->session_id;
  spec.broker_instance_id = instance_id_;
  spec.template_name = o.template_name;
  spec.language = o.language;
  spec.env = o.env;
  spec.labels = o.labels;
  spec.resources = o.resources;
  spec.ceiling = o.resources_ceiling;
  const absl::Time start = clock_->Monotonic();
  absl::StatusOr<std::unique_ptr<Sandbox>> created = provider->Create(spec);
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
  mu_.Lock();
  if (!status.ok()) {
    auto t = tenants_.find(s->tenant);
    t->second.erase(s->session_id);
    if (t->second.empty()) tenants_.erase(t);
    --total_;
    s->gone = true;
    s->create_status = status;
    if (metrics_) {
      metrics_->SessionCreateFailed(s->provider, absl::StatusCodeToString(status.code()));
    }
    Log(LogLevel::kWarning, "session.create_failed",
        {{"tenant", s->tenant},
         {"session_id", s->session_id},
         {"provider", s->provider},
         {"code", absl::StatusCodeToString(status.code())}});
    mu_.Unlock();
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
  if (metrics_) metrics_->SessionCreated(s->provider, s->tenant, clock_->Monotonic() - start);
  Log(LogLevel::kInfo, "session.created",
      {{"tenant", s->tenant},
       {"session_id", s->session_id},
       {"provider", s->provider},
       {"sandbox_id", s->sandbox_id},
       {"duration_ms", absl::ToInt64Milliseconds(clock_->Monotonic() - start)}});
  Lease lease = MakeLeaseLocked(s);
  SessionView view = ViewLocked(*s);
  mu_.Unlock();
  if (observer_ != nullptr) observer_->SessionCreated(view);
  return lease;
}

void SessionManager::FinishClose(const std::shared_ptr<Session>& s,
                                 std::shared_ptr<Sandbox> sandbox, CloseReason reason) {
  // What the sandbox used, read just before it is destroyed (usage metering
  // counts its CPU seconds at close).
  std::optional<SandboxUsage> final_usage;
  if (sandbox) final_usage = sandbox->Usage();
  absl::Status st = sandbox ? sandbox->Destroy() : absl::OkStatus();
  mu_.Lock();
  auto t = tenants_.find(s->tenant);
  if (t != tenants_.end()) {
    t->second.erase(s->session_id);
    if (t->second.empty()) tenants_.erase(t);
  }
  --total_;
  s->gone = true;
  if (metrics_) metrics_->SessionClosed(s->provider, s->tenant, CloseReasonName(reason));
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
        auto done = [&s]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return s->gone || s->state != SessionStateKind::kCreating;
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

SessionView SessionManager::ViewLocked(const Session& s) const {
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
  if (s.sandbox) {
    v.resources = s.sandbox->Resources();
    v.usage = s.sandbox->Usage();
  }
  return v;
}

absl::StatusOr<SessionView> SessionManager::Get(const std::string& tenant,
                                                const std::string& session_id) {
  absl::MutexLock l(&mu_);
  auto t = tenants_.find(tenant);
  if (t != tenants_.end()) {
    auto it = t->second.find(session_id);
    if (it != t->second.end()) return ViewLocked(*it->second);
  }
  return absl::NotFoundError(absl::StrCat("session \"", session_id, "\" not found"));
}

std::vector<SessionView> SessionManager::List(const std::string& tenant, const std::string& after,
                                              int limit, bool* more) {
  std::vector<SessionView> out;
  *more = false;
  absl::MutexLock l(&mu_);
  auto t = tenants_.find(tenant);
  if (t == tenants_.end()) return out;
  for (auto it = t->second.upper_bound(after); it != t->second.end(); ++it) {
    if (static_cast<int>(out.size()) == limit) {
      *more = true;
      break;
    }
    out.push_back(ViewLocked(*it->second));
  }
  return out;
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
      return s->last_active_wall + s->idle_timeout;
    }
  }
  return absl::NotFoundError(absl::StrCat("session \"", session_id, "\" not found"));
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
  std::vector<SessionView> out;
  *more = false;
  absl::MutexLock l(&mu_);
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
      if (static_cast<int>(out.size()) == limit) {
        *more = true;
        return out;
      }
      out.push_back(ViewLocked(*it->second));
    }
  }
  return out;
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
