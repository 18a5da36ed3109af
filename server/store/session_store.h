#pragma once

// The session store: the seam between the session table (in memory) and
// whatever keeps it across restarts. Narrow and transport-free: plain
// records in, plain records out. Implementations: SqliteStore (the embedded
// default), MemoryStore (tests, and operators who opt out of durability). A
// distributed backend can slot in behind the same calls: every write names
// the whole record by key, so a compare-and-set on `version` (a fencing
// token) can be added without changing callers.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/store/usage_store.h"

namespace sandbox {

// One session's durable row. Written ahead of provider calls: kCreating
// before Provider::Create, kReady after it, kClosing before Destroy; the row
// is deleted after. kGone is a tombstone: the session's sandbox vanished at
// the provider; it only keeps `generation` so the next sandbox gets +1.
enum class StoredState { kCreating = 0, kReady = 1, kClosing = 2, kGone = 3 };

struct SessionRecord {
  std::string tenant;
  std::string session_id;
  std::string provider;
  // Tags the provider call that creates the sandbox, so a crash between
  // Create and the ready write can be resolved through the provider's list.
  std::string attempt_id;
  std::string sandbox_id;  // empty until kReady
  StoredState state = StoredState::kCreating;
  int64_t generation = 1;
  // What the sandbox was created from (template, language, env, labels), as
  // JSON; the session manager owns its format.
  std::string spec_json;
  absl::Time created_at = absl::UnixEpoch();
  absl::Time last_active_at = absl::UnixEpoch();
  // Reserved for conditional writes (a fencing token); 0 here.
  int64_t version = 0;
};

// A retry-safe run (run_id / call_id). kRunning is written before the run
// starts; kDone (with the result) after it ends. A kRunning row found at
// startup means the broker died mid-run.
enum class RunState { kRunning = 0, kDone = 1 };

struct RunRecord {
  std::string tenant;
  std::string session_id;
  std::string run_id;
  std::string request_hash;  // tells a retry from a different request
  RunState state = RunState::kRunning;
  // kDone: a serialized RunResult (ok) or the error (code + message).
  int status_code = 0;
  std::string status_message;
  std::string result;
  absl::Time started_at = absl::UnixEpoch();
  absl::Time finished_at = absl::UnixEpoch();
};

// One (tenant, provider)'s usage: a row's totals, or a delta to add to it.
struct UsageRow {
  std::string tenant;
  std::string provider;
  UsageCounters counters;
};

// Thread-safe. Every write is durable when it returns OK (for a durable
// store). Errors: UNAVAILABLE / INTERNAL when the backing storage fails.
class SessionStore {
 public:
  virtual ~SessionStore() = default;

  // "sqlite" or "memory".
  virtual std::string backend() const = 0;
  // False for the memory store: nothing survives the process.
  virtual bool durable() const = 0;

  // The broker deployment this store belongs to: created randomly with the
  // store and kept in it. A configured id overrides (and is kept).
  virtual std::string deployment_id() const = 0;
  virtual absl::Status SetDeploymentId(const std::string& id) = 0;

  virtual absl::StatusOr<std::vector<SessionRecord>> LoadSessions() = 0;
  // Insert or replace by (tenant, session_id).
  virtual absl::Status PutSession(const SessionRecord& record) = 0;
  // Many at once, in one transaction (imports, bulk recovery).
  virtual absl::Status PutSessions(const std::vector<SessionRecord>& records) = 0;
  // Deletes the session and its runs. Deleting a missing row is OK.
  virtual absl::Status DeleteSession(const std::string& tenant, const std::string& session_id) = 0;
  // Lazily flushed activity: one transaction for many sessions.
  struct Touch {
    std::string tenant;
    std::string session_id;
    absl::Time last_active_at;
  };
  virtual absl::Status TouchSessions(const std::vector<Touch>& touches) = 0;

  virtual absl::StatusOr<std::vector<RunRecord>> LoadRuns() = 0;
  // Insert or replace by (tenant, session_id, run_id).
  virtual absl::Status PutRun(const RunRecord& record) = 0;
  virtual absl::Status DeleteRun(const std::string& tenant, const std::string& session_id,
                                 const std::string& run_id) = 0;

  // Usage since the store was created (BufferedUsageStore buffers and calls
  // AddUsage about once a second). AddUsage adds each delta to its
  // (tenant, provider) row, all in one transaction. The defaults keep no
  // usage (a store that does not meter).
  virtual absl::Status AddUsage(const std::vector<UsageRow>& deltas) {
    return deltas.empty() ? absl::OkStatus()
                          : absl::UnimplementedError("state: this store keeps no usage");
  }
  virtual absl::StatusOr<std::vector<UsageRow>> LoadUsage() { return std::vector<UsageRow>{}; }
  // When the store was created (for a store from before usage was kept: when
  // this broker version first opened it).
  virtual absl::Time created_at() const { return absl::InfinitePast(); }

  // True when other brokers keep their sessions in this store too (the
  // cluster store): LoadSessions returns only this broker's, and the orphan
  // sweep must spare what LoadAllSessions lists (every broker's rows).
  virtual bool shared() const { return false; }
  virtual absl::StatusOr<std::vector<SessionRecord>> LoadAllSessions() { return LoadSessions(); }
};

// Nothing durable; for tests and explicit opt-out.
std::unique_ptr<SessionStore> NewMemoryStore(std::string deployment_id = "");

// Opens (creating if missing) the SQLite store at `path`: WAL, synchronous
// FULL, and an exclusive lock on `path`.lock held for the process's life.
// FAILED_PRECONDITION when another process holds the lock (naming its pid),
// or when the file is torn, corrupt or not a sandbox-broker store (the file
// is left as it is: never silently emptied).
// A shared store's fenced write refused because another replica owns the
// session now (or this replica is no longer a live member): FAILED_PRECONDITION
// tagged so callers decide on the tag, never on the code or the text.
absl::Status OwnershipLost(std::string message);
bool IsOwnershipLost(const absl::Status& status);

absl::StatusOr<std::unique_ptr<SessionStore>> OpenSqliteStore(const std::string& path);

// Where the store lives by default: /var/lib/sandbox-broker/state.db as
// root, else $XDG_STATE_HOME (or ~/.local/state)/sandbox-broker/state.db.
std::string DefaultStatePath();

}  // namespace sandbox
