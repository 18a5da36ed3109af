#include "server/sessions/session_manager.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "common/refusal.h"
#include "tests/testing/fake_provider.h"

namespace sandbox {
namespace {

class SessionManagerTest : public ::testing::Test {
 protected:
  SessionManagerTest() {
    auto p = std::make_unique<FakeProvider>();
    fake_ = p.get();
    registry_.Add(std::move(p));
    registry_.AddUnavailable("e2b", "e2b: missing API key");
    limits_.idle_timeout = absl::Seconds(2);
    limits_.max_sessions_per_tenant = 3;
    limits_.close_wait = absl::Seconds(5);
  }
  SessionManager& manager() {
    if (!manager_) {
      manager_ = std::make_unique<SessionManager>(&registry_, &clock_, limits_, "fake", "test");
    }
    return *manager_;
  }
  int creates() { return fake_->counters()->creates; }
  int destroys() { return fake_->counters()->destroys; }
  int live() { return fake_->counters()->live; }

  FakeClock clock_;
  ProviderRegistry registry_;
  FakeProvider* fake_;
  SessionLimits limits_;
  CreateOptions create_;
  std::unique_ptr<SessionManager> manager_;
};

TEST_F(SessionManagerTest, FirstCallCreatesLaterCallsReuse) {
  auto a = manager().Acquire("t", "s", &create_);
  ASSERT_TRUE(a.ok()) << a.status();
  std::string id = a->sandbox()->id();
  a->Release();
  auto b = manager().Acquire("t", "s", &create_);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->sandbox()->id(), id);
  EXPECT_EQ(creates(), 1);
}

// Reading a sandbox's usage is I/O (cgroup files, statvfs for a local
// sandbox): listing sessions reads it with the table's lock released, so
// another caller of the table is never held up behind it.
TEST_F(SessionManagerTest, UsageIsReadWithTheTableUnlocked) {
  SessionManager& m = manager();
  std::vector<std::thread> probes;
  bool armed = false;  // set and read on this thread only
  int asked = 0, unlocked = 0;
  fake_->set_usage_hook([&] {
    if (!armed) return;
    ++asked;
    auto done = std::make_shared<absl::Notification>();
    probes.emplace_back([&m, done] {
      (void)m.size();  // takes the table's lock
      done->Notify();
    });
    if (done->WaitForNotificationWithTimeout(absl::Seconds(10))) ++unlocked;
  });
  for (const char* id : {"a", "b", "c"}) {
    auto l = m.Acquire("t", id, &create_);
    ASSERT_TRUE(l.ok()) << l.status();
    l->Release();
  }
  armed = true;
  bool more = false;
  std::vector<SessionView> all = m.ListAll(SessionFilter{}, {"", ""}, 100, &more);
  auto one = m.Get("t", "b");
  armed = false;
  for (auto& t : probes) t.join();
  ASSERT_EQ(all.size(), 3u);
  EXPECT_TRUE(all[0].usage.has_value());
  ASSERT_TRUE(one.ok());
  EXPECT_TRUE(one->usage.has_value());
  EXPECT_EQ(asked, 4);
  EXPECT_EQ(unlocked, 4);
  manager_.reset();  // its closes read usage too: while the hook's captures live
}

TEST_F(SessionManagerTest, WithoutCreateAMissingSessionIsNotFound) {
  EXPECT_EQ(manager().Acquire("t", "s", nullptr).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager().Get("t", "s").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager().KeepAlive("t", "s").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(creates(), 0);
}

TEST_F(SessionManagerTest, ConcurrentFirstCallsCreateExactlyOneSandbox) {
  absl::Notification gate;
  fake_->set_create_gate(&gate);
  SessionManager& m = manager();  // built before the threads share it
  std::vector<std::thread> threads;
  std::vector<std::string> ids(16);
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      auto l = m.Acquire("t", "s", &create_);
      ids[i] = l.ok() ? l->sandbox()->id() : "error";
    });
  }
  // Let every thread reach the table before the one creation completes.
  while (!m.Get("t", "s").ok()) std::this_thread::yield();
  gate.Notify();
  for (auto& t : threads) t.join();
  EXPECT_EQ(creates(), 1);
  for (const auto& id : ids) EXPECT_EQ(id, ids[0]);
  EXPECT_NE(ids[0], "error");
}

TEST_F(SessionManagerTest, FailedCreateIsNotCachedAndLeavesNothing) {
  fake_->FailNextCreates(1);
  auto a = manager().Acquire("t", "s", &create_);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(manager().size(), 0);
  EXPECT_EQ(manager().Get("t", "s").status().code(), absl::StatusCode::kNotFound);
  auto b = manager().Acquire("t", "s", &create_);
  EXPECT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(creates(), 2);
}

TEST_F(SessionManagerTest, SeedFilesAreWrittenBeforeTheFirstCall) {
  create_.files = {{"ok.txt", "1"}};
  auto a = manager().Acquire("t", "s", &create_);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(**a->sandbox()->ReadFile("ok.txt"), "1");
}

TEST_F(SessionManagerTest, TenantsAreSeparateEvenWithTheSameSessionId) {
  auto a = manager().Acquire("alpha", "same", &create_);
  auto b = manager().Acquire("beta", "same", &create_);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->sandbox()->id(), b->sandbox()->id());
  ASSERT_TRUE(a->sandbox()->WriteFile("f", "alpha's").ok());
  EXPECT_FALSE(b->sandbox()->ReadFile("f")->has_value());
  a->Release();
  b->Release();
  EXPECT_TRUE(*manager().Close("beta", "same"));
  EXPECT_TRUE(manager().Get("alpha", "same").ok());
  bool more;
  EXPECT_EQ(manager().List("beta", "", 10, &more).size(), 0u);
  EXPECT_EQ(manager().List("alpha", "", 10, &more).size(), 1u);
}

TEST_F(SessionManagerTest, IdleSessionsAreReapedByTheClock) {
  { auto a = manager().Acquire("t", "s", &create_); }
  clock_.Advance(absl::Milliseconds(1999));
  EXPECT_EQ(manager().RunOnce(), 0);
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_EQ(manager().RunOnce(), 1);
  EXPECT_EQ(destroys(), 1);
  EXPECT_EQ(manager().Get("t", "s").status().code(), absl::StatusCode::kNotFound);
  // The next call starts a fresh sandbox.
  auto b = manager().Acquire("t", "s", &create_);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(creates(), 2);
}

TEST_F(SessionManagerTest, IdleTimeCountsFromTheEndOfTheLastCall) {
  auto a = manager().Acquire("t", "s", &create_);
  clock_.Advance(absl::Minutes(10));  // a long call
  EXPECT_EQ(manager().RunOnce(), 0);  // never reaped mid-call
  EXPECT_FALSE(manager().Get("t", "s")->idle_expires_at.has_value());
  a->Release();
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(manager().RunOnce(), 0);
  auto v = manager().Get("t", "s");
  ASSERT_TRUE(v->idle_expires_at.has_value());
  EXPECT_EQ(*v->idle_expires_at, clock_.Now() + absl::Seconds(1));
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(manager().RunOnce(), 1);
}

TEST_F(SessionManagerTest, KeepAliveHoldsOffTheReaper) {
  { auto a = manager().Acquire("t", "s", &create_); }
  clock_.Advance(absl::Milliseconds(1500));
  auto deadline = manager().KeepAlive("t", "s");
  ASSERT_TRUE(deadline.ok());
  EXPECT_EQ(*deadline, clock_.Now() + absl::Seconds(2));
  clock_.Advance(absl::Milliseconds(1500));
  EXPECT_EQ(manager().RunOnce(), 0);
  clock_.Advance(absl::Milliseconds(500));
  EXPECT_EQ(manager().RunOnce(), 1);
}

// A tenant's max_sessions refusal names its rule in a typed payload; the
// broker-wide max_sessions_per_tenant is not a tenant policy refusal.
TEST_F(SessionManagerTest, MaxSessionsRefusalsCarryTheirRule) {
  CreateOptions capped = create_;
  capped.max_sessions = 1;
  ASSERT_TRUE(manager().Acquire("t", "a", &capped).ok());
  auto policy = manager().Acquire("t", "b", &capped);
  EXPECT_EQ(policy.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(RefusingRule(policy.status()), "max_sessions");
  for (const char* id : {"c", "d"}) ASSERT_TRUE(manager().Acquire("t", id, &create_).ok());
  auto broker = manager().Acquire("t", "e", &create_);  // limits_.max_sessions_per_tenant: 3
  EXPECT_EQ(broker.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(RefusingRule(broker.status()), std::nullopt);
}

TEST_F(SessionManagerTest, ReaperWorkIsProportionalToWhatExpires) {
  limits_.max_sessions_per_tenant = 100000;
  for (int i = 0; i < 1000; ++i) {
    if (i == 10) clock_.Advance(absl::Seconds(1));  // 10 older sessions
    auto a = manager().Acquire("t", "s" + std::to_string(i), &create_);
  }
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(manager().RunOnce(), 10);
  EXPECT_EQ(manager().size(), 990);
}

TEST_F(SessionManagerTest, MaxLifetimeClosesEvenActiveSessions) {
  limits_.max_lifetime = absl::Seconds(60);
  limits_.close_wait = absl::ZeroDuration();
  { auto a = manager().Acquire("t", "s", &create_); }
  for (int i = 0; i < 59; ++i) {
    clock_.Advance(absl::Seconds(1));
    ASSERT_TRUE(manager().KeepAlive("t", "s").ok());
    ASSERT_EQ(manager().RunOnce(), 0);
  }
  EXPECT_EQ(*manager().Get("t", "s")->expires_at, clock_.Now() + absl::Seconds(1));
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(manager().RunOnce(), 1);
  EXPECT_EQ(destroys(), 1);
}

TEST_F(SessionManagerTest, QuotaIsPerTenantAndNamesTheLimit) {
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(manager().Acquire("t", std::to_string(i), &create_).ok());
  auto over = manager().Acquire("t", "3", &create_);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("max_sessions_per_tenant (3)"), absl::string_view::npos);
  EXPECT_TRUE(manager().Acquire("other", "3", &create_).ok());
  EXPECT_TRUE(manager().Acquire("t", "0", &create_).ok());  // existing ones still work
  ASSERT_TRUE(*manager().Close("t", "0"));
  EXPECT_TRUE(manager().Acquire("t", "3", &create_).ok());
}

TEST_F(SessionManagerTest, CloseIsIdempotentAndDestroysOnce) {
  { auto a = manager().Acquire("t", "s", &create_); }
  EXPECT_TRUE(*manager().Close("t", "s"));
  EXPECT_FALSE(*manager().Close("t", "s"));
  EXPECT_EQ(destroys(), 1);
  EXPECT_EQ(live(), 0);
}

TEST_F(SessionManagerTest, CloseWaitsForInFlightCalls) {
  auto gate = std::make_shared<absl::Notification>();
  fake_->set_exec_gate(gate);
  auto lease = manager().Acquire("t", "s", &create_);  // builds the manager first
  ASSERT_TRUE(lease.ok());
  Sandbox* sb = lease->sandbox();
  std::atomic<bool> call_done{false};
  std::thread call([&] {
    ExecRequest r;
    r.code = "x";
    (void)sb->Exec(r);
    call_done = true;
    lease->Release();
  });
  std::atomic<bool> closed{false};
  std::thread closer([&] {
    EXPECT_TRUE(*manager().Close("t", "s"));
    closed = true;
  });
  // Close cannot finish while the call holds its lease.
  while (manager().Get("t", "s").ok() &&
         manager().Get("t", "s")->state != SessionStateKind::kClosing) {
    std::this_thread::yield();
  }
  EXPECT_FALSE(closed);
  EXPECT_EQ(destroys(), 0);
  gate->Notify();
  call.join();
  closer.join();
  EXPECT_TRUE(call_done);
  EXPECT_EQ(destroys(), 1);
}

TEST_F(SessionManagerTest, CloseReaperAndLateCallsRaceSafely) {
  limits_.max_sessions_per_tenant = 1000;
  for (int round = 0; round < 50; ++round) {
    { auto a = manager().Acquire("t", "s", &create_); }
    clock_.Advance(absl::Seconds(3));  // idle: the reaper wants it too
    std::thread t1([&] { (void)manager().Close("t", "s"); });
    std::thread t2([&] { manager().RunOnce(); });
    std::thread t3([&] { (void)manager().Close("t", "s"); });
    std::thread t4([&] { auto l = manager().Acquire("t", "s", &create_); });
    t1.join();
    t2.join();
    t3.join();
    t4.join();
    (void)manager().Close("t", "s");
  }
  EXPECT_EQ(live(), 0);
  EXPECT_EQ(creates(), destroys());
}

TEST_F(SessionManagerTest, SpecConflictsAreFailedPrecondition) {
  ASSERT_TRUE(manager().Acquire("t", "s", &create_).ok());
  CreateOptions other;
  other.provider = "e2b";
  auto r = manager().Acquire("t", "s", &other);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("runs on provider \"fake\""), absl::string_view::npos);
  CreateOptions same;
  same.provider = "fake";
  EXPECT_TRUE(manager().Acquire("t", "s", &same).ok());
}

TEST_F(SessionManagerTest, UnknownOrUnavailableProvidersAreFailedPrecondition) {
  CreateOptions o;
  o.provider = "e2b";
  auto r = manager().Acquire("t", "s", &o);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(), "e2b: missing API key");
  o.provider = "nope";
  EXPECT_EQ(manager().Acquire("t", "s", &o).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager().size(), 0);
}

TEST_F(SessionManagerTest, ListPagesInIdOrder) {
  limits_.max_sessions_per_tenant = 10;
  for (const char* id : {"c", "a", "e", "b", "d"})
    ASSERT_TRUE(manager().Acquire("t", id, &create_).ok());
  bool more = false;
  auto p1 = manager().List("t", "", 2, &more);
  ASSERT_EQ(p1.size(), 2u);
  EXPECT_EQ(p1[0].session_id, "a");
  EXPECT_EQ(p1[1].session_id, "b");
  EXPECT_TRUE(more);
  auto p3 = manager().List("t", "d", 2, &more);
  ASSERT_EQ(p3.size(), 1u);
  EXPECT_EQ(p3[0].session_id, "e");
  EXPECT_FALSE(more);
}

TEST_F(SessionManagerTest, SpecReachesTheProvider) {
  create_.template_name = "tmpl";
  create_.env = {{"A", "1"}};
  create_.labels = {{"team", "x"}};
  ASSERT_TRUE(manager().Acquire("acme", "s", &create_).ok());
  SandboxSpec spec = fake_->last_spec();
  EXPECT_EQ(spec.tenant, "acme");
  EXPECT_EQ(spec.session_id, "s");
  EXPECT_EQ(spec.broker_instance_id, "test");
  EXPECT_EQ(spec.template_name, "tmpl");
  EXPECT_EQ(spec.env.at("A"), "1");
  EXPECT_EQ(manager().Get("acme", "s")->labels.at("team"), "x");
}

}  // namespace
}  // namespace sandbox
