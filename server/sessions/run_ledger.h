#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/store/session_store.h"

namespace sandbox {

// Retry-safe runs (RunRequest/ShellRequest.run_id, CallToolRequest.call_id):
// a run with a given id runs at most once per session. A retry while it runs
// waits for it and gets its result; after it finished, the same result, for
// `ttl` (bounded to `max_per_session` finished runs per session, oldest
// evicted first). The same id with a different request is ALREADY_EXISTS. A
// run the broker died in the middle of is ABORTED on retry, never re-run.
//
// The record is written to the store before the run starts and with its
// result after it ends; nothing else on the hot path touches the store.
//
// A result is bound to the sandbox generation it ran in: once the session
// goes on in a new sandbox (NewGeneration), a retry runs again there
// instead of getting a result whose effects went with the old sandbox.
//
// Thread-safe.
class RunLedger {
 public:
  struct Options {
    absl::Duration ttl = absl::Seconds(600);
    int max_per_session = 256;
  };
  // `store` may be null (records live in memory only).
  RunLedger(SessionStore* store, Clock* clock, Options options);

  // Loads the store's records; a record still "running" means the broker
  // died during that run: it becomes ABORTED (and is rewritten so).
  absl::Status Load();

  // Runs `fn` (which returns the serialized result) unless this id already
  // ran or runs. Errors: ALREADY_EXISTS (same id, different `request_hash`),
  // ABORTED (the broker died mid-run), RESOURCE_EXHAUSTED (the session has
  // max_per_session runs still running), the store's error (then nothing
  // ran), or the run's own error. Errors from before anything ran
  // (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, UNAUTHENTICATED,
  // PERMISSION_DENIED) are not remembered: a corrected retry runs.
  //
  // `fn` calls `started(generation)` once it holds the session's sandbox,
  // with the generation the run goes on in.
  using Started = std::function<void(int64_t generation)>;
  using RunFn = std::function<absl::StatusOr<std::string>(const Started& started)>;
  absl::StatusOr<std::string> Do(const std::string& tenant, const std::string& session_id,
                                 const std::string& run_id, const std::string& request_hash,
                                 const RunFn& fn);

  // Drops a closed session's records.
  void ForgetSession(const std::string& tenant, const std::string& session_id);

  // The session goes on in a new sandbox, `generation`: records of runs
  // made in an earlier one are dropped (here and in the store), and so are
  // records whose generation is not known (loaded from the store, or ended
  // before holding a sandbox). Runs waiting for this sandbox are kept.
  void NewGeneration(const std::string& tenant, const std::string& session_id, int64_t generation);

  // Records held in memory for one session (tests).
  int CountForTest(const std::string& tenant, const std::string& session_id);

 private:
  struct Entry {
    std::string hash;
    bool done = false;
    absl::Status status;
    std::string result;
    absl::Time started_at;
    absl::Time finished_at;
    // The sandbox generation the run went on in; 0 = not known (not
    // started yet, or loaded from the store).
    int64_t generation = 0;
  };
  using SessionKey = std::pair<std::string, std::string>;

  // Drops the session's expired records; returns their run ids.
  std::vector<std::string> PruneLocked(std::map<std::string, std::shared_ptr<Entry>>* runs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::string> Answer(const Entry& e) const;
  void Persist(const SessionKey& key, const std::string& run_id, const Entry& e);

  SessionStore* const store_;
  Clock* const clock_;
  const Options options_;
  absl::Mutex mu_;
  std::map<SessionKey, std::map<std::string, std::shared_ptr<Entry>>> runs_ ABSL_GUARDED_BY(mu_);
};

// 1-128 characters of [A-Za-z0-9._:-].
absl::Status ValidateRunId(const std::string& id, const char* field);

// A stable 64-bit FNV-1a hash, as 16 hex digits (stored, so never absl::Hash).
std::string StableHash(const std::string& bytes);

}  // namespace sandbox
