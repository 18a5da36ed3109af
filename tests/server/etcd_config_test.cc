// state.backend "etcd" and state.etcd in the broker's config.

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "server/config/config.h"

namespace sandbox {
namespace {

std::string Err(const std::string& json) {
  auto c = ParseConfig(json);
  return c.ok() ? "ok" : std::string(c.status().message());
}

TEST(EtcdConfigTest, KeysAndDefaults) {
  auto c = ParseConfig(R"({"state": {"backend": "etcd", "etcd": {
      "endpoints": ["http://127.0.0.1:2379", "https://10.0.0.2:2379"],
      "prefix": "/brokers/one/", "member_ttl_seconds": 15,
      "ca_file": "/etc/ca.pem", "cert_file": "/etc/c.pem", "key_file": "/etc/k.pem",
      "username": "broker", "password_file": "/etc/pw"}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->state_backend, "etcd");
  EXPECT_EQ(c->state_etcd.endpoints.size(), 2u);
  EXPECT_EQ(c->state_etcd.endpoints[1], "https://10.0.0.2:2379");
  EXPECT_EQ(c->state_etcd.prefix, "/brokers/one/");
  EXPECT_EQ(c->state_etcd.member_ttl_seconds, 15);
  EXPECT_EQ(c->state_etcd.ca_file, "/etc/ca.pem");
  EXPECT_EQ(c->state_etcd.cert_file, "/etc/c.pem");
  EXPECT_EQ(c->state_etcd.key_file, "/etc/k.pem");
  EXPECT_EQ(c->state_etcd.username, "broker");
  EXPECT_EQ(c->state_etcd.password_file, "/etc/pw");
  EXPECT_FALSE(c->drain_close_sandboxes);  // durable: sandboxes stay over a restart

  c = ParseConfig(R"({"state": {"backend": "etcd", "etcd": {"endpoints": ["http://e:2379"]}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->state_etcd.prefix, "/sandbox-broker/");
  EXPECT_EQ(c->state_etcd.member_ttl_seconds, 10);
  EXPECT_TRUE(c->state_etcd.username.empty());
  EXPECT_EQ(c->cluster.lease_safety_margin_ms, 1000);  // a tenth of the TTL

  // The lease safety margin: below 2/3 of the TTL (renewals every third).
  auto cluster = [](int margin_ms) {
    return ParseConfig(absl::StrCat(R"({"state": {"backend": "etcd", "etcd": {
        "endpoints": ["http://e:2379"], "member_ttl_seconds": 3}},
        "cluster": {"token": "cluster-token-0123456789", "lease_safety_margin_ms": )",
                                    margin_ms, "}}"));
  };
  c = cluster(1999);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cluster.lease_safety_margin_ms, 1999);
  c = cluster(2000);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("cluster.lease_safety_margin_ms: 2000 must be below 2/3"),
            std::string::npos)
      << c.status();
  EXPECT_FALSE(cluster(-1).ok());
}

TEST(EtcdConfigTest, ErrorsNameTheKey) {
  EXPECT_NE(Err(R"({"state": {"backend": "etcd", "etcd": {"endpoints": ["http://e:1"],
      "endpoint": "x"}}})")
                .find("state.etcd.endpoint"),
            std::string::npos);
  EXPECT_NE(Err(R"({"state": {"backend": "etcd"}})").find("state.etcd.endpoints"),
            std::string::npos);
  EXPECT_NE(Err(R"({"state": {"backend": "etcd", "etcd": {"endpoints": "http://e:1"}}})")
                .find("state.etcd.endpoints"),
            std::string::npos);
  EXPECT_NE(Err(R"({"state": {"backend": "etcd", "etcd": {"endpoints": ["e:2379"]}}})")
                .find("state.etcd.endpoints"),
            std::string::npos);
  EXPECT_NE(Err(R"({"state": {"backend": "etcd", "etcd": {"endpoints": ["http://e:1"],
      "prefix": "nope"}}})")
                .find("state.etcd.prefix"),
            std::string::npos);
  EXPECT_NE(Err(R"({"state": {"backend": "etcd", "etcd": {"endpoints": ["http://e:1"],
      "member_ttl_seconds": 1}}})")
                .find("state.etcd.member_ttl_seconds"),
            std::string::npos);
  EXPECT_NE(Err(R"({"state": {"backend": "etcd", "etcd": {"endpoints": ["http://e:1"],
      "cert_file": "/c"}}})")
                .find("state.etcd.key_file"),
            std::string::npos);
  EXPECT_NE(Err(R"({"state": {"backend": "etcd", "etcd": {"endpoints": ["http://e:1"],
      "username": "u"}}})")
                .find("state.etcd.password_file"),
            std::string::npos);
  EXPECT_NE(Err(R"({"state": {"backend": "etcd", "etcd": {"endpoints": ["http://e:1"],
      "password": "inline"}}})")
                .find("state.etcd.password"),
            std::string::npos);
  EXPECT_NE(Err(R"({"state": {"backend": "etcd", "path": "/x.db",
      "etcd": {"endpoints": ["http://e:1"]}}})")
                .find("state.path"),
            std::string::npos);
  EXPECT_NE(Err(R"({"state": {"backend": "sqlite", "etcd": {"endpoints": ["http://e:1"]}}})")
                .find("state.etcd"),
            std::string::npos);
  EXPECT_NE(Err(R"({"state": {"backend": "consul"}})").find("state.backend"), std::string::npos);
}

}  // namespace
}  // namespace sandbox
