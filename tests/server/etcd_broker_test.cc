// End to end: a broker whose config says state.backend "etcd" serves
// sessions from a real etcd (started per test) and finds them again after a
// restart; one broker per prefix; etcd down at start is UNAVAILABLE.

#include <gtest/gtest.h>

#include "common/clock.h"
#include "server/cluster/cluster.h"
#include "server/store/etcd/etcd_store.h"
#include "tests/server/etcd_fixture.h"
#include "tests/testing/broker_fixture.h"

namespace sandbox {
namespace {

class EtcdBrokerTest : public BrokerFixture {
 protected:
  void SetUp() override {
    if (!EtcdInstalled()) GTEST_SKIP() << kEtcdPath << " is not installed";
    ASSERT_TRUE(etcd_.Start());
  }
  void TearDown() override { server_.reset(); }  // before etcd goes
  std::string EtcdState() const {
    return nlohmann::json({{"state",
                            {{"backend", "etcd"},
                             {"path", nullptr},
                             {"etcd",
                              {{"endpoints", {etcd_.endpoint()}},
                               {"prefix", "/e2e/"},
                               {"member_ttl_seconds", 2}}}}}})
        .dump();
  }
  EtcdServer etcd_;
};

// A replica acts on its sessions while its lease is provably valid: the
// TTL from the last renewal that succeeded, less
// cluster.lease_safety_margin_ms. Tested at both sides of that boundary on
// an injected clock (no keeper runs, so no renewal succeeds: an outage).
TEST_F(EtcdBrokerTest, AClusterMemberFencesItselfAtItsLeaseLessTheMargin) {
  EtcdStoreOptions so;
  so.etcd.endpoints = {etcd_.endpoint()};
  so.prefix = "/margin/";
  auto store = EtcdStore::Open(so);
  ASSERT_TRUE(store.ok()) << store.status();
  FakeClock clock;
  ClusterOptions o;
  o.member_id = "margin-m1";
  o.advertise_address = "127.0.0.1:1";
  o.token = "cluster-token-0123456789";
  o.member_ttl = absl::Seconds(10);
  o.lease_safety_margin = absl::Milliseconds(1500);
  Cluster cluster(store->get(), o, &clock);
  ASSERT_TRUE(cluster.Join().ok());
  EXPECT_TRUE(cluster.ready());
  clock.Advance(absl::Milliseconds(8499));  // TTL - margin - 1 ms: still served
  EXPECT_TRUE(cluster.ready());
  clock.Advance(absl::Milliseconds(1));  // TTL - margin: fenced
  EXPECT_FALSE(cluster.ready());
  EXPECT_FALSE(cluster.ServesLocally("t", "s"));
  auto route = cluster.Resolve("t", "s", "e2b", /*may_create=*/true, /*forwarded=*/false);
  EXPECT_EQ(route.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(route.status().message().find("8500 ms since the last renewal"), std::string::npos)
      << route.status();
  EXPECT_NE(route.status().message().find("fenced itself"), std::string::npos) << route.status();
}

TEST_F(EtcdBrokerTest, ServesSessionsAndFindsThemAfterRestart) {
  StartBroker(EtcdState());
  ASSERT_EQ(server_->store()->backend(), "etcd");
  auto sb = Client("kept");
  auto info = sb->Start();
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_TRUE(sb->WriteFile("note.txt", "from before").ok());
  auto run = sb->Shell("cat note.txt");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->output(), "from before");
  const std::string dep = server_->store()->deployment_id();

  // The session's row is in etcd, under the prefix.
  EtcdStoreOptions o;
  o.etcd.endpoints = {etcd_.endpoint()};
  o.prefix = "/e2e/";
  auto direct = EtcdStore::Open(o);
  ASSERT_TRUE(direct.ok()) << direct.status();
  auto rows = (*direct)->LoadSessions();
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0].session_id, "kept");
  EXPECT_EQ((*rows)[0].sandbox_id, info->sandbox_id());

  server_.reset();  // a graceful stop: the sandbox stays (durable store)
  StartBroker(EtcdState());
  EXPECT_EQ(server_->store()->deployment_id(), dep);
  auto again = Client("kept");
  auto info2 = again->Info();
  ASSERT_TRUE(info2.ok()) << info2.status();
  EXPECT_EQ(info2->sandbox_id(), info->sandbox_id());
  auto read = again->ReadFile("note.txt");
  ASSERT_TRUE(read.ok() && read->has_value()) << read.status();
  EXPECT_EQ(**read, "from before");
  ASSERT_TRUE(again->Close().ok());
  rows = (*direct)->LoadSessions();
  ASSERT_TRUE(rows.ok());
  EXPECT_TRUE(rows->empty());
}

TEST_F(EtcdBrokerTest, OneBrokerPerPrefixAndEtcdDownIsUnavailable) {
  StartBroker(EtcdState());
  // Another broker on the same prefix: refused after waiting out the TTL.
  nlohmann::json cfg = nlohmann::json::parse(R"({"listen": "127.0.0.1:0"})");
  cfg["providers"]["local"] = {{"workspace_root", dir_.path() + "/ws2"}, {"uid_base", 630000}};
  cfg.merge_patch(nlohmann::json::parse(EtcdState()));
  auto config = ParseConfig(cfg.dump());
  ASSERT_TRUE(config.ok()) << config.status();
  auto providers = BuildProviders(*config);
  ASSERT_TRUE(providers.ok());
  BrokerServer::Options opts;
  opts.clock = &clock_;
  opts.reaper_thread = false;
  opts.health_thread = false;
  auto second = BrokerServer::Start(*config, std::move(*providers), opts);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_NE(second.status().message().find("in use by"), absl::string_view::npos);

  server_.reset();
  etcd_.Kill9();
  auto providers2 = BuildProviders(*config);
  ASSERT_TRUE(providers2.ok());
  auto down = BrokerServer::Start(*config, std::move(*providers2), opts);
  ASSERT_FALSE(down.ok());
  EXPECT_EQ(down.status().code(), absl::StatusCode::kUnavailable) << down.status();
}

}  // namespace
}  // namespace sandbox
