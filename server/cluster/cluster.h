#pragma once

// More than one broker (issue #13; docs/cluster.md):
// N replicas share sessions through etcd, one owner replica per session.
//
// - Membership: each replica registers its id and advertise address under
//   a lease of member_ttl (EtcdStore::RegisterMember), renewed every ttl/3
//   by this class's keeper thread.
// - Ownership: a session's owner key (EtcdStore::ClaimSession) lives under
//   its owner's lease; its mod_revision is the fencing token. Every store
//   write about the session goes through ClusterStore, a transaction
//   conditioned on that token; the intent write right before a provider
//   create and the closing write right before a destroy are such writes.
// - Routing (Resolve): a session this replica holds is served here; one a
//   live replica owns is forwarded to it; an unowned one is claimed here
//   (remote providers) or placed by rendezvous hashing of (tenant, session)
//   over the live members (machine-local providers: the local sandbox).
// - Takeover: a claimed session's row, left by a replica whose lease
//   expired, is adopted (SessionManager::AdoptRecord); the keeper also scans
//   for unowned rows every `scan_interval` and adopts those that rendezvous
//   places here, so idle sessions of a dead replica are still reaped.
// - Self-fencing: when a renewal says the lease is gone, or none succeeded
//   for a whole TTL (etcd unreachable: the others may have taken over), the
//   replica stops serving, gives its sessions up (local sandboxes are
//   destroyed, remote ones let go of) and joins again as a new member.
//
// Thread-safe.

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/sessions/session_manager.h"
#include "server/store/etcd/etcd_store.h"
#include "server/store/session_store.h"

namespace sandbox {

struct ClusterOptions {
  std::string member_id;
  // host:port other replicas reach this one's gRPC listener on.
  std::string advertise_address;
  // Shared by the replicas; presented on forwarded calls.
  std::string token;
  absl::Duration member_ttl = absl::Seconds(10);
  // The replica acts on its sessions while its lease is provably valid:
  // until the last renewal that succeeded + member_ttl - this margin (room
  // for clock drift and pauses). Past that it fences itself (refuses,
  // saying why) until a renewal succeeds again.
  absl::Duration lease_safety_margin = absl::Seconds(1);
  // Providers whose sandboxes live on the replica's own machine.
  std::set<std::string> machine_local = {"local"};
  // How often the keeper looks for sessions nobody owns (zero: member_ttl).
  absl::Duration scan_interval = absl::ZeroDuration();
};

// Where a call goes.
struct ClusterRoute {
  bool local = true;
  std::string owner;    // the owning (or chosen) member
  std::string address;  // its advertise address, when !local
};

// One session row of the cluster listing, with its owner ("" when the
// owner's lease expired and nobody has taken it over yet).
struct ClusterSession {
  SessionRecord record;
  std::string owner;
};

class Cluster {
 public:
  // `etcd` and `clock` are not owned and outlive this.
  Cluster(EtcdStore* etcd, ClusterOptions options, Clock* clock);
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  // The store the session manager writes through (fenced writes).
  SessionStore* store() { return store_.get(); }

  // Registers this member; waits (up to member_ttl + 2 s) for a crashed
  // predecessor with the same id to expire. UNAVAILABLE when etcd does not
  // answer.
  absl::Status Join();
  // The session table takeovers go to (set before serving; not owned).
  void SetSessions(SessionManager* sessions) { sessions_ = sessions; }
  // Starts the keeper (renewals, self-fencing, the takeover scan).
  void Start();
  // Stops the keeper and revokes the lease: this replica's owner keys go
  // with it, and other replicas adopt its sessions on their next call.
  void Leave();

  const std::string& member_id() const { return options_.member_id; }
  const std::string& advertise_address() const { return options_.advertise_address; }
  // Before Join (the bound port is known only once the server listens).
  void set_advertise_address(std::string a) { options_.advertise_address = std::move(a); }
  const std::string& token() const { return options_.token; }
  // A member whose lease is confirmed within the TTL.
  bool ready() const;

  // Without etcd: true when this replica holds the session and its lease is
  // fresh (the common case: the call is served here at once).
  bool ServesLocally(const std::string& tenant, const std::string& session_id) const;
  // Blocking (etcd round trips). `provider`: the provider a new session
  // would get; `may_create`: the call creates the session when it has none;
  // `forwarded`: the call came from another replica (it is never forwarded
  // again: UNAVAILABLE when this replica is not the owner). UNAVAILABLE when
  // etcd does not answer or this replica's lease is not confirmed (fail
  // closed: nothing is created or claimed unrecorded).
  absl::StatusOr<ClusterRoute> Resolve(const std::string& tenant, const std::string& session_id,
                                       const std::string& provider, bool may_create,
                                       bool forwarded);
  // A forward to `owner` failed: forget the cached route.
  void ForgetRoute(const std::string& tenant, const std::string& session_id);

  // Every replica's sessions of one tenant, in session id order, with
  // their owners.
  absl::StatusOr<std::vector<ClusterSession>> ListTenant(const std::string& tenant);

  // Looks for sessions nobody owns and takes over those rendezvous places
  // here. Returns how many were taken over. (The keeper calls it; tests
  // may too.)
  int ScanOnce();

  // For ClusterStore: the fencing token of a session this replica holds.
  std::optional<int64_t> FenceOf(const std::string& tenant, const std::string& session_id) const;
  void Released(const std::string& tenant, const std::string& session_id);

  // The member rendezvous hashing places (tenant, session) on, among `ids`.
  static std::string Rendezvous(const std::string& tenant, const std::string& session_id,
                                const std::vector<std::string>& ids);

 private:
  using Key = std::pair<std::string, std::string>;
  struct CachedRoute {
    ClusterRoute route;
    absl::Time until;  // monotonic
  };
  bool FreshLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The live members (cached for a second). UNAVAILABLE on a read error.
  absl::StatusOr<std::vector<MemberInfo>> Members(bool refresh);
  absl::StatusOr<std::string> AddressOf(const std::string& member_id);
  // Claimed (or found owned by this member): reads the session's row and
  // adopts it, then records the claim.
  absl::Status TakeOver(const Key& key, int64_t fence);
  void Keep();
  void Lose(const std::string& why);

  EtcdStore* const etcd_;
  ClusterOptions options_;
  Clock* const clock_;
  std::unique_ptr<SessionStore> store_;
  SessionManager* sessions_ = nullptr;

  mutable absl::Mutex mu_;
  std::unique_ptr<EtcdMember> member_ ABSL_GUARDED_BY(mu_);
  bool lost_ ABSL_GUARDED_BY(mu_) = true;  // until Join
  // When the last renewal that succeeded was sent (monotonic): etcd
  // extended the lease after that, so it holds until this + TTL.
  absl::Time renewed_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::flat_hash_map<Key, int64_t> claims_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Key, CachedRoute> routes_ ABSL_GUARDED_BY(mu_);
  std::vector<MemberInfo> members_ ABSL_GUARDED_BY(mu_);
  absl::Time members_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // One takeover at a time on this replica: a row is read and adopted
  // once, never after the session it described was closed again.
  absl::Mutex takeover_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  absl::Notification stop_;
  std::thread keeper_;
};

}  // namespace sandbox
