#pragma once

// The etcd session store (groundwork for N broker replicas sharing sessions,
// issue #13): the SessionStore contract over etcd v3, plus the cluster
// primitives routing/forwarding/takeover will be built on (membership under
// leases, one owner per session, fenced writes). The broker selects it with
// state.backend "etcd", one broker per prefix for now (LockPrefix); see
// docs/durability.md.
//
// Key layout, all under the configured prefix P (default "/sandbox-broker/");
// each <component> is escaped ('%' -> %25, '/' -> %2F, bytes < 0x20 and
// >= 0x7f as %XX) so one component never spills into the next:
//
//   P meta/schema_version                  "1"
//   P meta/deployment_id                   the deployment id (text)
//   P meta/created_at_us                   when the store was created (µs)
//   P lock                                 {"holder","pid"} under the lease of
//                                          the one broker using P (LockPrefix)
//   P sessions/<tenant>/<session_id>       SessionRecord as JSON
//   P runs/<tenant>/<session_id>/<run_id>  RunRecord as JSON (result base64)
//   P usage/<tenant>/<provider>            UsageCounters as JSON (totals)
//   P members/<member_id>                  {"id","advertise_address"} under
//                                          the member's lease
//   P owners/<tenant>/<session_id>         {"member_id","lease"} under the
//                                          owner's lease
//
// Fencing: ClaimSession creates the owner key in one transaction (if it is
// absent) and returns its mod_revision, the fencing token. Fenced writes are
// transactions conditioned on the owner key's mod_revision still being that
// token: when the owner's lease expired (the key went) or another member
// claimed the session since, they fail with FAILED_PRECONDITION "fencing
// token stale" and write nothing.
//
// Multi-key writes (PutSessions, TouchSessions, AddUsage) are one
// transaction per chunk of up to 64 keys and about 512 KiB (etcd's
// --max-txn-ops defaults to 128, --max-request-bytes to 1.5 MiB): atomic per
// chunk, not per call. Read-modify-writes compare each key's mod_revision
// and retry. DeleteSession leaves the owner key (ReleaseSession's job).

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/store/etcd/etcd_client.h"
#include "server/store/session_store.h"

namespace sandbox {

struct EtcdStoreOptions {
  EtcdOptions etcd;
  std::string prefix = "/sandbox-broker/";
  // Keys per page when listing.
  int64_t page_size = 500;
};

struct MemberInfo {
  std::string id;
  std::string advertise_address;
  int64_t lease = 0;
};

// Who owns a session now.
struct SessionOwner {
  std::string member_id;
  int64_t lease = 0;
  int64_t fence = 0;  // the owner key's mod_revision
};

struct ClaimResult {
  bool claimed = false;  // true: `member_id` owns it (now, or already did)
  SessionOwner owner;    // the owner (this member when claimed)
};

class EtcdStore;

// A registered member (or a LockPrefix hold): its key lives under a lease kept alive by a
// background thread (every ttl/3) unless the options say otherwise; tests
// may drive renewals with KeepAliveOnce(). Destroying it stops the
// keepalive and revokes the lease (the member and its ownerships go).
class EtcdMember {
 public:
  ~EtcdMember();
  EtcdMember(const EtcdMember&) = delete;
  EtcdMember& operator=(const EtcdMember&) = delete;

  const std::string& id() const { return id_; }
  int64_t lease() const { return lease_; }
  int64_t ttl_seconds() const { return ttl_seconds_; }

  // One renewal. NOT_FOUND when the lease is gone (the member expired);
  // from then on lost() is true and renewals stop.
  absl::Status KeepAliveOnce();
  // Stops renewing without revoking (a replica that hung): the member and
  // its ownerships expire after the TTL.
  void StopKeepAlive();
  bool lost() const { return lost_.load(); }
  // Revokes the lease now (a clean leave). Idempotent.
  absl::Status Leave();

 private:
  friend class EtcdStore;
  EtcdMember(EtcdStore* store, std::string id, int64_t lease, int64_t ttl_seconds);
  void Run();

  EtcdStore* const store_;
  const std::string id_;
  const int64_t lease_;
  const int64_t ttl_seconds_;
  std::atomic<bool> lost_{false};
  std::atomic<bool> left_{false};
  absl::Mutex stop_mu_;
  absl::Notification stop_;
  std::thread thread_;
};

class EtcdStore final : public SessionStore {
 public:
  // Connects, and creates the meta keys if this prefix is new.
  // UNAVAILABLE when etcd does not answer; FAILED_PRECONDITION when the
  // prefix holds another schema version.
  static absl::StatusOr<std::unique_ptr<EtcdStore>> Open(EtcdStoreOptions options);
  ~EtcdStore() override;

  std::string backend() const override { return "etcd"; }
  bool durable() const override { return true; }
  std::string deployment_id() const override;
  absl::Status SetDeploymentId(const std::string& id) override;

  absl::StatusOr<std::vector<SessionRecord>> LoadSessions() override;
  absl::Status PutSession(const SessionRecord& record) override;
  absl::Status PutSessions(const std::vector<SessionRecord>& records) override;
  absl::Status DeleteSession(const std::string& tenant, const std::string& session_id) override;
  absl::Status TouchSessions(const std::vector<Touch>& touches) override;

  absl::StatusOr<std::vector<RunRecord>> LoadRuns() override;
  absl::Status PutRun(const RunRecord& record) override;
  absl::Status DeleteRun(const std::string& tenant, const std::string& session_id,
                         const std::string& run_id) override;

  absl::Status AddUsage(const std::vector<UsageRow>& deltas) override;
  absl::StatusOr<std::vector<UsageRow>> LoadUsage() override;
  absl::Time created_at() const override { return created_at_; }

  // ---- cluster primitives (not used by the broker yet) ----

  // Registers `id` at `advertise_address` under a new lease of `ttl`.
  // ALREADY_EXISTS when a live member holds the id (after a crash: wait for
  // its TTL). background_keepalive=false: renew with KeepAliveOnce().
  absl::StatusOr<std::unique_ptr<EtcdMember>> RegisterMember(const std::string& id,
                                                             const std::string& advertise_address,
                                                             absl::Duration ttl,
                                                             bool background_keepalive = true);
  absl::StatusOr<std::vector<MemberInfo>> ListMembers();

  // Holds <prefix>lock under a lease of `ttl` (renewed in the background)
  // so one broker at a time uses this prefix, as the SQLite store's flock
  // does: until replicas share sessions through claims, two brokers on one
  // prefix would adopt and sweep each other's sandboxes. Waits up to `wait`
  // for a crashed holder's lease to expire; then FAILED_PRECONDITION naming
  // the holder. Released when the result is destroyed.
  absl::StatusOr<std::unique_ptr<EtcdMember>> LockPrefix(const std::string& holder,
                                                         absl::Duration ttl, absl::Duration wait);

  // One transaction: creates the owner key under `member_id`'s lease if the
  // session has no owner, else reports the owner (claimed=true when it is
  // already this member). FAILED_PRECONDITION when `member_id` is not a
  // member registered through this store (or it was lost).
  absl::StatusOr<ClaimResult> ClaimSession(const std::string& tenant, const std::string& session_id,
                                           const std::string& member_id);
  absl::StatusOr<std::optional<SessionOwner>> GetOwner(const std::string& tenant,
                                                       const std::string& session_id);
  // Writes the record only while `fence` is the owner key's mod_revision.
  absl::Status PutSessionFenced(const SessionRecord& record, int64_t fence);
  // Deletes the session and its runs only while `fence` holds.
  absl::Status DeleteSessionFenced(const std::string& tenant, const std::string& session_id,
                                   int64_t fence);
  // Deletes the owner key only while `fence` holds.
  absl::Status ReleaseSession(const std::string& tenant, const std::string& session_id,
                              int64_t fence);
  // One session's record, or nullopt.
  absl::StatusOr<std::optional<SessionRecord>> LoadSession(const std::string& tenant,
                                                           const std::string& session_id);
  // One tenant's records, in key order (empty tenant: every tenant's).
  absl::StatusOr<std::vector<SessionRecord>> LoadTenantSessions(const std::string& tenant);
  // The owner keys under one tenant (empty: all), by owner key.
  absl::StatusOr<absl::flat_hash_map<std::string, SessionOwner>> LoadOwners(
      const std::string& tenant);

  EtcdClient* client() { return client_.get(); }
  const std::string& prefix() const { return prefix_; }

  // Keys (exposed for tests and tools).
  std::string SessionKey(const std::string& tenant, const std::string& session_id) const;
  std::string RunsPrefix(const std::string& tenant, const std::string& session_id) const;
  std::string RunKey(const std::string& tenant, const std::string& session_id,
                     const std::string& run_id) const;
  std::string UsageKey(const std::string& tenant, const std::string& provider) const;
  std::string MemberKey(const std::string& id) const;
  std::string OwnerKey(const std::string& tenant, const std::string& session_id) const;

 private:
  friend class EtcdMember;
  EtcdStore(EtcdStoreOptions options, std::unique_ptr<EtcdClient> client);
  absl::Status Init();
  // Creates `key` = `value` under a new lease if absent (ALREADY_EXISTS if
  // not); member_id non-empty: recorded as a member for ClaimSession.
  absl::StatusOr<std::unique_ptr<EtcdMember>> HoldKey(const std::string& key,
                                                      const std::string& member_id,
                                                      const std::string& value, absl::Duration ttl,
                                                      bool background_keepalive);
  // Read-modify-write of many keys: `update` gets the current value (nullopt
  // when absent) and returns the new one (nullopt: leave the key alone).
  absl::Status UpdateKeys(
      const std::vector<std::string>& keys,
      const std::function<std::optional<std::string>(size_t, const std::optional<std::string>&)>&
          update);
  void MemberGone(const std::string& id, int64_t lease);

  const EtcdStoreOptions options_;
  const std::string prefix_;
  std::unique_ptr<EtcdClient> client_;
  absl::Time created_at_ = absl::InfinitePast();
  mutable absl::Mutex mu_;
  std::string deployment_id_ ABSL_GUARDED_BY(mu_);
  // Members registered through this store: id -> lease.
  absl::flat_hash_map<std::string, int64_t> members_ ABSL_GUARDED_BY(mu_);
};

// Escapes one key component (see the layout above).
std::string EtcdKeyComponent(const std::string& s);

}  // namespace sandbox
