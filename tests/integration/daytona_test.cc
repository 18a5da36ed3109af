// The broker with provider "daytona" against the fake Daytona server, over
// gRPC: the conformance scenarios through our API, plus failure handling.

#include "absl/strings/escaping.h"
#include "tests/fakes/fake_daytona.h"
#include "tests/testing/broker_fixture.h"

namespace sandbox {
namespace {

class DaytonaTest : public BrokerFixture {
 protected:
  void SetUp() override {
    FakeDaytona::Options o;
    o.api_key = "dtn_test_key";
    o.clock = &fake_clock_;
    o.timer_thread = false;
    auto fake = FakeDaytona::Start(o);
    ASSERT_TRUE(fake.ok()) << fake.status();
    fake_ = std::move(*fake);
    nlohmann::json extra = {{"default_provider", "daytona"},
                            {"providers",
                             {{"daytona",
                               {{"api_key", "dtn_test_key"},
                                {"api_url", fake_->api_url()},
                                {"target", "us"},
                                {"create_timeout_seconds", 3},
                                {"workspace", "agent-default"}}}}}};
    extra_ = extra;
    StartBroker(extra.dump());
  }
  nlohmann::json extra_;
  void TearDown() override { server_.reset(); }  // its connections go before the fake

  FakeClock fake_clock_;
  std::unique_ptr<FakeDaytona> fake_;
};

pb::SessionSpec Lang(pb::Language l) {
  pb::SessionSpec s;
  s.set_language(l);
  return s;
}

TEST_F(DaytonaTest, NetworkRulesGoIntoTheCreateBodyOrAreRefused) {
  // Wider than the tenant allows (nothing): refused before the provider.
  pb::SessionSpec spec;
  spec.mutable_network()->add_allow_out("10.0.0.0/8");
  auto wide = Client("dtn-net", "token-alpha-123", spec)->Start();
  EXPECT_EQ(wide.status().code(), absl::StatusCode::kPermissionDenied) << wide.status();
  // The provider's default allows them: Daytona's allow lists, as its SDK
  // sends them (tests/conformance/daytona).
  server_.reset();
  nlohmann::json extra = extra_;
  extra["providers"]["daytona"]["network"] = {
      {"allow_out", nlohmann::json::array({"10.0.0.0/8", "1.2.3.4", "pypi.org"})}};
  StartBroker(extra.dump());
  auto info = Client("dtn-net")->Start();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(fake_->network(info->sandbox_id()),
            R"({"networkBlockAll":false,"networkAllowList":"10.0.0.0/8,1.2.3.4/32",)"
            R"("domainAllowList":"pypi.org"})");
  // What Daytona cannot express is refused naming it, never dropped.
  pb::SessionSpec port;
  port.mutable_network()->add_allow_out("10.0.0.0/8:5432");
  auto refused = Client("dtn-port", "token-alpha-123", port)->Start();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("\"10.0.0.0/8:5432\""), std::string::npos)
      << refused.status();
  // Daytona has no live update.
  pb::UpdateSessionNetworkRequest up;
  up.set_session_id("dtn-net");
  pb::SessionInfo updated;
  EXPECT_EQ(stub_->UpdateSessionNetwork(Ctx().get(), up, &updated).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(DaytonaTest, RunsCodeInTheSessionsLanguageAndShellCommands) {
  auto py = Client("dtn-py");
  auto r = py->Run("s = 'it\\'s \"q\" $HOME `x` \\\\ \u00fc'\nprint(s)\nimport sys; sys.exit(3)");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->output(), "it's \"q\" $HOME `x` \\ \u00fc\n");
  EXPECT_EQ(r->exit_code(), 3);
  auto sh = py->Shell("echo \"$(whoami) in $(pwd)\"; echo err >&2; exit 5");
  EXPECT_EQ(sh->output(), "daytona in /home/daytona\nerr\n");
  EXPECT_EQ(sh->exit_code(), 5);
  // The language is fixed at creation: node in a python session is refused.
  RemoteRunOptions node;
  node.language = pb::LANGUAGE_NODE;
  auto wrong = py->Run("console.log(1)", node);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(wrong.status().message().find("runs python code"), std::string::npos);
  auto js = Client("dtn-js", "token-alpha-123", Lang(pb::LANGUAGE_NODE));
  auto jr = js->Run("console.log(`a'b\"c ${6 * 7}`)");
  ASSERT_TRUE(jr.ok()) << jr.status();
  EXPECT_EQ(jr->output(), "a'b\"c 42\n");
}

TEST_F(DaytonaTest, EnvTimeoutCapAndOneChunkStreams) {
  pb::SessionSpec spec;
  (*spec.mutable_env())["FROM_SPEC"] = "s";
  auto sb = Client("dtn-env", "token-alpha-123", spec);
  EXPECT_EQ(sb->Shell("echo $FROM_SPEC $FROM_RUN", 0, {{"FROM_RUN", "r"}})->output(), "s r\n");
  auto slow = sb->Shell("echo partial; sleep 30", 1);
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_TRUE(slow->timed_out());
  EXPECT_EQ(slow->exit_code(), 124);
  auto capped = sb->Run("print('y' * 10000)");
  EXPECT_TRUE(capped->truncated());
  EXPECT_EQ(capped->output(), std::string(4096, 'y'));
  std::vector<std::string> chunks;
  auto r = sb->RunStream("print('a'); print('b')", {},
                         [&](pb::OutputStream, const std::string& d) { chunks.push_back(d); });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(chunks, std::vector<std::string>{"a\nb\n"});
}

TEST_F(DaytonaTest, FilesAreBinarySafe) {
  auto sb = Client("dtn-files");
  static const char kBinary[] = "\x00\x01\xfe\xff\r\n--DAYTONA-FILE-BOUNDARY\r\n";
  const std::string binary(kBinary, sizeof(kBinary) - 1);  // was 33: read past the end
  ASSERT_TRUE(
      sb->WriteFile("/home/daytona/data/b.bin", absl::Base64Escape(binary), pb::ENCODING_BASE64)
          .ok());
  EXPECT_EQ(**sb->ReadFile("/home/daytona/data/b.bin", pb::ENCODING_BASE64),
            absl::Base64Escape(binary));
  ASSERT_TRUE(sb->WriteFile("rel.txt", "caf\u00e9").ok());
  EXPECT_EQ(sb->Shell("cat rel.txt")->output(), "caf\u00e9");
  ASSERT_TRUE(sb->WriteFile("/tmp/empty", "").ok());
  EXPECT_EQ(**sb->ReadFile("/tmp/empty"), "");
  EXPECT_FALSE(sb->ReadFile("/home/daytona/missing.txt")->has_value());
}

TEST_F(DaytonaTest, SandboxesAreLabelledAndStopThemselvesWhenForgotten) {
  auto sb = Client("dtn-meta", "token-alpha-123", Lang(pb::LANGUAGE_NODE));
  auto info = sb->Start();
  ASSERT_TRUE(info.ok()) << info.status();
  auto labels = fake_->labels(info->sandbox_id());
  EXPECT_EQ(labels["code-toolbox-language"], "javascript");
  EXPECT_EQ(labels["sandbox-broker.tenant"], "alpha");
  EXPECT_EQ(labels["sandbox-broker.session-id"], "dtn-meta");
  EXPECT_EQ(labels["sandbox-broker.instance-id"].substr(0, 7), "broker-");
  EXPECT_EQ(fake_->auto_stop_minutes(info->sandbox_id()), 2);  // idle 2 s + 1 min, rounded up
  // KeepAlive refreshes Daytona's activity too.
  fake_clock_.Advance(absl::Seconds(90));
  ASSERT_TRUE(sb->KeepAlive().ok());
  fake_clock_.Advance(absl::Seconds(60));
  EXPECT_EQ(fake_->ApplyTimersNow(), 0);
  EXPECT_EQ(fake_->state(info->sandbox_id()), "started");
  // Forgotten (no activity): stopped, then deleted on stop, by Daytona itself.
  fake_clock_.Advance(absl::Minutes(2));
  EXPECT_EQ(fake_->ApplyTimersNow(), 2);
  EXPECT_EQ(fake_->state(info->sandbox_id()), "");
  // The broker notices at the next call and starts over.
  auto r = sb->Run("console.log('again')");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("no longer exists"), std::string::npos) << r.status();
  EXPECT_EQ(sb->Run("console.log('again')")->output(), "again\n");
}

TEST_F(DaytonaTest, CloseDeletesOnce) {
  auto sb = Client("dtn-close");
  ASSERT_TRUE(sb->Start().ok());
  EXPECT_EQ(fake_->live_sandboxes(), 1);
  EXPECT_TRUE(*sb->Close());
  EXPECT_EQ(fake_->live_sandboxes(), 0);
  EXPECT_FALSE(*sb->Close());
}

TEST_F(DaytonaTest, AStuckSandboxFailsCreationClearlyAndIsDeleted) {
  fake_->set_stuck_starting(true);
  auto r = Client("dtn-stuck")->Start();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(r.status().message().find("did not start within 3 s (state starting)"),
            std::string::npos)
      << r.status();
  EXPECT_EQ(fake_->live_sandboxes(), 0);  // nothing left behind
  fake_->set_stuck_starting(false);
  EXPECT_TRUE(Client("dtn-stuck")->Start().ok());
}

TEST_F(DaytonaTest, ProviderErrorsMapToCodesWithTheProvidersMessage) {
  fake_->faults().fail_next = 1;
  auto r = Client("dtn-5xx")->Start();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(
      r.status().message().find("daytona: create sandbox: 500 internal server error (injected)"),
      std::string::npos)
      << r.status();
  fake_->faults().rate_limit_next = 1;
  auto limited = Client("dtn-429")->Start();
  EXPECT_EQ(limited.status().code(), absl::StatusCode::kResourceExhausted);
  auto sb = Client("dtn-ok");
  ASSERT_TRUE(sb->Start().ok());
  fake_->faults().drop_next = 1;
  EXPECT_EQ(sb->Shell("true").status().code(), absl::StatusCode::kUnavailable);
  auto bad_env = sb->Shell("true", 0, {{"BAD-NAME", "x"}});
  EXPECT_EQ(bad_env.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_env.status().message().find("invalid env key"), std::string::npos);
  EXPECT_EQ(sb->Shell("echo fine")->output(), "fine\n");
}

TEST_F(DaytonaTest, ResourcesRoundUpToWholeUnitsAndOutOfRangeOnesAreRefused) {
  pb::SessionSpec spec;
  spec.mutable_resources()->set_cpus(1.5);
  spec.mutable_resources()->set_memory_bytes((int64_t{1} << 30) + 1);
  auto info = Client("dtn-res", "token-alpha-123", spec)->Start();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(fake_->resources(info->sandbox_id()),
            (std::map<std::string, int64_t>{{"cpu", 2}, {"memory", 2}, {"disk", 3}}));
  // The largest byte count rounds up without overflowing into "no size".
  pb::SessionSpec huge;
  huge.mutable_resources()->set_memory_bytes(INT64_MAX);
  huge.mutable_resources()->set_disk_bytes(INT64_MAX);
  auto big = Client("dtn-huge", "token-alpha-123", huge)->Start();
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(fake_->resources(big->sandbox_id()).at("memory"), int64_t{1} << 33);
  EXPECT_EQ(fake_->resources(big->sandbox_id()).at("disk"), int64_t{1} << 33);
  // A CPU count no integer holds is an error, not a silent default.
  pb::SessionSpec cpus;
  cpus.mutable_resources()->set_cpus(1e300);
  auto refused = Client("dtn-cpus", "token-alpha-123", cpus)->Start();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("resources.cpus"), std::string::npos);
}

// The tenant's resource ceiling reaches Daytona: a session asking for the
// default gets the ceiling (in whole units), a size that rounds up past it
// is refused, and what Daytona cannot apply (pids) is refused naming it.
TEST_F(DaytonaTest, TheTenantsResourceCeilingIsAppliedOrRefusedByName) {
  server_.reset();
  nlohmann::json extra = extra_;
  extra["tenants"]["alpha"]["resources"] = {
      {"cpus", 1.5}, {"memory_bytes", (int64_t{5} << 30) / 2}, {"disk_bytes", int64_t{4} << 30}};
  extra["tenants"]["beta"]["resources"] = {{"pids", 64}};
  StartBroker(extra.dump());
  auto info = Client("dtn-ceiling")->Start();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(fake_->resources(info->sandbox_id()),
            (std::map<std::string, int64_t>{{"cpu", 1}, {"memory", 2}, {"disk", 4}}));
  pb::SessionSpec spec;
  spec.mutable_resources()->set_cpus(1.5);  // 2 CPUs on Daytona
  auto over = Client("dtn-over", "token-alpha-123", spec)->Start();
  EXPECT_EQ(over.status().code(), absl::StatusCode::kFailedPrecondition) << over.status();
  EXPECT_NE(over.status().message().find("resources.cpus 1.5 rounds up to 2 CPUs"),
            std::string::npos)
      << over.status();
  auto pids = Client("dtn-pids", "token-beta-456")->Start();
  EXPECT_EQ(pids.status().code(), absl::StatusCode::kFailedPrecondition) << pids.status();
  EXPECT_NE(pids.status().message().find("resources.pids"), std::string::npos) << pids.status();
  EXPECT_EQ(fake_->live_sandboxes(), 1);  // nothing made for the refusals
}

TEST_F(DaytonaTest, AVanishedSandboxIsReportedAndRecreated) {
  auto sb = Client("dtn-gone");
  auto info = sb->Start();
  ASSERT_TRUE(fake_->Vanish(info->sandbox_id()));
  EXPECT_EQ(sb->ReadFile("x").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(sb->Info().status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(sb->WriteFile("x", "1").ok());
  EXPECT_NE(sb->Info()->sandbox_id(), info->sandbox_id());
}

TEST(DaytonaConfigTest, MissingKeyMakesTheProviderUnavailable) {
  unsetenv("DAYTONA_API_KEY");
  auto c = ParseConfig(R"({"providers": {"local": {"workspace_root": "/tmp/dtn-cfg-test"},
                                          "daytona": {}}})");
  ASSERT_TRUE(c.ok());
  auto registry = BuildProviders(*c);
  ASSERT_TRUE(registry.ok()) << registry.status();
  auto p = (*registry)->Find("daytona");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(p.status().message().find("daytona: missing API key"), std::string::npos);
  c->default_provider = "daytona";
  EXPECT_FALSE(BuildProviders(*c).ok());
}

}  // namespace
}  // namespace sandbox
