// The SQLite session store: WAL journal, synchronous=FULL (a commit is on
// disk when it returns), one connection behind a mutex, and an exclusive
// flock on <path>.lock so two brokers never share a store.

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "common/text.h"
#include "server/store/session_store.h"

namespace sandbox {
namespace {

constexpr char kSchemaVersion[] = "1";

int64_t ToMicros(absl::Time t) { return absl::ToUnixMicros(t); }
absl::Time FromMicros(int64_t us) { return absl::FromUnixMicros(us); }

absl::Status MakeParents(const std::string& path) {
  std::string cur;
  for (size_t i = 1; i < path.size(); ++i) {
    if (path[i] != '/') continue;
    cur = path.substr(0, i);
    // Traverse-only (the file itself is 0600): a directory created here,
    // /var/lib/sandbox-broker say, may also hold the local provider's
    // workspaces, which its sandboxes' own uid must reach.
    if (mkdir(cur.c_str(), 0711) != 0 && errno != EEXIST) {
      return absl::FailedPreconditionError(
          absl::StrCat("state: cannot create directory ", cur, ": ", strerror(errno)));
    }
  }
  return absl::OkStatus();
}

class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) { sqlite3_prepare_v2(db, sql, -1, &s_, nullptr); }
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt& Text(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& Blob(int i, const std::string& v) {
    sqlite3_bind_blob(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& Int(int i, int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  Stmt& Real(int i, double v) {
    sqlite3_bind_double(s_, i, v);
    return *this;
  }
  // SQLITE_ROW, SQLITE_DONE or an error code.
  int Step() { return s_ ? sqlite3_step(s_) : SQLITE_ERROR; }
  std::string ColText(int i) {
    const void* p = sqlite3_column_blob(s_, i);
    return p ? std::string(static_cast<const char*>(p),
                           static_cast<size_t>(sqlite3_column_bytes(s_, i)))
             : std::string();
  }
  int64_t ColInt(int i) { return sqlite3_column_int64(s_, i); }
  double ColReal(int i) { return sqlite3_column_double(s_, i); }
  bool ok() const { return s_ != nullptr; }

 private:
  sqlite3_stmt* s_ = nullptr;
};

class SqliteStore final : public SessionStore {
 public:
  SqliteStore(std::string path, sqlite3* db, int lock_fd)
      : path_(std::move(path)), db_(db), lock_fd_(lock_fd) {}
  ~SqliteStore() override {
    sqlite3_close_v2(db_);
    if (lock_fd_ >= 0) close(lock_fd_);  // releases the flock
  }

  std::string backend() const override { return "sqlite"; }
  bool durable() const override { return true; }

  absl::Status Init(bool fresh) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    if (fresh) {
      absl::Status s = ExecLocked(
          "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
          "CREATE TABLE IF NOT EXISTS sessions(tenant TEXT NOT NULL, session_id TEXT NOT NULL,"
          " provider TEXT NOT NULL, attempt_id TEXT NOT NULL, sandbox_id TEXT NOT NULL,"
          " state INTEGER NOT NULL, generation INTEGER NOT NULL, spec_json TEXT NOT NULL,"
          " created_at_us INTEGER NOT NULL, last_active_us INTEGER NOT NULL,"
          " version INTEGER NOT NULL, PRIMARY KEY(tenant, session_id));"
          "CREATE TABLE IF NOT EXISTS runs(tenant TEXT NOT NULL, session_id TEXT NOT NULL,"
          " run_id TEXT NOT NULL, request_hash TEXT NOT NULL, state INTEGER NOT NULL,"
          " status_code INTEGER NOT NULL, status_message TEXT NOT NULL, result BLOB NOT NULL,"
          " started_us INTEGER NOT NULL, finished_us INTEGER NOT NULL,"
          " PRIMARY KEY(tenant, session_id, run_id));");
      if (!s.ok()) return s;
      Stmt put(db_, "INSERT OR IGNORE INTO meta(key, value) VALUES (?1, ?2)");
      put.Text(1, "schema_version").Text(2, kSchemaVersion);
      if (put.Step() != SQLITE_DONE) return Error("init");
      Stmt dep(db_, "INSERT OR IGNORE INTO meta(key, value) VALUES ('deployment_id', ?1)");
      dep.Text(1, absl::StrCat("dep-", RandomHex(8)));
      if (dep.Step() != SQLITE_DONE) return Error("init");
    }
    Stmt ver(db_, "SELECT value FROM meta WHERE key = 'schema_version'");
    if (!ver.ok() || ver.Step() != SQLITE_ROW) {
      return absl::FailedPreconditionError(absl::StrCat(
          "state: ", path_,
          " is a SQLite file but not a sandbox-broker state store (no schema_version); "
          "refusing to use it (move it away or point state.path elsewhere)"));
    }
    if (ver.ColText(0) != kSchemaVersion) {
      return absl::FailedPreconditionError(absl::StrCat("state: ", path_, " has schema version ",
                                                        ver.ColText(0), ", this broker knows ",
                                                        kSchemaVersion));
    }
    Stmt dep(db_, "SELECT value FROM meta WHERE key = 'deployment_id'");
    if (dep.Step() != SQLITE_ROW) return absl::FailedPreconditionError("state: no deployment_id");
    deployment_id_ = dep.ColText(0);
    // Usage (added after schema 1 without changing it: a store from before
    // gets the table, and its created_at is when this version first opened it).
    RETURN_IF_ERROR(ExecLocked(
        "CREATE TABLE IF NOT EXISTS usage(tenant TEXT NOT NULL, provider TEXT NOT NULL,"
        " sessions_created INTEGER NOT NULL, runs INTEGER NOT NULL, run_seconds REAL NOT NULL,"
        " sandbox_seconds REAL NOT NULL, cpu_seconds REAL NOT NULL,"
        " output_bytes INTEGER NOT NULL, file_transfer_bytes INTEGER NOT NULL,"
        " oom_kills INTEGER NOT NULL, quota_refusals INTEGER NOT NULL,"
        " egress_bytes INTEGER NOT NULL DEFAULT 0, PRIMARY KEY(tenant, provider))"));
    // egress_bytes came later still: a table from before gets the column.
    Stmt has_egress(db_,
                    "SELECT COUNT(*) FROM pragma_table_info('usage') WHERE name = 'egress_bytes'");
    if (has_egress.Step() != SQLITE_ROW) return Error("read the usage table's columns");
    if (has_egress.ColInt(0) == 0) {
      RETURN_IF_ERROR(
          ExecLocked("ALTER TABLE usage ADD COLUMN egress_bytes INTEGER NOT NULL DEFAULT 0"));
    }
    Stmt put_created(db_, "INSERT OR IGNORE INTO meta(key, value) VALUES ('created_at_us', ?1)");
    put_created.Text(1, absl::StrCat(ToMicros(absl::Now())));
    if (put_created.Step() != SQLITE_DONE) return Error("init created_at");
    Stmt created(db_, "SELECT value FROM meta WHERE key = 'created_at_us'");
    int64_t us = 0;
    if (created.Step() != SQLITE_ROW || !absl::SimpleAtoi(created.ColText(0), &us)) {
      return absl::FailedPreconditionError(
          absl::StrCat("state: ", path_, " has a bad created_at_us"));
    }
    created_at_ = FromMicros(us);
    return absl::OkStatus();
  }

  std::string deployment_id() const override {
    absl::MutexLock l(&mu_);
    return deployment_id_;
  }
  absl::Status SetDeploymentId(const std::string& id) override {
    absl::MutexLock l(&mu_);
    Stmt s(db_, "INSERT OR REPLACE INTO meta(key, value) VALUES ('deployment_id', ?1)");
    s.Text(1, id);
    if (s.Step() != SQLITE_DONE) return Error("set deployment_id");
    deployment_id_ = id;
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<SessionRecord>> LoadSessions() override {
    absl::MutexLock l(&mu_);
    Stmt s(db_,
           "SELECT tenant, session_id, provider, attempt_id, sandbox_id, state, generation,"
           " spec_json, created_at_us, last_active_us, version FROM sessions");
    std::vector<SessionRecord> out;
    int rc;
    while ((rc = s.Step()) == SQLITE_ROW) {
      SessionRecord r;
      r.tenant = s.ColText(0);
      r.session_id = s.ColText(1);
      r.provider = s.ColText(2);
      r.attempt_id = s.ColText(3);
      r.sandbox_id = s.ColText(4);
      const int64_t st = s.ColInt(5);
      if (st < 0 || st > 3) return absl::DataLossError("state: session row with a bad state");
      r.state = static_cast<StoredState>(st);
      r.generation = s.ColInt(6);
      r.spec_json = s.ColText(7);
      r.created_at = FromMicros(s.ColInt(8));
      r.last_active_at = FromMicros(s.ColInt(9));
      r.version = s.ColInt(10);
      out.push_back(std::move(r));
    }
    if (rc != SQLITE_DONE) return Error("load sessions");
    return out;
  }

  absl::Status PutSession(const SessionRecord& r) override {
    absl::MutexLock l(&mu_);
    return PutLocked(r);
  }

  absl::Status PutSessions(const std::vector<SessionRecord>& records) override {
    absl::MutexLock l(&mu_);
    RETURN_IF_ERROR(ExecLocked("BEGIN IMMEDIATE"));
    for (const SessionRecord& r : records) {
      if (absl::Status s = PutLocked(r); !s.ok()) {
        (void)ExecLocked("ROLLBACK");
        return s;
      }
    }
    return ExecLocked("COMMIT");
  }

  absl::Status PutLocked(const SessionRecord& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Stmt s(db_,
           "INSERT OR REPLACE INTO sessions(tenant, session_id, provider, attempt_id, sandbox_id,"
           " state, generation, spec_json, created_at_us, last_active_us, version)"
           " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)");
    s.Text(1, r.tenant)
        .Text(2, r.session_id)
        .Text(3, r.provider)
        .Text(4, r.attempt_id)
        .Text(5, r.sandbox_id)
        .Int(6, static_cast<int64_t>(r.state))
        .Int(7, r.generation)
        .Text(8, r.spec_json)
        .Int(9, ToMicros(r.created_at))
        .Int(10, ToMicros(r.last_active_at))
        .Int(11, r.version);
    if (s.Step() != SQLITE_DONE) return Error("put session");
    return absl::OkStatus();
  }

  absl::Status DeleteSession(const std::string& tenant, const std::string& id) override {
    absl::MutexLock l(&mu_);
    RETURN_IF_ERROR(ExecLocked("BEGIN IMMEDIATE"));
    Stmt a(db_, "DELETE FROM sessions WHERE tenant = ?1 AND session_id = ?2");
    a.Text(1, tenant).Text(2, id);
    Stmt b(db_, "DELETE FROM runs WHERE tenant = ?1 AND session_id = ?2");
    b.Text(1, tenant).Text(2, id);
    if (a.Step() != SQLITE_DONE || b.Step() != SQLITE_DONE) {
      absl::Status e = Error("delete session");
      (void)ExecLocked("ROLLBACK");
      return e;
    }
    return ExecLocked("COMMIT");
  }

  absl::Status TouchSessions(const std::vector<Touch>& touches) override {
    if (touches.empty()) return absl::OkStatus();
    absl::MutexLock l(&mu_);
    RETURN_IF_ERROR(ExecLocked("BEGIN IMMEDIATE"));
    for (const Touch& t : touches) {
      Stmt s(db_, "UPDATE sessions SET last_active_us = ?3 WHERE tenant = ?1 AND session_id = ?2");
      s.Text(1, t.tenant).Text(2, t.session_id).Int(3, ToMicros(t.last_active_at));
      if (s.Step() != SQLITE_DONE) {
        absl::Status e = Error("touch sessions");
        (void)ExecLocked("ROLLBACK");
        return e;
      }
    }
    return ExecLocked("COMMIT");
  }

  absl::StatusOr<std::vector<RunRecord>> LoadRuns() override {
    absl::MutexLock l(&mu_);
    Stmt s(db_,
           "SELECT tenant, session_id, run_id, request_hash, state, status_code, status_message,"
           " result, started_us, finished_us FROM runs");
    std::vector<RunRecord> out;
    int rc;
    while ((rc = s.Step()) == SQLITE_ROW) {
      RunRecord r;
      r.tenant = s.ColText(0);
      r.session_id = s.ColText(1);
      r.run_id = s.ColText(2);
      r.request_hash = s.ColText(3);
      r.state = s.ColInt(4) == 1 ? RunState::kDone : RunState::kRunning;
      r.status_code = static_cast<int>(s.ColInt(5));
      r.status_message = s.ColText(6);
      r.result = s.ColText(7);
      r.started_at = FromMicros(s.ColInt(8));
      r.finished_at = FromMicros(s.ColInt(9));
      out.push_back(std::move(r));
    }
    if (rc != SQLITE_DONE) return Error("load runs");
    return out;
  }

  absl::Status PutRun(const RunRecord& r) override {
    absl::MutexLock l(&mu_);
    Stmt s(db_,
           "INSERT OR REPLACE INTO runs(tenant, session_id, run_id, request_hash, state,"
           " status_code, status_message, result, started_us, finished_us)"
           " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)");
    s.Text(1, r.tenant)
        .Text(2, r.session_id)
        .Text(3, r.run_id)
        .Text(4, r.request_hash)
        .Int(5, static_cast<int64_t>(r.state))
        .Int(6, r.status_code)
        .Text(7, r.status_message)
        .Blob(8, r.result)
        .Int(9, ToMicros(r.started_at))
        .Int(10, ToMicros(r.finished_at));
    if (s.Step() != SQLITE_DONE) return Error("put run");
    return absl::OkStatus();
  }

  absl::Status DeleteRun(const std::string& tenant, const std::string& id,
                         const std::string& run_id) override {
    absl::MutexLock l(&mu_);
    Stmt s(db_, "DELETE FROM runs WHERE tenant = ?1 AND session_id = ?2 AND run_id = ?3");
    s.Text(1, tenant).Text(2, id).Text(3, run_id);
    if (s.Step() != SQLITE_DONE) return Error("delete run");
    return absl::OkStatus();
  }

  absl::Time created_at() const override {
    absl::MutexLock l(&mu_);
    return created_at_;
  }

  absl::Status AddUsage(const std::vector<UsageRow>& deltas) override {
    if (deltas.empty()) return absl::OkStatus();
    absl::MutexLock l(&mu_);
    RETURN_IF_ERROR(ExecLocked("BEGIN IMMEDIATE"));
    for (const UsageRow& d : deltas) {
      Stmt s(db_,
             "INSERT INTO usage(tenant, provider, sessions_created, runs, run_seconds,"
             " sandbox_seconds, cpu_seconds, output_bytes, file_transfer_bytes, oom_kills,"
             " quota_refusals, egress_bytes)"
             " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"
             " ON CONFLICT(tenant, provider) DO UPDATE SET"
             " sessions_created = sessions_created + excluded.sessions_created,"
             " runs = runs + excluded.runs, run_seconds = run_seconds + excluded.run_seconds,"
             " sandbox_seconds = sandbox_seconds + excluded.sandbox_seconds,"
             " cpu_seconds = cpu_seconds + excluded.cpu_seconds,"
             " output_bytes = output_bytes + excluded.output_bytes,"
             " file_transfer_bytes = file_transfer_bytes + excluded.file_transfer_bytes,"
             " oom_kills = oom_kills + excluded.oom_kills,"
             " quota_refusals = quota_refusals + excluded.quota_refusals,"
             " egress_bytes = egress_bytes + excluded.egress_bytes");
      const UsageCounters& c = d.counters;
      s.Text(1, d.tenant)
          .Text(2, d.provider)
          .Int(3, c.sessions_created)
          .Int(4, c.runs)
          .Real(5, c.run_seconds)
          .Real(6, c.sandbox_seconds)
          .Real(7, c.cpu_seconds)
          .Int(8, c.output_bytes)
          .Int(9, c.file_transfer_bytes)
          .Int(10, c.oom_kills)
          .Int(11, c.quota_refusals)
          .Int(12, c.egress_bytes);
      if (s.Step() != SQLITE_DONE) {
        absl::Status e = Error("add usage");
        (void)ExecLocked("ROLLBACK");
        return e;
      }
    }
    return ExecLocked("COMMIT");
  }

  absl::StatusOr<std::vector<UsageRow>> LoadUsage() override {
    absl::MutexLock l(&mu_);
    Stmt s(db_,
           "SELECT tenant, provider, sessions_created, runs, run_seconds, sandbox_seconds,"
           " cpu_seconds, output_bytes, file_transfer_bytes, oom_kills, quota_refusals,"
           " egress_bytes FROM usage");
    std::vector<UsageRow> out;
    int rc;
    while ((rc = s.Step()) == SQLITE_ROW) {
      UsageRow r;
      r.tenant = s.ColText(0);
      r.provider = s.ColText(1);
      r.counters.sessions_created = s.ColInt(2);
      r.counters.runs = s.ColInt(3);
      r.counters.run_seconds = s.ColReal(4);
      r.counters.sandbox_seconds = s.ColReal(5);
      r.counters.cpu_seconds = s.ColReal(6);
      r.counters.output_bytes = s.ColInt(7);
      r.counters.file_transfer_bytes = s.ColInt(8);
      r.counters.oom_kills = s.ColInt(9);
      r.counters.quota_refusals = s.ColInt(10);
      r.counters.egress_bytes = s.ColInt(11);
      out.push_back(std::move(r));
    }
    if (rc != SQLITE_DONE) return Error("load usage");
    return out;
  }

  // Runs `sql` (no results). Public for OpenSqliteStore's pragmas.
  absl::Status ExecLocked(const char* sql) {
    char* err = nullptr;
    if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
      std::string msg = err ? err : sqlite3_errmsg(db_);
      sqlite3_free(err);
      return absl::UnavailableError(absl::StrCat("state: ", path_, ": ", msg));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Error(absl::string_view op) {
    return absl::UnavailableError(
        absl::StrCat("state: ", op, " in ", path_, ": ", sqlite3_errmsg(db_)));
  }

  const std::string path_;
  mutable absl::Mutex mu_;
  sqlite3* const db_ ABSL_PT_GUARDED_BY(mu_);
  const int lock_fd_;
  std::string deployment_id_ ABSL_GUARDED_BY(mu_);
  absl::Time created_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

absl::StatusOr<int> TakeLock(const std::string& path) {
  const std::string lock_path = path + ".lock";
  int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("state: cannot open lock file ", lock_path, ": ", strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {0};
    ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
    close(fd);
    std::string pid = n > 0 ? std::string(absl::StripAsciiWhitespace(std::string(buf, n))) : "";
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrCat(
          "state: ", path, " is in use by another broker (pid ", pid.empty() ? "unknown" : pid,
          ", lock ", lock_path, "); two brokers can never share a store"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("state: cannot lock ", lock_path, ": ", strerror(err)));
  }
  std::string me = absl::StrCat(getpid(), "\n");
  if (ftruncate(fd, 0) != 0 || pwrite(fd, me.data(), me.size(), 0) < 0) {
    // The lock holds anyway; only the pid in the message would be missing.
  }
  return fd;
}

}  // namespace

std::string DefaultStatePath() {
  if (geteuid() == 0) return "/var/lib/sandbox-broker/state.db";
  const char* xdg = getenv("XDG_STATE_HOME");
  if (xdg != nullptr && xdg[0] == '/') return absl::StrCat(xdg, "/sandbox-broker/state.db");
  const char* home = getenv("HOME");
  return absl::StrCat(home && *home ? home : "/tmp", "/.local/state/sandbox-broker/state.db");
}

absl::StatusOr<std::unique_ptr<SessionStore>> OpenSqliteStore(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("state.path: empty");
  if (absl::Status s = MakeParents(path); !s.ok()) return s;
  absl::StatusOr<int> lock = TakeLock(path);
  if (!lock.ok()) return lock.status();
  auto refuse = [&](const std::string& why) {
    close(*lock);
    return absl::FailedPreconditionError(absl::StrCat(
        "state: ", path, " ", why,
        "; refusing to start rather than lose sessions (restore a backup, or move the file "
        "away to start empty)"));
  };
  bool fresh = true;
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && st.st_size > 0) {
    fresh = false;
    char header[16] = {0};
    std::ifstream in(path, std::ios::binary);
    in.read(header, sizeof(header));
    if (in.gcount() != 16 || memcmp(header, "SQLite format 3\0", 16) != 0) {
      return refuse("is not a SQLite database (torn or overwritten)");
    }
    if (st.st_size < 512) return refuse("is torn (shorter than one page)");
  }
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close_v2(db);
    return refuse(absl::StrCat("cannot be opened: ", msg));
  }
  chmod(path.c_str(), 0600);  // it holds session env (may carry secrets)
  sqlite3_busy_timeout(db, 5000);
  auto store = std::make_unique<SqliteStore>(path, db, *lock);
  // Integrity first: a corrupt file is refused, never rewritten.
  {
    Stmt check(db, "PRAGMA quick_check");
    const int rc = check.Step();
    if (rc != SQLITE_ROW || check.ColText(0) != "ok") {
      std::string why = rc == SQLITE_ROW ? check.ColText(0) : sqlite3_errmsg(db);
      store.reset();  // closes db and lock
      return absl::FailedPreconditionError(absl::StrCat(
          "state: ", path, " is corrupt (", why,
          "); refusing to start rather than lose sessions (restore a backup, or move the file "
          "away to start empty)"));
    }
  }
  for (const char* pragma : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL"}) {
    Stmt p(db, pragma);
    int rc = p.Step();
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
      std::string why = sqlite3_errmsg(db);
      store.reset();
      return absl::FailedPreconditionError(absl::StrCat("state: ", path, ": ", pragma, ": ", why));
    }
  }
  if (absl::Status s = static_cast<SqliteStore*>(store.get())->Init(fresh); !s.ok()) return s;
  return std::unique_ptr<SessionStore>(std::move(store));
}

}  // namespace sandbox
