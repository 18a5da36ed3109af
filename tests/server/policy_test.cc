// Tenant policy parsing and resolution, the policy engine's rules, the
// usage meter's bounded labels, the audit log's shape, admin auth and the
// reload key diff.

#include "server/config/policy.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/refusal.h"
#include "server/config/auth.h"
#include "server/config/config.h"
#include "server/operators/reload.h"
#include "server/operators/usage.h"
#include "server/telemetry/audit.h"

namespace sandbox {
namespace {

absl::StatusOr<BrokerConfig> Parse(const std::string& extra) {
  nlohmann::json j = nlohmann::json::parse(R"({"providers": {"local": {}, "e2b": {}}})");
  j.merge_patch(nlohmann::json::parse(extra));
  return ParseConfig(j.dump());
}

BrokerMaxima Maxima() {
  BrokerMaxima m;
  m.providers = {"e2b", "local"};
  m.default_provider = "local";
  m.max_sessions = 100;
  m.max_timeout_seconds = 900;
  m.idle_timeout_seconds = 300;
  m.max_output_bytes = 65536;
  return m;
}

TEST(PolicyConfig, TenantValuesOverrideDefaultsAndOnlyTighten) {
  auto c = Parse(R"({
    "tenant_defaults": {"max_sessions": 10, "max_timeout_seconds": 60, "providers": ["local"]},
    "tenants": {"acme": {"max_sessions": 1000, "max_timeout_seconds": 5, "providers": ["local", "e2b"],
                         "templates": {"e2b": ["base"]}, "run_rate": 30, "max_concurrent_runs": 2,
                         "resources": {"memory_bytes": 1048576, "cpus": 0.5},
                         "max_output_bytes": 1000000000, "idle_timeout_seconds": 60}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  TenantRules acme = ResolveTenantRules(c->policy, Maxima(), "acme");
  EXPECT_EQ(acme.max_sessions, 100);  // 1000 is clamped to the broker's 100
  EXPECT_EQ(acme.max_timeout_seconds, 5);
  EXPECT_EQ(acme.providers, (std::vector<std::string>{"e2b", "local"}));
  EXPECT_EQ(acme.templates.at("e2b"), std::vector<std::string>{"base"});
  EXPECT_EQ(acme.run_rate, 30);
  EXPECT_EQ(acme.max_concurrent_runs, 2);
  EXPECT_EQ(acme.resources.memory_bytes, 1048576);
  EXPECT_DOUBLE_EQ(acme.resources.cpus, 0.5);
  EXPECT_EQ(acme.max_output_bytes, 65536);  // clamped
  EXPECT_EQ(acme.idle_timeout_seconds, 60);
  TenantRules other = ResolveTenantRules(c->policy, Maxima(), "someone");
  EXPECT_EQ(other.max_sessions, 10);
  EXPECT_EQ(other.max_timeout_seconds, 60);
  EXPECT_EQ(other.providers, std::vector<std::string>{"local"});
  EXPECT_EQ(other.max_concurrent_runs, 0);
  EXPECT_EQ(other.idle_timeout_seconds, 300);
}

TEST(PolicyConfig, BadPolicyIsAnErrorNamingTheKey) {
  struct Case {
    const char* json;
    const char* message;
  } cases[] = {
      {R"({"tenants": {"acme": {"providers": ["gpu"]}}})",
       "tenants.acme.providers: unknown provider \"gpu\" (configured: e2b, local)"},
      {R"({"tenants": {"acme": {"max_sessoins": 3}}})", "tenants.acme.max_sessoins: unknown key"},
      {R"({"tenants": {"acme": {"max_sessions": 0}}})",
       "tenants.acme.max_sessions: must be between 1 and 100000000"},
      {R"({"tenant_defaults": {"run_rate": "fast"}})",
       "tenant_defaults.run_rate: must be an integer"},
      {R"({"tenants": {"acme": {"resources": {"cpus": -1}}}})",
       "tenants.acme.resources.cpus: must be a positive number"},
      {R"({"tenants": {"acme": {"resources": {"gpus": 1}}}})",
       "tenants.acme.resources.gpus: unknown key"},
      {R"({"tenants": {"acme": {"templates": {"gpu": ["x"]}}}})",
       "tenants.acme.templates.gpu: unknown provider (configured: e2b, local)"},
      {R"({"tenants": {"acme": {"providers": ["e2b"]}}})",
       "tenants.acme: default provider \"local\" is not in providers (e2b); set default_provider"},
      {R"({"tenants": {"bad tenant": {}}})",
       "tenants: tenant \"bad tenant\" must be 1-64 characters of [A-Za-z0-9._-]"},
      {R"({"auth": {"admin_tokens": {"short": "ops"}}})",
       "auth.admin_tokens: tokens must be at least 8 characters"},
      {R"({"auth": {"tokens": {"same-token-1": "acme"}, "admin_tokens": {"same-token-1": "ops"}}})",
       "auth.admin_tokens: a token is also a tenant token; use separate tokens"},
      // A token is never shown, even when its entry is wrong.
      {R"({"auth": {"tokens": {"a-token-1": "acme", "b-LEAK-CANARY-9": 42}}})",
       "auth.tokens: the value of entry 2 (in sorted key order; the key is a secret, not shown) "
       "must be a string"},
      {R"({"auth": {"admin_tokens": {"LEAK-CANARY-9": ["ops"]}}})",
       "auth.admin_tokens: the value of entry 1 (in sorted key order; the key is a secret, not "
       "shown) must be a string"},
      {R"({"audit_log": {"path": ""}})", "audit_log.path: must not be empty"},
      {R"({"audit_log": {"file": "x"}})", "audit_log.file: unknown key"},
  };
  for (const auto& c : cases) {
    auto r = Parse(c.json);
    ASSERT_FALSE(r.ok()) << c.json;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(), c.message) << c.json;
  }
  auto ok = Parse(R"({"tenants": {"acme": {"providers": ["e2b"], "default_provider": "e2b"}},
                      "auth": {"admin_tokens": {"admin-token-1": "ops"}}, "audit_log": {"path": "/tmp/a"}})");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->admin_tokens.at("admin-token-1"), "ops");
  EXPECT_EQ(ok->audit_log_path, "/tmp/a");
}

TEST(PolicyEngine, SpecChecksNameTheRuleAndValue) {
  TenantRules r;
  r.providers = {"local"};
  r.templates = {{"local", {"py", "node"}}};
  r.resources.memory_bytes = 1024;
  r.resources.cpus = 1;
  r.max_timeout_seconds = 60;
  EXPECT_TRUE(PolicyEngine::CheckSpec(r, "acme", "local", "", {}).ok());
  EXPECT_TRUE(PolicyEngine::CheckSpec(r, "acme", "local", "py", {}).ok());
  absl::Status s = PolicyEngine::CheckSpec(r, "acme", "e2b", "", {});
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(), "tenant acme: provider \"e2b\" not allowed (allowed: local)");
  EXPECT_EQ(RefusingRule(s), "providers");  // typed, not read from the text
  s = PolicyEngine::CheckSpec(r, "acme", "local", "gpu", {});
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(),
            "tenant acme: template \"gpu\" not allowed on provider \"local\" (allowed: py, node)");
  EXPECT_EQ(RefusingRule(s), "templates");
  ResourceLimits big;
  big.memory_bytes = 2048;
  s = PolicyEngine::CheckSpec(r, "acme", "local", "", big);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "tenant acme: spec.resources.memory_bytes 2048 exceeds resources.memory_bytes (1024)");
  EXPECT_EQ(RefusingRule(s), "resources");
  ResourceLimits cpus;
  cpus.cpus = 1.5;
  s = PolicyEngine::CheckSpec(r, "acme", "local", "", cpus);
  EXPECT_EQ(s.message(), "tenant acme: spec.resources.cpus 1.5 exceeds resources.cpus (1)");
  s = PolicyEngine::CheckTimeout(r, "acme", 61);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "tenant acme: timeout_seconds 61 exceeds max_timeout_seconds (60)");
  EXPECT_TRUE(PolicyEngine::CheckTimeout(r, "acme", 60).ok());
}

TEST(PolicyEngine, ConcurrentRunsAndRunRate) {
  FakeClock clock;
  PolicyEngine engine(&clock, MakeOperatorSnapshot({}, {}, {}, Maxima(), "", 1));
  TenantRules r;
  r.max_concurrent_runs = 2;
  {
    auto a = engine.BeginRun(r, "acme");
    auto b = engine.BeginRun(r, "acme");
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(engine.running("acme"), 2);
    auto c = engine.BeginRun(r, "acme");
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(c.status().message(),
              "tenant acme: max_concurrent_runs (2) reached: wait for a run to finish");
    EXPECT_EQ(RefusingRule(c.status()), "max_concurrent_runs");
    EXPECT_TRUE(engine.BeginRun(r, "other").ok());  // per tenant
  }
  EXPECT_EQ(engine.running("acme"), 0);
  // 6 per minute: a burst of 6, then one every 10 s.
  TenantRules rate;
  rate.run_rate = 6;
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(engine.BeginRun(rate, "acme").ok()) << i;
  auto refused = engine.BeginRun(rate, "acme");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.status().message(),
            "tenant acme: run_rate (6 per minute) exceeded: retry in 10s");
  EXPECT_EQ(RefusingRule(refused.status()), "run_rate");
  clock.Advance(absl::Seconds(9));
  EXPECT_FALSE(engine.BeginRun(rate, "acme").ok());
  clock.Advance(absl::Seconds(1));
  EXPECT_TRUE(engine.BeginRun(rate, "acme").ok());
  EXPECT_FALSE(engine.BeginRun(rate, "acme").ok());
  EXPECT_EQ(engine.running("acme"), 0);
}

TEST(PolicyEngine, AdminSwitchOverridesTheConfig) {
  FakeClock clock;
  PolicyEngine engine(&clock, MakeOperatorSnapshot({}, {}, {}, Maxima(), "", 1));
  TenantRules r;
  EXPECT_TRUE(engine.CheckEnabled(r, "acme").ok());
  r.disabled = true;
  absl::Status s = engine.CheckEnabled(r, "acme");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(), "tenant acme: disabled (disabled: true in the config)");
  engine.SetDisabled("acme", false);
  EXPECT_TRUE(engine.CheckEnabled(r, "acme").ok());
  r.disabled = false;
  engine.SetDisabled("acme", true);
  EXPECT_EQ(engine.CheckEnabled(r, "acme").message(), "tenant acme: disabled (by an operator)");
}

TEST(AdminAuth, AdminTokensOnly) {
  auto snap = MakeOperatorSnapshot({{"tenant-token-1", "acme"}}, {{"admin-token-1", "ops"}}, {},
                                   Maxima(), "", 1);
  absl::string_view admin = "Bearer admin-token-1", tenant = "Bearer tenant-token-1",
                    unknown = "Bearer who-knows-1";
  EXPECT_EQ(*Authenticator::AuthenticateAdmin(*snap, &admin), "ops");
  EXPECT_EQ(Authenticator::AuthenticateAdmin(*snap, &tenant).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Authenticator::AuthenticateAdmin(*snap, &unknown).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Authenticator::AuthenticateAdmin(*snap, nullptr).status().code(),
            absl::StatusCode::kUnauthenticated);
  // An admin token is not a tenant token.
  EXPECT_EQ(Authenticator::AuthenticateWith(*snap, &admin).status().code(),
            absl::StatusCode::kUnauthenticated);
  auto none = MakeOperatorSnapshot({{"tenant-token-1", "acme"}}, {}, {}, Maxima(), "", 1);
  auto off = Authenticator::AuthenticateAdmin(*none, &unknown);
  EXPECT_EQ(off.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(off.status().message(), "the Admin API is off: no auth.admin_tokens are configured");
}

TEST(UsageMeter, CountsAndFoldsUnknownTenantsInLabels) {
  prometheus::Registry registry;
  UsageMeter meter(&registry, nullptr, absl::FromUnixSeconds(1));
  meter.SetKnownTenants({"acme"});
  UsageCounters run;
  run.runs = 1;
  run.output_bytes = 10;
  meter.Record("acme", "local", run);
  meter.Record("acme", "local", run);
  meter.Record("stranger", "local", run);
  meter.Record("another", "local", run);
  auto totals = meter.Totals();
  EXPECT_EQ((totals[{"acme", "local"}].runs), 2);
  EXPECT_EQ((totals[{"acme", "local"}].output_bytes), 20);
  EXPECT_EQ((totals[{"stranger", "local"}].runs), 1);  // GetUsage keeps names
  EXPECT_EQ(meter.Totals("acme").size(), 1u);
  std::map<std::string, double> by_label;
  for (const auto& fam : registry.Collect()) {
    if (fam.name != "sandbox_broker_tenant_runs_total") continue;
    for (const auto& m : fam.metric) {
      for (const auto& l : m.label) {
        if (l.name == "tenant") by_label[l.value] += m.counter.value;
      }
    }
  }
  EXPECT_EQ(by_label, (std::map<std::string, double>{{"acme", 2}, {"other", 2}}));
}

TEST(AuditLog, OneJsonObjectPerLineWithTheRequestId) {
  FakeClock clock(absl::FromUnixSeconds(1800000000));
  std::vector<std::string> lines;
  AuditLog log([&](absl::string_view l) { lines.emplace_back(l); }, &clock);
  {
    RequestIdScope scope("req-1");
    AuditEvent e;
    e.event = "session.closed";
    e.tenant = "acme";
    e.session_id = "s1";
    e.provider = "local";
    e.sandbox_id = "sb-1";
    e.fields["reason"] = "idle";
    log.Record(e);
  }
  AuditEvent e;
  e.event = "config.reload";
  log.Record(e);
  ASSERT_EQ(lines.size(), 2u);
  auto j = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(j["audit"], true);
  EXPECT_EQ(j["time"], "2027-01-15T08:00:00.000Z");
  EXPECT_EQ(j["event"], "session.closed");
  EXPECT_EQ(j["tenant"], "acme");
  EXPECT_EQ(j["session_id"], "s1");
  EXPECT_EQ(j["provider"], "local");
  EXPECT_EQ(j["sandbox_id"], "sb-1");
  EXPECT_EQ(j["request_id"], "req-1");
  EXPECT_EQ(j["reason"], "idle");
  EXPECT_EQ(lines[0].back(), '\n');
  EXPECT_EQ(nlohmann::json::parse(lines[1])["request_id"], "-");
}

TEST(AuditLog, AppendsToItsFile) {
  FakeClock clock;
  char tmpl[] = "/tmp/sbaudit-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/audit.jsonl";
  const mode_t umask_was = umask(022);  // a usual umask, which would leave 0644
  for (int i = 0; i < 2; ++i) {         // reopened: appended, not truncated
    auto log = AuditLog::Open(path, &clock);
    ASSERT_TRUE(log.ok()) << log.status();
    AuditEvent e;
    e.event = absl::StrCat("event.", i);
    (*log)->Record(e);
  }
  std::ifstream in(path);
  std::string l1, l2, l3;
  std::getline(in, l1);
  std::getline(in, l2);
  EXPECT_FALSE(std::getline(in, l3));
  EXPECT_EQ(nlohmann::json::parse(l1)["event"], "event.0");
  EXPECT_EQ(nlohmann::json::parse(l2)["event"], "event.1");
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);  // owner-only
  // A file that already exists with a loose mode is made owner-only at open.
  ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  ASSERT_TRUE(AuditLog::Open(path, &clock).ok());
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  umask(umask_was);
  unlink(path.c_str());
  rmdir(tmpl);
  auto bad = AuditLog::Open("/nonexistent-dir-sb/audit.jsonl", &clock);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "audit_log.path: cannot open /nonexistent-dir-sb/audit.jsonl");
}

TEST(Reloader, RestartKeysIgnoreReloadableOnes) {
  auto before = nlohmann::json::parse(R"({"listen": "a:1", "auth": {"tokens": {"x": "y"}},
      "providers": {"local": {"cpu_seconds": 1}, "e2b": {"api_key": "k"}}, "tenants": {}})");
  auto after = nlohmann::json::parse(R"({"listen": "a:2", "auth": {"tokens": {"z": "y"},
      "admin_tokens": {"q": "r"}}, "providers": {"local": {"cpu_seconds": 2}, "e2b": {"api_key": "k"}},
      "tenants": {"acme": {}}, "tenant_defaults": {"max_sessions": 1}, "max_output_bytes": 5})");
  EXPECT_EQ(Reloader::RestartKeys(before, after),
            (std::vector<std::string>{"listen", "max_output_bytes", "providers.local"}));
  EXPECT_TRUE(Reloader::RestartKeys(before, before).empty());
}

}  // namespace
}  // namespace sandbox
