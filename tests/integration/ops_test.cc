// Operations: health through drain, metrics over HTTP after real calls,
// reflection, TLS, and logs free of secrets.

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "adapters/http/http_client.h"
#include "common/log.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "grpcpp/impl/codegen/sync_stream.h"
#include "tests/fakes/fake_daytona.h"
#include "tests/fakes/fake_e2b.h"
#include "tests/testing/broker_fixture.h"
#include "tests/testing/test_cert.h"

namespace sandbox {
namespace {

int CountDirs(const std::string& path) {
  int n = 0;
  DIR* d = opendir(path.c_str());
  if (d == nullptr) return 0;
  while (struct dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

class OpsTest : public BrokerFixture {
 protected:
  std::string Health(const std::string& service = "") {
    auto r = RemoteSandbox::Health(channel_, service);
    return r.ok() ? *r : std::string(r.status().message());
  }
  std::string Scrape() {
    HttpClient http("test");
    HttpRequest req;
    req.url = absl::StrCat("http://127.0.0.1:", server_->admin_port(), "/metrics");
    auto r = http.Send(req);
    return r.ok() ? r->body : std::string(r.status().message());
  }
};

TEST_F(OpsTest, HealthNeedsNoTokenAndTracksProviders) {
  unsetenv("E2B_API_KEY");  // (an earlier test in this process may set it)
  StartBroker(R"({"providers": {"e2b": {}}})");  // e2b without a key: unusable
  EXPECT_EQ(Health(), "SERVING");
  EXPECT_EQ(Health("sandboxbroker.v1.SandboxBroker"), "SERVING");
  EXPECT_EQ(Health("sandboxbroker.v1.SandboxBroker/local"), "SERVING");
  EXPECT_EQ(Health("sandboxbroker.v1.SandboxBroker/e2b"), "NOT_SERVING");
}

TEST_F(OpsTest, ReflectionListsTheApi) {
  StartBroker();
  // grpc.reflection.v1alpha ServerReflectionRequest{list_services: ""}.
  grpc::ClientContext ctx;
  grpc::internal::RpcMethod method("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                   grpc::internal::RpcMethod::BIDI_STREAMING);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> call(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel_.get(), method, &ctx));
  const std::string request("\x3a\x00", 2);
  grpc::Slice slice(request);
  grpc::ByteBuffer req(&slice, 1);
  ASSERT_TRUE(call->Write(req));
  call->WritesDone();
  grpc::ByteBuffer resp;
  ASSERT_TRUE(call->Read(&resp));
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(resp.Dump(&slices).ok());
  std::string bytes;
  for (auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_NE(bytes.find("sandboxbroker.v1.SandboxBroker"), std::string::npos);
  EXPECT_NE(bytes.find("grpc.health.v1.Health"), std::string::npos);
  EXPECT_TRUE(call->Finish().ok());
}

TEST_F(OpsTest, MetricsAreScrapedAfterRealCalls) {
  StartBroker(R"({"admin_listen": "127.0.0.1:0"})");
  ASSERT_GT(server_->admin_port(), 0);
  auto sb = Client("metered-session-id");
  ASSERT_TRUE(sb->Run("print('x' * 10)").ok());
  ASSERT_TRUE(sb->Shell("sleep 5", 1).ok());  // a timeout
  EXPECT_EQ(Client("bad id")->Run("1").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(*sb->Close());
  const std::string m = Scrape();
  for (const char* want : {
           "sandbox_broker_calls_total{code=\"OK\",method=\"Run\"} 1",
           "sandbox_broker_calls_total{code=\"OK\",method=\"Shell\"} 1",
           "sandbox_broker_calls_total{code=\"INVALID_ARGUMENT\",method=\"Run\"} 1",
           "sandbox_broker_session_creates_total{provider=\"local\"} 1",
           "sandbox_broker_session_closes_total{provider=\"local\",reason=\"client\"} 1",
           "sandbox_broker_sessions{provider=\"local\",tenant=\"alpha\"} 0",
           "sandbox_broker_run_timeouts_total{provider=\"local\"} 1",
           "sandbox_broker_output_bytes_total{provider=\"local\"} 11",
           "sandbox_broker_calls_in_flight{method=\"Run\"} 0",
           "sandbox_broker_call_duration_seconds_count{method=\"Run\",provider=\"local\"} 1",
           "sandbox_broker_session_create_duration_seconds_count{provider=\"local\"} 1",
       }) {
    EXPECT_NE(m.find(want), std::string::npos) << want << "\n" << m;
  }
  EXPECT_EQ(m.find("metered-session-id"), std::string::npos);  // no session ids as labels
}

TEST_F(OpsTest, DrainFinishesRunningCallsRefusesNewOnesAndClosesSandboxes) {
  // Closing on drain is the default only with the memory store.
  StartBroker(R"({"drain_grace_seconds": 30, "drain_close_sandboxes": true})");
  auto sb = Client("draining");
  ASSERT_TRUE(sb->Start().ok());
  ASSERT_TRUE(Client("other")->Start().ok());
  EXPECT_EQ(CountDirs(WorkspaceRoot()), 2);
  std::string out;
  std::thread call([&] {
    auto r = Client("draining")->Shell("sleep 1; echo finished");
    out = r.ok() ? r->output() : std::string(r.status().message());
  });
  while (sb->Info()->calls_in_flight() == 0) std::this_thread::yield();
  std::thread drain([&] { server_->Drain(); });
  // Health flips and new calls are refused while the running one goes on.
  std::string h;
  for (int i = 0; i < 1000 && (h = Health()) != "NOT_SERVING"; ++i) usleep(1000);
  EXPECT_EQ(h, "NOT_SERVING");
  auto refused = Client("new")->Run("print(1)");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  call.join();
  EXPECT_EQ(out, "finished\n");
  drain.join();
  EXPECT_EQ(CountDirs(WorkspaceRoot()), 0);  // every sandbox closed
}

TEST_F(OpsTest, TlsWithAndWithoutClientCertificates) {
  Cert c = MakeCert(dir_.path());
  nlohmann::json tls = {{"tls", {{"cert_file", c.cert_file}, {"key_file", c.key_file}}}};
  StartBroker(tls.dump());
  const std::string addr = absl::StrCat("127.0.0.1:", server_->port());
  RemoteSandbox::Tls t;
  t.enabled = true;
  t.root_certs_pem = c.cert;
  auto secure = RemoteSandbox::Connect(addr, "token-alpha-123", "tls", {}, t);
  auto r = secure->Run("print('over tls')");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->output(), "over tls\n");
  auto plain = RemoteSandbox::Connect(addr, "token-alpha-123", "tls");
  EXPECT_EQ(plain->Run("print(1)").status().code(), absl::StatusCode::kUnavailable);

  server_.reset();
  tls["tls"]["client_ca_file"] = c.cert_file;
  StartBroker(tls.dump());
  const std::string addr2 = absl::StrCat("127.0.0.1:", server_->port());
  auto anonymous = RemoteSandbox::Connect(addr2, "token-alpha-123", "mtls", {}, t);
  EXPECT_EQ(anonymous->Run("print(1)").status().code(), absl::StatusCode::kUnavailable);
  t.client_cert_pem = c.cert;
  t.client_key_pem = c.key;
  auto known = RemoteSandbox::Connect(addr2, "token-alpha-123", "mtls", {}, t);
  auto ok = known->Run("print('mutual')");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->output(), "mutual\n");
}

TEST_F(OpsTest, LogsNeverContainSecretsCodeOrOutput) {
  std::vector<std::string> lines;
  absl::Mutex mu;
  SetLogSink([&](absl::string_view line) {
    absl::MutexLock l(&mu);
    lines.emplace_back(line);
  });
  for (bool json : {false, true}) {
    SetLogJson(json);
    server_.reset();
    setenv("E2B_API_KEY", "e2b_SECRET_KEY_abc", 1);
    StartBroker(R"({"providers": {"e2b": {}}})");
    pb::SessionSpec spec;
    (*spec.mutable_env())["SPEC_SECRET"] = "SECRET_ENV_VALUE_1";
    auto sb = Client("logged", "token-alpha-123", spec);
    ASSERT_TRUE(
        sb->Run("print('SECRET_OUTPUT_' + 'x')", {{}, 0, {{"RUN_SECRET", "SECRET_ENV_2"}}}).ok());
    ASSERT_TRUE(sb->Shell("echo SECRET_COMMAND_TEXT").ok());
    ASSERT_TRUE(sb->WriteFile("f.txt", "SECRET_FILE_CONTENTS").ok());
    ASSERT_TRUE(sb->ReadFile("f.txt").ok());
    EXPECT_FALSE(Client("logged", "SECRET_WRONG_TOKEN")->Run("1").ok());
    ASSERT_TRUE(
        sb->CallTool("sandbox_local_run", R"j({"code": "print('SECRET_TOOL_CODE')"})j").ok());
    (void)sb->Close();
  }
  SetLogJson(false);
  SetLogSink(nullptr);
  absl::MutexLock l(&mu);
  ASSERT_GT(lines.size(), 20u);
  for (const auto& line : lines) {
    for (const char* secret : {"SECRET", "token-alpha-123", "token-beta-456", "e2b_SECRET"}) {
      EXPECT_EQ(line.find(secret), std::string::npos) << line;
    }
  }
}


std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Writes `text` to `path` atomically (a rename), so a running exec of the
// old file is never disturbed.
void WriteScript(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".new";
  std::ofstream(tmp) << text;
  chmod(tmp.c_str(), 0755);
  ASSERT_EQ(rename(tmp.c_str(), path.c_str()), 0);
}

// The process state letter and parent of `pid` ('\0' when it is gone).
std::pair<char, int> StateAndParent(int pid) {
  const std::string stat = Slurp(absl::StrCat("/proc/", pid, "/stat"));
  size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 4 > stat.size()) return {'\0', 0};
  return {stat[close + 2], atoi(stat.c_str() + close + 4)};
}

// Zombie children of `parent`, from /proc.
std::vector<int> ZombieChildren(int parent) {
  std::vector<int> out;
  DIR* d = opendir("/proc");
  while (struct dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    auto [state, ppid] = StateAndParent(atoi(e->d_name));
    if (ppid == parent && state == 'Z') out.push_back(atoi(e->d_name));
  }
  closedir(d);
  return out;
}

// The health probe of each provider, driven by the fake clock: a local
// provider that cannot run code (its bubblewrap fails) turns its service
// and "" (it is the default) NOT_SERVING at the first probe after one
// interval, says why in the logs, and turns back once it works again.
TEST_F(OpsTest, HealthProbeFlipsLocalProviderAndDefaultAndBack) {
  const std::string bwrap = dir_.path() + "/bwrap";
  WriteScript(bwrap, "#!/bin/sh\nexec /usr/bin/bwrap \"$@\"\n");
  std::vector<std::string> lines;
  absl::Mutex mu;
  SetLogSink([&](absl::string_view line) {
    absl::MutexLock l(&mu);
    lines.emplace_back(line);
  });
  nlohmann::json extra = {{"health_probe_interval_seconds", 5},
                          {"providers", {{"local", {{"bwrap_path", bwrap}}}}}};
  StartBroker(extra.dump());
  const std::string local = "sandboxbroker.v1.SandboxBroker/local";
  server_->ProbeProviders();
  EXPECT_EQ(Health(), "SERVING");
  EXPECT_EQ(Health(local), "SERVING");

  WriteScript(bwrap, "#!/bin/sh\necho 'bwrap: Can not fork (injected)' >&2\nexit 1\n");
  clock_.Advance(absl::Seconds(4));
  server_->ProbeProviders();  // not due yet
  EXPECT_EQ(Health(local), "SERVING");
  clock_.Advance(absl::Seconds(1));
  server_->ProbeProviders();
  EXPECT_EQ(Health(local), "NOT_SERVING");
  EXPECT_EQ(Health(), "NOT_SERVING");
  EXPECT_EQ(Health("sandboxbroker.v1.SandboxBroker"), "SERVING");  // the process lives
  EXPECT_NE(server_->health()->Reason("local").find("injected"), std::string::npos)
      << server_->health()->Reason("local");
  {
    absl::MutexLock l(&mu);
    bool logged = false;
    for (const auto& line : lines) {
      logged |= line.find("provider.unhealthy") != std::string::npos &&
                line.find("provider=local") != std::string::npos &&
                line.find("injected") != std::string::npos;
    }
    EXPECT_TRUE(logged);
  }

  WriteScript(bwrap, "#!/bin/sh\nexec /usr/bin/bwrap \"$@\"\n");
  clock_.Advance(absl::Seconds(5));
  server_->ProbeProviders();
  EXPECT_EQ(Health(local), "SERVING");
  EXPECT_EQ(Health(), "SERVING");
  auto r = Client("after-recovery")->Run("print(6*7)");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->output(), "42\n");
  SetLogSink(nullptr);
}

// A remote provider whose API fails turns NOT_SERVING (and "" with it, as
// the default provider), then SERVING when the API answers again.
TEST_F(OpsTest, HealthProbeFlipsRemoteProviderWhenItsApiFails) {
  FakeE2B::Options o;
  o.api_key = "e2b_probe_key";
  o.ttl_thread = false;
  auto fake = FakeE2B::Start(o);
  ASSERT_TRUE(fake.ok()) << fake.status();
  nlohmann::json extra = {{"default_provider", "e2b"},
                          {"health_probe_interval_seconds", 3},
                          {"providers",
                           {{"e2b",
                             {{"api_key", "e2b_probe_key"},
                              {"api_url", (*fake)->url()},
                              {"sandbox_url", (*fake)->url()}}}}}};
  StartBroker(extra.dump());
  const std::string e2b = "sandboxbroker.v1.SandboxBroker/e2b";
  server_->ProbeProviders();
  EXPECT_EQ(Health(e2b), "SERVING");
  EXPECT_EQ(Health(), "SERVING");
  (*fake)->faults().fail_next = 1000000;  // every request: 500
  clock_.Advance(absl::Seconds(3));
  server_->ProbeProviders();
  EXPECT_EQ(Health(e2b), "NOT_SERVING");
  EXPECT_EQ(Health(), "NOT_SERVING");
  EXPECT_EQ(Health("sandboxbroker.v1.SandboxBroker/local"), "SERVING");
  (*fake)->faults().fail_next = 0;
  clock_.Advance(absl::Seconds(3));
  server_->ProbeProviders();
  EXPECT_EQ(Health(e2b), "SERVING");
  EXPECT_EQ(Health(), "SERVING");
  server_.reset();  // before the fake
}

// Daytona's probe too; as a provider other than the default, its failure
// leaves "" SERVING.
TEST_F(OpsTest, HealthProbeFlipsDaytonaButNotTheDefault) {
  FakeDaytona::Options o;
  o.api_key = "dtn_probe_key";
  o.timer_thread = false;
  auto fake = FakeDaytona::Start(o);
  ASSERT_TRUE(fake.ok()) << fake.status();
  nlohmann::json extra = {{"health_probe_interval_seconds", 2},
                          {"providers",
                           {{"daytona",
                             {{"api_key", "dtn_probe_key"}, {"api_url", (*fake)->api_url()}}}}}};
  StartBroker(extra.dump());
  const std::string daytona = "sandboxbroker.v1.SandboxBroker/daytona";
  server_->ProbeProviders();
  EXPECT_EQ(Health(daytona), "SERVING");
  (*fake)->faults().fail_next = 1000000;
  clock_.Advance(absl::Seconds(2));
  server_->ProbeProviders();
  EXPECT_EQ(Health(daytona), "NOT_SERVING");
  EXPECT_EQ(Health(), "SERVING");  // the default (local) still runs code
  (*fake)->faults().fail_next = 0;
  clock_.Advance(absl::Seconds(2));
  server_->ProbeProviders();
  EXPECT_EQ(Health(daytona), "SERVING");
  server_.reset();  // before the fake
}

// The real daemon reaps every orphan handed to it (it is a child subreaper,
// as PID 1 in a container would be) while the exit status of every run,
// which RunProcess waits for by pid, stays its own.
TEST(DaemonTest, ReapsOrphansWithoutTakingRunStatuses) {
  TempDir dir;
  const std::string config = dir.path() + "/config.json";
  const std::string log = dir.path() + "/brokerd.log";
  std::ofstream(config) << nlohmann::json(
                               {{"listen", "127.0.0.1:0"},
                                {"drain_grace_seconds", 5},
                                {"state", {{"path", dir.path() + "/state.db"}}},
                                {"providers",
                                 {{"local",
                                   {{"isolation", "none"},
                                    {"workspace_root", dir.path() + "/ws"}}}}}})
                               .dump();
  pid_t daemon = fork();
  ASSERT_GE(daemon, 0);
  if (daemon == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // a failing test leaves no daemon
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execl(BROKERD_PATH, BROKERD_PATH, "--config", config.c_str(), nullptr);
    _exit(127);
  }
  std::string addr;
  for (int i = 0; i < 1000 && addr.empty(); ++i) {
    const std::string text = Slurp(log);
    size_t at = text.find("broker.serving address=");
    if (at != std::string::npos) {
      at += strlen("broker.serving address=");
      addr = text.substr(at, text.find(' ', at) - at);
    } else {
      usleep(10000);
    }
  }
  ASSERT_FALSE(addr.empty()) << Slurp(log);
  EXPECT_NE(Slurp(log).find("broker.subreaper"), std::string::npos);
  auto channel = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
  auto client = [&](const std::string& session) {
    return std::make_unique<RemoteSandbox>(pb::SandboxBroker::NewStub(channel), session, "",
                                           pb::SessionSpec{});
  };

  // An orphan that outlives its run (its own session escapes the run's
  // process group) is handed to the daemon, then reaped when it exits.
  auto orphan_run = client("orphans")->Shell("setsid sleep 0.3 >/dev/null 2>&1 & echo $!");
  ASSERT_TRUE(orphan_run.ok()) << orphan_run.status();
  const int orphan = atoi(orphan_run->output().c_str());
  ASSERT_GT(orphan, 0);
  auto [state, parent] = StateAndParent(orphan);
  EXPECT_EQ(parent, daemon) << "state " << state;
  bool gone = false;
  for (int i = 0; i < 500 && !gone; ++i) {
    gone = StateAndParent(orphan).first == '\0';
    if (!gone) usleep(10000);
  }
  EXPECT_TRUE(gone) << "orphan " << orphan << " state " << StateAndParent(orphan).first;

  // Runs and orphan-makers at once: every run keeps its own exit status.
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      auto sb = client(absl::StrCat("runs-", t));
      for (int i = 0; i < 40; ++i) {
        // A status taken by the reaper would show as 255 (or a timeout).
        auto r = sb->Shell(t == 0 ? "(setsid true &); exit 7" : "exit 7", 10);
        if (!r.ok() || r->exit_code() != 7) ++wrong;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  std::vector<int> zombies = ZombieChildren(daemon);
  for (int i = 0; i < 300 && !zombies.empty(); ++i) {
    usleep(10000);  // the reaper runs on SIGCHLD, within its 1 s backstop
    zombies = ZombieChildren(daemon);
  }
  EXPECT_TRUE(zombies.empty()) << zombies.size() << " zombies";

  ASSERT_EQ(kill(daemon, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(waitpid(daemon, &status, 0), daemon);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << Slurp(log);
}

}  // namespace
}  // namespace sandbox
