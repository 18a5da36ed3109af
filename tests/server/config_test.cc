#include "server/config/config.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

namespace sandbox {
namespace {

TEST(Config, EmptyConfigGivesDocumentedDefaults) {
  auto c = ParseConfig("{}");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->listen, "127.0.0.1:50051");
  EXPECT_EQ(c->default_provider, "local");
  EXPECT_EQ(c->idle_timeout_seconds, 300);
  EXPECT_EQ(c->max_lifetime_seconds, 0);
  EXPECT_EQ(c->default_timeout_seconds, 30);
  EXPECT_EQ(c->max_output_bytes, 65536);
  EXPECT_TRUE(c->tokens.empty());
}

TEST(Config, ReadsEveryContractKey) {
  auto c = ParseConfig(R"({
    "listen": "0.0.0.0:7000", "default_provider": "local",
    "idle_timeout_seconds": 2, "reap_interval_seconds": 1, "max_lifetime_seconds": 60,
    "max_sessions_per_tenant": 3, "default_timeout_seconds": 5, "max_timeout_seconds": 10,
    "max_output_bytes": 100, "auth": {"tokens": {"token-aaaaaaaa": "acme"}},
    "providers": {"local": {"isolation": "none"}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->listen, "0.0.0.0:7000");
  EXPECT_EQ(c->idle_timeout_seconds, 2);
  EXPECT_EQ(c->reap_interval_seconds, 1);
  EXPECT_EQ(c->max_lifetime_seconds, 60);
  EXPECT_EQ(c->max_sessions_per_tenant, 3);
  EXPECT_EQ(c->max_timeout_seconds, 10);
  EXPECT_EQ(c->max_output_bytes, 100);
  EXPECT_EQ(c->tokens.at("token-aaaaaaaa"), "acme");
  EXPECT_EQ(c->providers["local"]["isolation"], "none");
}

TEST(Config, RefusesAndNamesBadKeys) {
  struct Case {
    const char* json;
    const char* message;
  } cases[] = {
      {"not json", "config: not valid JSON"},
      {"[]", "config: must be a JSON object"},
      {R"({"idle_timeout": 5})", "idle_timeout: unknown key"},
      {R"({"idle_timeout_seconds": 0})", "idle_timeout_seconds: must be between 1 and 2592000"},
      {R"({"idle_timeout_seconds": "300"})", "idle_timeout_seconds: must be an integer"},
      {R"({"max_output_bytes": -5})", "max_output_bytes: must be between 1 and 1073741824"},
      {R"({"auth": {"token": {}}})", "auth.token: unknown key"},
      {R"({"auth": {"tokens": {"short": "t"}}})",
       "auth.tokens: tokens must be at least 8 characters"},
      {R"({"auth": {"tokens": {"long-enough-token": "bad tenant"}}})",
       "auth.tokens: tenant \"bad tenant\" must be 1-64 characters of [A-Za-z0-9._-]"},
      {R"({"providers": {"local": 5}})", "providers.local: must be a JSON object"},
      {R"({"default_timeout_seconds": 100, "max_timeout_seconds": 50})",
       "default_timeout_seconds: must not exceed max_timeout_seconds"},
      {R"({"log_format": "xml"})", "log_format: must be one of: text, json"},
  };
  for (const auto& c : cases) {
    auto r = ParseConfig(c.json);
    ASSERT_FALSE(r.ok()) << c.json;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(), c.message) << c.json;
  }
}

TEST(Config, TokensFileIsMergedAndValidated) {
  std::string path = ::testing::TempDir() + "/tokens.json";
  std::ofstream(path) << R"({"file-token-123": "beta"})";
  auto c = ParseConfig(R"({"auth": {"tokens": {"inline-token-1": "alpha"}, "tokens_file": ")" +
                       path + "\"}}");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tokens.at("inline-token-1"), "alpha");
  EXPECT_EQ(c->tokens.at("file-token-123"), "beta");

  std::ofstream(path) << R"(["not", "an", "object"])";
  auto bad = ParseConfig(R"({"auth": {"tokens_file": ")" + path + "\"}}");
  EXPECT_EQ(bad.status().message(), "auth.tokens_file: must hold a JSON object of token -> tenant");
  auto missing = ParseConfig(R"({"auth": {"tokens_file": "/nonexistent/x.json"}})");
  EXPECT_EQ(missing.status().message(), "auth.tokens_file: cannot read /nonexistent/x.json");
}

}  // namespace
}  // namespace sandbox

#include <regex>
#include <set>
#include <sstream>

#include "common/config_reader.h"
#include "server/app/provider_setup.h"

namespace sandbox {
namespace {

// docs/config.md lists every key the code reads, once, and nothing else:
// every section present (so each reader runs), the keys read recorded, the
// document's first column compared with them.
std::set<std::string> KeysTheCodeReads() {
  // Tenants are named NAME and templates name a provider: docs write
  // <name> and one row for the templates map.
  const char* kConfigs[] = {
      R"({"state": {"backend": "sqlite", "path": "/tmp/x.db"},
          "tls": {"cert_file": "c", "key_file": "k"}, "auth": {}, "mcp": {}, "limits": {},
          "audit_log": {"path": "/tmp/a"},
          "tenant_defaults": {"templates": {"local": ["a"]}, "resources": {"cpus": 1},
                              "network": {}},
          "tenants": {"NAME": {"templates": {"local": ["a"]}, "resources": {"cpus": 1},
                               "network": {}}},
          "providers": {"local": {"limits": {}, "max_limits": {}, "max_concurrent_creates": 2,
                                  "network": {}},
                        "e2b": {"api_key": "k", "pool": {}},
                        "daytona": {"api_key": "k", "pool": {}}, "echo": {}}})",
      R"({"state": {"backend": "etcd", "etcd": {"endpoints": ["http://127.0.0.1:1"]}},
          "cluster": {"token": "a-cluster-token-of-some-length"}})",
  };
  std::set<std::string> read;
  ConfigReader::RecordReadKeys(&read);
  for (const char* text : kConfigs) {
    auto c = ParseConfig(text);
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) {
      EXPECT_TRUE(CheckProviderConfigs(*c).ok());
    }
  }
  ConfigReader::RecordReadKeys(nullptr);
  std::set<std::string> keys;
  for (std::string k : read) {
    k = std::regex_replace(k, std::regex(R"(^tenants\.NAME\.)"), "tenants.<name>.");
    k = std::regex_replace(k, std::regex(R"(\.templates\..*$)"), ".templates");
    k = std::regex_replace(k, std::regex(R"(^providers\.[a-z0-9]+\.max_concurrent_creates$)"),
                           "providers.<name>.max_concurrent_creates");
    k = std::regex_replace(k, std::regex(R"(^providers\.[a-z0-9]+\.network$)"),
                           "providers.<name>.network");
    keys.insert(k);
  }
  // Objects that only hold other keys have no row of their own.
  std::set<std::string> leaves;
  for (const std::string& k : keys) {
    auto next = keys.upper_bound(k);
    if (next == keys.end() || next->compare(0, k.size() + 1, k + ".") != 0) leaves.insert(k);
  }
  return leaves;
}

TEST(ConfigDocs, EveryKeyTheCodeReadsIsDocumentedOnceAndNothingElse) {
  std::ifstream in(std::string(SOURCE_DIR) + "/docs/config.md");
  ASSERT_TRUE(in) << "docs/config.md";
  std::multiset<std::string> documented;
  std::string line;
  const std::regex row(R"(^\| `([^`]+)` \|)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, row)) documented.insert(m[1]);
  }
  const std::set<std::string> read = KeysTheCodeReads();
  ASSERT_GT(read.size(), 100u);
  for (const std::string& k : read) {
    EXPECT_EQ(documented.count(k), 1u) << k << ": read by the code, documented "
                                       << documented.count(k) << " times in docs/config.md";
  }
  for (const std::string& k : std::set<std::string>(documented.begin(), documented.end())) {
    EXPECT_EQ(read.count(k), 1u) << k << ": in docs/config.md, but the code does not read it";
  }
}

}  // namespace
}  // namespace sandbox
