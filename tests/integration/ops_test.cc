// Operations: health through drain, metrics over HTTP after real calls,
// reflection, TLS, and logs free of secrets.

#include <dirent.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "adapters/http/http_client.h"
#include "common/log.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "grpcpp/impl/codegen/sync_stream.h"
#include "tests/testing/broker_fixture.h"

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
  StartBroker(R"({"providers": {"e2b": {}}})");  // e2b without a key: unusable
  unsetenv("E2B_API_KEY");
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

// A self-signed certificate for 127.0.0.1 (also its own CA).
struct Cert {
  std::string cert, key, cert_file, key_file;
};
Cert MakeCert(const std::string& dir) {
  Cert c;
  c.cert_file = dir + "/cert.pem";
  c.key_file = dir + "/key.pem";
  const std::string cmd = absl::StrCat(
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
      "-addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout ",
      c.key_file, " -out ", c.cert_file, " 2>/dev/null");
  EXPECT_EQ(system(cmd.c_str()), 0);
  auto slurp = [](const std::string& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  c.cert = slurp(c.cert_file);
  c.key = slurp(c.key_file);
  return c;
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

}  // namespace
}  // namespace sandbox
