// Operators' control against a real broker (gRPC on 127.0.0.1:0, the echo
// and local providers, a FakeClock): tenant policy refusals, ListTools
// filtering, the Admin API and its authorization, usage metering, the audit
// log, reload (RPC, tokens_file change, SIGHUP on a real daemon) and
// sandboxctl admin.

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "adapters/http/http_client.h"
#include "client/remote_admin.h"
#include "common/log.h"
#include "sandboxbroker/v1/admin.grpc.pb.h"
#include "tests/testing/broker_fixture.h"

namespace sandbox {
namespace {

constexpr char kAlpha[] = "token-alpha-123";
constexpr char kBeta[] = "token-beta-456";
constexpr char kAdmin[] = "admin-token-999";

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path + ".tmp", std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  rename((path + ".tmp").c_str(), path.c_str());
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class OperatorsTest : public ::testing::Test {
 protected:
  nlohmann::json Base() {
    nlohmann::json cfg = nlohmann::json::parse(R"({
      "listen": "127.0.0.1:0", "default_provider": "echo", "idle_timeout_seconds": 300,
      "max_sessions_per_tenant": 50, "max_timeout_seconds": 60, "max_output_bytes": 4096,
      "auth": {"tokens": {"token-alpha-123": "alpha", "token-beta-456": "beta"},
               "admin_tokens": {"admin-token-999": "ops"}}})");
    cfg["providers"]["echo"] = nlohmann::json::object();
    cfg["providers"]["local"] = {{"workspace_root", dir_.path() + "/ws"}, {"uid_base", 630000}};
    // Each test its own store (durable sessions), never the default path.
    cfg["state"] = {{"backend", "sqlite"}, {"path", dir_.path() + "/state/state.db"}};
    return cfg;
  }
  std::string ConfigPath() const { return dir_.path() + "/config.json"; }
  void WriteConfig(const nlohmann::json& patch) {
    nlohmann::json cfg = Base();
    cfg.merge_patch(patch);
    WriteText(ConfigPath(), cfg.dump(2));
  }

  void Start(const std::string& patch = "{}") {
    WriteConfig(nlohmann::json::parse(patch));
    auto config = LoadConfigFile(ConfigPath());
    ASSERT_TRUE(config.ok()) << config.status();
    auto providers = BuildProviders(*config);
    ASSERT_TRUE(providers.ok()) << providers.status();
    BrokerServer::Options o;
    o.clock = &clock_;
    o.reaper_thread = false;
    o.config_path = ConfigPath();
    o.watch_tokens_file = false;
    o.audit_sink = [this](absl::string_view line) {
      absl::MutexLock l(&mu_);
      audit_.emplace_back(line);
    };
    auto server = BrokerServer::Start(*config, std::move(*providers), o);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                   grpc::InsecureChannelCredentials());
    stub_ = pb::SandboxBroker::NewStub(channel_);
    admin_stub_ = pb::Admin::NewStub(channel_);
  }

  std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    return ctx;
  }

  grpc::Status Run(const std::string& token, const std::string& session, const std::string& code,
                   pb::RunResult* out = nullptr, int timeout = 0, pb::SessionSpec spec = {}) {
    pb::RunRequest req;
    req.set_session_id(session);
    req.set_code(code);
    req.set_timeout_seconds(timeout);
    *req.mutable_spec() = std::move(spec);
    pb::RunResult r;
    grpc::Status s = stub_->Run(Ctx(token).get(), req, &r);
    if (out) *out = r;
    return s;
  }
  grpc::Status Start(const std::string& token, const std::string& session, pb::SessionSpec spec) {
    pb::StartSessionRequest req;
    req.set_session_id(session);
    *req.mutable_spec() = std::move(spec);
    pb::SessionInfo info;
    return stub_->StartSession(Ctx(token).get(), req, &info);
  }
  std::unique_ptr<RemoteAdmin> Admin(const std::string& token = kAdmin) {
    return RemoteAdmin::Connect(channel_, token);
  }

  // Audit lines (parsed) of `event`.
  std::vector<nlohmann::json> Audit(const std::string& event) {
    absl::MutexLock l(&mu_);
    std::vector<nlohmann::json> out;
    for (const auto& line : audit_) {
      auto j = nlohmann::json::parse(line);
      if (j["event"] == event) out.push_back(j);
    }
    return out;
  }
  std::string AllAudit() {
    absl::MutexLock l(&mu_);
    std::string all;
    for (const auto& l : audit_) all += l;
    return all;
  }

  TempDir dir_;
  FakeClock clock_;
  // Before server_: its shutdown still writes audit lines.
  absl::Mutex mu_;
  std::vector<std::string> audit_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<BrokerServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::SandboxBroker::Stub> stub_;
  std::unique_ptr<pb::Admin::Stub> admin_stub_;
};

pb::SessionSpec Spec(const std::string& provider, const std::string& tmpl = "") {
  pb::SessionSpec s;
  s.set_provider(provider);
  s.set_template_(tmpl);
  return s;
}

TEST_F(OperatorsTest, PolicyRefusalsNameTheRuleAndCreateNothing) {
  Start(R"({"tenants": {
      "alpha": {"providers": ["echo"], "max_sessions": 2, "max_timeout_seconds": 10,
                "templates": {"echo": ["t1"]}, "resources": {"memory_bytes": 1000}},
      "beta": {"disabled": true}}})");
  struct Case {
    grpc::Status status;
    grpc::StatusCode code;
    std::string message;
    std::string rule;
  };
  pb::SessionSpec big = Spec("echo");
  big.mutable_resources()->set_memory_bytes(2000);
  std::vector<Case> cases;
  cases.push_back({Start(kAlpha, "s-local", Spec("local")), grpc::StatusCode::PERMISSION_DENIED,
                   "tenant alpha: provider \"local\" not allowed (allowed: echo)", "providers"});
  cases.push_back({Start(kAlpha, "s-t2", Spec("echo", "t2")), grpc::StatusCode::PERMISSION_DENIED,
                   "tenant alpha: template \"t2\" not allowed on provider \"echo\" (allowed: t1)",
                   "templates"});
  cases.push_back({Start(kAlpha, "s-big", big), grpc::StatusCode::INVALID_ARGUMENT,
                   "tenant alpha: spec.resources.memory_bytes 2000 exceeds resources.memory_bytes "
                   "(1000)",
                   "resources"});
  cases.push_back({Run(kAlpha, "s-slow", "x", nullptr, 11), grpc::StatusCode::INVALID_ARGUMENT,
                   "tenant alpha: timeout_seconds 11 exceeds max_timeout_seconds (10)",
                   "max_timeout_seconds"});
  cases.push_back({Run(kBeta, "b1", "x"), grpc::StatusCode::PERMISSION_DENIED,
                   "tenant beta: disabled (disabled: true in the config)", "disabled"});
  EXPECT_EQ(server_->sessions()->size(), 0);  // nothing was created
  pb::RunResult r;
  ASSERT_TRUE(Run(kAlpha, "s1", "one", &r).ok());
  ASSERT_TRUE(Run(kAlpha, "s2", "two", nullptr, 10, Spec("echo", "t1")).ok());
  cases.push_back({Run(kAlpha, "s3", "three"), grpc::StatusCode::RESOURCE_EXHAUSTED,
                   "tenant alpha: max_sessions (2) reached: close a session first",
                   "max_sessions"});
  EXPECT_EQ(server_->sessions()->size(), 2);
  for (const auto& c : cases) {
    EXPECT_EQ(c.status.error_code(), c.code) << c.message;
    EXPECT_EQ(c.status.error_message(), c.message);
  }
  // Each refusal is audited with its rule.
  auto refused = Audit("policy.refused");
  ASSERT_EQ(refused.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(refused[i]["rule"], cases[i].rule);
    EXPECT_EQ(refused[i]["message"], cases[i].message);
  }
  // A disabled tenant is refused everything, reads included.
  pb::ListSessionsResponse list;
  EXPECT_EQ(stub_->ListSessions(Ctx(kBeta).get(), pb::ListSessionsRequest(), &list).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(OperatorsTest, TenantLimitsShapeItsSessions) {
  Start(R"({"tenants": {"alpha": {"idle_timeout_seconds": 5, "max_lifetime_seconds": 100,
                                  "max_output_bytes": 10, "default_provider": "echo"}}})");
  pb::RunResult r;
  ASSERT_TRUE(Run(kAlpha, "a", std::string(100, 'x'), &r).ok());
  EXPECT_EQ(r.output(), std::string(10, 'x'));
  EXPECT_TRUE(r.truncated());
  ASSERT_TRUE(Run(kBeta, "b", std::string(100, 'y'), &r).ok());
  EXPECT_EQ(r.output().size(), 100u);
  pb::GetSessionRequest g;
  g.set_session_id("a");
  pb::SessionInfo info;
  ASSERT_TRUE(stub_->GetSession(Ctx(kAlpha).get(), g, &info).ok());
  EXPECT_EQ(info.idle_expires_at().seconds() - info.last_active_at().seconds(), 5);
  EXPECT_EQ(info.expires_at().seconds() - info.created_at().seconds(), 100);
  clock_.Advance(absl::Seconds(5));
  EXPECT_EQ(server_->sessions()->RunOnce(), 1);  // alpha's, not beta's
  EXPECT_FALSE(server_->sessions()->Get("alpha", "a").ok());
  EXPECT_TRUE(server_->sessions()->Get("beta", "b").ok());
  auto closed = Audit("session.closed");
  ASSERT_EQ(closed.size(), 1u);
  EXPECT_EQ(closed[0]["reason"], "idle");
  EXPECT_EQ(closed[0]["tenant"], "alpha");
}

// A session asking for the provider's default (0) still gets at most its
// tenant's resources cap: min(provider default, tenant maximum).
TEST_F(OperatorsTest, TenantResourceCapBoundsTheProviderDefault) {
  Start(R"({"tenants": {"alpha": {"resources": {"memory_bytes": 268435456, "pids": 64}}}})");
  ASSERT_TRUE(Start(kAlpha, "capped", Spec("local")).ok());
  ASSERT_TRUE(Start(kBeta, "free", Spec("local")).ok());
  pb::GetSessionRequest g;
  pb::SessionInfo alpha, beta;
  g.set_session_id("capped");
  ASSERT_TRUE(stub_->GetSession(Ctx(kAlpha).get(), g, &alpha).ok());
  g.set_session_id("free");
  ASSERT_TRUE(stub_->GetSession(Ctx(kBeta).get(), g, &beta).ok());
  EXPECT_EQ(alpha.resources().memory_bytes(), 256 << 20);  // default 1 GiB, capped
  EXPECT_EQ(alpha.resources().pids(), 64);                 // default 256, capped
  EXPECT_EQ(alpha.resources().cpus(), 1.0);                // no cap: the default
  EXPECT_EQ(beta.resources().memory_bytes(), int64_t{1} << 30);
  EXPECT_EQ(beta.resources().pids(), 256);
  // Asking below the cap gets what was asked.
  pb::SessionSpec small = Spec("local");
  small.mutable_resources()->set_memory_bytes(128 << 20);
  ASSERT_TRUE(Start(kAlpha, "small", small).ok());
  g.set_session_id("small");
  ASSERT_TRUE(stub_->GetSession(Ctx(kAlpha).get(), g, &alpha).ok());
  EXPECT_EQ(alpha.resources().memory_bytes(), 128 << 20);
  // The cap is what the sandbox's cgroup enforces (where cgroups are on).
  g.set_session_id("capped");
  ASSERT_TRUE(stub_->GetSession(Ctx(kAlpha).get(), g, &alpha).ok());
  for (const std::string& f :
       {"/sys/fs/cgroup/sandbox-broker/" + alpha.sandbox_id() + "/memory.max",
        "/sys/fs/cgroup/memory/sandbox-broker/" + alpha.sandbox_id() + "/memory.limit_in_bytes"}) {
    std::ifstream in(f);
    int64_t limit = -1;
    if (in >> limit) {
      EXPECT_EQ(limit, 256 << 20) << f;
    }
  }
  // A restart keeps the cap: the session's row carries the ceiling it was
  // created under, so the adopted sandbox gets the same limits, not the
  // provider's default.
  const std::string id = alpha.sandbox_id();
  server_.reset();  // a graceful stop: the sandboxes stay for the next start
  Start(R"({"tenants": {"alpha": {"resources": {"memory_bytes": 268435456, "pids": 64}}}})");
  ASSERT_TRUE(Run(kAlpha, "capped", "print(1)", nullptr, 0, Spec("local")).ok());
  ASSERT_TRUE(stub_->GetSession(Ctx(kAlpha).get(), g, &alpha).ok());
  EXPECT_EQ(alpha.sandbox_id(), id);  // adopted
  EXPECT_EQ(alpha.resources().memory_bytes(), 256 << 20);
  EXPECT_EQ(alpha.resources().pids(), 64);
}

TEST_F(OperatorsTest, RunRateAndConcurrentRuns) {
  Start(R"({"tenants": {"alpha": {"run_rate": 3}, "beta": {"max_concurrent_runs": 1}}})");
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Run(kAlpha, "a", "x").ok()) << i;
  grpc::Status s = Run(kAlpha, "a", "x");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(), "tenant alpha: run_rate (3 per minute) exceeded: retry in 20s");
  clock_.Advance(absl::Seconds(20));
  EXPECT_TRUE(Run(kAlpha, "a", "x").ok());

  // beta: one run at a time. The first waits for a file the test writes.
  pb::RunResult first;
  grpc::Status first_status;
  std::thread t([&] {
    pb::ShellRequest req;
    req.set_session_id("slow");
    req.set_command("while [ ! -e go ]; do sleep 0.02; done; echo done");
    *req.mutable_spec() = Spec("local");
    first_status = stub_->Shell(Ctx(kBeta).get(), req, &first);
  });
  for (int i = 0; i < 2000 && server_->policy()->running("beta") == 0; ++i) usleep(5000);
  ASSERT_EQ(server_->policy()->running("beta"), 1);
  s = Run(kBeta, "other", "x");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(),
            "tenant beta: max_concurrent_runs (1) reached: wait for a run to finish");
  EXPECT_FALSE(server_->sessions()->Get("beta", "other").ok());  // not created
  pb::WriteFileRequest w;
  w.set_session_id("slow");
  w.set_path("go");
  pb::WriteFileResponse wr;
  ASSERT_TRUE(stub_->WriteFile(Ctx(kBeta).get(), w, &wr).ok());  // files are not runs
  t.join();
  ASSERT_TRUE(first_status.ok()) << first_status.error_message();
  EXPECT_EQ(first.output(), "done\n");
  EXPECT_TRUE(Run(kBeta, "other", "x").ok());
  auto usage = Admin()->GetUsage();
  ASSERT_TRUE(usage.ok());
  int64_t refusals = 0;
  for (const auto& u : usage->usage()) refusals += u.quota_refusals();
  EXPECT_EQ(refusals, 2);
}

// CPU seconds from the local sandbox's cgroup accounting, read just before
// its destroy, are metered into the tenant's usage and the counter.
TEST_F(OperatorsTest, UsageCountsCpuSecondsAtClose) {
  Start(R"({"admin_listen": "127.0.0.1:0"})");
  pb::RunResult r;
  ASSERT_TRUE(Run(kAlpha, "burn",
                  "import time\nt = time.process_time()\n"
                  "while time.process_time() - t < 0.3:\n    pass\nprint('burnt')",
                  &r, 30, Spec("local"))
                  .ok());
  ASSERT_EQ(r.output(), "burnt\n");
  pb::GetSessionRequest g;
  g.set_session_id("burn");
  pb::SessionInfo info;
  ASSERT_TRUE(stub_->GetSession(Ctx(kAlpha).get(), g, &info).ok());
  if (info.usage().cpu_seconds() == 0) GTEST_SKIP() << "no cgroup CPU accounting here";
  auto before = Admin()->GetUsage("alpha");
  ASSERT_TRUE(before.ok());
  ASSERT_EQ(before->usage_size(), 1);
  EXPECT_EQ(before->usage(0).cpu_seconds(), 0);  // counted at close
  pb::CloseSessionRequest c;
  c.set_session_id("burn");
  pb::CloseSessionResponse cr;
  ASSERT_TRUE(stub_->CloseSession(Ctx(kAlpha).get(), c, &cr).ok());
  auto usage = Admin()->GetUsage("alpha");
  ASSERT_TRUE(usage.ok()) << usage.status();
  ASSERT_EQ(usage->usage_size(), 1);
  EXPECT_EQ(usage->usage(0).provider(), "local");
  const double cpu = usage->usage(0).cpu_seconds();
  EXPECT_GE(cpu, 0.25) << cpu;
  EXPECT_GE(cpu, info.usage().cpu_seconds());
  EXPECT_LT(cpu, 30) << cpu;

  HttpClient http("test");
  HttpRequest req;
  req.url = absl::StrCat("http://127.0.0.1:", server_->admin_port(), "/metrics");
  auto scraped = http.Send(req);
  ASSERT_TRUE(scraped.ok());
  bool found = false;
  std::istringstream in(scraped->body);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("sandbox_broker_tenant_cpu_seconds_total{", 0) == 0 &&
        line.find("tenant=\"alpha\"") != std::string::npos &&
        line.find("provider=\"local\"") != std::string::npos) {
      found = true;
      EXPECT_DOUBLE_EQ(std::stod(line.substr(line.rfind(' ') + 1)), cpu) << line;
    }
  }
  EXPECT_TRUE(found) << scraped->body;
}

TEST_F(OperatorsTest, ListToolsListsOnlyAllowedProviders) {
  Start(R"({"tenants": {"alpha": {"providers": ["echo"]}}})");
  pb::ListToolsRequest req;
  pb::ListToolsResponse resp;
  ASSERT_TRUE(stub_->ListTools(Ctx(kAlpha).get(), req, &resp).ok());
  ASSERT_EQ(resp.tools_size(), 4);
  for (const auto& t : resp.tools()) EXPECT_EQ(t.name().rfind("sandbox_echo_", 0), 0u) << t.name();
  resp.Clear();
  ASSERT_TRUE(stub_->ListTools(Ctx(kBeta).get(), req, &resp).ok());
  EXPECT_EQ(resp.tools_size(), 8);  // echo and local
  req.set_provider("local");
  grpc::Status s = stub_->ListTools(Ctx(kAlpha).get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(), "tenant alpha: provider \"local\" not allowed (allowed: echo)");
  // A model calling a tool of a provider not allowed gets a tool error.
  pb::CallToolRequest call;
  call.set_session_id("t");
  call.set_name("sandbox_local_run");
  call.set_arguments_json(R"j({"code": "print(1)"})j");
  pb::CallToolResponse cr;
  ASSERT_TRUE(stub_->CallTool(Ctx(kAlpha).get(), call, &cr).ok());
  EXPECT_TRUE(cr.is_error());
  EXPECT_NE(cr.content().find("provider \"local\" not allowed"), std::string::npos) << cr.content();
}

TEST_F(OperatorsTest, AdminApiNeedsAnAdminToken) {
  Start();
  struct Who {
    std::string token;
    grpc::StatusCode code;
  } whos[] = {{"", grpc::StatusCode::UNAUTHENTICATED},
              {"not-a-known-token", grpc::StatusCode::UNAUTHENTICATED},
              {kAlpha, grpc::StatusCode::PERMISSION_DENIED},
              {kAdmin, grpc::StatusCode::OK}};
  for (const auto& w : whos) {
    auto a = Admin(w.token);
    pb::ListAllSessionsRequest list;
    EXPECT_EQ(static_cast<int>(a->ListAllSessions(list).status().code()), static_cast<int>(w.code))
        << w.token;
    auto get = a->GetSession("alpha", "none");
    EXPECT_EQ(
        static_cast<int>(get.status().code()),
        static_cast<int>(w.code == grpc::StatusCode::OK ? grpc::StatusCode::NOT_FOUND : w.code));
    pb::CloseSessionsRequest close;
    close.set_tenant("alpha");
    EXPECT_EQ(static_cast<int>(a->CloseSessions(close).status().code()), static_cast<int>(w.code));
    EXPECT_EQ(static_cast<int>(a->SetTenantDisabled("gamma", false, false).status().code()),
              static_cast<int>(w.code));
    EXPECT_EQ(static_cast<int>(a->GetUsage().status().code()), static_cast<int>(w.code));
    EXPECT_EQ(static_cast<int>(a->ReloadConfig().status().code()), static_cast<int>(w.code));
  }
  // Every admin call is audited, refused ones too, with the admin's name.
  auto lines = Audit("admin.GetUsage");
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0]["code"], "UNAUTHENTICATED");
  EXPECT_EQ(lines[2]["code"], "PERMISSION_DENIED");
  EXPECT_EQ(lines[3]["code"], "OK");
  EXPECT_EQ(lines[3]["admin"], "ops");
}

TEST_F(OperatorsTest, AdminListsGetsClosesAndDisablesAcrossTenants) {
  Start();
  auto labeled = [](const std::string& team) {
    pb::SessionSpec s;
    (*s.mutable_labels())["team"] = team;
    return s;
  };
  ASSERT_TRUE(Start(kAlpha, "a1", labeled("x")).ok());
  ASSERT_TRUE(Start(kAlpha, "a2", labeled("y")).ok());
  ASSERT_TRUE(Start(kBeta, "b1", labeled("x")).ok());
  auto admin = Admin();
  auto all = admin->ListAllSessions({});
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].tenant() + "/" + (*all)[0].session_id(), "alpha/a1");
  EXPECT_EQ((*all)[1].tenant() + "/" + (*all)[1].session_id(), "alpha/a2");
  EXPECT_EQ((*all)[2].tenant() + "/" + (*all)[2].session_id(), "beta/b1");
  EXPECT_EQ((*all)[2].provider(), "echo");
  // Paged: one per page, three pages.
  pb::ListAllSessionsRequest paged;
  paged.set_page_size(1);
  pb::ListAllSessionsResponse page;
  std::vector<std::string> seen;
  do {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", std::string("Bearer ") + kAdmin);
    page.Clear();
    ASSERT_TRUE(admin_stub_->ListAllSessions(&ctx, paged, &page).ok());
    for (const auto& s : page.sessions()) seen.push_back(s.session_id());
    paged.set_page_token(page.next_page_token());
  } while (!page.next_page_token().empty());
  EXPECT_EQ(seen, (std::vector<std::string>{"a1", "a2", "b1"}));
  pb::ListAllSessionsRequest f;
  f.set_tenant("beta");
  EXPECT_EQ(admin->ListAllSessions(f)->size(), 1u);
  f.Clear();
  (*f.mutable_labels())["team"] = "x";
  EXPECT_EQ(admin->ListAllSessions(f)->size(), 2u);
  f.Clear();
  f.set_provider("local");
  EXPECT_EQ(admin->ListAllSessions(f)->size(), 0u);
  f.Clear();
  f.set_state(pb::SESSION_STATE_READY);
  EXPECT_EQ(admin->ListAllSessions(f)->size(), 3u);
  f.Clear();
  f.set_page_token("garbage");
  EXPECT_EQ(admin->ListAllSessions(f).status().code(), absl::StatusCode::kInvalidArgument);

  auto got = admin->GetSession("beta", "b1");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->tenant(), "beta");
  EXPECT_EQ(admin->GetSession("alpha", "b1").status().code(), absl::StatusCode::kNotFound);

  pb::CloseSessionsRequest close;
  EXPECT_EQ(admin->CloseSessions(close).status().code(), absl::StatusCode::kInvalidArgument);
  (*close.mutable_labels())["team"] = "x";
  EXPECT_EQ(*admin->CloseSessions(close), 2);  // a1 and b1
  close.Clear();
  close.set_tenant("alpha");
  close.set_session_id("a2");
  EXPECT_EQ(*admin->CloseSessions(close), 1);
  EXPECT_EQ(*admin->CloseSessions(close), 0);
  EXPECT_EQ(server_->sessions()->size(), 0);
  auto closed = Audit("session.closed");
  ASSERT_EQ(closed.size(), 3u);
  for (const auto& c : closed) EXPECT_EQ(c["reason"], "admin");

  // Disable (closing its sessions), then enable.
  ASSERT_TRUE(Run(kAlpha, "a3", "x").ok());
  EXPECT_EQ(*admin->SetTenantDisabled("alpha", true, true), 1);
  grpc::Status s = Run(kAlpha, "a3", "x");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(), "tenant alpha: disabled (by an operator)");
  EXPECT_TRUE(Run(kBeta, "b2", "x").ok());
  // The switch survives a reload.
  ASSERT_TRUE(admin->ReloadConfig().ok());
  EXPECT_EQ(Run(kAlpha, "a3", "x").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(*admin->SetTenantDisabled("alpha", false, false), 0);
  EXPECT_TRUE(Run(kAlpha, "a3", "x").ok());
  auto disabled = Audit("admin.SetTenantDisabled");
  ASSERT_EQ(disabled.size(), 2u);
  EXPECT_EQ(disabled[0]["tenant"], "alpha");
  EXPECT_EQ(disabled[0]["disabled"], "true");
  EXPECT_EQ(disabled[0]["closed"], "1");
  EXPECT_EQ(disabled[0]["admin"], "ops");
}

TEST_F(OperatorsTest, UsageMatchesAKnownWorkload) {
  Start(R"({"admin_listen": "127.0.0.1:0", "tenants": {"alpha": {"max_sessions": 2}}})");
  ASSERT_TRUE(Run(kAlpha, "s1", "12345").ok());
  ASSERT_TRUE(Run(kAlpha, "s1", "1234567").ok());
  ASSERT_TRUE(Run(kAlpha, "s2", "12345678901").ok());
  EXPECT_EQ(Run(kAlpha, "s3", "x").error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  pb::WriteFileRequest w;
  w.set_session_id("s1");
  w.set_path("f");
  w.set_contents(std::string(100, 'z'));
  pb::WriteFileResponse wr;
  ASSERT_TRUE(stub_->WriteFile(Ctx(kAlpha).get(), w, &wr).ok());
  pb::ReadFileRequest rd;
  rd.set_session_id("s1");
  rd.set_path("f");
  pb::ReadFileResponse rr;
  ASSERT_TRUE(stub_->ReadFile(Ctx(kAlpha).get(), rd, &rr).ok());
  rd.set_path("missing");
  ASSERT_TRUE(stub_->ReadFile(Ctx(kAlpha).get(), rd, &rr).ok());
  clock_.Advance(absl::Seconds(30));
  pb::CloseSessionRequest c;
  c.set_session_id("s1");
  pb::CloseSessionResponse cresp;
  ASSERT_TRUE(stub_->CloseSession(Ctx(kAlpha).get(), c, &cresp).ok());
  ASSERT_TRUE(Run(kBeta, "b", "abc").ok());

  auto usage = Admin()->GetUsage("alpha");
  ASSERT_TRUE(usage.ok()) << usage.status();
  ASSERT_EQ(usage->usage_size(), 1);
  const pb::TenantUsage& u = usage->usage(0);
  EXPECT_EQ(u.tenant(), "alpha");
  EXPECT_EQ(u.provider(), "echo");
  EXPECT_EQ(u.sessions_created(), 2);
  EXPECT_EQ(u.runs(), 3);
  EXPECT_EQ(u.output_bytes(), 5 + 7 + 11);
  EXPECT_EQ(u.file_transfer_bytes(), 200);
  EXPECT_DOUBLE_EQ(u.sandbox_seconds(), 30);  // s1 closed after 30 s; s2 still open
  EXPECT_DOUBLE_EQ(u.run_seconds(), 0);       // the fake clock stood still during runs
  EXPECT_EQ(u.quota_refusals(), 1);
  EXPECT_EQ(u.oom_kills(), 0);
  EXPECT_EQ(usage->since().seconds(), 1800000000);
  auto all = Admin()->GetUsage();
  ASSERT_EQ(all->usage_size(), 2);
  EXPECT_EQ(all->usage(1).tenant(), "beta");
  EXPECT_EQ(all->usage(1).runs(), 1);

  HttpClient http("test");
  HttpRequest req;
  req.url = absl::StrCat("http://127.0.0.1:", server_->admin_port(), "/metrics");
  auto scraped = http.Send(req);
  ASSERT_TRUE(scraped.ok());
  auto has = [&](const std::string& metric, const std::string& tenant, const std::string& value) {
    std::istringstream in(scraped->body);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(metric + "{", 0) == 0 &&
          line.find("tenant=\"" + tenant + "\"") != std::string::npos &&
          line.find("provider=\"echo\"") != std::string::npos &&
          line.substr(line.rfind(' ') + 1) == value) {
        return true;
      }
    }
    return false;
  };
  EXPECT_TRUE(has("sandbox_broker_tenant_runs_total", "alpha", "3")) << scraped->body;
  EXPECT_TRUE(has("sandbox_broker_tenant_sessions_created_total", "alpha", "2"));
  EXPECT_TRUE(has("sandbox_broker_tenant_output_bytes_total", "alpha", "23"));
  EXPECT_TRUE(has("sandbox_broker_tenant_file_transfer_bytes_total", "alpha", "200"));
  EXPECT_TRUE(has("sandbox_broker_tenant_sandbox_seconds_total", "alpha", "30"));
  EXPECT_TRUE(has("sandbox_broker_tenant_quota_refusals_total", "alpha", "1"));
  EXPECT_TRUE(has("sandbox_broker_tenant_runs_total", "beta", "1"));
}

// Usage since the store was created survives a restart (the broker flushes
// its buffered usage at shutdown and reloads it at start); usage since start
// begins again from zero.
TEST_F(OperatorsTest, UsageSinceTheStoreSurvivesARestart) {
  Start();
  ASSERT_TRUE(Run(kAlpha, "s1", "12345").ok());
  ASSERT_TRUE(Run(kAlpha, "s1", "123").ok());
  ASSERT_TRUE(Run(kBeta, "b", "ab").ok());
  auto first = Admin()->GetUsage("alpha");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->usage_size(), 1);
  ASSERT_EQ(first->since_store_size(), 1);  // a new store: the same as since start
  EXPECT_EQ(first->since_store(0).tenant(), "alpha");
  EXPECT_EQ(first->since_store(0).runs(), 2);
  EXPECT_EQ(first->since_store(0).output_bytes(), 8);
  ASSERT_TRUE(first->has_store_created());
  const int64_t created = first->store_created().seconds();
  EXPECT_GT(created, 0);

  server_.reset();  // a graceful stop
  Start();
  auto second = Admin()->GetUsage("alpha");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->usage_size(), 0) << "since start resets";
  ASSERT_EQ(second->since_store_size(), 1);
  EXPECT_EQ(second->since_store(0).provider(), "echo");
  EXPECT_EQ(second->since_store(0).runs(), 2);
  EXPECT_EQ(second->since_store(0).output_bytes(), 8);
  EXPECT_EQ(second->since_store(0).sessions_created(), 1);
  EXPECT_EQ(second->store_created().seconds(), created);

  ASSERT_TRUE(Run(kAlpha, "s2", "1").ok());
  auto third = Admin()->GetUsage("alpha");
  ASSERT_TRUE(third.ok());
  ASSERT_EQ(third->usage_size(), 1);
  EXPECT_EQ(third->usage(0).runs(), 1);
  EXPECT_EQ(third->usage(0).sessions_created(), 1);
  ASSERT_EQ(third->since_store_size(), 1);  // not flushed yet, and counted
  EXPECT_EQ(third->since_store(0).runs(), 3);
  EXPECT_EQ(third->since_store(0).sessions_created(), 2);
  auto all = Admin()->GetUsage();
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->usage_size(), 1);
  ASSERT_EQ(all->since_store_size(), 2);
  EXPECT_EQ(all->since_store(1).tenant(), "beta");
  EXPECT_EQ(all->since_store(1).runs(), 1);
}

TEST_F(OperatorsTest, AuditTrailCoversEveryEventAndHoldsNoSecrets) {
  std::vector<std::string> logs;
  absl::Mutex logs_mu;
  SetLogSink([&](absl::string_view l) {
    absl::MutexLock lock(&logs_mu);
    logs.emplace_back(l);
  });
  Start(R"({"tenants": {"beta": {"providers": ["local"], "default_provider": "local"}}})");
  // Marked secrets: in code, env, file contents and tokens.
  pb::RunRequest run;
  run.set_session_id("audited");
  run.set_code("print('SECRET-CODE-7731')");
  (*run.mutable_env())["API_KEY"] = "SECRET-ENV-7731";
  (*run.mutable_spec()->mutable_env())["OTHER"] = "SECRET-SPECENV-7731";
  pb::RunResult rr;
  auto ctx = Ctx(kAlpha);
  ctx->AddMetadata("x-request-id", "req-audit-1");
  ASSERT_TRUE(stub_->Run(ctx.get(), run, &rr).ok());
  EXPECT_NE(rr.output().find("SECRET-CODE-7731"), std::string::npos);
  pb::WriteFileRequest w;
  w.set_session_id("audited");
  w.set_path("secret.txt");
  w.set_contents("SECRET-FILE-7731");
  pb::WriteFileResponse wr;
  ASSERT_TRUE(stub_->WriteFile(Ctx(kAlpha).get(), w, &wr).ok());
  pb::CloseSessionRequest c;
  c.set_session_id("audited");
  pb::CloseSessionResponse cr;
  ASSERT_TRUE(stub_->CloseSession(Ctx(kAlpha).get(), c, &cr).ok());
  ASSERT_TRUE(Run(kAlpha, "idle-one", "x").ok());
  clock_.Advance(absl::Seconds(300));
  EXPECT_EQ(server_->sessions()->RunOnce(), 1);
  EXPECT_EQ(Run(kBeta, "b", "SECRET-CODE-7731", nullptr, 0, Spec("echo")).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  ASSERT_TRUE(Admin()->ListAllSessions({}).ok());
  ASSERT_TRUE(Admin()->ReloadConfig().ok());
  SetLogSink(nullptr);

  auto created = Audit("session.created");
  ASSERT_EQ(created.size(), 2u);
  EXPECT_EQ(created[0]["tenant"], "alpha");
  EXPECT_EQ(created[0]["session_id"], "audited");
  EXPECT_EQ(created[0]["provider"], "echo");
  EXPECT_NE(created[0]["sandbox_id"], "-");
  EXPECT_EQ(created[0]["request_id"], "req-audit-1");
  auto closed = Audit("session.closed");
  ASSERT_EQ(closed.size(), 2u);
  EXPECT_EQ(closed[0]["reason"], "client");
  EXPECT_EQ(closed[0]["sandbox_id"], created[0]["sandbox_id"]);
  EXPECT_NE(closed[0]["request_id"], "-");
  EXPECT_EQ(closed[1]["reason"], "idle");
  EXPECT_EQ(closed[1]["request_id"], "-");  // the reaper: no call
  auto refused = Audit("policy.refused");
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0]["tenant"], "beta");
  EXPECT_EQ(refused[0]["session_id"], "b");  // the session the call was for
  EXPECT_EQ(refused[0]["code"], "PERMISSION_DENIED");
  EXPECT_EQ(Audit("admin.ListAllSessions").size(), 1u);
  EXPECT_EQ(Audit("admin.ReloadConfig").size(), 1u);
  auto reload = Audit("config.reload");
  ASSERT_EQ(reload.size(), 1u);
  EXPECT_EQ(reload[0]["result"], "applied");
  EXPECT_EQ(reload[0]["source"], "admin:ops");
  for (const auto& line : Audit("session.created")) EXPECT_EQ(line["audit"], true);

  std::string everything = AllAudit();
  {
    absl::MutexLock lock(&logs_mu);
    for (const auto& l : logs) everything += l;
  }
  for (const char* secret : {"SECRET-CODE-7731", "SECRET-ENV-7731", "SECRET-SPECENV-7731",
                             "SECRET-FILE-7731", kAlpha, kBeta, kAdmin}) {
    EXPECT_EQ(everything.find(secret), std::string::npos) << secret;
  }
}

TEST_F(OperatorsTest, ReloadByRpcSwapsPolicyAndRejectsABrokenFileWhole) {
  Start();
  pb::RunResult before;
  ASSERT_TRUE(Run(kAlpha, "a", "print(6 * 7)", &before, 0, Spec("local")).ok());
  EXPECT_EQ(before.output(), "42\n");  // local is allowed before the reload
  nlohmann::json next = nlohmann::json::parse(R"({
      "listen": "127.0.0.1:1", "max_output_bytes": 1,
      "auth": {"tokens": {"token-gamma-789": "gamma"}},
      "tenants": {"alpha": {"providers": ["echo"]}}})");
  WriteConfig(next);
  auto r = Admin()->ReloadConfig();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generation(), 2);
  EXPECT_EQ(std::vector<std::string>(r->needs_restart().begin(), r->needs_restart().end()),
            (std::vector<std::string>{"listen", "max_output_bytes"}));
  EXPECT_TRUE(Run("token-gamma-789", "g", "x").ok());
  EXPECT_EQ(Run(kAlpha, "a2", "x", nullptr, 0, Spec("local")).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  pb::RunResult out;
  ASSERT_TRUE(Run(kAlpha, "a3", "abcdef", &out).ok());
  EXPECT_EQ(out.output(), "abcdef");  // max_output_bytes needs a restart: ignored

  // Broken: rejected whole; the old policy and tokens stay.
  next["tenants"]["alpha"]["max_sessoins"] = 1;
  next["auth"]["tokens"] = {{"token-delta-000", "delta"}};
  WriteConfig(next);
  auto bad = Admin()->ReloadConfig();
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "config rejected, the old one stays: tenants.alpha.max_sessoins: unknown key");
  EXPECT_TRUE(Run("token-gamma-789", "g", "x").ok());
  EXPECT_EQ(Run("token-delta-000", "d", "x").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Run(kAlpha, "a2", "x", nullptr, 0, Spec("local")).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  WriteText(ConfigPath(), "{not json");
  EXPECT_EQ(Admin()->ReloadConfig().status().message(),
            "config rejected, the old one stays: config: not valid JSON");
  // A policy naming a provider the broker does not run needs a restart.
  next = nlohmann::json::parse(R"({"providers": {"daytona": {}},
                                   "tenants": {"alpha": {"providers": ["daytona"], "default_provider": "daytona"}}})");
  WriteConfig(next);
  auto unknown = Admin()->ReloadConfig();
  EXPECT_EQ(unknown.status().message(),
            "config rejected, the old one stays: tenants.alpha.providers: provider \"daytona\" "
            "is not running (a new provider needs a restart)");
  auto reloads = Audit("config.reload");
  ASSERT_EQ(reloads.size(), 4u);
  EXPECT_EQ(reloads[0]["result"], "applied");
  EXPECT_EQ(reloads[0]["needs_restart"], "listen,max_output_bytes");
  EXPECT_EQ(reloads[1]["result"], "rejected");
  EXPECT_EQ(reloads[1]["reason"],
            "config rejected, the old one stays: tenants.alpha.max_sessoins: unknown key");
  EXPECT_EQ(server_->policy()->Current()->generation, 2);
}

TEST_F(OperatorsTest, ReloadOnTokensFileChangeAndATokenRevokedMidSession) {
  const std::string tokens_file = dir_.path() + "/tokens.json";
  WriteText(tokens_file, R"({"token-file-0001": "filer"})");
  Start(absl::StrCat(R"({"auth": {"tokens_file": ")", tokens_file, R"("}})"));
  EXPECT_FALSE(server_->reloader()->CheckTokensFile());  // unchanged
  // filer has a run in flight on the local provider when its token goes.
  pb::ShellRequest req;
  req.set_session_id("long");
  req.set_command("while [ ! -e go ]; do sleep 0.02; done; echo finished");
  *req.mutable_spec() = Spec("local");
  pb::RunResult inflight;
  grpc::Status inflight_status;
  std::thread t(
      [&] { inflight_status = stub_->Shell(Ctx("token-file-0001").get(), req, &inflight); });
  // Admitted, and its sandbox created (a container takes a moment to start).
  auto ready = [&] {
    auto v = server_->sessions()->Get("filer", "long");
    return server_->policy()->running("filer") == 1 && v.ok() && !v->sandbox_id.empty();
  };
  for (int i = 0; i < 2000 && !ready(); ++i) usleep(5000);
  ASSERT_EQ(server_->policy()->running("filer"), 1);
  // Admitted is not yet created: the run's session gets its sandbox after
  // the store's write-ahead (durable sessions), so wait for it to exist.
  auto before = server_->sessions()->Get("filer", "long");
  for (int i = 0; i < 2000 && (!before.ok() || before->sandbox_id.empty()); ++i) {
    usleep(5000);
    before = server_->sessions()->Get("filer", "long");
  }
  ASSERT_TRUE(before.ok());
  ASSERT_FALSE(before->sandbox_id.empty());

  WriteText(tokens_file, R"({"token-file-0002": "filer"})");
  EXPECT_TRUE(server_->reloader()->CheckTokensFile());
  EXPECT_FALSE(server_->reloader()->CheckTokensFile());
  // The revoked token is refused on its next call; the new one sees the
  // same session, and the run in flight goes on.
  pb::WriteFileRequest w;
  w.set_session_id("long");
  w.set_path("go");
  pb::WriteFileResponse wr;
  EXPECT_EQ(stub_->WriteFile(Ctx("token-file-0001").get(), w, &wr).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  ASSERT_TRUE(stub_->WriteFile(Ctx("token-file-0002").get(), w, &wr).ok());
  t.join();
  ASSERT_TRUE(inflight_status.ok()) << inflight_status.error_message();
  EXPECT_EQ(inflight.output(), "finished\n");
  auto after = server_->sessions()->Get("filer", "long");
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->sandbox_id, before->sandbox_id);
  EXPECT_TRUE(Run(kAlpha, "a", "x").ok());  // config tokens stay

  // A broken tokens file: rejected, the old tokens stay; tried once per change.
  WriteText(tokens_file, "{broken");
  EXPECT_TRUE(server_->reloader()->CheckTokensFile());
  EXPECT_FALSE(server_->reloader()->CheckTokensFile());
  EXPECT_TRUE(Run("token-file-0002", "long", "x").ok());
  auto reloads = Audit("config.reload");
  ASSERT_EQ(reloads.size(), 2u);
  EXPECT_EQ(reloads[0]["source"], "tokens_file");
  EXPECT_EQ(reloads[0]["result"], "applied");
  EXPECT_EQ(reloads[1]["result"], "rejected");
  EXPECT_EQ(reloads[1]["reason"],
            "config rejected, the old one stays: auth.tokens_file: must hold a JSON object of "
            "token -> tenant");
}

// ---- a real daemon process ------------------------------------------------

class Daemon {
 public:
  bool Start(const std::string& config, const std::string& log) {
    log_ = log;
    pid_ = fork();
    if (pid_ == 0) {
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(fd, 2);
      execl(BROKERD_PATH, BROKERD_PATH, "--config", config.c_str(), nullptr);
      _exit(127);
    }
    for (int i = 0; i < 1000; ++i) {  // up to 10 s for "broker.serving"
      std::string text = ReadText(log);
      size_t at = text.find("broker.serving");
      if (at != std::string::npos) {
        size_t addr = text.find("address=127.0.0.1:", at);
        if (addr == std::string::npos) return false;
        port_ = atoi(text.c_str() + addr + strlen("address=127.0.0.1:"));
        return port_ > 0;
      }
      usleep(10000);
    }
    return false;
  }
  int Stop() {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  ~Daemon() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }
  int port() const { return port_; }
  std::string log() const { return ReadText(log_); }

 private:
  pid_t pid_ = 0;
  int port_ = 0;
  std::string log_;
};

TEST(OperatorsDaemonTest, ReloadsOnSighupAndOnATokensFileChange) {
  TempDir dir;
  const std::string config = dir.path() + "/config.json", tokens = dir.path() + "/tokens.json";
  nlohmann::json cfg = {{"listen", "127.0.0.1:0"},
                        {"state", {{"path", dir.path() + "/state.db"}}},
                        {"default_provider", "echo"},
                        {"providers", {{"echo", nlohmann::json::object()}}},
                        {"auth",
                         {{"tokens", {{"token-first-111", "one"}}},
                          {"tokens_file", tokens},
                          {"admin_tokens", {{"admin-token-999", "ops"}}}}}};
  WriteText(tokens, R"({"token-filed-222": "two"})");
  WriteText(config, cfg.dump());
  Daemon d;
  ASSERT_TRUE(d.Start(config, dir.path() + "/brokerd.log")) << d.log();
  auto channel =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", d.port()), grpc::InsecureChannelCredentials());
  auto run_ok = [&](const std::string& token) {
    RemoteSandbox sb(pb::SandboxBroker::NewStub(channel), "s", token);
    return sb.Run("x").ok();
  };
  // Polls a state (the reload happens asynchronously to the signal).
  auto eventually = [](const std::function<bool()>& f) {
    for (int i = 0; i < 1000; ++i) {
      if (f()) return true;
      usleep(10000);
    }
    return false;
  };
  EXPECT_TRUE(run_ok("token-first-111"));
  EXPECT_TRUE(run_ok("token-filed-222"));
  EXPECT_FALSE(run_ok("token-sighup-333"));

  cfg["auth"]["tokens"]["token-sighup-333"] = "three";
  WriteText(config, cfg.dump());
  kill(d.pid(), SIGHUP);
  EXPECT_TRUE(eventually([&] { return run_ok("token-sighup-333"); })) << d.log();

  // A broken config: logged, the old one stays.
  WriteText(config, "{\"listen\": ");
  kill(d.pid(), SIGHUP);
  EXPECT_TRUE(
      eventually([&] { return d.log().find("config.reload_rejected") != std::string::npos; }));
  EXPECT_TRUE(run_ok("token-sighup-333"));
  EXPECT_NE(d.log().find("config: not valid JSON"), std::string::npos);

  // The watched tokens file (polled every second).
  WriteText(config, cfg.dump());
  WriteText(tokens, R"({"token-filed-444": "two"})");
  EXPECT_TRUE(eventually([&] { return run_ok("token-filed-444"); })) << d.log();
  EXPECT_FALSE(run_ok("token-filed-222"));
  // The audit log (stderr by default) recorded each reload.
  const std::string log = d.log();
  EXPECT_NE(log.find("\"source\":\"sighup\""), std::string::npos);
  EXPECT_NE(log.find("\"source\":\"tokens_file\""), std::string::npos);
  EXPECT_EQ(log.find("token-sighup-333"), std::string::npos);
  EXPECT_EQ(d.Stop(), 0);
}

// ---- sandboxctl admin -----------------------------------------------------

struct Cli {
  int code;
  std::string out;
};

Cli Sandboxctl(int port, const std::string& args, const std::string& env = "") {
  std::string cmd =
      absl::StrCat(env, " ", SANDBOXCTL_PATH, " --addr 127.0.0.1:", port, " ", args, " 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int status = pclose(p);
  return {WEXITSTATUS(status), out};
}

TEST_F(OperatorsTest, SandboxctlAdminCommands) {
  Start();
  pb::SessionSpec labeled;
  (*labeled.mutable_labels())["team"] = "x";
  ASSERT_TRUE(Start(kAlpha, "a1", labeled).ok());
  ASSERT_TRUE(Run(kBeta, "b1", "hello").ok());
  const int port = server_->port();
  const std::string admin = absl::StrCat("--admin-token ", kAdmin, " ");

  Cli r = Sandboxctl(port, admin + "admin sessions");
  EXPECT_EQ(r.code, 0) << r.out;
  std::istringstream lines(r.out);
  std::string header, row1, row2;
  std::getline(lines, header);
  std::getline(lines, row1);
  std::getline(lines, row2);
  EXPECT_EQ(header.rfind("TENANT  SESSION  PROVIDER  STATE  SANDBOX", 0), 0u) << r.out;
  EXPECT_EQ(row1.rfind("alpha   a1       echo      ready  echo-", 0), 0u) << r.out;
  EXPECT_NE(row1.find("team=x"), std::string::npos);
  EXPECT_EQ(row2.rfind("beta    b1       echo      ready", 0), 0u) << r.out;

  r = Sandboxctl(port, admin + "--json admin sessions --tenant beta");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.size(), 1u);
  EXPECT_EQ(j[0]["tenant"], "beta");
  EXPECT_EQ(j[0]["session_id"], "b1");

  r = Sandboxctl(port, admin + "admin usage --tenant beta");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("TENANT  PROVIDER  SESSIONS  RUNS"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("beta    echo      1         1 "), std::string::npos) << r.out;
  r = Sandboxctl(port, admin + "admin usage --json");
  ASSERT_EQ(r.code, 0);
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["usage"].size(), 2u);

  r = Sandboxctl(port, admin + "admin disable alpha --close-sessions");
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out, "tenant alpha disabled; closed 1 sessions\n");
  EXPECT_EQ(Run(kAlpha, "a1", "x").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  r = Sandboxctl(port, admin + "admin enable alpha");
  EXPECT_EQ(r.out, "tenant alpha enabled\n");
  EXPECT_TRUE(Run(kAlpha, "a1", "x").ok());

  r = Sandboxctl(port, admin + "admin close --tenant beta b1");
  EXPECT_EQ(r.out, "closed 1 session\n");
  r = Sandboxctl(port, admin + "--json admin close --label team=none");
  EXPECT_EQ(r.out, "{\"closed\":0}\n");
  r = Sandboxctl(port, admin + "admin reload");
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out, "reloaded: generation 2\n");

  // The admin token from the environment; a tenant token is refused.
  r = Sandboxctl(port, "admin usage", absl::StrCat("SANDBOX_BROKER_ADMIN_TOKEN=", kAdmin));
  EXPECT_EQ(r.code, 0);
  r = Sandboxctl(port, "admin usage", absl::StrCat("SANDBOX_BROKER_ADMIN_TOKEN=", kAlpha));
  EXPECT_EQ(r.code, 69);
  EXPECT_EQ(r.out,
            "sandboxctl: PERMISSION_DENIED: the Admin API needs an admin token, not a tenant "
            "token\n");
  r = Sandboxctl(port, "admin usage", "SANDBOX_BROKER_ADMIN_TOKEN=");
  EXPECT_EQ(r.code, 69);
  EXPECT_NE(r.out.find("UNAUTHENTICATED"), std::string::npos);
  r = Sandboxctl(port, admin + "admin frobnicate");
  EXPECT_EQ(r.code, 64);
}

}  // namespace
}  // namespace sandbox
