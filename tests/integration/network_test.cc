// Network policies through the API (docs/network.md), against a real broker
// (gRPC on 127.0.0.1:0, the local provider, real nftables): tenant rules,
// SessionSpec.network narrowing them, SessionInfo reporting them,
// UpdateSessionNetwork, metrics and the audit log.

#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "adapters/http/http_client.h"
#include "client/remote_admin.h"
#include "grpcpp/create_channel.h"
#include "sandboxbroker/v1/broker.grpc.pb.h"
#include "server/app/broker_server.h"
#include "server/app/provider_setup.h"
#include "server/config/config.h"
#include "tests/testing/temp_dir.h"

namespace sandbox {
namespace {

constexpr char kNetAlpha[] = "net-token-alpha";
constexpr char kNetBeta[] = "net-token-beta";
constexpr char kNetAdmin[] = "net-token-admin";

// Polls `done` until it holds or 10 s pass: a relay counts a connection's
// bytes when it ends, just after the client has its answer.
bool Eventually(const std::function<bool()>& done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

class NetworkApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    web_.Get("/hello", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("hello", "text/plain");
    });
    web_port_ = web_.bind_to_any_port("127.0.0.1");
    web_thread_ = std::thread([this] { web_.listen_after_bind(); });
    while (!web_.is_running()) std::this_thread::yield();

    nlohmann::json cfg = {
        {"listen", "127.0.0.1:0"},
        {"admin_listen", "127.0.0.1:0"},
        {"default_provider", "local"},
        // Its own store, never the default path (parallel runs).
        {"state", {{"backend", "sqlite"}, {"path", dir_.path() + "/state/state.db"}}},
        {"auth",
         {{"tokens", {{kNetAlpha, "alpha"}, {kNetBeta, "beta"}}},
          {"admin_tokens", {{kNetAdmin, "ops"}}}}},
        {"providers", {{"local", {{"workspace_root", dir_.path() + "/ws"}, {"uid_base", 650000}}}}},
        {"tenants",
         {{"alpha",
           {{"network",
             {{"allow_out", {"files.test", "*.files.test"}},
              {"hosts", {{"files.test", "127.0.0.1"}, {"a.files.test", "127.0.0.1"}}}}}}}}}};
    cfg_ = cfg;
    std::ofstream(ConfigPath()) << cfg.dump(2);
    auto config = LoadConfigFile(ConfigPath());
    ASSERT_TRUE(config.ok()) << config.status();
    auto providers = BuildProviders(*config);
    ASSERT_TRUE(providers.ok()) << providers.status();
    BrokerServer::Options o;
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
  }

  void TearDown() override {
    server_.reset();
    web_.stop();
    if (web_thread_.joinable()) web_thread_.join();
  }

  std::unique_ptr<grpc::ClientContext> Ctx(const char* token) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token));
    return ctx;
  }

  grpc::Status Start(const char* token, const std::string& id, pb::SessionInfo* info,
                     const pb::NetworkPolicy* network = nullptr) {
    pb::StartSessionRequest req;
    req.set_session_id(id);
    if (network != nullptr) *req.mutable_spec()->mutable_network() = *network;
    return stub_->StartSession(Ctx(token).get(), req, info);
  }

  std::string Shell(const char* token, const std::string& id, const std::string& command) {
    pb::ShellRequest req;
    req.set_session_id(id);
    req.set_command(command);
    pb::RunResult r;
    grpc::Status s = stub_->Shell(Ctx(token).get(), req, &r);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return r.output();
  }

  std::string Curl(const std::string& host) {
    return absl::StrCat("curl -sS --noproxy '*' http://", host, ":", web_port_,
                        "/hello 2>&1; echo \" rc=$?\"");
  }

  std::string ConfigPath() const { return dir_.path() + "/config.json"; }

  // Rewrites alpha's network rule and reloads.
  void ReloadAlpha(const nlohmann::json& network) {
    cfg_["tenants"]["alpha"]["network"] = network;
    std::ofstream(ConfigPath() + ".new") << cfg_.dump(2);
    rename((ConfigPath() + ".new").c_str(), ConfigPath().c_str());
    auto r = server_->Reload("test");
    ASSERT_TRUE(r.ok()) << r.status();
  }

  std::string Audit() {
    absl::MutexLock l(&mu_);
    std::string all;
    for (const auto& line : audit_) all += line;
    return all;
  }

  TempDir dir_;
  nlohmann::json cfg_;
  httplib::Server web_;
  int web_port_ = 0;
  std::thread web_thread_;
  absl::Mutex mu_;
  std::vector<std::string> audit_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<BrokerServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::SandboxBroker::Stub> stub_;
};

TEST_F(NetworkApiTest, SessionsGetTheirTenantsRulesAndMayOnlyNarrowThem) {
  pb::SessionInfo info;
  grpc::Status s = Start(kNetAlpha, "a1", &info);
  if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) GTEST_SKIP() << s.error_message();
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(info.network().allow_out_size(), 2);
  EXPECT_EQ(info.network().allow_out(0), "files.test");
  EXPECT_EQ(info.network().hosts().at("files.test"), "127.0.0.1");
  EXPECT_TRUE(absl::StrContains(Shell(kNetAlpha, "a1", Curl("files.test")), "hello rc=0"));

  // Narrower: allowed, and only what it asked for is reachable.
  pb::NetworkPolicy narrow;
  narrow.add_allow_out("a.files.test");
  (*narrow.mutable_hosts())["a.files.test"] = "127.0.0.1";
  ASSERT_TRUE(Start(kNetAlpha, "a2", &info, &narrow).ok());
  EXPECT_EQ(info.network().allow_out_size(), 1);
  EXPECT_TRUE(absl::StrContains(Shell(kNetAlpha, "a2", Curl("a.files.test")), "hello rc=0"));
  EXPECT_FALSE(absl::StrContains(Shell(kNetAlpha, "a2", Curl("files.test")), "hello rc=0"));

  // Wider: refused naming the rule, audited, nothing created.
  pb::NetworkPolicy wider;
  wider.add_allow_out("example.com");
  s = Start(kNetAlpha, "a3", &info, &wider);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(absl::StrContains(s.error_message(), "allow_out \"example.com\""))
      << s.error_message();
  EXPECT_TRUE(absl::StrContains(Audit(), "\"rule\":\"network\"")) << Audit();
  pb::GetSessionRequest get;
  get.set_session_id("a3");
  EXPECT_EQ(stub_->GetSession(Ctx(kNetAlpha).get(), get, &info).error_code(),
            grpc::StatusCode::NOT_FOUND);
  // Malformed: INVALID_ARGUMENT naming the field.
  pb::NetworkPolicy bad;
  bad.add_deny_out("not a cidr");
  s = Start(kNetAlpha, "a4", &info, &bad);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StartsWith(s.error_message(), "spec.network.deny_out[0]")) << s.error_message();

  // Tenant beta has no network rule: no network at all, the same server.
  ASSERT_TRUE(Start(kNetBeta, "b1", &info).ok());
  EXPECT_FALSE(info.has_network() && info.network().allow_out_size() > 0);
  EXPECT_FALSE(absl::StrContains(Shell(kNetBeta, "b1", Curl("files.test")), "hello rc=0"));
}

TEST_F(NetworkApiTest, LiveUpdatesStayWithinTheTenantsRulesAndAreMeteredAndAudited) {
  pb::SessionInfo info;
  grpc::Status s = Start(kNetAlpha, "u1", &info);
  if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) GTEST_SKIP() << s.error_message();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(absl::StrContains(Shell(kNetAlpha, "u1", Curl("files.test")), "hello rc=0"));

  pb::UpdateSessionNetworkRequest up;
  up.set_session_id("u1");
  (*up.mutable_network()->mutable_hosts())["files.test"] = "127.0.0.1";
  ASSERT_TRUE(stub_->UpdateSessionNetwork(Ctx(kNetAlpha).get(), up, &info).ok());
  EXPECT_EQ(info.network().allow_out_size(), 0);
  std::string out = Shell(kNetAlpha, "u1", Curl("files.test"));
  EXPECT_FALSE(absl::StrContains(out, "hello rc=0")) << out;
  pb::GetSessionRequest get;
  get.set_session_id("u1");
  ASSERT_TRUE(stub_->GetSession(Ctx(kNetAlpha).get(), get, &info).ok());
  EXPECT_EQ(info.network().allow_out_size(), 0);

  // Wider than the tenant allows; another tenant's session; none at all.
  up.mutable_network()->add_allow_out("example.com");
  EXPECT_EQ(stub_->UpdateSessionNetwork(Ctx(kNetAlpha).get(), up, &info).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  up.clear_network();
  EXPECT_EQ(stub_->UpdateSessionNetwork(Ctx(kNetBeta).get(), up, &info).error_code(),
            grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(Start(kNetBeta, "b2", &info).ok());
  up.set_session_id("b2");
  EXPECT_EQ(stub_->UpdateSessionNetwork(Ctx(kNetBeta).get(), up, &info).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);

  // The denial above, in the audit log and the metrics.
  EXPECT_TRUE(absl::StrContains(Audit(), "\"event\":\"network.dns_denied\"")) << Audit();
  HttpClient http("test");
  HttpRequest req;
  req.url = absl::StrCat("http://127.0.0.1:", server_->admin_port(), "/metrics");
  std::string body;
  EXPECT_TRUE(Eventually([&] {
    auto scraped = http.Send(req);
    body = scraped.ok() ? scraped->body : "";
    return absl::StrContains(body, "sandbox_broker_egress_bytes_total{direction=\"in\"");
  })) << body;
  EXPECT_TRUE(absl::StrContains(body,
                                "sandbox_broker_egress_connections_total{decision=\"allowed\","
                                "kind=\"connection\",provider=\"local\"}"))
      << body;
  // And in the tenant's usage.
  auto admin = RemoteAdmin::Connect(channel_, kNetAdmin);
  int64_t egress = 0;
  EXPECT_TRUE(Eventually([&] {
    auto usage = admin->GetUsage("alpha");
    egress = 0;
    if (usage.ok()) {
      for (const auto& u : usage->usage()) egress += u.egress_bytes();
    }
    return egress > 0;
  }));
  EXPECT_GT(egress, 100);  // a request and its answer
}

TEST_F(NetworkApiTest, AReloadReachesRunningSessionsOnlyWhenItsRuleSaysSo) {
  pb::SessionInfo info;
  grpc::Status s = Start(kNetAlpha, "r1", &info);
  if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) GTEST_SKIP() << s.error_message();
  ASSERT_TRUE(s.ok()) << s.error_message();
  const nlohmann::json hosts = {{"files.test", "127.0.0.1"}, {"a.files.test", "127.0.0.1"}};
  // A new rule for new sessions only: r1 keeps what it had.
  ReloadAlpha({{"allow_out", nlohmann::json::array({"a.files.test"})}, {"hosts", hosts}});
  EXPECT_TRUE(absl::StrContains(Shell(kNetAlpha, "r1", Curl("files.test")), "hello rc=0"));
  ASSERT_TRUE(Start(kNetAlpha, "r2", &info).ok());
  EXPECT_FALSE(absl::StrContains(Shell(kNetAlpha, "r2", Curl("files.test")), "hello rc=0"));
  // apply_to_running: r1 follows at once, and says so.
  ReloadAlpha({{"allow_out", nlohmann::json::array({"a.files.test"})},
               {"hosts", hosts},
               {"apply_to_running", true}});
  EXPECT_FALSE(absl::StrContains(Shell(kNetAlpha, "r1", Curl("files.test")), "hello rc=0"));
  EXPECT_TRUE(absl::StrContains(Shell(kNetAlpha, "r1", Curl("a.files.test")), "hello rc=0"));
  pb::GetSessionRequest get;
  get.set_session_id("r1");
  ASSERT_TRUE(stub_->GetSession(Ctx(kNetAlpha).get(), get, &info).ok());
  ASSERT_EQ(info.network().allow_out_size(), 1);
  EXPECT_EQ(info.network().allow_out(0), "a.files.test");
}

}  // namespace
}  // namespace sandbox
