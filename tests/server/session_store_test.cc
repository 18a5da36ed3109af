#include "server/store/session_store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "server/config/config.h"
#include "server/store/usage_store.h"
#include "tests/testing/temp_dir.h"

namespace sandbox {
namespace {

SessionRecord Row(const std::string& tenant, const std::string& id, StoredState state) {
  SessionRecord r;
  r.tenant = tenant;
  r.session_id = id;
  r.provider = "local";
  r.attempt_id = "att-" + id;
  r.sandbox_id = state == StoredState::kCreating ? "" : "sb-" + id;
  r.state = state;
  r.generation = 2;
  r.spec_json = R"({"template":"t"})";
  r.created_at = absl::FromUnixSeconds(1800000000);
  r.last_active_at = absl::FromUnixSeconds(1800000100);
  return r;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A store with enough rows to span several pages, closed (checkpointed).
void Fill(const std::string& path) {
  auto s = OpenSqliteStore(path);
  ASSERT_TRUE(s.ok()) << s.status();
  std::vector<SessionRecord> rows;
  for (int i = 0; i < 300; ++i) {
    rows.push_back(Row("t", absl::StrCat("s", i), StoredState::kReady));
    rows.back().spec_json = std::string(200, 'j');
  }
  ASSERT_TRUE((*s)->PutSessions(rows).ok());
}

// Both stores keep the same contract.
class StoreContractTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "memory") {
      store_ = NewMemoryStore();
    } else {
      auto s = OpenSqliteStore(dir_.path() + "/state.db");
      ASSERT_TRUE(s.ok()) << s.status();
      store_ = std::move(*s);
    }
  }
  TempDir dir_;
  std::unique_ptr<SessionStore> store_;
};

TEST_P(StoreContractTest, SessionsPutReplaceTouchDelete) {
  EXPECT_EQ(store_->backend(), GetParam());
  EXPECT_EQ(store_->durable(), GetParam() == "sqlite");
  EXPECT_FALSE(store_->deployment_id().empty());
  ASSERT_TRUE(store_->PutSession(Row("t", "a", StoredState::kCreating)).ok());
  ASSERT_TRUE(store_->PutSession(Row("t", "b", StoredState::kReady)).ok());
  ASSERT_TRUE(store_->PutSession(Row("t", "a", StoredState::kReady)).ok());  // replaces
  ASSERT_TRUE(
      store_->TouchSessions({{"t", "b", absl::FromUnixSeconds(1800000500)}, {"t", "zz", {}}}).ok());
  auto rows = store_->LoadSessions();
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), 2u);
  for (const auto& r : *rows) {
    EXPECT_EQ(r.state, StoredState::kReady);
    EXPECT_EQ(r.sandbox_id, "sb-" + r.session_id);
    EXPECT_EQ(r.generation, 2);
    EXPECT_EQ(r.spec_json, R"({"template":"t"})");
    EXPECT_EQ(r.created_at, absl::FromUnixSeconds(1800000000));
    EXPECT_EQ(r.last_active_at,
              absl::FromUnixSeconds(r.session_id == "b" ? 1800000500 : 1800000100));
  }
  ASSERT_TRUE(store_->DeleteSession("t", "a").ok());
  ASSERT_TRUE(store_->DeleteSession("t", "missing").ok());
  EXPECT_EQ(store_->LoadSessions()->size(), 1u);
}

TEST_P(StoreContractTest, RunsPutReplaceAndGoWithTheirSession) {
  RunRecord r;
  r.tenant = "t";
  r.session_id = "a";
  r.run_id = "r1";
  r.request_hash = "h";
  r.started_at = absl::FromUnixSeconds(1800000000);
  ASSERT_TRUE(store_->PutRun(r).ok());
  r.state = RunState::kDone;
  r.result = std::string("out\0put", 7);
  r.status_code = 0;
  ASSERT_TRUE(store_->PutRun(r).ok());
  r.run_id = "r2";
  ASSERT_TRUE(store_->PutRun(r).ok());
  auto runs = store_->LoadRuns();
  ASSERT_TRUE(runs.ok());
  ASSERT_EQ(runs->size(), 2u);
  EXPECT_EQ((*runs)[0].state, RunState::kDone);
  EXPECT_EQ((*runs)[0].result, std::string("out\0put", 7));  // bytes, not text
  ASSERT_TRUE(store_->DeleteRun("t", "a", "r2").ok());
  EXPECT_EQ(store_->LoadRuns()->size(), 1u);
  ASSERT_TRUE(store_->PutSession(Row("t", "a", StoredState::kReady)).ok());
  ASSERT_TRUE(store_->DeleteSession("t", "a").ok());
  EXPECT_EQ(store_->LoadRuns()->size(), 0u);
}

TEST_P(StoreContractTest, UsageAddsDeltasToTheirRow) {
  UsageCounters a;
  a.runs = 2;
  a.run_seconds = 1.5;
  a.output_bytes = 10;
  UsageCounters b;
  b.runs = 1;
  b.cpu_seconds = 0.25;
  b.quota_refusals = 3;
  b.egress_bytes = 4096;
  ASSERT_TRUE(store_->AddUsage({{"alpha", "echo", a}, {"beta", "-", b}}).ok());
  ASSERT_TRUE(store_->AddUsage({{"alpha", "echo", b}}).ok());
  auto rows = store_->LoadUsage();
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);
  std::map<UsageKey, UsageCounters> by;
  for (const UsageRow& r : *rows) by[{r.tenant, r.provider}] = r.counters;
  const UsageCounters& ae = by[UsageKey("alpha", "echo")];
  EXPECT_EQ(ae.runs, 3);
  EXPECT_DOUBLE_EQ(ae.run_seconds, 1.5);
  EXPECT_DOUBLE_EQ(ae.cpu_seconds, 0.25);
  EXPECT_EQ(ae.output_bytes, 10);
  EXPECT_EQ(ae.quota_refusals, 3);
  EXPECT_EQ(ae.egress_bytes, 4096);
  EXPECT_EQ(by[UsageKey("beta", "-")].quota_refusals, 3);
  EXPECT_NE(store_->created_at(), absl::InfinitePast());
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreContractTest, ::testing::Values("memory", "sqlite"));

TEST(SqliteStoreTest, ReopenKeepsRowsAndTheDeploymentId) {
  TempDir dir;
  const std::string path = dir.path() + "/sub/dir/state.db";  // parents are created
  std::string dep;
  {
    auto s = OpenSqliteStore(path);
    ASSERT_TRUE(s.ok()) << s.status();
    dep = (*s)->deployment_id();
    ASSERT_TRUE((*s)->PutSession(Row("t", "a", StoredState::kReady)).ok());
  }
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);  // holds session env
  // Its parents: traverse-only, so a workspace root beside the file (the
  // local provider's default is /var/lib/sandbox-broker/workspaces) stays
  // reachable by the sandboxes' uid whichever was created first.
  ASSERT_EQ(stat((dir.path() + "/sub").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0711u);
  {
    auto s = OpenSqliteStore(path);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ((*s)->deployment_id(), dep);
    EXPECT_EQ((*s)->LoadSessions()->size(), 1u);
    ASSERT_TRUE((*s)->SetDeploymentId("prod-eu").ok());
  }
  auto s = OpenSqliteStore(path);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->deployment_id(), "prod-eu");
}

// A store from before usage counted egress bytes: its table gains the
// column, and its rows keep their counts with 0 egress bytes.
TEST(SqliteStoreTest, AUsageTableFromBeforeGainsEgressBytes) {
  TempDir dir;
  const std::string path = dir.path() + "/state.db";
  {
    auto s = OpenSqliteStore(path);
    ASSERT_TRUE(s.ok()) << s.status();
    UsageCounters c;
    c.runs = 5;
    ASSERT_TRUE((*s)->AddUsage({{"alpha", "local", c}}).ok());
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(
      sqlite3_exec(db, "ALTER TABLE usage DROP COLUMN egress_bytes", nullptr, nullptr, nullptr),
      SQLITE_OK);
  sqlite3_close(db);
  auto s = OpenSqliteStore(path);
  ASSERT_TRUE(s.ok()) << s.status();
  UsageCounters more;
  more.egress_bytes = 10;
  ASSERT_TRUE((*s)->AddUsage({{"alpha", "local", more}}).ok());
  auto rows = (*s)->LoadUsage();
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0].counters.runs, 5);
  EXPECT_EQ((*rows)[0].counters.egress_bytes, 10);
}

// Buffered usage: Add() writes nothing; Flush() writes once; the totals
// (and the store's creation time) survive reopening the file; what was never
// flushed (a kill -9 between ticks) is lost, and only that.
TEST(SqliteStoreTest, BufferedUsageSurvivesReopenAfterFlush) {
  TempDir dir;
  const std::string path = dir.path() + "/state.db";
  absl::Time created;
  {
    auto store = OpenSqliteStore(path);
    ASSERT_TRUE(store.ok()) << store.status();
    created = (*store)->created_at();
    auto usage = BufferedUsageStore::Open(store->get());
    ASSERT_TRUE(usage.ok()) << usage.status();
    UsageCounters d;
    d.runs = 1;
    d.run_seconds = 0.5;
    d.file_transfer_bytes = 100;
    for (int i = 0; i < 50; ++i) (*usage)->Add("alpha", "echo", d);
    d.sessions_created = 1;
    (*usage)->Add("beta", "local", d);
    EXPECT_EQ((*usage)->pending(), 2u);
    EXPECT_EQ((*usage)->Totals()[UsageKey("alpha", "echo")].runs, 50);  // before the flush
    auto stored = (*store)->LoadUsage();
    ASSERT_TRUE(stored.ok());
    EXPECT_TRUE(stored->empty()) << "Add() must not write";
    ASSERT_TRUE((*usage)->Flush().ok());
    EXPECT_EQ((*usage)->pending(), 0u);
    ASSERT_TRUE((*usage)->Flush().ok());  // nothing new: nothing added twice
    // Added after the last flush and never flushed: lost with the process.
    (*usage)->Add("alpha", "echo", d);
  }
  auto store = OpenSqliteStore(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->created_at(), created);
  auto usage = BufferedUsageStore::Open(store->get());
  ASSERT_TRUE(usage.ok()) << usage.status();
  EXPECT_EQ((*usage)->created_at(), created);
  UsageTotals t = (*usage)->Totals();
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[UsageKey("alpha", "echo")].runs, 50);
  EXPECT_DOUBLE_EQ(t[UsageKey("alpha", "echo")].run_seconds, 25.0);
  EXPECT_EQ(t[UsageKey("alpha", "echo")].file_transfer_bytes, 5000);
  EXPECT_EQ(t[UsageKey("alpha", "echo")].sessions_created, 0);
  EXPECT_EQ(t[UsageKey("beta", "local")].sessions_created, 1);
  // Counting goes on from the persisted totals.
  UsageCounters more;
  more.runs = 5;
  (*usage)->Add("alpha", "echo", more);
  ASSERT_TRUE((*usage)->Flush().ok());
  auto rows = (*store)->LoadUsage();
  ASSERT_TRUE(rows.ok());
  for (const UsageRow& r : *rows) {
    if (r.tenant == "alpha") EXPECT_EQ(r.counters.runs, 55);
  }
}

TEST(SqliteStoreTest, SecondOpenerIsRefusedAndNamesTheHolder) {
  TempDir dir;
  const std::string path = dir.path() + "/state.db";
  auto first = OpenSqliteStore(path);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = OpenSqliteStore(path);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find(absl::StrCat("pid ", getpid())), std::string::npos)
      << second.status();
  first->reset();  // the lock goes with the holder
  EXPECT_TRUE(OpenSqliteStore(path).ok());
}

TEST(SqliteStoreTest, GarbageFileIsRefusedAndLeftAsItIs) {
  TempDir dir;
  const std::string path = dir.path() + "/state.db";
  std::ofstream(path) << std::string(4096, 'x');
  auto s = OpenSqliteStore(path);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("refusing"), std::string::npos) << s.status();
  EXPECT_EQ(ReadAll(path), std::string(4096, 'x'));  // never silently emptied
}

TEST(SqliteStoreTest, TornFileIsRefused) {
  TempDir dir;
  const std::string path = dir.path() + "/state.db";
  ASSERT_NO_FATAL_FAILURE(Fill(path));
  // Checkpointed on close: the rows are in the main file. Tear it.
  std::string whole = ReadAll(path);
  ASSERT_GT(whole.size(), 8192u);
  const std::string torn = whole.substr(0, whole.size() / 2);
  unlink((path + "-wal").c_str());
  unlink((path + "-shm").c_str());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << torn;
  auto s = OpenSqliteStore(path);
  ASSERT_FALSE(s.ok()) << "a torn store was accepted";
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find(path), std::string::npos);
  EXPECT_EQ(ReadAll(path), torn);
}

TEST(SqliteStoreTest, FlippedBytesAreRefused) {
  TempDir dir;
  const std::string path = dir.path() + "/state.db";
  ASSERT_NO_FATAL_FAILURE(Fill(path));
  std::string whole = ReadAll(path);
  // Scribble over the b-tree pages (not the header).
  for (size_t i = 4096 + 8; i < whole.size() && i < 4096 * 6; i += 7) whole[i] = '\xff';
  std::ofstream(path, std::ios::binary | std::ios::trunc) << whole;
  auto s = OpenSqliteStore(path);
  ASSERT_FALSE(s.ok()) << "a corrupt store was accepted";
  EXPECT_NE(s.status().message().find("refusing"), std::string::npos) << s.status();
}

TEST(SqliteStoreTest, DefaultPathFollowsTheUser) {
  if (geteuid() == 0) {
    EXPECT_EQ(DefaultStatePath(), "/var/lib/sandbox-broker/state.db");
  } else {
    setenv("XDG_STATE_HOME", "/x/state", 1);
    EXPECT_EQ(DefaultStatePath(), "/x/state/sandbox-broker/state.db");
    unsetenv("XDG_STATE_HOME");
  }
}

}  // namespace
}  // namespace sandbox

namespace sandbox {
namespace {

TEST(StateConfigTest, KeysDefaultsAndErrors) {
  auto d = ParseConfig("{}");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->state_backend, "sqlite");
  EXPECT_EQ(d->state_path, "");
  EXPECT_FALSE(d->drain_close_sandboxes);  // durable store: sandboxes stay
  EXPECT_EQ(d->orphan_sweep_interval_seconds, 300);
  EXPECT_EQ(d->orphan_grace_seconds, 300);
  EXPECT_EQ(d->run_result_ttl_seconds, 600);
  auto m = ParseConfig(R"({"state": {"backend": "memory"}})");
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->drain_close_sandboxes);  // memory: closed as before
  auto e = ParseConfig(
      R"({"state": {"path": "/x/s.db"}, "drain_close_sandboxes": true, "deployment_id": "prod-1",
          "orphan_grace_seconds": 1})");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE(e->drain_close_sandboxes);
  EXPECT_EQ(e->deployment_id, "prod-1");
  EXPECT_EQ(e->orphan_grace_seconds, 1);
  for (const char* bad : {R"({"state": {"backend": "etcd"}})", R"({"state": {"path": "rel.db"}})",
                          R"({"state": {"backend": "memory", "path": "/x"}})",
                          R"({"state": {"pth": "/x"}})", R"({"deployment_id": "a b"})",
                          R"({"orphan_grace_seconds": 0})", R"({"run_result_ttl_seconds": -1})"}) {
    auto c = ParseConfig(bad);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(
      ParseConfig(R"({"state": {"backend": "etcd"}})").status().message().find("state.backend"),
      std::string::npos);
}

}  // namespace
}  // namespace sandbox
