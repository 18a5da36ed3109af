#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "adapters/api/provider.h"
#include "adapters/api/registry.h"
#include "common/clock.h"
#include "common/limiter.h"
#include "server/store/session_store.h"
#include "server/telemetry/metrics.h"

namespace sandbox {

struct SessionLimits {
  absl::Duration idle_timeout = absl::Seconds(300);
  absl::Duration max_lifetime = absl::ZeroDuration();  // zero = none
  int64_t max_sessions_per_tenant = 100;
  // How long Close waits for in-flight calls before destroying anyway.
  absl::Duration close_wait = absl::Seconds(10);
};

// What a call that may create the session's sandbox asks for.
struct CreateOptions {
  std::string provider;  // empty = default provider
  std::string template_name;
  Language language = Language::kPython;
  bool language_set = false;
  std::map<std::string, std::string> env;
  std::map<std::string, std::string> labels;
  SandboxResources resources;          // SessionSpec.resources
  SandboxResources resources_ceiling;  // the tenant's maximum (SandboxSpec.ceiling)
  NetworkPolicy network;               // what the sandbox may reach (docs/network.md)
  // Seed files: written before the first call runs; (path, bytes).
  std::vector<std::pair<std::string, std::string>> files;
  // Tenant policy (server/config/policy.h) for a session this call creates; zero
  // values mean the manager's own limits.
  std::string default_provider;  // when `provider` is empty
  int64_t max_sessions = 0;      // the tenant's quota; refusals name it
  absl::Duration idle_timeout = absl::ZeroDuration();
  absl::Duration max_lifetime = absl::ZeroDuration();
};

enum class SessionStateKind { kCreating, kReady, kClosing };

// A point-in-time view of one session, for GetSession / ListSessions.
struct SessionView {
  std::string tenant;
  std::string session_id;
  std::string provider;
  std::string sandbox_id;
  SessionStateKind state = SessionStateKind::kCreating;
  absl::Time created_at;
  absl::Time last_active_at;
  std::optional<absl::Time> idle_expires_at;  // unset while calls run
  std::optional<absl::Time> expires_at;       // max lifetime
  Language language = Language::kPython;
  std::string template_name;
  std::map<std::string, std::string> labels;
  int calls_in_flight = 0;
  // Limits applied and current use, when the provider reports them.
  std::optional<SandboxResources> resources;
  std::optional<SandboxUsage> usage;
  NetworkPolicy network;  // the rules in force
  // 1 for the session's first sandbox, +1 for each new one after its
  // sandbox vanished at the provider.
  int64_t generation = 1;
};

// Why a session ended, for logs and metrics.
enum class CloseReason { kClient, kIdle, kLifetime, kShutdown, kGone, kAdmin };
absl::string_view CloseReasonName(CloseReason r);

class SessionManager;

// Told about session lifecycle events (for usage metering and the audit
// log). Called on the thread that caused the event, with no lock held.
class SessionObserver {
 public:
  virtual ~SessionObserver() = default;
  virtual void SessionCreated(const SessionView& v) {}
  // A session taken over from a store or another replica.
  virtual void SessionAdopted(const SessionView& v) {}
  // `age`: from creation to destruction.
  virtual void SessionClosed(const SessionView& v, CloseReason reason, absl::Duration age) {}
};

// Which sessions an admin listing or bulk close selects (empty = any).
struct SessionFilter {
  std::string tenant;
  std::string provider;
  std::optional<SessionStateKind> state;
  std::map<std::string, std::string> labels;  // all must match
};

// A call's hold on a session: while any lease exists the session is not
// idle and cannot be reaped. Movable; releasing marks the session active now.
class Lease {
 public:
  Lease() = default;
  Lease(Lease&& o) noexcept { *this = std::move(o); }
  Lease& operator=(Lease&& o) noexcept;
  ~Lease() { Release(); }

  Sandbox* sandbox() const { return sandbox_.get(); }
  Language language() const { return language_; }
  const std::string& provider() const { return provider_; }
  // The session's sandbox generation this lease holds.
  int64_t generation() const { return generation_; }
  void Release();

 private:
  friend class SessionManager;
  SessionManager* manager_ = nullptr;
  std::shared_ptr<void> session_;  // keeps the session alive
  std::shared_ptr<Sandbox> sandbox_;
  Language language_ = Language::kPython;
  std::string provider_;
  int64_t generation_ = 0;
};

// The session table: exactly one provider sandbox per (tenant, session id),
// created lazily and single-flight, reaped when idle, destroyed once.
//
// Time comes from the injected Clock; RunOnce() reaps deterministically, so
// tests advance a FakeClock instead of sleeping. No lock is held across a
// provider call.
//
// Thread-safe.
class SessionManager {
 public:
  // `metrics` and `store` may be null (no store: nothing is written ahead
  // and nothing is recovered).
  SessionManager(const ProviderRegistry* providers, Clock* clock, SessionLimits limits,
                 std::string default_provider, std::string broker_instance_id,
                 Metrics* metrics = nullptr, SessionStore* store = nullptr);
  // Closes every session, or (SetDetachOnShutdown) lets go of them.
  ~SessionManager();

  // ---- durable sessions (see docs/durability.md) ----

  // Loads the store's sessions into the table without calling any provider:
  // ready rows become sessions whose sandbox is attached on first use (or
  // destroyed when they idle out); creating and closing rows wait for
  // ResolvePending. Idle deadlines continue by wall clock. Returns how many
  // sessions were loaded.
  absl::StatusOr<int64_t> LoadFromStore();
  // Resolves rows a crash left mid-way: creating rows through the attempt
  // tag at the provider (adopted if the sandbox exists, else forgotten),
  // closing rows by finishing the destroy. One ListOwned call per provider.
  // A creating row whose provider cannot be listed stays (calls on it get
  // UNAVAILABLE meanwhile; the orphan sweep spares its sandbox): returns
  // how many, for the caller to try again later.
  int ResolvePending();
  // Destroys sandboxes tagged with this deployment that no session owns and
  // that are at least `grace` old. Returns how many were destroyed.
  int SweepOrphans(absl::Duration grace);
  // Writes last-activity times changed since the last flush (at most once a
  // second per session). Cheap when nothing changed.
  void FlushActivity();
  // On destruction, let go of sandboxes (Sandbox::Detach) instead of closing
  // them, so the next process adopts them.
  void SetDetachOnShutdown(bool detach);
  // Forgets every session without destroying its sandbox; rows stay.
  void DetachAll();

  // ---- more than one broker (see docs/cluster.md) ----

  // Takes over one session another replica held (its row, read after this
  // replica claimed it): a ready row becomes a session whose sandbox is
  // attached on first use (a local sandbox from another machine is gone:
  // the next call gets a new one, generation + 1); a creating row starts
  // over; a closing row's destroy is finished. No-op when the session is
  // in the table already.
  absl::Status AdoptRecord(const SessionRecord& r);
  // This replica lost its lease: forgets every session, writing nothing;
  // sandboxes whose provider `destroy` names are destroyed (local ones no
  // other replica can reach), the rest let go of (another replica adopts
  // them). Returns how many sessions were given up.
  int GiveUp(const std::function<bool(const std::string& provider)>& destroy);
  // How a stored row (another replica's session) looks in a listing.
  static SessionView ViewOfRecord(const SessionRecord& r);
  const std::string& deployment_id() const { return deployment_id_; }

  // A lease on the session. When it has no sandbox and `create` is set, one
  // is created (concurrent callers share one creation; a failed creation is
  // not remembered). Errors: NOT_FOUND (no session, `create` null),
  // RESOURCE_EXHAUSTED (tenant quota), FAILED_PRECONDITION (spec conflicts
  // with the session; unknown provider), and whatever the provider's Create
  // returns.
  absl::StatusOr<Lease> Acquire(const std::string& tenant, const std::string& session_id,
                                const CreateOptions* create);

  // Acquire for a caller that must not wait on the provider: a lease or an
  // error is given to `done`, once. A creation of its own runs with
  // Provider::CreateAsync and holds no thread while the provider works;
  // another call's creation is waited for as a callback. The steps that
  // block run on the calling thread (the intent row; waiting on a close or
  // an attach) or on WorkPool::Shared() (seed files, the ready row), where
  // `done` is then called. `create` must stay valid until `done` runs.
  using LeaseDone = std::function<void(absl::StatusOr<Lease>)>;
  void AcquireAsync(const std::string& tenant, const std::string& session_id,
                    const CreateOptions* create, LeaseDone done);

  // Acquire without waiting: a lease when the session is ready and needs no
  // provider call (no create, no attach, no creation to wait for); else
  // sets *would_block and returns UNAVAILABLE, and the caller goes to
  // Acquire on a thread that may block. Other errors as Acquire.
  absl::StatusOr<Lease> TryAcquire(const std::string& tenant, const std::string& session_id,
                                   const CreateOptions* create, bool* would_block);

  // When the session's sandbox is being created now: registers `wake`,
  // called once the creation settles (OK: look again with TryAcquire; an
  // error: the creation failed and that is the answer, as Acquire gives it),
  // and returns true. False when no creation is in progress (look again at
  // once). The caller holds no thread while it waits.
  bool WaitForCreation(const std::string& tenant, const std::string& session_id,
                       std::function<void(absl::Status)> wake);

  // Per provider: at most `limit` creates (Provider::Create) at once; more
  // wait in the limiter's queue. Set before serving. Not owned.
  void SetCreateLimiter(const std::string& provider, Limiter* limiter) {
    create_limiters_[provider] = limiter;
  }

  // Closes the session: waits (bounded) for in-flight calls, destroys the
  // sandbox exactly once. Returns whether the session existed. Idempotent.
  absl::StatusOr<bool> Close(const std::string& tenant, const std::string& session_id,
                             CloseReason reason = CloseReason::kClient);
  // Close holding no thread while the provider destroys the sandbox
  // (Sandbox::DestroyAsync). The steps that block run on the calling thread
  // (waiting for another call's create or close, or for the session's calls
  // to finish; the closing row) or on WorkPool::Shared() (the last row),
  // where `done` is then called.
  using CloseDone = std::function<void(absl::StatusOr<bool>)>;
  void CloseAsync(const std::string& tenant, const std::string& session_id, CloseReason reason,
                  CloseDone done);

  absl::StatusOr<SessionView> Get(const std::string& tenant, const std::string& session_id);

  // Up to `limit` sessions with id > `after`, ordered by id; `more` tells
  // whether any follow.
  std::vector<SessionView> List(const std::string& tenant, const std::string& after, int limit,
                                bool* more);

  // Counts as activity; returns the new idle deadline. NOT_FOUND if none.
  absl::StatusOr<absl::Time> KeepAlive(const std::string& tenant, const std::string& session_id);

  // The network rules now in force for a ready session (its sandbox already
  // follows them), kept in the store for adoption. NOT_FOUND if none.
  absl::Status SetNetwork(const std::string& tenant, const std::string& session_id,
                          const NetworkPolicy& network);

  // Closes sessions idle past the idle timeout or older than the max
  // lifetime. Work is proportional to the sessions that expire. Returns how
  // many were closed.
  int RunOnce();

  // Closes every session (reason kShutdown).
  void CloseAll();

  // Across tenants (the Admin API): up to `limit` sessions matching `f` after
  // (tenant, id) `after`, ordered by (tenant, id).
  std::vector<SessionView> ListAll(const SessionFilter& f,
                                   const std::pair<std::string, std::string>& after, int limit,
                                   bool* more);
  // Closes every session matching `f`; returns how many were closed.
  int CloseMatching(const SessionFilter& f, CloseReason reason);

  // Set before serving; may be null.
  void set_observer(SessionObserver* o) { observer_ = o; }

  int64_t size() const;

 private:
  struct Session;
  friend class Lease;

  void ReleaseLease(Session* s);
  // FAILED_PRECONDITION when a ready session is asked for with another
  // provider / template than it has (Acquire and TryAcquire).
  static absl::Status ProviderConflict(const Session& s, const CreateOptions* create);
  static absl::Status TemplateConflict(const Session& s, const CreateOptions* create);
  // A session as seen now, without its usage: reading usage is I/O (cgroup
  // files, statvfs), never done under mu_. `sandbox`, when given, receives
  // the sandbox whose usage WithUsage reads once mu_ is released.
  SessionView ViewLocked(const Session& s, std::shared_ptr<Sandbox>* sandbox = nullptr) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ListAllLocked(const SessionFilter& f, const std::pair<std::string, std::string>& after,
                     int limit, bool* more,
                     std::vector<std::pair<SessionView, std::shared_ptr<Sandbox>>>* rows)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills each view's usage from its sandbox (null: none). Called without mu_.
  static std::vector<SessionView> WithUsage(
      std::vector<std::pair<SessionView, std::shared_ptr<Sandbox>>> rows) ABSL_LOCKS_EXCLUDED(mu_);
  void UnindexLocked(Session* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void IndexIdleLocked(Session* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Destroys a sandbox taken from a closing session (no lock held) and
  // removes the session from the table.
  void FinishClose(const std::shared_ptr<Session>& s, std::shared_ptr<Sandbox> sandbox,
                   CloseReason reason);
  // FinishClose's steps: the closing row (and whether this process still
  // owns the session), the destroy, the last row and the table.
  struct Closing {
    SessionRecord rec;
    bool owned = true;
    bool pending = false;  // recovered, not yet attached
    std::optional<SandboxUsage> final_usage;
  };
  Closing BeginDestroy(const std::shared_ptr<Session>& s, CloseReason reason);
  void FinishCloseFrom(const std::shared_ptr<Session>& s, std::shared_ptr<Sandbox> sandbox,
                       Closing c, CloseReason reason);
  void EndClose(const std::shared_ptr<Session>& s, Closing c, CloseReason reason,
                const absl::Status& st);
  // Acquire's table work: a lease, an error, or (*fresh set, with its
  // provider) a new session in state creating that the caller must create.
  // With `wake`, another call's creation in progress is not waited for:
  // `wake` joins its waiters and *waiting is set.
  absl::StatusOr<Lease> AcquireOrBegin(const std::string& tenant, const std::string& session_id,
                                       const CreateOptions* create, std::shared_ptr<Session>* fresh,
                                       Provider** fresh_provider,
                                       std::function<void(absl::Status)>* wake, bool* waiting);
  // Creates the sandbox of a session in state creating: the intent row
  // (BeginCreate), a create slot, the provider's create, then FinishCreate
  // (seed files, the ready row, the table, the waiters).
  absl::StatusOr<Lease> CreateAndLease(const std::shared_ptr<Session>& s, Provider* provider,
                                       const CreateOptions& o);
  void CreateAndLeaseAsync(const std::shared_ptr<Session>& s, Provider* provider,
                           const CreateOptions& o, LeaseDone done);
  SandboxSpec CreateSpecOf(const Session& s, const CreateOptions& o) const;
  absl::Status BeginCreate(const Session& s);
  absl::StatusOr<Lease> FinishCreate(const std::shared_ptr<Session>& s, const CreateOptions& o,
                                     absl::StatusOr<std::unique_ptr<Sandbox>> created,
                                     absl::Time start);
  Limiter* CreateLimiter(const std::string& provider) const;
  // Attaches a recovered session's sandbox (mu_ held; released around the
  // provider call). OK: ready with a sandbox. A gone sandbox: the session is
  // removed (its next sandbox gets generation + 1).
  absl::Status AdoptLocked(const std::shared_ptr<Session>& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same without holding a thread while the provider attaches: the
  // session's waiters are called when it settles.
  void StartAdoptLocked(const std::shared_ptr<Session>& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct AdoptPlan {
    std::string provider, sandbox_id;
    SandboxSpec spec;
  };
  // Adoption's steps: mark the session creating (callers wait), then, with
  // the provider's answer, the tombstone of a gone sandbox (unlocked), then
  // the session ready, removed or left for a retry, and its waiters called.
  AdoptPlan BeginAdoptLocked(const std::shared_ptr<Session>& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AdoptGone(const Session& s, const absl::Status& attached);
  absl::Status FinishAdoptLocked(const std::shared_ptr<Session>& s,
                                 absl::StatusOr<std::unique_ptr<Sandbox>> att, bool gone)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveLocked(Session* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkActiveLocked(Session* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  SessionRecord RecordOf(const Session& s, StoredState state) const;
  // A session from a stored row (ready rows indexed as idle).
  std::shared_ptr<Session> FromRecordLocked(const SessionRecord& r, absl::Time now_wall,
                                            absl::Time now_mono) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Store write failures are logged; the in-memory table stays the truth.
  void StoreWrite(const char* what, const absl::Status& s);
  Lease MakeLeaseLocked(const std::shared_ptr<Session>& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ProviderRegistry* const providers_;
  Clock* const clock_;
  const SessionLimits limits_;
  const std::string default_provider_;
  const std::string instance_id_;
  Metrics* const metrics_;
  SessionObserver* observer_ = nullptr;

  bool MatchesLocked(const Session& s, const SessionFilter& f) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  SessionStore* const store_;
  const std::string deployment_id_;
  std::map<std::string, Limiter*> create_limiters_;  // by provider
  bool detach_on_shutdown_ = false;

  mutable absl::Mutex mu_;
  // tenant -> (session id -> session), ordered for paging.
  absl::flat_hash_map<std::string, std::map<std::string, std::shared_ptr<Session>>> tenants_
      ABSL_GUARDED_BY(mu_);
  int64_t total_ ABSL_GUARDED_BY(mu_) = 0;
  // Ready sessions with no call in flight, by idle deadline (monotonic).
  absl::btree_set<std::pair<absl::Time, Session*>> idle_ ABSL_GUARDED_BY(mu_);
  // Sessions by max-lifetime deadline (monotonic), when one is set.
  absl::btree_set<std::pair<absl::Time, Session*>> lifetime_ ABSL_GUARDED_BY(mu_);
  // Sessions whose last activity is not yet in the store.
  std::vector<std::pair<std::string, std::string>> dirty_ ABSL_GUARDED_BY(mu_);
  // Sessions whose sandbox vanished: the generation their next one gets.
  std::map<std::pair<std::string, std::string>, int64_t> next_generation_ ABSL_GUARDED_BY(mu_);
  // Orphan candidates without a provider creation time: when first seen.
  std::map<std::string, absl::Time> first_seen_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sandbox
