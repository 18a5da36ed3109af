#include "server/cluster/cluster.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace sandbox {

namespace {

// The session store of one replica: the etcd store, with every write about
// a session conditioned on this replica's fencing token for it.
class ClusterStore final : public SessionStore {
 public:
  ClusterStore(EtcdStore* etcd, Cluster* cluster) : etcd_(etcd), cluster_(cluster) {}

  std::string backend() const override { return "etcd"; }
  bool durable() const override { return true; }
  bool shared() const override { return true; }
  std::string deployment_id() const override { return etcd_->deployment_id(); }
  absl::Status SetDeploymentId(const std::string& id) override {
    return etcd_->SetDeploymentId(id);
  }
  absl::Time created_at() const override { return etcd_->created_at(); }

  // A replica starts owning nothing: its sessions come to it by claims.
  absl::StatusOr<std::vector<SessionRecord>> LoadSessions() override {
    return std::vector<SessionRecord>{};
  }
  absl::StatusOr<std::vector<SessionRecord>> LoadAllSessions() override {
    return etcd_->LoadSessions();
  }

  absl::Status PutSession(const SessionRecord& r) override {
    ASSIGN_OR_RETURN(int64_t fence, Fence(r.tenant, r.session_id));
    return etcd_->PutSessionFenced(r, fence);
  }
  absl::Status PutSessions(const std::vector<SessionRecord>& records) override {
    for (const SessionRecord& r : records) RETURN_IF_ERROR(PutSession(r));
    return absl::OkStatus();
  }
  absl::Status DeleteSession(const std::string& tenant, const std::string& id) override {
    ASSIGN_OR_RETURN(int64_t fence, Fence(tenant, id));
    RETURN_IF_ERROR(etcd_->DeleteSessionFenced(tenant, id, fence));
    // The session is over: the next call for its id may land anywhere.
    absl::Status released = etcd_->ReleaseSession(tenant, id, fence);
    cluster_->Released(tenant, id);
    if (!released.ok()) {
      Log(LogLevel::kWarning, "cluster.release_failed",
          {{"tenant", tenant}, {"session_id", id}, {"error", released.message()}});
    }
    return absl::OkStatus();
  }
  // Activity only (never creates a row): not fenced.
  absl::Status TouchSessions(const std::vector<Touch>& touches) override {
    return etcd_->TouchSessions(touches);
  }

  // Run results stay with the replica that ran them (see docs/cluster.md).
  absl::StatusOr<std::vector<RunRecord>> LoadRuns() override { return std::vector<RunRecord>{}; }
  absl::Status PutRun(const RunRecord& r) override { return etcd_->PutRun(r); }
  absl::Status DeleteRun(const std::string& tenant, const std::string& id,
                         const std::string& run_id) override {
    return etcd_->DeleteRun(tenant, id, run_id);
  }
  absl::Status AddUsage(const std::vector<UsageRow>& deltas) override {
    return etcd_->AddUsage(deltas);
  }
  absl::StatusOr<std::vector<UsageRow>> LoadUsage() override { return etcd_->LoadUsage(); }

 private:
  absl::StatusOr<int64_t> Fence(const std::string& tenant, const std::string& id) {
    std::optional<int64_t> f = cluster_->FenceOf(tenant, id);
    if (!f) {
      return absl::FailedPreconditionError(
          absl::StrCat("state: this replica does not own session ", tenant, "/", id,
                       " (its cluster lease lapsed, or another replica took the session over)"));
    }
    return *f;
  }

  EtcdStore* const etcd_;
  Cluster* const cluster_;
};

// 64-bit FNV-1a, then a finalizer: stable across processes and builds
// (unlike absl::Hash, which is seeded per process).
uint64_t StableHash(absl::string_view a, absl::string_view b, absl::string_view c) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](absl::string_view s) {
    for (unsigned char ch : s) {
      h ^= ch;
      h *= 1099511628211ull;
    }
    h ^= 0xff;  // separator: ("ab","c") differs from ("a","bc")
    h *= 1099511628211ull;
  };
  mix(a);
  mix(b);
  mix(c);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

absl::Status Unreachable(const absl::Status& s) {
  if (s.code() == absl::StatusCode::kUnavailable) {
    return absl::UnavailableError(
        absl::StrCat("cluster state (etcd) unreachable: ", s.message(), "; retry"));
  }
  return s;
}

}  // namespace

Cluster::Cluster(EtcdStore* etcd, ClusterOptions options, Clock* clock)
    : etcd_(etcd),
      options_(std::move(options)),
      clock_(clock),
      store_(std::make_unique<ClusterStore>(etcd, this)) {}

Cluster::~Cluster() { Leave(); }

std::string Cluster::Rendezvous(const std::string& tenant, const std::string& session_id,
                                const std::vector<std::string>& ids) {
  std::string best;
  uint64_t best_score = 0;
  for (const std::string& id : ids) {
    const uint64_t score = StableHash(tenant, session_id, id);
    if (best.empty() || score > best_score || (score == best_score && id < best)) {
      best = id;
      best_score = score;
    }
  }
  return best;
}

absl::Status Cluster::Join() {
  const absl::Time deadline = clock_->Monotonic() + options_.member_ttl + absl::Seconds(2);
  while (true) {
    const absl::Time sent = clock_->Monotonic();
    absl::StatusOr<std::unique_ptr<EtcdMember>> m =
        etcd_->RegisterMember(options_.member_id, options_.advertise_address, options_.member_ttl,
                              /*background_keepalive=*/false);
    if (m.ok()) {
      absl::MutexLock l(&mu_);
      member_ = std::move(*m);
      lost_ = false;
      renewed_ = sent;
      members_at_ = absl::InfinitePast();
      Log(LogLevel::kInfo, "cluster.joined",
          {{"member_id", options_.member_id},
           {"advertise_address", options_.advertise_address},
           {"lease", member_->lease()},
           {"member_ttl_seconds", absl::ToInt64Seconds(options_.member_ttl)}});
      return absl::OkStatus();
    }
    if (m.status().code() != absl::StatusCode::kAlreadyExists || clock_->Monotonic() >= deadline) {
      if (m.status().code() == absl::StatusCode::kAlreadyExists) {
        return absl::FailedPreconditionError(
            absl::StrCat("cluster: member id ", options_.member_id,
                         " is held by a live replica (cluster.member_id must be unique)"));
      }
      return Unreachable(m.status());
    }
    if (stop_.WaitForNotificationWithTimeout(absl::Milliseconds(200))) {
      return absl::CancelledError("cluster: leaving");
    }
  }
}

void Cluster::Start() {
  keeper_ = std::thread([this] { Keep(); });
}

void Cluster::Leave() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (keeper_.joinable()) keeper_.join();
  std::unique_ptr<EtcdMember> m;
  {
    absl::MutexLock l(&mu_);
    m = std::move(member_);
    lost_ = true;
    claims_.clear();
    routes_.clear();
  }
  if (m) {
    absl::Status s = m->Leave();
    Log(s.ok() ? LogLevel::kInfo : LogLevel::kWarning, "cluster.left",
        {{"member_id", options_.member_id},
         {"result", s.ok() ? std::string("ok") : std::string(s.message())}});
  }
}

bool Cluster::FreshLocked() const {
  // A renewal is sent every ttl/3; the margin keeps this side's view ahead
  // of etcd's expiry (the lease holds until a renewal's send time + TTL).
  return !lost_ && member_ != nullptr &&
         clock_->Monotonic() - renewed_ < options_.member_ttl - options_.lease_safety_margin;
}

bool Cluster::ready() const {
  absl::ReaderMutexLock l(&mu_);
  return FreshLocked();
}

bool Cluster::ServesLocally(const std::string& tenant, const std::string& session_id) const {
  absl::ReaderMutexLock l(&mu_);
  return FreshLocked() && claims_.contains(Key{tenant, session_id});
}

std::optional<int64_t> Cluster::FenceOf(const std::string& tenant,
                                        const std::string& session_id) const {
  absl::ReaderMutexLock l(&mu_);
  auto it = claims_.find(Key{tenant, session_id});
  if (it == claims_.end() || lost_) return std::nullopt;
  return it->second;
}

void Cluster::Released(const std::string& tenant, const std::string& session_id) {
  absl::MutexLock l(&mu_);
  claims_.erase(Key{tenant, session_id});
}

void Cluster::ForgetRoute(const std::string& tenant, const std::string& session_id) {
  absl::MutexLock l(&mu_);
  routes_.erase(Key{tenant, session_id});
}

absl::StatusOr<std::vector<MemberInfo>> Cluster::Members(bool refresh) {
  {
    absl::ReaderMutexLock l(&mu_);
    if (!refresh && clock_->Monotonic() - members_at_ < absl::Seconds(1)) return members_;
  }
  absl::StatusOr<std::vector<MemberInfo>> m = etcd_->ListMembers();
  if (!m.ok()) return Unreachable(m.status());
  absl::MutexLock l(&mu_);
  members_ = *m;
  members_at_ = clock_->Monotonic();
  return members_;
}

absl::StatusOr<std::string> Cluster::AddressOf(const std::string& member_id) {
  for (bool refresh : {false, true}) {
    ASSIGN_OR_RETURN(std::vector<MemberInfo> members, Members(refresh));
    for (const MemberInfo& m : members) {
      if (m.id == member_id && !m.advertise_address.empty()) return m.advertise_address;
    }
  }
  return absl::UnavailableError(absl::StrCat("cluster: the session's owner replica ", member_id,
                                             " is not a live member (leaving?); retry"));
}

absl::Status Cluster::TakeOver(const Key& key, int64_t fence) {
  absl::StatusOr<std::optional<SessionRecord>> row = etcd_->LoadSession(key.first, key.second);
  if (!row.ok()) return Unreachable(row.status());
  {
    absl::MutexLock l(&mu_);
    claims_[key] = fence;
  }
  if (!row->has_value()) return absl::OkStatus();
  SessionRecord r = **row;
  if (r.state == StoredState::kCreating) {
    // Its replica died mid-create (or is paused in it: its late write will
    // be refused and it destroys what it made). Forget the intent, keeping
    // the generation, as a failed create does.
    absl::Status forgot;
    if (r.generation > 1) {
      r.state = StoredState::kGone;
      r.generation -= 1;
      forgot = etcd_->PutSessionFenced(r, fence);
    } else {
      forgot = etcd_->DeleteSessionFenced(r.tenant, r.session_id, fence);
    }
    if (!forgot.ok()) {
      absl::MutexLock l(&mu_);
      claims_.erase(key);
      return Unreachable(forgot);
    }
    if (r.generation <= 1 && r.state == StoredState::kCreating) return absl::OkStatus();
  }
  if (sessions_ != nullptr) return sessions_->AdoptRecord(r);
  return absl::OkStatus();
}

absl::StatusOr<ClusterRoute> Cluster::Resolve(const std::string& tenant,
                                              const std::string& session_id,
                                              const std::string& provider, bool may_create,
                                              bool forwarded) {
  const Key key{tenant, session_id};
  auto not_fresh = [this] {
    return absl::UnavailableError(absl::StrCat(
        "this replica cannot confirm its cluster membership (etcd unreachable past its lease "
        "less cluster.lease_safety_margin_ms, ",
        absl::ToInt64Milliseconds(options_.member_ttl - options_.lease_safety_margin),
        " ms since the last renewal, or its lease lapsed and it is rejoining): it fenced "
        "itself and acts on no session until a renewal succeeds; retry"));
  };
  {
    absl::ReaderMutexLock l(&mu_);
    if (!FreshLocked()) return not_fresh();
    if (claims_.contains(key)) return ClusterRoute{true, options_.member_id, ""};
    if (!forwarded) {
      auto it = routes_.find(key);
      if (it != routes_.end() && clock_->Monotonic() < it->second.until) return it->second.route;
    }
  }
  int64_t my_lease = 0;
  {
    absl::ReaderMutexLock l(&mu_);
    if (!FreshLocked()) return not_fresh();
    my_lease = member_->lease();
  }
  auto forward_to = [&](const std::string& owner) -> absl::StatusOr<ClusterRoute> {
    if (forwarded) {
      return absl::UnavailableError(absl::StrCat("cluster: session moved to replica ", owner,
                                                 " while the call was forwarded; retry"));
    }
    ASSIGN_OR_RETURN(std::string address, AddressOf(owner));
    ClusterRoute route{false, owner, address};
    absl::MutexLock l(&mu_);
    routes_[key] = CachedRoute{route, clock_->Monotonic() + absl::Seconds(2)};
    return route;
  };
  // Owned by another replica: forwarded, without waiting for takeovers.
  absl::StatusOr<std::optional<SessionOwner>> owner = etcd_->GetOwner(tenant, session_id);
  if (!owner.ok()) return Unreachable(owner.status());
  auto mine = [&](const SessionOwner& o) {
    return o.member_id == options_.member_id && o.lease == my_lease;
  };
  if (owner->has_value() && !mine(**owner)) return forward_to((*owner)->member_id);
  absl::MutexLock takeover(&takeover_mu_);
  {
    absl::ReaderMutexLock l(&mu_);
    if (!FreshLocked()) return not_fresh();
    if (claims_.contains(key)) return ClusterRoute{true, options_.member_id, ""};
  }
  if (owner->has_value()) {
    RETURN_IF_ERROR(TakeOver(key, (*owner)->fence));
    return ClusterRoute{true, options_.member_id, ""};
  }
  if (!may_create) {
    // Nobody owns it: a row left by a dead replica is taken over; with no
    // row the session does not exist, and this replica says so.
    absl::StatusOr<std::optional<SessionRecord>> row = etcd_->LoadSession(tenant, session_id);
    if (!row.ok()) return Unreachable(row.status());
    if (!row->has_value()) return ClusterRoute{true, options_.member_id, ""};
  }
  if (!forwarded && options_.machine_local.count(provider) != 0) {
    // A fresh member list (one read per new local session): placement
    // follows the membership at the moment of the call.
    ASSIGN_OR_RETURN(std::vector<MemberInfo> members, Members(true));
    std::vector<std::string> ids;
    for (const MemberInfo& m : members) ids.push_back(m.id);
    if (std::find(ids.begin(), ids.end(), options_.member_id) == ids.end()) {
      ids.push_back(options_.member_id);
    }
    const std::string target = Rendezvous(tenant, session_id, ids);
    if (target != options_.member_id) return forward_to(target);
  }
  absl::StatusOr<ClaimResult> claim = etcd_->ClaimSession(tenant, session_id, options_.member_id);
  if (!claim.ok()) {
    if (IsOwnershipLost(claim.status())) return not_fresh();
    return Unreachable(claim.status());
  }
  if (!claim->claimed) return forward_to(claim->owner.member_id);
  RETURN_IF_ERROR(TakeOver(key, claim->owner.fence));
  return ClusterRoute{true, options_.member_id, ""};
}

absl::StatusOr<std::vector<ClusterSession>> Cluster::ListTenant(const std::string& tenant) {
  absl::StatusOr<std::vector<SessionRecord>> rows = etcd_->LoadTenantSessions(tenant);
  if (!rows.ok()) return Unreachable(rows.status());
  absl::StatusOr<absl::flat_hash_map<std::string, SessionOwner>> owners = etcd_->LoadOwners(tenant);
  if (!owners.ok()) return Unreachable(owners.status());
  std::vector<ClusterSession> out;
  out.reserve(rows->size());
  for (SessionRecord& r : *rows) {
    if (r.state == StoredState::kGone) continue;
    ClusterSession s;
    auto it = owners->find(etcd_->OwnerKey(r.tenant, r.session_id));
    if (it != owners->end()) s.owner = it->second.member_id;
    s.record = std::move(r);
    out.push_back(std::move(s));
  }
  std::sort(out.begin(), out.end(), [](const ClusterSession& a, const ClusterSession& b) {
    return a.record.session_id < b.record.session_id;
  });
  return out;
}

int Cluster::ScanOnce() {
  {
    absl::ReaderMutexLock l(&mu_);
    if (!FreshLocked()) return 0;
  }
  absl::StatusOr<std::vector<SessionRecord>> rows = etcd_->LoadSessions();
  if (!rows.ok()) return 0;
  absl::StatusOr<absl::flat_hash_map<std::string, SessionOwner>> owners = etcd_->LoadOwners("");
  if (!owners.ok()) return 0;
  absl::StatusOr<std::vector<MemberInfo>> members = Members(true);
  if (!members.ok()) return 0;
  std::vector<std::string> ids;
  for (const MemberInfo& m : *members) ids.push_back(m.id);
  int taken = 0;
  for (const SessionRecord& r : *rows) {
    if (r.state == StoredState::kGone) continue;
    if (owners->contains(etcd_->OwnerKey(r.tenant, r.session_id))) continue;
    // Spread the dead replica's sessions; each row has one taker.
    if (!ids.empty() && Rendezvous(r.tenant, r.session_id, ids) != options_.member_id) continue;
    absl::StatusOr<ClusterRoute> route = Resolve(r.tenant, r.session_id, r.provider,
                                                 /*may_create=*/false, /*forwarded=*/true);
    if (route.ok() && route->local) ++taken;
  }
  if (taken > 0) {
    Log(LogLevel::kInfo, "cluster.scan_took_over",
        {{"member_id", options_.member_id}, {"sessions", static_cast<int64_t>(taken)}});
  }
  return taken;
}

void Cluster::Lose(const std::string& why) {
  {
    absl::MutexLock l(&mu_);
    if (lost_) return;
    lost_ = true;
    claims_.clear();
    routes_.clear();
  }
  Log(LogLevel::kError, "cluster.lease_lost",
      {{"member_id", options_.member_id},
       {"reason", why},
       {"message", "this replica stops serving its sessions, gives them up and rejoins"}});
  if (sessions_ != nullptr) {
    const std::set<std::string>& local = options_.machine_local;
    sessions_->GiveUp([&local](const std::string& p) { return local.count(p) != 0; });
  }
  std::unique_ptr<EtcdMember> old;
  {
    absl::MutexLock l(&mu_);
    old = std::move(member_);
  }
  if (old) old->StopKeepAlive();  // its lease is gone or going; revoked on destruction
}

void Cluster::Keep() {
  const absl::Duration period = options_.member_ttl / 3;
  const absl::Duration scan_every =
      options_.scan_interval > absl::ZeroDuration() ? options_.scan_interval : options_.member_ttl;
  absl::Time last_scan = clock_->Monotonic();
  while (!stop_.WaitForNotificationWithTimeout(period)) {
    EtcdMember* m = nullptr;
    absl::Time renewed;
    {
      absl::ReaderMutexLock l(&mu_);
      m = lost_ ? nullptr : member_.get();
      renewed = renewed_;
    }
    if (m == nullptr) {
      // Lost: join again as a new member (its old claims are gone).
      (void)Join();
      continue;
    }
    const absl::Time sent = clock_->Monotonic();
    absl::Status s = m->KeepAliveOnce();
    if (s.ok()) {
      absl::MutexLock l(&mu_);
      renewed_ = std::max(renewed_, sent);
    } else if (s.code() == absl::StatusCode::kNotFound || m->lost()) {
      Lose("the lease expired (this replica was paused or cut off for longer than its TTL)");
      continue;
    } else if (clock_->Monotonic() - renewed >= options_.member_ttl) {
      Lose(absl::StrCat("no renewal succeeded for a whole TTL: ", s.message()));
      continue;
    }
    if (clock_->Monotonic() - last_scan >= scan_every) {
      last_scan = clock_->Monotonic();
      ScanOnce();
    }
  }
}

}  // namespace sandbox
