// The broker with provider "e2b" against the fake E2B server, over gRPC:
// the conformance scenarios through our API, plus failure handling.

#include <thread>

#include "absl/strings/escaping.h"
#include "tests/fakes/fake_e2b.h"
#include "tests/testing/broker_fixture.h"
#include "tests/testing/processes.h"

namespace sandbox {
namespace {

class E2BTest : public BrokerFixture {
 protected:
  void SetUp() override {
    FakeE2B::Options o;
    o.api_key = "e2b_test_key";
    o.clock = &fake_clock_;
    o.ttl_thread = false;
    auto fake = FakeE2B::Start(o);
    ASSERT_TRUE(fake.ok()) << fake.status();
    fake_ = std::move(*fake);
    nlohmann::json extra = {{"default_provider", "e2b"},
                            {"providers",
                             {{"e2b",
                               {{"api_key", "e2b_test_key"},
                                {"api_url", fake_->url()},
                                {"sandbox_url", fake_->url()}}}}}};
    extra_ = extra;
    StartBroker(extra.dump());
  }
  nlohmann::json extra_;

  // The broker (and its kept-alive connections) goes before the fake.
  void TearDown() override { server_.reset(); }

  // The fake's TTL clock, apart from the broker's.
  FakeClock fake_clock_;
  std::unique_ptr<FakeE2B> fake_;
};

TEST_F(E2BTest, ResourcesAreRefusedBecauseTheTemplateDecides) {
  pb::SessionSpec spec;
  spec.mutable_resources()->set_memory_bytes(int64_t{2} << 30);
  auto r = Client("e2b-sized", "token-alpha-123", spec)->Start();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("template"), absl::string_view::npos) << r.status();
}

// The template decides an E2B sandbox's size (the fake's: 2 CPUs, 512 MiB
// memory, 1024 MiB disk), so a tenant's ceiling is checked after the
// create: a sandbox over it is killed and the create refused naming the
// key; one within it serves. A pids ceiling E2B cannot apply is refused.
TEST_F(E2BTest, TheTenantsResourceCeilingIsCheckedAgainstTheTemplate) {
  server_.reset();
  nlohmann::json extra = extra_;
  extra["tenants"]["alpha"]["resources"] = {{"cpus", 1}, {"memory_bytes", int64_t{1} << 30}};
  extra["tenants"]["beta"]["resources"] = {
      {"cpus", 2}, {"memory_bytes", int64_t{512} << 20}, {"disk_bytes", int64_t{2} << 30}};
  StartBroker(extra.dump());
  auto over = Client("e2b-over")->Run("print(1)");
  EXPECT_EQ(over.status().code(), absl::StatusCode::kFailedPrecondition) << over.status();
  EXPECT_NE(over.status().message().find("gives 2 CPUs, over the tenant's resources.cpus ceiling"),
            std::string::npos)
      << over.status();
  EXPECT_EQ(fake_->live_sandboxes(), 0);  // killed, not leaked
  auto within = Client("e2b-within", "token-beta-456")->Run("print(2)");
  ASSERT_TRUE(within.ok()) << within.status();
  EXPECT_EQ(within->output(), "2\n");
  EXPECT_EQ(fake_->live_sandboxes(), 1);
  server_.reset();
  extra["tenants"]["alpha"]["resources"] = {{"pids", 64}};
  StartBroker(extra.dump());
  auto pids = Client("e2b-pids")->Start();
  EXPECT_EQ(pids.status().code(), absl::StatusCode::kFailedPrecondition) << pids.status();
  EXPECT_NE(pids.status().message().find("resources.pids"), std::string::npos) << pids.status();
}

TEST_F(E2BTest, NetworkRulesGoIntoTheCreateBodyAndLiveUpdates) {
  // Wider than the tenant allows (nothing): refused before the provider.
  pb::SessionSpec spec;
  spec.mutable_network()->add_allow_out("pypi.org");
  auto wide = Client("e2b-net", "token-alpha-123", spec)->Start();
  EXPECT_EQ(wide.status().code(), absl::StatusCode::kPermissionDenied) << wide.status();
  // The provider's default allows them: E2B's allowOut, everything else
  // denied, as the SDK sends it (tests/conformance/e2b).
  server_.reset();
  nlohmann::json extra = extra_;
  extra["providers"]["e2b"]["network"] = {
      {"allow_out", nlohmann::json::array({"pypi.org", "*.pythonhosted.org"})}};
  StartBroker(extra.dump());
  auto info = Client("e2b-net")->Start();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(
      fake_->network(info->sandbox_id()),
      R"({"network":{"allowOut":["pypi.org","*.pythonhosted.org"],"denyOut":["0.0.0.0/0"]}})");
  pb::UpdateSessionNetworkRequest up;
  up.set_session_id("e2b-net");
  up.mutable_network()->add_allow_out("pypi.org");
  pb::SessionInfo updated;
  ASSERT_TRUE(stub_->UpdateSessionNetwork(Ctx().get(), up, &updated).ok());
  EXPECT_EQ(fake_->network(info->sandbox_id()),
            R"({"network":{"allowOut":["pypi.org"],"denyOut":["0.0.0.0/0"]}})");
  EXPECT_EQ(updated.network().allow_out_size(), 1);
  // What E2B cannot express is refused naming it, never dropped.
  pb::SessionSpec port;
  port.mutable_network()->add_allow_out("pypi.org:443");
  auto refused = Client("e2b-port", "token-alpha-123", port)->Start();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("\"pypi.org:443\""), std::string::npos)
      << refused.status();
}

TEST_F(E2BTest, RunsCodeOfAnyBytesInEachLanguage) {
  auto sb = Client("e2b-run");
  auto py = sb->Run("s = 'it\\'s \"q\" $HOME `x` \\\\ \u00fc'\nprint(s)\nimport sys; sys.exit(3)");
  ASSERT_TRUE(py.ok()) << py.status();
  EXPECT_EQ(py->output(), "it's \"q\" $HOME `x` \\ \u00fc\n");
  EXPECT_EQ(py->exit_code(), 3);
  RemoteRunOptions node;
  node.language = pb::LANGUAGE_NODE;
  EXPECT_EQ(sb->Run("console.log(`a'b\"c ${6 * 7}`)", node)->output(), "a'b\"c 42\n");
  auto sh = sb->Shell("echo \"$(whoami) in $(pwd)\"; echo err >&2; exit 5");
  EXPECT_EQ(sh->output(), "user in /home/user\nerr\n");
  EXPECT_EQ(sh->exit_code(), 5);
  // A program too big for a command line goes through an uploaded file.
  auto big = sb->Run(absl::StrCat("# ", std::string(100000, 'x'), "\nprint('big ok')"));
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->output(), "big ok\n");
  // Code files do not linger in the sandbox.
  EXPECT_EQ(sb->Shell("ls -A /tmp | grep -c sandbox-broker || true")->output(), "0\n");
}

TEST_F(E2BTest, EnvTimeoutsAndStreaming) {
  pb::SessionSpec spec;
  (*spec.mutable_env())["FROM_SPEC"] = "s";
  auto sb = Client("e2b-env", "token-alpha-123", spec);
  EXPECT_EQ(sb->Shell("echo $FROM_SPEC $FROM_RUN", 0, {{"FROM_RUN", "r"}})->output(), "s r\n");
  auto slow = sb->Shell("echo partial; sleep 30", 1);
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_TRUE(slow->timed_out());
  EXPECT_EQ(slow->exit_code(), 124);
  EXPECT_EQ(slow->output(), "partial\n");
  std::string streamed;
  auto r = sb->RunStream(
      "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.05)", {},
      [&](pb::OutputStream, const std::string& d) { streamed += d; });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(streamed, "0\n1\n2\n");
  auto capped = sb->Run("print('y' * 10000)");
  EXPECT_TRUE(capped->truncated());
  EXPECT_EQ(capped->output().size(), 4096u);
}

TEST_F(E2BTest, FilesAreBinarySafe) {
  auto sb = Client("e2b-files");
  const std::string binary("\x00\x01\xfe\xff\r\n", 6);
  ASSERT_TRUE(sb->WriteFile("data/b.bin", absl::Base64Escape(binary), pb::ENCODING_BASE64).ok());
  EXPECT_EQ(**sb->ReadFile("/home/user/data/b.bin", pb::ENCODING_BASE64),
            absl::Base64Escape(binary));
  ASSERT_TRUE(sb->WriteFile("/tmp/t.txt", "caf\u00e9").ok());
  EXPECT_EQ(sb->Shell("cat /tmp/t.txt")->output(), "caf\u00e9");
  ASSERT_TRUE(sb->WriteFile("empty", "").ok());
  EXPECT_EQ(**sb->ReadFile("empty"), "");
  EXPECT_FALSE(sb->ReadFile("missing.txt")->has_value());
}

TEST_F(E2BTest, SandboxesAreTaggedAndGuardedByTheirOwnTimeout) {
  auto sb = Client("e2b-meta");
  auto info = sb->Start();
  ASSERT_TRUE(info.ok()) << info.status();
  auto md = fake_->metadata(info->sandbox_id());
  EXPECT_EQ(md["sandbox-broker.tenant"], "alpha");
  EXPECT_EQ(md["sandbox-broker.session-id"], "e2b-meta");
  EXPECT_EQ(md["sandbox-broker.instance-id"].substr(0, 7), "broker-");
  // A dead-man's switch a little above the broker's idle timeout (2 s).
  const int64_t ttl = fake_->ttl_left_seconds(info->sandbox_id());
  EXPECT_GE(ttl, 2);
  EXPECT_LE(ttl, 2 + 120);
  // A long run extends it past the run's own timeout.
  ASSERT_TRUE(sb->Shell("true", 60).ok());
  EXPECT_GE(fake_->ttl_left_seconds(info->sandbox_id()), 60);
  // If the broker forgot it, E2B would kill it by itself.
  fake_clock_.Advance(absl::Hours(1));
  EXPECT_EQ(fake_->ExpireNow(), 1);
}

TEST_F(E2BTest, CloseKillsTheSandboxOnce) {
  auto sb = Client("e2b-close");
  ASSERT_TRUE(sb->Start().ok());
  EXPECT_EQ(fake_->live_sandboxes(), 1);
  EXPECT_TRUE(*sb->Close());
  EXPECT_EQ(fake_->live_sandboxes(), 0);
  EXPECT_FALSE(*sb->Close());
}

TEST_F(E2BTest, AVanishedSandboxIsReportedAndTheSessionRecreated) {
  auto sb = Client("e2b-gone");
  auto info = sb->Start();
  ASSERT_TRUE(info.ok());
  ASSERT_TRUE(fake_->Vanish(info->sandbox_id()));
  auto r = sb->Run("print(1)");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("no longer exists"), std::string::npos) << r.status();
  EXPECT_EQ(sb->Info().status().code(), absl::StatusCode::kNotFound);
  auto again = sb->Run("print(2)");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->output(), "2\n");
  EXPECT_NE(sb->Info()->sandbox_id(), info->sandbox_id());
  // Gone again right after a run: no timeout extension is due, so the run
  // itself meets envd's 502, and it says the same (not "malformed stream").
  const std::string second = sb->Info()->sandbox_id();
  ASSERT_TRUE(fake_->Vanish(second));
  auto r2 = sb->Run("print(3)");
  EXPECT_EQ(r2.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(r2.status().message().find("no longer exists"), std::string::npos) << r2.status();
  auto third = sb->Run("print(4)");
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_NE(sb->Info()->sandbox_id(), second);
}

// A run_id's result is bound to the sandbox that produced it: once the
// session goes on in a new sandbox (generation 2), a retry of the same
// run_id runs there instead of returning generation 1's result.
TEST_F(E2BTest, ARunIdResultFromAnEarlierGenerationIsNotReturned) {
  auto run = [&](pb::RunResult* out) {
    pb::RunRequest r;
    r.set_session_id("e2b-gen");
    r.set_code("import uuid; print(uuid.uuid4())");
    r.set_run_id("gen-run-1");
    return stub_->Run(Ctx().get(), r, out);
  };
  pb::RunResult first, retry, after, again;
  ASSERT_TRUE(run(&first).ok());
  ASSERT_TRUE(run(&retry).ok());
  EXPECT_EQ(retry.output(), first.output());  // the same sandbox: the kept result
  auto sb = Client("e2b-gen");
  const std::string gen1 = sb->Info()->sandbox_id();
  ASSERT_TRUE(fake_->Vanish(gen1));
  EXPECT_EQ(sb->Run("print(1)").status().code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(sb->Run("print(2)").ok());  // generation 2
  ASSERT_EQ(sb->Info()->generation(), 2);
  ASSERT_TRUE(run(&after).ok());
  EXPECT_EQ(after.output().size(), 37u) << after.output();
  EXPECT_NE(after.output(), first.output());  // ran again, in generation 2
  ASSERT_TRUE(run(&again).ok());
  EXPECT_EQ(again.output(), after.output());  // and is kept there
}

TEST_F(E2BTest, RateLimitsAreRetriedLikeTheSdk) {
  fake_->faults().retry_after_seconds = 0;
  fake_->faults().rate_limit_next = 2;
  auto r = Client("e2b-429")->Run("print('after retries')");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->output(), "after retries\n");
  fake_->faults().rate_limit_next = 10;  // more than 3 retries
  auto limited = Client("e2b-429b")->Start();
  EXPECT_EQ(limited.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(limited.status().message().find("e2b: create sandbox: 429"), std::string::npos);
  fake_->faults().rate_limit_next = 0;
}

TEST_F(E2BTest, ServerErrorsAndDroppedConnectionsAreUnavailable) {
  fake_->faults().fail_next = 1;
  auto r = Client("e2b-5xx")->Start();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("e2b: create sandbox: 500 internal server error (injected)"),
            std::string::npos)
      << r.status();
  EXPECT_TRUE(Client("e2b-5xx")->Start().ok());  // not cached: the next call works
  auto sb = Client("e2b-drop");
  ASSERT_TRUE(sb->Start().ok());
  fake_->faults().drop_next = 1;
  auto dropped = sb->ReadFile("x");
  EXPECT_EQ(dropped.status().code(), absl::StatusCode::kUnavailable) << dropped.status();
  EXPECT_EQ(sb->Run("print('fine')")->output(), "fine\n");
}

TEST_F(E2BTest, CancellingARunKillsItRemotely) {
  auto sb = Client("e2b-cancel");
  ASSERT_TRUE(sb->Start().ok());
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer token-alpha-123");
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(1500));
  pb::RunRequest req;
  req.set_session_id("e2b-cancel");
  req.set_language(pb::LANGUAGE_SHELL);
  const std::string marker = absl::StrCat("e2b-cancel-marker-", getpid());
  req.set_code(absl::StrCat("bash -c 'sleep 1000; : ", marker, "'"));
  req.set_timeout_seconds(60);
  pb::RunResult out;
  EXPECT_EQ(stub_->Run(&ctx, req, &out).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // SendSignal killed it (the fake runs it on this machine, so look).
  EXPECT_TRUE(GoneWithin(marker, absl::Seconds(10)));
  EXPECT_EQ(sb->Run("print('alive')")->output(), "alive\n");
}

TEST(E2BConfigTest, MissingKeyMakesTheProviderUnavailableWithTheReason) {
  unsetenv("E2B_API_KEY");
  auto c = ParseConfig(R"({"providers": {"local": {"workspace_root": "/tmp/e2b-cfg-test"},
                                          "e2b": {}}})");
  ASSERT_TRUE(c.ok());
  auto registry = BuildProviders(*c);
  ASSERT_TRUE(registry.ok()) << registry.status();
  auto p = (*registry)->Find("e2b");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(p.status().message().find("e2b: missing API key"), std::string::npos);
  c->default_provider = "e2b";
  auto as_default = BuildProviders(*c);
  EXPECT_FALSE(as_default.ok());  // the daemon refuses to start
  auto bad = ParseConfig(R"({"providers": {"e2b": {"api_key": "k", "templat": "x"}}})");
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(BuildProviders(*bad).status().message(), "providers.e2b.templat: unknown key");
}

}  // namespace
}  // namespace sandbox
