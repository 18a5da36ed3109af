#include "server/sessions/run_ledger.h"

#include <cctype>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace sandbox {
namespace {

bool NothingRan(absl::StatusCode c) {
  return c == absl::StatusCode::kInvalidArgument || c == absl::StatusCode::kNotFound ||
         c == absl::StatusCode::kFailedPrecondition || c == absl::StatusCode::kUnauthenticated ||
         c == absl::StatusCode::kPermissionDenied;
}

constexpr char kAbortedMessage[] =
    "the broker stopped while the first attempt of this run was in progress: its effects are "
    "unknown (it may have run partly, fully or not at all), so it is not run again; check the "
    "sandbox's state, then use a new run_id";

}  // namespace

absl::Status ValidateRunId(const std::string& id, const char* field) {
  bool ok = !id.empty() && id.size() <= 128;
  for (char c : id) {
    ok = ok &&
         (isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' || c == '-');
  }
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " must be 1-128 characters of [A-Za-z0-9._:-]"));
}

std::string StableHash(const std::string& bytes) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  char buf[17];
  snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

RunLedger::RunLedger(SessionStore* store, Clock* clock, Options options)
    : store_(store), clock_(clock), options_(options) {}

absl::Status RunLedger::Load() {
  if (store_ == nullptr) return absl::OkStatus();
  absl::StatusOr<std::vector<RunRecord>> rows = store_->LoadRuns();
  if (!rows.ok()) return rows.status();
  int aborted = 0;
  absl::MutexLock l(&mu_);
  for (RunRecord& r : *rows) {
    auto e = std::make_shared<Entry>();
    e->hash = r.request_hash;
    e->done = true;
    e->started_at = r.started_at;
    if (r.state == RunState::kRunning) {
      e->status = absl::AbortedError(kAbortedMessage);
      e->finished_at = clock_->Now();
      ++aborted;
      RunRecord done = r;
      done.state = RunState::kDone;
      done.status_code = static_cast<int>(absl::StatusCode::kAborted);
      done.status_message = kAbortedMessage;
      done.finished_at = e->finished_at;
      if (absl::Status s = store_->PutRun(done); !s.ok()) return s;
    } else {
      e->status = absl::Status(static_cast<absl::StatusCode>(r.status_code), r.status_message);
      e->result = std::move(r.result);
      e->finished_at = r.finished_at;
    }
    runs_[{r.tenant, r.session_id}][r.run_id] = std::move(e);
  }
  if (aborted > 0) {
    Log(LogLevel::kWarning, "runs.aborted_by_restart", {{"runs", aborted}});
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RunLedger::Answer(const Entry& e) const {
  if (!e.status.ok()) return e.status;
  return e.result;
}

void RunLedger::Persist(const SessionKey& key, const std::string& run_id, const Entry& e) {
  if (store_ == nullptr) return;
  RunRecord r;
  r.tenant = key.first;
  r.session_id = key.second;
  r.run_id = run_id;
  r.request_hash = e.hash;
  r.state = e.done ? RunState::kDone : RunState::kRunning;
  r.status_code = static_cast<int>(e.status.code());
  r.status_message = std::string(e.status.message());
  r.result = e.result;
  r.started_at = e.started_at;
  r.finished_at = e.finished_at;
  if (absl::Status s = store_->PutRun(r); !s.ok()) {
    Log(LogLevel::kError, "state.write_failed", {{"what", "run"}, {"error", s.message()}});
  }
}

std::vector<std::string> RunLedger::PruneLocked(
    std::map<std::string, std::shared_ptr<Entry>>* runs) {
  std::vector<std::string> dropped;
  const absl::Time now = clock_->Now();
  for (auto it = runs->begin(); it != runs->end();) {
    if (it->second->done && it->second->finished_at + options_.ttl <= now) {
      dropped.push_back(it->first);
      it = runs->erase(it);
    } else {
      ++it;
    }
  }
  return dropped;
}

absl::StatusOr<std::string> RunLedger::Do(const std::string& tenant, const std::string& session_id,
                                          const std::string& run_id,
                                          const std::string& request_hash, const RunFn& fn) {
  const SessionKey key{tenant, session_id};
  std::shared_ptr<Entry> e;
  std::vector<std::string> dropped;
  {
    absl::MutexLock l(&mu_);
    auto& runs = runs_[key];
    dropped = PruneLocked(&runs);
    auto it = runs.find(run_id);
    if (it != runs.end()) {
      std::shared_ptr<Entry> prev = it->second;
      if (prev->hash != request_hash) {
        return absl::AlreadyExistsError(
            absl::StrCat("run_id \"", run_id,
                         "\" was already used in this session for a different request; use a "
                         "new run_id"));
      }
      auto done = [&prev]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return prev->done; };
      mu_.Await(absl::Condition(&done));  // a retry while it runs waits for it
      return Answer(*prev);
    }
    if (static_cast<int>(runs.size()) >= options_.max_per_session) {
      // Evict the oldest finished record.
      auto oldest = runs.end();
      for (auto r = runs.begin(); r != runs.end(); ++r) {
        if (r->second->done &&
            (oldest == runs.end() || r->second->finished_at < oldest->second->finished_at)) {
          oldest = r;
        }
      }
      if (oldest == runs.end()) {
        return absl::ResourceExhaustedError(absl::StrCat("this session already has ",
                                                         options_.max_per_session,
                                                         " runs with a run_id in progress"));
      }
      dropped.push_back(oldest->first);
      runs.erase(oldest);
    }
    e = std::make_shared<Entry>();
    e->hash = request_hash;
    e->started_at = clock_->Now();
    runs[run_id] = e;
  }
  if (store_) {
    for (const auto& id : dropped) (void)store_->DeleteRun(tenant, session_id, id);
    RunRecord r;
    r.tenant = tenant;
    r.session_id = session_id;
    r.run_id = run_id;
    r.request_hash = request_hash;
    r.state = RunState::kRunning;
    r.started_at = e->started_at;
    if (absl::Status s = store_->PutRun(r); !s.ok()) {
      // Not recorded: must not run (a crash would re-run it).
      absl::MutexLock l(&mu_);
      e->done = true;
      e->status = s;
      auto& runs = runs_[key];
      if (auto it = runs.find(run_id); it != runs.end() && it->second == e) runs.erase(it);
      return s;
    }
  }
  absl::StatusOr<std::string> result = fn([this, e](int64_t generation) {
    absl::MutexLock l(&mu_);
    e->generation = generation;
  });
  const bool forget = !result.ok() && NothingRan(result.status().code());
  bool current = false;  // still this session's record (not dropped meanwhile)
  {
    absl::MutexLock l(&mu_);
    e->done = true;
    e->finished_at = clock_->Now();
    if (result.ok()) {
      e->result = *result;
    } else {
      e->status = result.status();
    }
    // Looked up, never re-created: a closed session's table stays gone.
    if (auto sit = runs_.find(key); sit != runs_.end()) {
      auto it = sit->second.find(run_id);
      current = it != sit->second.end() && it->second == e;
      if (current && forget) sit->second.erase(it);
    }
  }
  // A record dropped meanwhile (the session closed, or went on in a new
  // sandbox) had its store row removed then; a retry may own the id now.
  if (!current) return result;
  if (forget) {
    if (store_) (void)store_->DeleteRun(tenant, session_id, run_id);
  } else {
    Persist(key, run_id, *e);
  }
  return result;
}

void RunLedger::NewGeneration(const std::string& tenant, const std::string& session_id,
                              int64_t generation) {
  std::vector<std::string> dropped;
  {
    absl::MutexLock l(&mu_);
    auto it = runs_.find({tenant, session_id});
    if (it == runs_.end()) return;
    for (auto r = it->second.begin(); r != it->second.end();) {
      const Entry& e = *r->second;
      if ((e.done || e.generation > 0) && e.generation < generation) {
        dropped.push_back(r->first);
        r = it->second.erase(r);
      } else {
        ++r;
      }
    }
  }
  if (store_) {
    for (const auto& id : dropped) (void)store_->DeleteRun(tenant, session_id, id);
  }
  if (!dropped.empty()) {
    Log(LogLevel::kInfo, "runs.new_generation",
        {{"tenant", tenant},
         {"session_id", session_id},
         {"generation", generation},
         {"runs_dropped", static_cast<int64_t>(dropped.size())}});
  }
}

void RunLedger::ForgetSession(const std::string& tenant, const std::string& session_id) {
  absl::MutexLock l(&mu_);
  runs_.erase({tenant, session_id});
}

int RunLedger::CountForTest(const std::string& tenant, const std::string& session_id) {
  absl::MutexLock l(&mu_);
  auto it = runs_.find({tenant, session_id});
  return it == runs_.end() ? 0 : static_cast<int>(it->second.size());
}

}  // namespace sandbox
