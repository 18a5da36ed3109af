// Session manager recovery from the store, the orphan sweep and retry-safe
// runs, against a provider whose sandboxes outlive the manager (as a cloud
// provider's outlive the broker process).

#include <gtest/gtest.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "server/sessions/run_ledger.h"
#include "server/sessions/session_manager.h"
#include "server/store/session_store.h"
#include "tests/testing/store_rows.h"
#include "tests/testing/temp_dir.h"

namespace sandbox {
namespace {

// The provider's side: sandboxes by id, with their tags and files.
struct World {
  struct Box {
    std::string deployment, attempt, tenant, session;
    absl::Time created;
    std::map<std::string, std::string> files;
    bool alive = true;
  };
  absl::Mutex mu;
  std::map<std::string, Box> boxes;
  int creates = 0, attaches = 0, destroys = 0, lists = 0;
  int list_failures = 0;  // the next N ListOwned calls fail (UNAVAILABLE)
  // Called inside Create / Destroy (to check what the store holds then).
  std::function<void(const SandboxSpec&)> on_create;
  std::function<void(const std::string&)> on_destroy;
  int live() {
    absl::MutexLock l(&mu);
    int n = 0;
    for (auto& [id, b] : boxes) n += b.alive;
    return n;
  }
};

class WorldSandbox final : public Sandbox {
 public:
  WorldSandbox(World* w, std::string id) : w_(w), id_(std::move(id)) {}
  const std::string& id() const override { return id_; }
  absl::StatusOr<ExecResult> Exec(const ExecRequest& r) override {
    ExecResult out;
    out.output = r.code;
    return out;
  }
  absl::Status WriteFile(absl::string_view path, absl::string_view data) override {
    absl::MutexLock l(&w_->mu);
    auto& b = w_->boxes[id_];
    if (!b.alive) return SandboxGoneError("gone");
    b.files[std::string(path)] = std::string(data);
    return absl::OkStatus();
  }
  absl::StatusOr<std::optional<std::string>> ReadFile(absl::string_view path) override {
    absl::MutexLock l(&w_->mu);
    auto& b = w_->boxes[id_];
    if (!b.alive) return SandboxGoneError("gone");
    auto it = b.files.find(std::string(path));
    if (it == b.files.end()) return std::optional<std::string>();
    return std::optional<std::string>(it->second);
  }
  absl::Status Destroy() override {
    if (w_->on_destroy) w_->on_destroy(id_);
    absl::MutexLock l(&w_->mu);
    if (w_->boxes[id_].alive) ++w_->destroys;
    w_->boxes[id_].alive = false;
    return absl::OkStatus();
  }

 private:
  World* const w_;
  const std::string id_;
};

class WorldProvider final : public Provider {
 public:
  WorldProvider(World* w, Clock* clock) : w_(w), clock_(clock) {}
  absl::string_view name() const override { return "world"; }
  absl::StatusOr<std::unique_ptr<Sandbox>> Create(const SandboxSpec& spec) override {
    if (w_->on_create) w_->on_create(spec);
    absl::MutexLock l(&w_->mu);
    std::string id = absl::StrCat("w-", ++w_->creates);
    w_->boxes[id] = {spec.deployment_id, spec.attempt_id, spec.tenant, spec.session_id,
                     clock_->Now()};
    return std::unique_ptr<Sandbox>(new WorldSandbox(w_, id));
  }
  absl::StatusOr<std::unique_ptr<Sandbox>> Attach(const std::string& id,
                                                  const SandboxSpec&) override {
    absl::MutexLock l(&w_->mu);
    ++w_->attaches;
    auto it = w_->boxes.find(id);
    if (it == w_->boxes.end() || !it->second.alive) return SandboxGoneError("world: gone");
    return std::unique_ptr<Sandbox>(new WorldSandbox(w_, id));
  }
  absl::StatusOr<std::vector<OwnedSandbox>> ListOwned(const std::string& dep) override {
    absl::MutexLock l(&w_->mu);
    ++w_->lists;
    if (w_->list_failures > 0) {
      --w_->list_failures;
      return absl::UnavailableError("world: list: 503 service unavailable");
    }
    std::vector<OwnedSandbox> out;
    for (auto& [id, b] : w_->boxes) {
      if (b.alive && b.deployment == dep)
        out.push_back({id, b.attempt, b.tenant, b.session, b.created});
    }
    return out;
  }

 private:
  World* const w_;
  Clock* const clock_;
};

class DurableSessionsTest : public ::testing::Test {
 protected:
  DurableSessionsTest() {
    registry_.Add(std::make_unique<WorldProvider>(&world_, &clock_));
    limits_.idle_timeout = absl::Seconds(60);
    auto s = OpenSqliteStore(dir_.path() + "/state.db");
    EXPECT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
  }
  // A new broker process on the same store (the old one "crashed": its
  // sandboxes were let go of, never destroyed).
  SessionManager& Restart() {
    if (manager_) manager_->SetDetachOnShutdown(true);
    manager_.reset();
    manager_ = std::make_unique<SessionManager>(&registry_, &clock_, limits_, "world", "test",
                                                nullptr, store_.get());
    return *manager_;
  }
  std::vector<SessionRecord> Rows() { return *store_->LoadSessions(); }

  TempDir dir_;
  FakeClock clock_;
  World world_;
  ProviderRegistry registry_;
  SessionLimits limits_;
  CreateOptions create_;
  std::unique_ptr<SessionStore> store_;
  std::unique_ptr<SessionManager> manager_;
};

TEST_F(DurableSessionsTest, IntentIsWrittenBeforeCreateAndClosingBeforeDestroy) {
  std::vector<SessionRecord> at_create, at_destroy;
  world_.on_create = [&](const SandboxSpec& spec) {
    at_create = Rows();
    EXPECT_EQ(spec.deployment_id, store_->deployment_id());
    EXPECT_FALSE(spec.attempt_id.empty());
  };
  world_.on_destroy = [&](const std::string&) { at_destroy = Rows(); };
  SessionManager& m = Restart();
  { ASSERT_TRUE(m.Acquire("t", "s", &create_).ok()); }
  ASSERT_EQ(at_create.size(), 1u);
  EXPECT_EQ(at_create[0].state, StoredState::kCreating);
  EXPECT_EQ(at_create[0].attempt_id, world_.boxes["w-1"].attempt);
  ASSERT_EQ(Rows().size(), 1u);
  EXPECT_EQ(Rows()[0].state, StoredState::kReady);
  EXPECT_EQ(Rows()[0].sandbox_id, "w-1");
  ASSERT_TRUE(*m.Close("t", "s"));
  ASSERT_EQ(at_destroy.size(), 1u);
  EXPECT_EQ(at_destroy[0].state, StoredState::kClosing);
  EXPECT_TRUE(Rows().empty());
}

TEST_F(DurableSessionsTest, RestartAdoptsLazilyWithSameSandboxFilesAndGeneration) {
  {
    auto l = Restart().Acquire("t", "s", &create_);
    ASSERT_TRUE(l.ok());
    ASSERT_TRUE(l->sandbox()->WriteFile("f.txt", "kept").ok());
  }
  SessionManager& m = Restart();
  ASSERT_EQ(*m.LoadFromStore(), 1);
  EXPECT_EQ(world_.attaches, 0);  // nothing called before the session's first use
  auto v = m.Get("t", "s");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->sandbox_id, "w-1");
  EXPECT_EQ(v->generation, 1);
  auto l = m.Acquire("t", "s", &create_);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->sandbox()->id(), "w-1");
  EXPECT_EQ(**l->sandbox()->ReadFile("f.txt"), "kept");
  EXPECT_EQ(world_.attaches, 1);
  EXPECT_EQ(world_.creates, 1);
  EXPECT_EQ(world_.live(), 1);
}

TEST_F(DurableSessionsTest, VanishedWhileDownMeansANewSandboxAndGenerationPlusOne) {
  { ASSERT_TRUE(Restart().Acquire("t", "s", &create_).ok()); }
  SessionManager& m = Restart();
  ASSERT_TRUE(m.LoadFromStore().ok());
  world_.boxes["w-1"].alive = false;  // expired at the provider meanwhile
  EXPECT_EQ(m.Acquire("t", "s", nullptr).status().code(), absl::StatusCode::kNotFound);
  {
    auto l = m.Acquire("t", "s", &create_);
    ASSERT_TRUE(l.ok()) << l.status();
    EXPECT_EQ(l->sandbox()->id(), "w-2");
  }
  EXPECT_EQ(m.Get("t", "s")->generation, 2);
  // Adoption keeps the generation.
  SessionManager& m2 = Restart();
  ASSERT_TRUE(m2.LoadFromStore().ok());
  EXPECT_EQ(m2.Get("t", "s")->generation, 2);
  { ASSERT_TRUE(m2.Acquire("t", "s", &create_).ok()); }
  EXPECT_EQ(m2.Get("t", "s")->generation, 2);
  EXPECT_EQ(world_.live(), 1);
}

TEST_F(DurableSessionsTest, CreatingRowsResolveThroughTheAttemptTag) {
  // Two creates the old process died in: one reached the provider, one not.
  SessionRecord made, lost;
  made.tenant = lost.tenant = "t";
  made.session_id = "made";
  lost.session_id = "lost";
  made.provider = lost.provider = "world";
  made.attempt_id = "att-made";
  lost.attempt_id = "att-lost";
  made.state = lost.state = StoredState::kCreating;
  made.created_at = lost.created_at = made.last_active_at = lost.last_active_at = clock_.Now();
  ASSERT_TRUE(store_->PutSession(made).ok());
  ASSERT_TRUE(store_->PutSession(lost).ok());
  world_.boxes["w-made"] = {store_->deployment_id(), "att-made", "t", "made", clock_.Now()};
  SessionManager& m = Restart();
  ASSERT_EQ(*m.LoadFromStore(), 2);
  m.ResolvePending();
  EXPECT_EQ(world_.lists, 1);  // one list call for all of them
  auto l = m.Acquire("t", "made", nullptr);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->sandbox()->id(), "w-made");
  EXPECT_EQ(m.Get("t", "lost").status().code(), absl::StatusCode::kNotFound);
  auto rows = Rows();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].state, StoredState::kReady);
  EXPECT_EQ(rows[0].sandbox_id, "w-made");
}

TEST_F(DurableSessionsTest, ACreatingRowWaitsOutAFailedListInsteadOfBeingForgotten) {
  SessionRecord made;
  made.tenant = "t";
  made.session_id = "made";
  made.provider = "world";
  made.attempt_id = "att-made";
  made.state = StoredState::kCreating;
  made.created_at = made.last_active_at = clock_.Now();
  ASSERT_TRUE(store_->PutSession(made).ok());
  world_.boxes["w-made"] = {store_->deployment_id(), "att-made", "t", "made", clock_.Now()};
  SessionManager& m = Restart();
  ASSERT_EQ(*m.LoadFromStore(), 1);
  world_.list_failures = 2;  // the provider is briefly unreachable
  // A call that came before the resolution waits, then gets UNAVAILABLE
  // (it may also come after: the same answer).
  absl::Status early;
  std::thread caller([&] { early = m.Acquire("t", "made", &create_).status(); });
  EXPECT_EQ(m.ResolvePending(), 1);
  caller.join();
  EXPECT_EQ(early.code(), absl::StatusCode::kUnavailable) << early;
  // Not "not found": the row and the sandbox stay, the orphan sweep (its
  // list failing or not) spares it, and calls say why they cannot go on.
  EXPECT_EQ(m.SweepOrphans(absl::ZeroDuration()), 0);
  EXPECT_EQ(m.SweepOrphans(absl::ZeroDuration()), 0);
  EXPECT_EQ(world_.live(), 1);
  ASSERT_EQ(Rows().size(), 1u);
  EXPECT_EQ(Rows()[0].state, StoredState::kCreating);
  auto waiting = m.Acquire("t", "made", &create_);
  EXPECT_EQ(waiting.status().code(), absl::StatusCode::kUnavailable) << waiting.status();
  EXPECT_NE(waiting.status().message().find("could not be listed"), std::string::npos);
  EXPECT_EQ(m.Close("t", "made").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(world_.creates, 0);  // no second sandbox for the session
  // The provider answers again: the next pass adopts the sandbox.
  EXPECT_EQ(m.ResolvePending(), 0);
  auto l = m.Acquire("t", "made", nullptr);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->sandbox()->id(), "w-made");
  EXPECT_EQ(world_.creates, 0);
  EXPECT_EQ(Rows()[0].state, StoredState::kReady);
}

TEST_F(DurableSessionsTest, ClosingRowsFinishTheDestroy) {
  { ASSERT_TRUE(Restart().Acquire("t", "s", &create_).ok()); }
  SessionRecord r = Rows()[0];
  r.state = StoredState::kClosing;  // died between the closing write and the destroy
  ASSERT_TRUE(store_->PutSession(r).ok());
  SessionManager& m = Restart();
  ASSERT_TRUE(m.LoadFromStore().ok());
  m.ResolvePending();
  EXPECT_EQ(world_.live(), 0);
  EXPECT_TRUE(Rows().empty());
  EXPECT_EQ(m.Get("t", "s").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(DurableSessionsTest, IdleDeadlineContinuesByWallClock) {
  { ASSERT_TRUE(Restart().Acquire("t", "s", &create_).ok()); }
  Restart();
  clock_.Advance(absl::Seconds(61));  // idle past its timeout while down
  SessionManager& m = Restart();
  ASSERT_TRUE(m.LoadFromStore().ok());
  EXPECT_EQ(m.RunOnce(), 1);
  EXPECT_EQ(world_.live(), 0);
  EXPECT_TRUE(Rows().empty());
}

TEST_F(DurableSessionsTest, OrphanSweepTouchesOnlyOurUnownedSandboxesPastTheGrace) {
  SessionManager& m = Restart();
  { ASSERT_TRUE(m.Acquire("t", "owned", &create_).ok()); }
  const std::string dep = store_->deployment_id();
  world_.boxes["old-orphan"] = {dep, "att-x", "t", "x", clock_.Now() - absl::Seconds(400)};
  world_.boxes["young-orphan"] = {dep, "att-y", "t", "y", clock_.Now() - absl::Seconds(10)};
  world_.boxes["other-deployment"] = {"someone-else", "att-z", "t", "z",
                                      clock_.Now() - absl::Hours(5)};
  world_.boxes["untagged"] = {"", "", "", "", clock_.Now() - absl::Hours(5)};
  EXPECT_EQ(m.SweepOrphans(absl::Seconds(300)), 1);
  EXPECT_FALSE(world_.boxes["old-orphan"].alive);
  EXPECT_TRUE(world_.boxes["young-orphan"].alive);
  EXPECT_TRUE(world_.boxes["other-deployment"].alive);
  EXPECT_TRUE(world_.boxes["untagged"].alive);
  EXPECT_TRUE(world_.boxes["w-1"].alive);  // owned
  clock_.Advance(absl::Seconds(300));
  EXPECT_EQ(m.SweepOrphans(absl::Seconds(300)), 1);
  EXPECT_FALSE(world_.boxes["young-orphan"].alive);
  EXPECT_TRUE(world_.boxes["w-1"].alive);
}

// Counts writes, to show the hot path stays in memory.
class CountingStore final : public SessionStore {
 public:
  explicit CountingStore(SessionStore* inner) : inner_(inner) {}
  std::string backend() const override { return inner_->backend(); }
  bool durable() const override { return true; }
  std::string deployment_id() const override { return inner_->deployment_id(); }
  absl::Status SetDeploymentId(const std::string& id) override {
    return inner_->SetDeploymentId(id);
  }
  absl::StatusOr<std::vector<SessionRecord>> LoadSessions() override {
    return inner_->LoadSessions();
  }
  absl::Status PutSession(const SessionRecord& r) override {
    ++puts;
    return inner_->PutSession(r);
  }
  absl::Status PutSessions(const std::vector<SessionRecord>& r) override {
    ++puts;
    return inner_->PutSessions(r);
  }
  absl::Status DeleteSession(const std::string& t, const std::string& s) override {
    ++deletes;
    return inner_->DeleteSession(t, s);
  }
  absl::Status TouchSessions(const std::vector<Touch>& t) override {
    if (!t.empty()) ++touches;
    touched += static_cast<int>(t.size());
    return inner_->TouchSessions(t);
  }
  absl::StatusOr<std::vector<RunRecord>> LoadRuns() override { return inner_->LoadRuns(); }
  absl::Status PutRun(const RunRecord& r) override {
    ++run_puts;
    return inner_->PutRun(r);
  }
  absl::Status DeleteRun(const std::string& t, const std::string& s,
                         const std::string& r) override {
    return inner_->DeleteRun(t, s, r);
  }
  int puts = 0, deletes = 0, touches = 0, touched = 0, run_puts = 0;

 private:
  SessionStore* inner_;
};

TEST_F(DurableSessionsTest, CallsDoNotWriteActivityIsFlushedLazily) {
  CountingStore counting(store_.get());
  SessionManager m(&registry_, &clock_, limits_, "world", "test", nullptr, &counting);
  for (int i = 0; i < 100; ++i) {
    auto l = m.Acquire("t", "s", &create_);
    ASSERT_TRUE(l.ok());
  }
  EXPECT_EQ(counting.puts, 2);  // creating + ready, nothing per call
  m.FlushActivity();
  EXPECT_EQ(counting.touches, 1);
  EXPECT_EQ(counting.touched, 1);
  { ASSERT_TRUE(m.Acquire("t", "s", &create_).ok()); }
  m.FlushActivity();  // within a second of the last flush: not yet
  EXPECT_EQ(counting.touches, 1);
  clock_.Advance(absl::Seconds(1));
  m.FlushActivity();
  EXPECT_EQ(counting.touches, 2);
  EXPECT_EQ(Rows()[0].last_active_at, clock_.Now() - absl::Seconds(1));
  m.SetDetachOnShutdown(true);
}

TEST_F(DurableSessionsTest, TenThousandStoredSessionsLoadWithoutProviderCalls) {
  std::vector<SessionRecord> rows =
      ReadyRows(10000, "t", "world", clock_.Now(), [](int i) { return absl::StrCat("gone-", i); });
  ASSERT_TRUE(store_->PutSessions(rows).ok());
  const absl::Time start = absl::Now();
  SessionManager& m = Restart();
  ASSERT_EQ(*m.LoadFromStore(), 10000);
  const absl::Duration took = absl::Now() - start;
  EXPECT_LT(took, absl::Seconds(5));
  EXPECT_EQ(world_.attaches + world_.lists, 0);
  printf("loaded 10000 sessions in %s\n", absl::FormatDuration(took).c_str());
  m.SetDetachOnShutdown(true);
}

// ---- run_id ----------------------------------------------------------------

class RunLedgerTest : public ::testing::Test {
 protected:
  RunLedgerTest() : store_(NewMemoryStore()) {}
  RunLedger& Ledger() {
    if (!ledger_) {
      ledger_ = std::make_unique<RunLedger>(store_.get(), &clock_, options_);
      EXPECT_TRUE(ledger_->Load().ok());
    }
    return *ledger_;
  }
  // Runs in sandbox generation `generation_` (0: fails before holding one).
  absl::StatusOr<std::string> Do(const std::string& id, const std::string& hash = "h",
                                 absl::StatusOr<std::string> result = std::string("out")) {
    return Ledger().Do("t", "s", id, hash, [&, result](const RunLedger::Started& started) {
      if (generation_ > 0) started(generation_);
      ++ran_;
      return result;
    });
  }
  FakeClock clock_;
  std::unique_ptr<SessionStore> store_;
  RunLedger::Options options_;
  std::unique_ptr<RunLedger> ledger_;
  int ran_ = 0;
  int64_t generation_ = 1;
};

TEST_F(RunLedgerTest, FinishedRetryGetsTheStoredResultAndNeverRunsTwice) {
  EXPECT_EQ(*Do("r1"), "out");
  EXPECT_EQ(*Do("r1", "h", std::string("different")), "out");
  EXPECT_EQ(ran_, 1);
  // Survives a restart of the ledger (the store holds it).
  ledger_.reset();
  EXPECT_EQ(*Do("r1"), "out");
  EXPECT_EQ(ran_, 1);
}

TEST_F(RunLedgerTest, RetryWhileRunningWaitsForTheFirst) {
  absl::Notification started, release;
  std::thread first([&] {
    auto r = Ledger().Do("t", "s", "r1", "h",
                         [&](const RunLedger::Started&) -> absl::StatusOr<std::string> {
                           started.Notify();
                           release.WaitForNotification();
                           return std::string("first");
                         });
    EXPECT_EQ(*r, "first");
  });
  started.WaitForNotification();
  absl::StatusOr<std::string> second;
  std::thread retry([&] { second = Do("r1"); });
  absl::SleepFor(absl::Milliseconds(50));  // let the retry block (not a timing assertion)
  release.Notify();
  first.join();
  retry.join();
  EXPECT_EQ(*second, "first");
  EXPECT_EQ(ran_, 0);
}

TEST_F(RunLedgerTest, SameIdDifferentRequestIsAlreadyExists) {
  ASSERT_TRUE(Do("r1", "h1").ok());
  EXPECT_EQ(Do("r1", "h2").status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ran_, 1);
}

TEST_F(RunLedgerTest, ACrashMidRunIsAbortedNotRerun) {
  RunRecord r;
  r.tenant = "t";
  r.session_id = "s";
  r.run_id = "r1";
  r.request_hash = "h";
  r.state = RunState::kRunning;  // what a broker killed mid-run leaves
  ASSERT_TRUE(store_->PutRun(r).ok());
  auto got = Do("r1");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(got.status().message().find("effects are unknown"), std::string::npos);
  EXPECT_EQ(ran_, 0);
  ledger_.reset();  // and stays ABORTED across another restart
  EXPECT_EQ(Do("r1").status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(ran_, 0);
}

TEST_F(RunLedgerTest, ResultsExpireAfterTheTtl) {
  options_.ttl = absl::Seconds(600);
  ASSERT_TRUE(Do("r1").ok());
  clock_.Advance(absl::Seconds(599));
  ASSERT_TRUE(Do("r1").ok());
  EXPECT_EQ(ran_, 1);
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(Do("r1").ok());
  EXPECT_EQ(ran_, 2);
}

TEST_F(RunLedgerTest, CountPerSessionIsBoundedOldestFirst) {
  options_.max_per_session = 3;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(Do(absl::StrCat("r", i)).ok());
    clock_.Advance(absl::Seconds(1));
  }
  EXPECT_EQ(Ledger().CountForTest("t", "s"), 3);
  EXPECT_EQ(store_->LoadRuns()->size(), 3u);
  ASSERT_TRUE(Do("r4").ok());  // newest kept
  EXPECT_EQ(ran_, 5);
  ASSERT_TRUE(Do("r0").ok());  // oldest evicted: runs again
  EXPECT_EQ(ran_, 6);
}

TEST_F(RunLedgerTest, ErrorsFromBeforeTheRunAreNotRemembered) {
  EXPECT_EQ(Do("r1", "h", absl::InvalidArgumentError("bad")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*Do("r1"), "out");
  EXPECT_EQ(ran_, 2);
  // A provider failure mid-run is remembered: effects unknown, not re-run.
  EXPECT_EQ(Do("r2", "h", absl::UnavailableError("down")).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(Do("r2").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ran_, 3);
}

// A result is bound to the sandbox it ran in: once the session goes on in
// a new one, a retry runs there (the old result's effects are gone).
TEST_F(RunLedgerTest, ANewGenerationDropsResultsOfEarlierOnes) {
  EXPECT_EQ(*Do("r1"), "out");
  Ledger().NewGeneration("t", "s", 1);  // the same sandbox: kept
  EXPECT_EQ(*Do("r1"), "out");
  EXPECT_EQ(ran_, 1);
  // A failure that never held a sandbox (generation unknown) goes too.
  generation_ = 0;
  EXPECT_EQ(Do("r0", "h", absl::UnavailableError("no sandbox")).status().code(),
            absl::StatusCode::kUnavailable);
  generation_ = 2;
  Ledger().NewGeneration("t", "s", 2);
  EXPECT_EQ(Ledger().CountForTest("t", "s"), 0);
  EXPECT_TRUE(store_->LoadRuns()->empty());  // the store's rows too
  EXPECT_EQ(*Do("r1", "h", std::string("again")), "again");
  EXPECT_EQ(*Do("r0"), "out");
  EXPECT_EQ(ran_, 4);
  // Generation 2's results are kept by generation 2, over a restart.
  ledger_.reset();
  EXPECT_EQ(*Do("r1"), "again");
  EXPECT_EQ(ran_, 4);
  // A record loaded from the store does not know its generation: a new
  // sandbox after the restart drops it.
  Ledger().NewGeneration("t", "s", 3);
  EXPECT_EQ(*Do("r1", "h", std::string("third")), "third");
  EXPECT_EQ(ran_, 5);
}

// A run that holds the old sandbox when the new one comes: its answer goes
// to its own caller and any retry already waiting, but is not kept (and not
// written back to the store) for later retries.
TEST_F(RunLedgerTest, ARunInFlightAcrossANewGenerationIsNotKept) {
  absl::Notification started, release;
  std::thread first([&] {
    auto r = Ledger().Do("t", "s", "r1", "h",
                         [&](const RunLedger::Started& s) -> absl::StatusOr<std::string> {
                           s(1);
                           started.Notify();
                           release.WaitForNotification();
                           return absl::UnavailableError("the sandbox vanished");
                         });
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  });
  started.WaitForNotification();
  Ledger().NewGeneration("t", "s", 2);
  release.Notify();
  first.join();
  EXPECT_TRUE(store_->LoadRuns()->empty());
  generation_ = 2;
  EXPECT_EQ(*Do("r1"), "out");
  EXPECT_EQ(ran_, 1);
}

// A run still going when its session closes answers its caller, but its
// record is not written back: a later session under the same id must not
// find it.
TEST_F(RunLedgerTest, ARunInFlightWhenItsSessionClosesLeavesNothing) {
  absl::Notification started, release;
  std::thread first([&] {
    auto r = Ledger().Do("t", "s", "r1", "h",
                         [&](const RunLedger::Started& s) -> absl::StatusOr<std::string> {
                           s(1);
                           started.Notify();
                           release.WaitForNotification();
                           return std::string("late");
                         });
    EXPECT_EQ(*r, "late");
  });
  started.WaitForNotification();
  Ledger().ForgetSession("t", "s");
  ASSERT_TRUE(store_->DeleteRun("t", "s", "r1").ok());  // as the session row's removal does
  release.Notify();
  first.join();
  EXPECT_EQ(Ledger().CountForTest("t", "s"), 0);
  EXPECT_TRUE(store_->LoadRuns()->empty());
}

TEST(RunIdValidationTest, IdsAndHashes) {
  EXPECT_TRUE(ValidateRunId("call_abc-1.2:3", "run_id").ok());
  EXPECT_FALSE(ValidateRunId("", "run_id").ok());
  EXPECT_FALSE(ValidateRunId(std::string(129, 'a'), "run_id").ok());
  EXPECT_FALSE(ValidateRunId("a b", "run_id").ok());
  EXPECT_EQ(StableHash("abc"), StableHash("abc"));
  EXPECT_NE(StableHash("abc"), StableHash("abd"));
}

}  // namespace
}  // namespace sandbox
