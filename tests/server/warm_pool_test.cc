// Warm pools (server/sessions/warm_pool.h) against the fake E2B and Daytona servers:
// filling, claiming, misses, max age, bounded refill, the orphan sweep and
// shutdown. The pool is driven by hand (Refill) with a fake clock, except
// in the broker test, which runs its background thread.

#include "server/sessions/warm_pool.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "adapters/daytona/daytona_provider.h"
#include "adapters/e2b/e2b_provider.h"
#include "adapters/http/http_client.h"
#include "server/app/provider_setup.h"
#include "server/sessions/session_manager.h"
#include "server/store/session_store.h"
#include "tests/fakes/fake_daytona.h"
#include "tests/fakes/fake_e2b.h"
#include "tests/testing/broker_fixture.h"

namespace sandbox {
namespace {

using json = nlohmann::json;

std::set<std::string> Ids(const absl::StatusOr<std::vector<OwnedSandbox>>& owned) {
  std::set<std::string> ids;
  if (owned.ok()) {
    for (const auto& o : *owned) ids.insert(o.sandbox_id);
  }
  return ids;
}

// A counter or gauge summed over the series whose labels include `labels`.
double MetricValue(Metrics& m, const std::string& name,
                   const std::map<std::string, std::string>& labels = {}) {
  double v = 0;
  for (const auto& fam : m.registry()->Collect()) {
    if (fam.name != name) continue;
    for (const auto& metric : fam.metric) {
      bool match = true;
      for (const auto& [k, want] : labels) {
        bool found = false;
        for (const auto& l : metric.label) found = found || (l.name == k && l.value == want);
        match = match && found;
      }
      if (!match) continue;
      v += fam.type == prometheus::MetricType::Counter ? metric.counter.value : metric.gauge.value;
    }
  }
  return v;
}

json FakeControl(const std::string& url, const std::string& method, const std::string& path,
                 const std::string& body = "") {
  // Its own client: a kept-alive connection would hold the fake's shutdown.
  HttpClient http("warm-pool-test");
  HttpRequest req;
  req.method = method;
  req.url = url + path;
  req.body = body;
  req.headers = {{"Content-Type", "application/json"}};
  req.timeout = absl::Seconds(30);
  auto resp = http.Send(req);
  if (!resp.ok()) return json();
  return json::parse(resp->body, nullptr, false);
}

class WarmPoolE2BTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FakeE2B::Options o;
    o.clock = &fake_clock_;
    o.ttl_thread = false;
    auto fake = FakeE2B::Start(o);
    ASSERT_TRUE(fake.ok()) << fake.status();
    fake_ = std::move(*fake);
    store_ = NewMemoryStore("dep-pool");
  }

  std::unique_ptr<Provider> NewE2B() {
    json cfg = {{"api_key", "e2b_test_key"},
                {"api_url", fake_->url()},
                {"sandbox_url", fake_->url()},
                {"sandbox_timeout_seconds", 120}};
    auto c = ParseE2BConfig(cfg, 60);
    EXPECT_TRUE(c.ok()) << c.status();
    auto p = E2BProvider::Create(*c);
    EXPECT_TRUE(p.ok()) << p.status();
    return std::move(*p);
  }

  // The pool, registered as provider "e2b" and started (no thread).
  WarmPool* AddPool(int64_t size, absl::Duration max_age = absl::Hours(1), int max_concurrent = 4) {
    WarmPool::Options o;
    o.size = size;
    o.max_age = max_age;
    o.max_concurrent_creates = max_concurrent;
    o.clock = &clock_;
    auto pool = std::make_unique<WarmPool>(NewE2B(), o);
    WarmPool* raw = pool.get();
    registry_.Add(std::move(pool));
    raw->Start(store_->deployment_id(), "broker-test", &metrics_, false);
    return raw;
  }

  SessionManager& Manager() {
    if (!manager_) {
      limits_.idle_timeout = absl::Seconds(60);
      manager_ = std::make_unique<SessionManager>(&registry_, &clock_, limits_, "e2b",
                                                  "broker-test", &metrics_, store_.get());
    }
    return *manager_;
  }

  json Stats() { return FakeControl(fake_->url(), "GET", "/_fake/stats"); }
  int64_t Creates() { return Stats().value("creates", int64_t{-1}); }
  int64_t Live() { return Stats().value("live", int64_t{-1}); }

  FakeClock fake_clock_;  // the fake's TTLs
  FakeClock clock_;       // the pool's and the session manager's
  std::unique_ptr<FakeE2B> fake_;
  std::unique_ptr<SessionStore> store_;
  Metrics metrics_;
  ProviderRegistry registry_;
  SessionLimits limits_;
  CreateOptions create_;
  std::unique_ptr<SessionManager> manager_;  // first to go
};

TEST_F(WarmPoolE2BTest, FillsToSizeWithTaggedMembers) {
  WarmPool* pool = AddPool(3);
  EXPECT_EQ(Creates(), 0);
  EXPECT_TRUE(pool->Refill());
  EXPECT_EQ(pool->ready(), 3);
  EXPECT_EQ(Creates(), 3);
  EXPECT_EQ(Live(), 3);
  EXPECT_EQ(MetricValue(metrics_, "sandbox_broker_pool_size", {{"provider", "e2b"}}), 3);
  // Full: another pass creates nothing.
  EXPECT_TRUE(pool->Refill());
  EXPECT_EQ(Creates(), 3);
  // Members carry the deployment and pool tags, and no session's.
  auto owned = pool->inner()->ListOwned("dep-pool");
  ASSERT_TRUE(owned.ok()) << owned.status();
  ASSERT_EQ(owned->size(), 3u);
  for (const OwnedSandbox& o : *owned) {
    auto md = fake_->metadata(o.sandbox_id);
    EXPECT_EQ(md[kPoolTag], "broker-test");
    EXPECT_EQ(md[kDeploymentTag], "dep-pool");
    EXPECT_EQ(md[kAttemptTag].substr(0, 5), "pool-");
    EXPECT_EQ(md.count("sandbox-broker.session-id"), 0u);
    // Kept alive unused past max_age (1 h), not the session timeout.
    EXPECT_GE(fake_->ttl_left_seconds(o.sandbox_id), 3600);
  }
}

TEST_F(WarmPoolE2BTest, AMatchingSessionTakesAMemberWithoutACreate) {
  WarmPool* pool = AddPool(2);
  ASSERT_TRUE(pool->Refill());
  const std::set<std::string> members = Ids(pool->inner()->ListOwned("dep-pool"));
  create_.env["FROM_SPEC"] = "s";
  auto lease = Manager().Acquire("alpha", "s1", &create_);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_TRUE(members.count(lease->sandbox()->id()));
  // Its timeout is now the session's (120 s), not the pool's.
  EXPECT_EQ(fake_->ttl_left_seconds(lease->sandbox()->id()), 120);
  // The session's first call runs there, with the session's env.
  ExecRequest r;
  r.language = Language::kShell;
  r.code = "echo $FROM_SPEC";
  auto out = lease->sandbox()->Exec(r);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->output, "s\n");
  EXPECT_EQ(Creates(), 2);
  EXPECT_EQ(pool->ready(), 1);
  EXPECT_EQ(MetricValue(metrics_, "sandbox_broker_pool_hits_total"), 1);
  EXPECT_EQ(MetricValue(metrics_, "sandbox_broker_pool_misses_total"), 0);
  EXPECT_EQ(MetricValue(metrics_, "sandbox_broker_pool_size"), 1);
  // The store knows the session's sandbox by id (E2B metadata cannot
  // change; the claimed member keeps its pool tags).
  auto rows = store_->LoadSessions();
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0].sandbox_id, lease->sandbox()->id());
  EXPECT_EQ((*rows)[0].state, StoredState::kReady);
  // The pool refills the one taken.
  ASSERT_TRUE(pool->Refill());
  EXPECT_EQ(pool->ready(), 2);
  EXPECT_EQ(Creates(), 3);
}

TEST_F(WarmPoolE2BTest, ASpecThatDoesNotMatchMissesAndCreates) {
  WarmPool* pool = AddPool(1);
  ASSERT_TRUE(pool->Refill());
  CreateOptions other = create_;
  other.template_name = "other-template";
  ASSERT_TRUE(Manager().Acquire("alpha", "other", &other).ok());
  EXPECT_EQ(Creates(), 2);
  EXPECT_EQ(pool->ready(), 1);
  EXPECT_EQ(MetricValue(metrics_, "sandbox_broker_pool_misses_total", {{"reason", "mismatch"}}), 1);
  // An empty pool misses too.
  ASSERT_TRUE(Manager().Acquire("alpha", "a", &create_).ok());
  EXPECT_EQ(Creates(), 2);  // a hit
  ASSERT_TRUE(Manager().Acquire("alpha", "b", &create_).ok());
  EXPECT_EQ(Creates(), 3);
  EXPECT_EQ(MetricValue(metrics_, "sandbox_broker_pool_misses_total", {{"reason", "empty"}}), 1);
  EXPECT_EQ(MetricValue(metrics_, "sandbox_broker_pool_hits_total"), 1);
}

TEST_F(WarmPoolE2BTest, AMemberIsNeverGivenTwiceNorReused) {
  WarmPool* pool = AddPool(2);
  ASSERT_TRUE(pool->Refill());
  std::vector<std::string> ids(6);
  std::vector<std::thread> threads;
  SessionManager& manager = Manager();  // made once, before the threads share it
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([&, i] {
      auto lease = manager.Acquire("alpha", absl::StrCat("c", i), &create_);
      if (lease.ok()) ids[i] = lease->sandbox()->id();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), 6u);
  EXPECT_EQ(MetricValue(metrics_, "sandbox_broker_pool_hits_total"), 2);
  EXPECT_EQ(MetricValue(metrics_, "sandbox_broker_pool_misses_total"), 4);
  EXPECT_EQ(Creates(), 2 + 4);
  // Closing a session destroys its sandbox: it never goes back to the pool.
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(*Manager().Close("alpha", absl::StrCat("c", i)));
  EXPECT_EQ(Live(), 0);
  EXPECT_EQ(pool->ready(), 0);
}

TEST_F(WarmPoolE2BTest, MembersPastMaxAgeAreReplaced) {
  WarmPool* pool = AddPool(2, absl::Seconds(60));
  ASSERT_TRUE(pool->Refill());
  const std::set<std::string> first = Ids(pool->inner()->ListOwned("dep-pool"));
  clock_.Advance(absl::Seconds(30));
  ASSERT_TRUE(pool->Refill());
  EXPECT_EQ(Creates(), 2);  // not yet
  clock_.Advance(absl::Seconds(31));
  ASSERT_TRUE(pool->Refill());
  EXPECT_EQ(Creates(), 4);
  EXPECT_EQ(Stats().value("deletes", 0), 2);
  EXPECT_EQ(Live(), 2);
  EXPECT_EQ(pool->ready(), 2);
  const std::set<std::string> now = Ids(pool->inner()->ListOwned("dep-pool"));
  EXPECT_EQ(now.size(), 2u);
  for (const auto& id : now) EXPECT_FALSE(first.count(id)) << id;
  // A session never gets a member past max_age, even before a Refill.
  clock_.Advance(absl::Seconds(61));
  ASSERT_TRUE(Manager().Acquire("alpha", "late", &create_).ok());
  EXPECT_EQ(Creates(), 5);
  EXPECT_EQ(pool->ready(), 0);
  EXPECT_EQ(Live(), 1);  // the session's; the old members were destroyed
}

TEST_F(WarmPoolE2BTest, RefillKeepsAtMostMaxConcurrentCreatesInFlight) {
  WarmPool* pool = AddPool(6, absl::Hours(1), /*max_concurrent=*/2);
  FakeControl(fake_->url(), "POST", "/_fake/faults", R"({"create_latency_ms": 300})");
  Clock* real = Clock::Real();
  const absl::Time start = real->Monotonic();
  ASSERT_TRUE(pool->Refill());
  const absl::Duration took = real->Monotonic() - start;
  json stats = Stats();
  EXPECT_EQ(stats.value("creates", 0), 6);
  EXPECT_EQ(stats.value("max_creates_in_flight", 0), 2) << stats.dump();
  // Three rounds of two, 300 ms each.
  EXPECT_GE(took, absl::Milliseconds(900));
  EXPECT_EQ(pool->ready(), 6);
}

TEST_F(WarmPoolE2BTest, SweepSparesUnclaimedMembersButDestroysADeadPoolsLeftovers) {
  WarmPool* pool = AddPool(2);
  ASSERT_TRUE(pool->Refill());
  // A crashed broker's pool: members tagged with this deployment and its
  // own pool instance, never destroyed.
  std::vector<std::string> leftovers;
  for (int i = 0; i < 2; ++i) {
    SandboxSpec dead;
    dead.deployment_id = "dep-pool";
    dead.attempt_id = absl::StrCat("pool-dead", i);
    dead.pool = "broker-dead";
    dead.broker_instance_id = "broker-dead";
    auto sb = pool->inner()->Create(dead);
    ASSERT_TRUE(sb.ok()) << sb.status();
    leftovers.push_back((*sb)->id());
    (*sb)->Detach();
  }
  auto lease = Manager().Acquire("alpha", "claimed", &create_);
  ASSERT_TRUE(lease.ok()) << lease.status();
  const std::string session_sandbox = lease->sandbox()->id();
  lease->Release();
  // The claimed member is listed as its session's.
  auto listed = pool->ListOwned("dep-pool");
  ASSERT_TRUE(listed.ok());
  bool seen = false;
  for (const auto& o : *listed) {
    if (o.sandbox_id != session_sandbox) continue;
    seen = true;
    EXPECT_EQ(o.session_id, "claimed");
    EXPECT_EQ(o.tenant, "alpha");
  }
  EXPECT_TRUE(seen);
  EXPECT_EQ(Live(), 2 + 2);  // one member left, one claimed, two leftovers
  EXPECT_EQ(Manager().SweepOrphans(absl::ZeroDuration()), 2);
  EXPECT_EQ(Live(), 2);
  EXPECT_EQ(pool->ready(), 1);
  for (const auto& id : leftovers) EXPECT_TRUE(fake_->metadata(id).empty()) << id;
  ExecRequest r;
  r.language = Language::kShell;
  r.code = "echo alive";
  auto again = Manager().Acquire("alpha", "claimed", nullptr);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->sandbox()->Exec(r).ok());
  // Nothing else goes on the next sweep.
  EXPECT_EQ(Manager().SweepOrphans(absl::ZeroDuration()), 0);
}

TEST_F(WarmPoolE2BTest, StopDestroysTheUnclaimedMembers) {
  WarmPool* pool = AddPool(3);
  ASSERT_TRUE(pool->Refill());
  ASSERT_TRUE(Manager().Acquire("alpha", "kept", &create_).ok());
  EXPECT_EQ(Live(), 3);
  pool->Stop();
  EXPECT_EQ(Live(), 1);  // the session's stays its session's
  EXPECT_EQ(pool->ready(), 0);
  EXPECT_EQ(MetricValue(metrics_, "sandbox_broker_pool_size"), 0);
  // Stopped: sessions create as without a pool, and Refill does nothing.
  EXPECT_TRUE(pool->Refill());
  ASSERT_TRUE(Manager().Acquire("alpha", "after", &create_).ok());
  EXPECT_EQ(Creates(), 4);
  manager_.reset();
  EXPECT_EQ(Live(), 0);
}

// ---- Daytona ---------------------------------------------------------------

TEST(WarmPoolDaytonaTest, AClaimReplacesTheLabelsAndTheAutoStop) {
  FakeDaytona::Options fo;
  fo.timer_thread = false;
  auto fake = FakeDaytona::Start(fo);
  ASSERT_TRUE(fake.ok()) << fake.status();
  json cfg = {
      {"api_key", "dtn_test_key"}, {"api_url", (*fake)->api_url()}, {"auto_stop_minutes", 5}};
  auto c = ParseDaytonaConfig(cfg, 60);
  ASSERT_TRUE(c.ok()) << c.status();
  auto provider = DaytonaProvider::Create(*c);
  ASSERT_TRUE(provider.ok());
  Metrics metrics;
  FakeClock clock;
  WarmPool::Options o;
  o.size = 1;
  o.max_age = absl::Hours(2);
  o.clock = &clock;
  WarmPool pool(std::move(*provider), o);
  pool.Start("dep-d", "broker-d", &metrics, false);
  ASSERT_TRUE(pool.Refill());
  auto owned = pool.inner()->ListOwned("dep-d");
  ASSERT_TRUE(owned.ok());
  ASSERT_EQ(owned->size(), 1u);
  const std::string id = (*owned)[0].sandbox_id;
  EXPECT_EQ((*fake)->labels(id)[kPoolTag], "broker-d");
  EXPECT_GE((*fake)->auto_stop_minutes(id), 120);  // alive unused past max_age
  // A node session cannot use a python member (the language is fixed).
  SandboxSpec node;
  node.language = Language::kNode;
  node.deployment_id = "dep-d";
  node.attempt_id = "att-node";
  EXPECT_FALSE(pool.CanClaim(SandboxSpec{}, node));
  SandboxSpec spec;
  spec.tenant = "alpha";
  spec.session_id = "d1";
  spec.deployment_id = "dep-d";
  spec.attempt_id = "att-1";
  spec.labels = {{"team", "x"}};
  spec.env = {{"FROM_SPEC", "d"}};
  auto sb = pool.Create(spec);
  ASSERT_TRUE(sb.ok()) << sb.status();
  EXPECT_EQ((*sb)->id(), id);
  auto labels = (*fake)->labels(id);
  EXPECT_EQ(labels.count(kPoolTag), 0u);
  EXPECT_EQ(labels[kAttemptTag], "att-1");
  EXPECT_EQ(labels["sandbox-broker.session-id"], "d1");
  EXPECT_EQ(labels["team"], "x");
  EXPECT_EQ((*fake)->auto_stop_minutes(id), 5);
  ExecRequest r;
  r.language = Language::kShell;
  r.code = "echo $FROM_SPEC";
  auto out = (*sb)->Exec(r);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->output, "d\n");
  // Listed as the session's by its own tags now.
  auto after = pool.ListOwned("dep-d");
  ASSERT_TRUE(after.ok());
  ASSERT_EQ(after->size(), 1u);
  EXPECT_EQ((*after)[0].attempt_id, "att-1");
  EXPECT_EQ(MetricValue(metrics, "sandbox_broker_pool_hits_total"), 1);
  (void)(*sb)->Destroy();
  pool.Stop();
  EXPECT_EQ((*fake)->live_sandboxes(), 0);
}

// ---- config and the assembled broker ----------------------------------------

TEST(WarmPoolConfigTest, PoolKeysAreParsedStrictly) {
  json cfg = {{"api_key", "k"},
              {"pool", {{"size", 3}, {"template", "py"}, {"max_age_seconds", 600}}}};
  auto c = ParseE2BConfig(cfg, 60);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->pool.size, 3);
  EXPECT_EQ(c->pool.template_name, "py");
  EXPECT_EQ(c->pool.max_age_seconds, 600);
  EXPECT_EQ(c->pool.max_concurrent_creates, 4);
  // max_concurrent_creates is the broker's key, read in one place
  // (ParseConfig), and never reaches the provider's section.
  auto broker = ParseConfig(
      json{{"providers", {{"e2b", {{"api_key", "k"}, {"max_concurrent_creates", 2}}}}}}.dump());
  ASSERT_TRUE(broker.ok()) << broker.status();
  EXPECT_EQ(broker->max_concurrent_creates.at("e2b"), 2);
  EXPECT_FALSE(broker->providers["e2b"].contains("max_concurrent_creates"));
  auto too_many = ParseConfig(
      json{{"providers", {{"e2b", {{"api_key", "k"}, {"max_concurrent_creates", 100001}}}}}}
          .dump());
  EXPECT_EQ(too_many.status().message(),
            "providers.e2b.max_concurrent_creates: must be between 1 and 100000");
  cfg["pool"]["sise"] = 1;
  auto bad = ParseE2BConfig(cfg, 60);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("providers.e2b.pool.sise"), std::string::npos)
      << bad.status();
  json d = {{"api_key", "k"}, {"pool", {{"size", -1}}}};
  auto bad_size = ParseDaytonaConfig(d, 60);
  EXPECT_NE(bad_size.status().message().find("providers.daytona.pool.size"), std::string::npos)
      << bad_size.status();
  // Default: no pool.
  EXPECT_EQ(ParseE2BConfig(json{{"api_key", "k"}}, 60)->pool.size, 0);
}

class WarmPoolBrokerTest : public BrokerFixture {
 protected:
  void SetUp() override {
    FakeE2B::Options o;
    o.ttl_thread = false;
    auto fake = FakeE2B::Start(o);
    ASSERT_TRUE(fake.ok()) << fake.status();
    fake_ = std::move(*fake);
    json extra = {{"default_provider", "e2b"},
                  {"providers",
                   {{"e2b",
                     {{"api_key", "e2b_test_key"},
                      {"api_url", fake_->url()},
                      {"sandbox_url", fake_->url()},
                      {"pool", {{"size", 2}}}}}}}};
    StartBroker(extra.dump());
  }
  void TearDown() override { server_.reset(); }
  bool WaitReady(WarmPool* pool, int64_t n) {
    for (int i = 0; i < 600 && pool->ready() != n; ++i) absl::SleepFor(absl::Milliseconds(50));
    return pool->ready() == n;
  }
  std::unique_ptr<FakeE2B> fake_;
};

TEST_F(WarmPoolBrokerTest, TheBackgroundThreadKeepsThePoolFullAndShutdownEmptiesIt) {
  ASSERT_EQ(server_->pools().size(), 1u);
  WarmPool* pool = server_->pools()[0];
  ASSERT_TRUE(WaitReady(pool, 2));
  auto sb = Client("pooled");
  auto r = sb->Shell("echo from the pool");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->output(), "from the pool\n");
  EXPECT_EQ(MetricValue(*server_->metrics(), "sandbox_broker_pool_hits_total"), 1);
  ASSERT_TRUE(WaitReady(pool, 2));
  EXPECT_EQ(fake_->faults().creates.load(), 3);
  EXPECT_TRUE(*sb->Close());
  server_->Shutdown(absl::ZeroDuration());
  EXPECT_EQ(fake_->live_sandboxes(), 0);
}

}  // namespace
}  // namespace sandbox
