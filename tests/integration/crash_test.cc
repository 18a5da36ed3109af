// Crash tests: the real sandbox-brokerd, killed with SIGKILL at each point
// that matters, restarted on the same store; the fakes run as separate
// processes and are counted through GET /_fake/stats, local workspaces on
// disk.

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "adapters/api/provider.h"
#include "adapters/http/http_client.h"
#include "common/text.h"
#include "grpcpp/create_channel.h"
#include "nlohmann/json.hpp"
#include "sandboxbroker/v1/broker.grpc.pb.h"
#include "server/store/session_store.h"
#include "tests/testing/child_process.h"
#include "tests/testing/store_rows.h"
#include "tests/testing/temp_dir.h"

#ifndef FAKE_E2B_PATH
#define FAKE_E2B_PATH "fake-e2b"
#endif
#ifndef FAKE_DAYTONA_PATH
#define FAKE_DAYTONA_PATH "fake-daytona"
#endif

namespace sandbox {
namespace {

namespace pb = ::sandboxbroker::v1;
using nlohmann::json;

// Polls `done` every 20 ms until it holds or `timeout` passes (waiting for
// another process, never for timing logic of our own).
bool WaitFor(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(20)) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return done();
}

class CrashTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    provider_ = GetParam();
    deployment_ = absl::StrCat("crash-", RandomHex(4));
    state_ = dir_.path() + "/state/state.db";
    ws_ = dir_.path() + "/ws";
    if (provider_ != "local") StartFake();
  }
  void TearDown() override {
    // A fake provider server that ended by itself mid-test (a sanitizer
    // report aborts it, halt_on_error=1) fails the test with its stderr,
    // which would otherwise go with the temp dir. So does its stderr when
    // the test failed for another reason.
    if (fake_ != nullptr && (fake_->Exited() || HasFailure())) {
      const std::string err = ReadAll(fake_->err());
      if (fake_->Exited()) {
        ADD_FAILURE() << "the fake " << provider_ << " server ended mid-test ("
                      << fake_->ExitStatus() << "); its stderr:\n"
                      << err;
      } else if (!err.empty()) {
        std::fprintf(stderr, "---- fake %s server stderr ----\n%s\n", provider_.c_str(),
                     err.c_str());
      }
    }
    if (broker_ != nullptr && broker_->Exited()) {
      ADD_FAILURE() << "sandbox-brokerd ended by itself (" << broker_->ExitStatus()
                    << "); its stderr:\n"
                    << BrokerLog();
    }
    broker_.reset();  // ends any call still running in the background
    JoinBackground();
    StopWatch();
    fake_.reset();
  }

  // "At most one live sandbox per session at every moment after recovery":
  // from WatchLive() on, a thread samples the provider's live sandboxes (the
  // fake's /_fake/stats, or the local workspaces on disk) as fast as they
  // answer; StopWatch() returns the most seen at once.
  void WatchLive() {
    StopWatch();
    watching_ = true;
    watch_max_ = Live();
    watcher_ = std::thread([this] {
      HttpClient http("crash-test-watch");
      while (watching_) {
        const int64_t n = Live(&http);
        int64_t seen = watch_max_.load();
        while (n > seen && !watch_max_.compare_exchange_weak(seen, n)) {
        }
        absl::SleepFor(absl::Milliseconds(2));
      }
    });
  }
  int64_t StopWatch() {
    watching_ = false;
    if (watcher_.joinable()) watcher_.join();
    return watch_max_.load();
  }
  // Waits until the broker logged that it reached failpoint `name`.
  ::testing::AssertionResult AtFailpoint(const std::string& name) {
    if (WaitFor(
            [&] { return BrokerLog().find("failpoint.hit name=" + name) != std::string::npos; })) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure() << "never reached failpoint " << name << "\n"
                                         << BrokerLog();
  }

  // Runs `call` (an RPC the broker is killed under) on a thread that
  // JoinBackground, or TearDown after killing the broker, joins: a fatal
  // assertion in the test body never leaves a joinable std::thread behind
  // (std::terminate, which ends the whole binary).
  void InBackground(std::function<void()> call) { background_.emplace_back(std::move(call)); }
  void JoinBackground() {
    for (auto& t : background_) t.join();
    background_.clear();
  }

  void StartFake() {
    const bool e2b = provider_ == "e2b";
    fake_ = std::make_unique<Proc>(
        std::vector<std::string>{e2b ? FAKE_E2B_PATH : FAKE_DAYTONA_PATH, "--port", "0",
                                 "--api-key", "crash_test_key", "--workspace-root",
                                 dir_.path() + "/fake", "--uid-base", e2b ? "652000" : "662000"},
        dir_.path() + "/fake.out", dir_.path() + "/fake.err");
    mkdir((dir_.path() + "/fake").c_str(), 0711);
    std::string port;
    ASSERT_TRUE(WaitFor([&] {
      std::string o = ReadAll(fake_->out());
      auto at = o.find("listening on 127.0.0.1:");
      if (at == std::string::npos || o.find('\n', at) == std::string::npos) return false;
      port = o.substr(at + 23, o.find('\n', at) - at - 23);
      return true;
    })) << ReadAll(fake_->err());
    fake_url_ = absl::StrCat("http://127.0.0.1:", port);
  }

  json Config(const std::string& extra) {
    json c = {{"listen", "127.0.0.1:0"},
              {"default_provider", provider_},
              {"deployment_id", deployment_},
              {"state", {{"path", state_}}},
              {"orphan_grace_seconds", 2},
              {"orphan_sweep_interval_seconds", 1},
              {"reap_interval_seconds", 1},
              {"drain_grace_seconds", 5},
              {"log_level", "debug"},
              {"providers", {{"local", {{"workspace_root", ws_}, {"uid_base", 672000}}}}}};
    if (provider_ == "e2b") {
      c["providers"]["e2b"] = {
          {"api_key", "crash_test_key"}, {"api_url", fake_url_}, {"sandbox_url", fake_url_}};
    } else if (provider_ == "daytona") {
      c["providers"]["daytona"] = {{"api_key", "crash_test_key"},
                                   {"api_url", fake_url_ + "/api"},
                                   {"create_timeout_seconds", 10}};
    }
    c.merge_patch(json::parse(extra));
    return c;
  }

  // Starts sandbox-brokerd and waits until it serves. `failpoints`: its
  // SANDBOX_BROKER_FAILPOINTS (common/failpoint.h).
  void StartBroker(const std::string& extra = "{}", const std::string& failpoints = "") {
    if (broker_ != nullptr && broker_->Exited()) {
      ADD_FAILURE() << "sandbox-brokerd ended by itself before it was killed ("
                    << broker_->ExitStatus() << "); its stderr:\n"
                    << BrokerLog();
    }
    const std::string cfg = absl::StrCat(dir_.path(), "/broker-", ++starts_, ".json");
    std::ofstream(cfg) << Config(extra).dump();
    const std::string err = absl::StrCat(dir_.path(), "/broker-", starts_, ".err");
    std::vector<std::string> env;
    if (!failpoints.empty()) env.push_back("SANDBOX_BROKER_FAILPOINTS=" + failpoints);
    broker_ = std::make_unique<Proc>(std::vector<std::string>{BROKERD_PATH, "--config", cfg},
                                     dir_.path() + "/broker.out", err, env);
    const std::string addr = WaitForServingAddress(err, absl::Seconds(20));
    ASSERT_FALSE(addr.empty()) << ReadAll(err);
    stub_ =
        pb::SandboxBroker::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  }
  std::string BrokerLog() {
    return ReadAll(absl::StrCat(dir_.path(), "/broker-", starts_, ".err"));
  }

  std::unique_ptr<grpc::ClientContext> Ctx(absl::Duration timeout = absl::Seconds(30)) {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    return c;
  }
  grpc::Status Write(const std::string& session, const std::string& path, const std::string& data) {
    pb::WriteFileRequest r;
    r.set_session_id(session);
    r.set_path(path);
    r.set_contents(data);
    pb::WriteFileResponse resp;
    return stub_->WriteFile(Ctx().get(), r, &resp);
  }
  ::testing::AssertionResult WriteOk(const std::string& session, const std::string& path,
                                     const std::string& data) {
    grpc::Status s = Write(session, path, data);
    if (s.ok()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << s.error_code() << ": " << s.error_message() << "\n"
                                         << BrokerLog();
  }
  // The file's contents, "<missing>" or "<error: ...>".
  std::string Read(const std::string& session, const std::string& path) {
    pb::ReadFileRequest r;
    r.set_session_id(session);
    r.set_path(path);
    pb::ReadFileResponse resp;
    grpc::Status s = stub_->ReadFile(Ctx().get(), r, &resp);
    if (!s.ok()) return absl::StrCat("<error: ", s.error_message(), ">");
    return resp.found() ? resp.contents() : "<missing>";
  }
  grpc::Status Shell(const std::string& session, const std::string& command,
                     const std::string& run_id, pb::RunResult* out) {
    pb::ShellRequest r;
    r.set_session_id(session);
    r.set_command(command);
    r.set_run_id(run_id);
    r.set_timeout_seconds(60);
    return stub_->Shell(Ctx(absl::Seconds(60)).get(), r, out);
  }
  absl::StatusOr<pb::SessionInfo> Info(const std::string& session) {
    pb::GetSessionRequest r;
    r.set_session_id(session);
    pb::SessionInfo info;
    grpc::Status s = stub_->GetSession(Ctx().get(), r, &info);
    if (!s.ok())
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    return info;
  }
  int ListCount() {
    pb::ListSessionsRequest r;
    pb::ListSessionsResponse resp;
    if (!stub_->ListSessions(Ctx().get(), r, &resp).ok()) return -1;
    return resp.sessions_size();
  }
  grpc::Status Close(const std::string& session) {
    pb::CloseSessionRequest r;
    r.set_session_id(session);
    pb::CloseSessionResponse resp;
    return stub_->CloseSession(Ctx().get(), r, &resp);
  }

  // ---- the provider's side ----
  json Http(const std::string& method, const std::string& path, const std::string& body = "",
            HttpClient* http = nullptr) {
    HttpRequest req;
    req.method = method;
    req.url = fake_url_ + path;
    req.body = body;
    req.headers = {{"Content-Type", "application/json"}};
    if (provider_ == "e2b") {
      req.headers.push_back({"X-API-KEY", "crash_test_key"});
    } else {
      req.headers.push_back({"Authorization", "Bearer crash_test_key"});
    }
    req.timeout = absl::Seconds(30);
    auto resp = (http != nullptr ? *http : http_).Send(req);
    if (!resp.ok()) return json();
    return json::parse(resp->body, nullptr, false);
  }
  json Stats() { return Http("GET", "/_fake/stats"); }
  int64_t Live(HttpClient* http = nullptr) {
    if (provider_ == "local") return static_cast<int64_t>(Workspaces().size());
    json stats = Http("GET", "/_fake/stats", "", http);
    return stats.is_object() ? stats.value("live", int64_t{-1}) : -1;
  }
  void Faults(const json& j) { Http("POST", "/_fake/faults", j.dump()); }
  // A sandbox made behind the broker's back, tagged as `tags` say.
  std::string MakeSandbox(const std::map<std::string, std::string>& tags) {
    if (provider_ == "e2b") {
      json r = Http("POST", "/v2/sandboxes",
                    json({{"templateID", "base"}, {"timeout", 600}, {"metadata", tags}}).dump());
      return r.value("sandboxID", "");
    }
    json r = Http("POST", "/api/sandbox", json({{"env", json::object()}, {"labels", tags}}).dump());
    return r.value("id", "");
  }
  bool Exists(const std::string& id) {
    json r = Http("GET", provider_ == "e2b" ? "/sandboxes/" + id : "/api/sandbox/" + id);
    return r.is_object() && (r.contains("sandboxID") || r.contains("id"));
  }
  // Local workspaces on disk (sandbox dirs only).
  std::vector<std::string> Workspaces() {
    std::vector<std::string> out;
    DIR* d = opendir(ws_.c_str());
    if (!d) return out;
    while (auto* e = readdir(d)) {
      std::string n = e->d_name;
      // Not the health probe's short-lived "local-probe-..." sandbox.
      if (absl::StartsWith(n, "local-") && !absl::StartsWith(n, "local-probe-") &&
          n.find('.') == std::string::npos) {
        out.push_back(n);
      }
    }
    closedir(d);
    return out;
  }

  TempDir dir_;
  std::string provider_, deployment_, state_, ws_, fake_url_;
  std::unique_ptr<Proc> fake_, broker_;
  std::unique_ptr<pb::SandboxBroker::Stub> stub_;
  HttpClient http_{"crash-test"};
  int starts_ = 0;
  std::vector<std::thread> background_;
  std::thread watcher_;
  std::atomic<bool> watching_{false};
  std::atomic<int64_t> watch_max_{0};
};

// kill -9 with sessions at rest: every session comes back with its sandbox
// and files; no second sandbox; closing afterwards leaves nothing.
TEST_P(CrashTest, SessionsAndFilesComeBackAfterKill9) {
  StartBroker();
  std::map<std::string, std::string> ids;
  for (const char* s : {"a", "b", "c"}) {
    ASSERT_TRUE(WriteOk(s, "note.txt", absl::StrCat("from ", s)));
    ids[s] = Info(s)->sandbox_id();
  }
  EXPECT_EQ(Live(), 3);
  broker_->Kill9();
  StartBroker();
  WatchLive();
  EXPECT_EQ(ListCount(), 3);
  for (const char* s : {"a", "b", "c"}) {
    EXPECT_EQ(Read(s, "note.txt"), absl::StrCat("from ", s));
    auto info = Info(s);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->sandbox_id(), ids[s]);
    EXPECT_EQ(info->generation(), 1);
    EXPECT_EQ(Live(), 3);  // at most one per session, at every step
  }
  if (provider_ != "local") {
    EXPECT_EQ(Stats()["creates"], 3);
  }
  EXPECT_EQ(StopWatch(), 3);
  for (const char* s : {"a", "b", "c"}) ASSERT_TRUE(Close(s).ok());
  EXPECT_TRUE(WaitFor([&] { return Live() == 0; })) << Live();
}

// SIGTERM with a durable store keeps the sandboxes for the next start.
TEST_P(CrashTest, GracefulRestartKeepsSandboxes) {
  StartBroker();
  ASSERT_TRUE(WriteOk("g", "f.txt", "kept"));
  const std::string id = Info("g")->sandbox_id();
  EXPECT_EQ(WEXITSTATUS(broker_->Term()), 0);
  EXPECT_EQ(Live(), 1);
  StartBroker();
  EXPECT_EQ(Read("g", "f.txt"), "kept");
  EXPECT_EQ(Info("g")->sandbox_id(), id);
  EXPECT_EQ(Live(), 1);
  // drain_close_sandboxes: true closes them all, as before.
  EXPECT_EQ(WEXITSTATUS(broker_->Term()), 0);
  StartBroker(R"({"drain_close_sandboxes": true})");
  EXPECT_EQ(Read("g", "f.txt"), "kept");
  EXPECT_EQ(WEXITSTATUS(broker_->Term()), 0);
  EXPECT_EQ(Live(), 0);
}

// Killed mid-run: the run's process dies (local) or is abandoned; a retry
// with the same run_id is ABORTED, never run again; files survive.
TEST_P(CrashTest, KilledMidRunRetryIsAbortedFilesSurvive) {
  StartBroker();
  ASSERT_TRUE(WriteOk("r", "f.txt", "before"));
  const std::string id = Info("r")->sandbox_id();
  const std::string cmd = "echo x >> runs.txt; sleep 30";
  InBackground([this, cmd] {
    pb::RunResult out;
    EXPECT_FALSE(Shell("r", cmd, "run-1", &out).ok());  // the broker dies under it
  });
  ASSERT_TRUE(WaitFor([&] { return Read("r", "runs.txt") == "x\n"; }));
  broker_->Kill9();
  JoinBackground();
  StartBroker();
  WatchLive();
  pb::RunResult out;
  grpc::Status retry = Shell("r", cmd, "run-1", &out);
  EXPECT_EQ(retry.error_code(), grpc::StatusCode::ABORTED) << retry.error_message();
  EXPECT_NE(retry.error_message().find("effects are unknown"), std::string::npos);
  EXPECT_EQ(Read("r", "runs.txt"), "x\n");  // not run a second time
  EXPECT_EQ(Read("r", "f.txt"), "before");
  EXPECT_EQ(Info("r")->sandbox_id(), id);
  // A finished run_id is answered from the store, output included.
  ASSERT_TRUE(Shell("r", "echo once >> runs.txt; cat runs.txt", "run-2", &out).ok());
  EXPECT_EQ(out.output(), "x\nonce\n");
  broker_->Kill9();
  StartBroker();
  pb::RunResult again;
  ASSERT_TRUE(Shell("r", "echo once >> runs.txt; cat runs.txt", "run-2", &again).ok());
  EXPECT_EQ(again.output(), "x\nonce\n");
  EXPECT_EQ(Read("r", "runs.txt"), "x\nonce\n");
  EXPECT_EQ(Shell("r", "other", "run-2", &again).error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(Live(), 1);
  EXPECT_EQ(StopWatch(), 1);
}

// Killed after the intent write, before the provider created anything: the
// row is forgotten; the next call creates the session's one sandbox. With a
// fake, its create request is held and then dropped; locally a failpoint
// holds the create right after the intent write.
TEST_P(CrashTest, KilledAfterIntentWrite) {
  const bool local = provider_ == "local";
  int64_t before = 0;
  if (local) {
    StartBroker("{}", "create.after_intent=sleep(60000)");
  } else {
    StartBroker();
    // The daemon's own startup requests (its orphan sweep's listing) are
    // done before the faults, which are for the create.
    ASSERT_TRUE(WaitFor([&] { return BrokerLog().find("recovery.done") != std::string::npos; }))
        << BrokerLog();
    before = Stats()["create_requests"];
    Faults({{"latency_ms", 1500}, {"drop_next", 1}});  // the create sleeps, then is dropped
  }
  InBackground([this] { EXPECT_FALSE(Write("i", "f.txt", "x").ok()); });
  if (local) {
    ASSERT_TRUE(AtFailpoint("create.after_intent"));
  } else {
    ASSERT_TRUE(WaitFor([&] { return Stats()["create_requests"] > before; }));
  }
  broker_->Kill9();  // intent written (it precedes the create request), nothing created
  JoinBackground();
  if (!local) {
    Faults({{"latency_ms", 0}});
    // The fake finishes the injected delay and cuts the response.
    EXPECT_TRUE(WaitFor([&] { return Stats()["dropped"] == 1; })) << Stats().dump();
    Faults({{"drop_next", 0}});
    EXPECT_EQ(Stats()["creates"], 0);
  }
  EXPECT_EQ(Live(), 0);
  StartBroker();
  WatchLive();
  ASSERT_TRUE(WriteOk("i", "f.txt", "x"));
  EXPECT_EQ(Read("i", "f.txt"), "x");
  EXPECT_EQ(Info("i")->generation(), 1);
  if (!local) {
    EXPECT_EQ(Stats()["creates"], 1);
  }
  EXPECT_EQ(Live(), 1);
  EXPECT_EQ(StopWatch(), 1);
}

// Killed between the provider's create and the ready write (widened with the
// fake's create_latency_ms, or locally a failpoint after the create): the
// sandbox is found by its attempt tag and adopted.
TEST_P(CrashTest, KilledBetweenCreateAndReadyWrite) {
  const bool local = provider_ == "local";
  if (local) {
    StartBroker("{}", "create.before_ready=sleep(60000)");
  } else {
    StartBroker();
    Faults({{"create_latency_ms", 1500}});
  }
  InBackground([this] { EXPECT_FALSE(Write("w", "f.txt", "x").ok()); });
  if (local) {
    ASSERT_TRUE(AtFailpoint("create.before_ready"));
  } else {
    ASSERT_TRUE(WaitFor([&] { return Stats()["creates"] == 1; }));
  }
  const std::vector<std::string> created = local ? Workspaces() : std::vector<std::string>{};
  if (local) {
    ASSERT_EQ(created.size(), 1u);
  }
  broker_->Kill9();  // the sandbox exists; the broker never heard back
  JoinBackground();
  if (!local) Faults({{"create_latency_ms", 0}});
  StartBroker();
  WatchLive();
  ASSERT_TRUE(WriteOk("w", "f.txt", "x"));
  if (local) {
    EXPECT_EQ(Info("w")->sandbox_id(), created[0]);  // adopted, not created again
    EXPECT_EQ(Workspaces(), created);
  } else {
    EXPECT_EQ(Stats()["creates"], 1);  // adopted, not created again
  }
  EXPECT_EQ(Live(), 1);
  // And stays that way past the orphan grace.
  absl::SleepFor(absl::Seconds(3));
  EXPECT_EQ(Live(), 1);
  EXPECT_EQ(Read("w", "f.txt"), "x");
  EXPECT_EQ(StopWatch(), 1);
}

// Killed mid-close (the delete never reached the provider): the next start
// finishes the destroy. With a fake, its delete request is held and then
// dropped; locally a failpoint holds the close after the closing write.
TEST_P(CrashTest, KilledMidClose) {
  const bool local = provider_ == "local";
  StartBroker("{}", local ? "close.before_destroy=sleep(60000)" : "");
  ASSERT_TRUE(WriteOk("c", "f.txt", "x"));
  int64_t before = 0;
  if (!local) {
    before = Stats()["requests"];
    Faults({{"latency_ms", 1500}, {"drop_next", 1}});  // the delete sleeps, then is dropped
  }
  InBackground([this] { EXPECT_FALSE(Close("c").ok()); });
  if (local) {
    ASSERT_TRUE(AtFailpoint("close.before_destroy"));
  } else {
    ASSERT_TRUE(WaitFor([&] { return Stats()["requests"] > before; }));
  }
  broker_->Kill9();
  JoinBackground();
  if (!local) {
    Faults({{"latency_ms", 0}});
    // The fake finishes the injected delay and cuts the response.
    EXPECT_TRUE(WaitFor([&] { return Stats()["dropped"] == 1; })) << Stats().dump();
    Faults({{"drop_next", 0}});
  }
  EXPECT_EQ(Live(), 1);  // the provider never got the delete
  StartBroker();
  WatchLive();
  // The session shows CLOSING until the destroy is done, then is gone.
  EXPECT_TRUE(WaitFor([&] {
    return Live() == 0 && Info("c").status().code() == absl::StatusCode::kNotFound;
  })) << BrokerLog();
  if (!local) {
    EXPECT_EQ(Stats()["deletes"], 1);
  }
  EXPECT_LE(StopWatch(), 1);
}

// Orphans (tagged with this deployment, owned by no session) are destroyed
// after the grace, also when a sweep was killed half-way; another
// deployment's sandboxes and untagged ones are never touched.
TEST_P(CrashTest, OrphanSweepSurvivesAKillAndSparesOthers) {
  std::string own1, own2, other, untagged;
  if (provider_ == "local") {
    mkdir(ws_.c_str(), 0711);
    auto plant = [&](const std::string& id, const std::string& dep) {
      // Containment's layout: <root>/<id>/workspace/.
      mkdir((ws_ + "/" + id).c_str(), 0711);
      mkdir((ws_ + "/" + id + "/workspace").c_str(), 0700);
      std::ofstream(ws_ + "/" + id + "/workspace/data") << "x";
      if (!dep.empty()) {
        mkdir((ws_ + "/.owners").c_str(), 0700);
        std::ofstream(ws_ + "/.owners/" + id)
            << json({{"deployment_id", dep}, {"attempt_id", "lost"}, {"created_at", 1}}).dump();
      }
      return id;
    };
    own1 = plant("local-0000000000a1", deployment_);
    own2 = plant("local-0000000000a2", deployment_);
    other = plant("local-0000000000b1", "someone-else");
    untagged = plant("local-0000000000c1", "");
    // Kill the first broker half-way through its sweep: one orphan
    // destroyed, the other not yet (a failpoint holds the sweep there).
    StartBroker("{}", "sweep.after_destroy=sleep(60000)");
    ASSERT_TRUE(AtFailpoint("sweep.after_destroy"));
    struct stat st;
    EXPECT_EQ(
        (stat((ws_ + "/" + own1).c_str(), &st) == 0) + (stat((ws_ + "/" + own2).c_str(), &st) == 0),
        1);
    broker_->Kill9();
  } else {
    own1 = MakeSandbox({{kDeploymentTag, deployment_}, {kAttemptTag, "lost-1"}});
    own2 = MakeSandbox({{kDeploymentTag, deployment_}, {kAttemptTag, "lost-2"}});
    other = MakeSandbox({{kDeploymentTag, "someone-else"}, {kAttemptTag, "x"}});
    untagged = MakeSandbox({{"team", "x"}});
    ASSERT_FALSE(own1.empty() || own2.empty() || other.empty() || untagged.empty());
    absl::SleepFor(absl::Milliseconds(2100));  // past the grace (provider timestamps)
    // Kill the first broker during its sweep: the deletes are slow.
    const int64_t before = Stats()["requests"];
    Faults({{"latency_ms", 1000}});
    StartBroker();
    ASSERT_TRUE(WaitFor([&] { return Stats()["requests"] > before; }));
    broker_->Kill9();
    Faults({{"latency_ms", 0}});
  }
  auto exists = [&](const std::string& id) {
    if (provider_ == "local") {
      struct stat st;
      return stat((ws_ + "/" + id).c_str(), &st) == 0;
    }
    return Exists(id);
  };
  StartBroker();
  EXPECT_TRUE(WaitFor([&] { return !exists(own1) && !exists(own2); })) << BrokerLog();
  EXPECT_TRUE(exists(other));
  EXPECT_TRUE(exists(untagged));
  if (provider_ == "local") {
    struct stat st;
    EXPECT_NE(stat((ws_ + "/.owners/" + own1).c_str(), &st), 0);  // marker gone too
    EXPECT_EQ(stat((ws_ + "/.owners/" + other).c_str(), &st), 0);
  }
  // A session's own sandbox is never swept.
  ASSERT_TRUE(WriteOk("kept", "f.txt", "x"));
  absl::SleepFor(absl::Seconds(3));
  EXPECT_EQ(Read("kept", "f.txt"), "x");
  EXPECT_EQ(Live(), 3);  // other + untagged + the session's
}

INSTANTIATE_TEST_SUITE_P(Providers, CrashTest, ::testing::Values("local", "e2b", "daytona"),
                         [](const auto& info) { return info.param; });

// 10k stored sessions: the real daemon answers within 5 s of starting.
TEST(CrashRecoveryScaleTest, TenThousandStoredSessionsServeWithinFiveSeconds) {
  TempDir dir;
  const std::string state = dir.path() + "/state.db";
  {
    auto store = OpenSqliteStore(state);
    ASSERT_TRUE(store.ok()) << store.status();
    std::vector<SessionRecord> rows = ReadyRows(10000, "default", "local", absl::Now(), [](int i) {
      return absl::StrCat("local-", absl::Hex(i, absl::kZeroPad12));
    });
    ASSERT_TRUE((*store)->PutSessions(rows).ok());
  }
  json cfg = {{"listen", "127.0.0.1:0"},
              {"state", {{"path", state}}},
              {"max_sessions_per_tenant", 100000},
              {"providers", {{"local", {{"workspace_root", dir.path() + "/ws"}}}}}};
  std::ofstream(dir.path() + "/c.json") << cfg.dump();
  const absl::Time start = absl::Now();
  Proc broker({BROKERD_PATH, "--config", dir.path() + "/c.json"}, dir.path() + "/out",
              dir.path() + "/err");
  std::string addr;
  absl::Duration took;
  ASSERT_TRUE(WaitFor(
      [&] {
        if (addr.empty()) {
          std::string log = ReadAll(dir.path() + "/err");
          auto at = log.find("broker.serving address=");
          if (at == std::string::npos) return false;
          at += 23;
          addr = log.substr(at, log.find_first_not_of("0123456789.:", at) - at);
        }
        auto stub = pb::SandboxBroker::NewStub(
            grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
        grpc::ClientContext ctx;
        ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
        pb::ListSessionsRequest req;
        req.set_page_size(1000);
        pb::ListSessionsResponse resp;
        if (!stub->ListSessions(&ctx, req, &resp).ok() || resp.sessions_size() != 1000) {
          return false;
        }
        took = absl::Now() - start;
        return true;
      },
      absl::Seconds(30)))
      << ReadAll(dir.path() + "/err");
  printf("10000 stored sessions: serving after %s\n", absl::FormatDuration(took).c_str());
  EXPECT_LT(took, absl::Seconds(5));
}

}  // namespace
}  // namespace sandbox
