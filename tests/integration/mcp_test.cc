// The daemon's MCP endpoint over real HTTP(S): the listener BrokerServer
// starts from mcp.listen, TLS and mutual TLS with the gRPC settings, and a
// drain that ends a running MCP call.

#include <httplib.h>

#include <thread>

#include "tests/testing/broker_fixture.h"
#include "tests/testing/test_cert.h"

namespace sandbox {
namespace {

class McpHttpTest : public BrokerFixture {
 protected:
  static httplib::Headers Headers() {
    return {{"Authorization", "Bearer token-alpha-123"},
            {"Accept", "application/json, text/event-stream"},
            {"MCP-Protocol-Version", "2026-07-28"},
            {"Mcp-Method", "tools/call"},
            {"Mcp-Name", "sandbox_local_run"}};
  }
  static std::string RunBody(const std::string& code) {
    nlohmann::json meta = {{"io.modelcontextprotocol/protocolVersion", "2026-07-28"},
                           {"io.modelcontextprotocol/clientCapabilities", nlohmann::json::object()}};
    return nlohmann::json({{"jsonrpc", "2.0"},
                           {"id", 1},
                           {"method", "tools/call"},
                           {"params",
                            {{"name", "sandbox_local_run"},
                             {"arguments", {{"code", code}}},
                             {"_meta", meta}}}})
        .dump();
  }
  static std::string OutputOf(const std::string& sse) {
    size_t at = sse.rfind("data: ");
    if (at == std::string::npos) return "<no data in " + sse + ">";
    nlohmann::json j = nlohmann::json::parse(sse.substr(at + 6), nullptr, false);
    if (j.is_discarded()) return "<bad json>";
    return j["result"]["structuredContent"].value("output", "<none>");
  }
};

TEST_F(McpHttpTest, ServesOverTlsAndMutualTls) {
  Cert c = MakeCert(dir_.path());
  nlohmann::json cfg = {{"tls", {{"cert_file", c.cert_file}, {"key_file", c.key_file}}},
                        {"mcp", {{"listen", "127.0.0.1:0"}}}};
  StartBroker(cfg.dump());
  ASSERT_GT(server_->mcp_port(), 0);
  {
    httplib::SSLClient https("127.0.0.1", server_->mcp_port());
    https.set_ca_cert_path(c.cert_file.c_str());
    https.enable_server_certificate_verification(true);
    auto r = https.Post("/mcp", Headers(), RunBody("print('over tls')"), "application/json");
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(OutputOf(r->body), "over tls\n");
    httplib::Client plain("127.0.0.1", server_->mcp_port());
    auto p = plain.Post("/mcp", Headers(), RunBody("print(1)"), "application/json");
    EXPECT_TRUE(!p || p->status != 200);
  }
  server_.reset();
  cfg["tls"]["client_ca_file"] = c.cert_file;
  StartBroker(cfg.dump());
  {
    httplib::SSLClient anonymous("127.0.0.1", server_->mcp_port());
    anonymous.set_ca_cert_path(c.cert_file.c_str());
    anonymous.enable_server_certificate_verification(true);
    EXPECT_FALSE(anonymous.Post("/mcp", Headers(), RunBody("print(1)"), "application/json"));
    httplib::SSLClient known("127.0.0.1", server_->mcp_port(), c.cert_file, c.key_file);
    known.set_ca_cert_path(c.cert_file.c_str());
    known.enable_server_certificate_verification(true);
    auto r = known.Post("/mcp", Headers(), RunBody("print('mutual')"), "application/json");
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    EXPECT_EQ(OutputOf(r->body), "mutual\n");
  }
}

TEST_F(McpHttpTest, SameRulesAsGrpcForLimitsAndQuotas) {
  StartBroker(R"({"mcp": {"listen": "127.0.0.1:0"}, "max_sessions_per_tenant": 1})");
  httplib::Client http("127.0.0.1", server_->mcp_port());
  // Timeouts above max_timeout_seconds (60 here) are the model's error.
  nlohmann::json body = nlohmann::json::parse(RunBody("print(1)"));
  body["params"]["arguments"]["timeoutSeconds"] = 61;
  auto r = http.Post("/mcp", Headers(), body.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_NE(r->body.find("\"isError\":true"), std::string::npos) << r->body;
  // The tenant's quota counts MCP sessions too: "mcp" is its one session.
  ASSERT_TRUE(http.Post("/mcp", Headers(), RunBody("print(1)"), "application/json"));
  auto grpc_side = Client("another")->Run("print(2)");
  EXPECT_EQ(grpc_side.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(McpHttpTest, DrainEndsARunningCall) {
  StartBroker(R"({"mcp": {"listen": "127.0.0.1:0"}, "drain_grace_seconds": 0})");
  httplib::Client http("127.0.0.1", server_->mcp_port());
  http.set_read_timeout(30, 0);
  std::string body;
  std::thread call([&] {
    auto r = http.Post("/mcp", Headers(), RunBody("import time\nprint('started', flush=True)\ntime.sleep(20)"),
                       "application/json");
    if (r) body = r->body;
  });
  // Wait until the run is in flight.
  for (int i = 0; i < 200 && server_->sessions()->size() == 0; ++i) absl::SleepFor(absl::Milliseconds(20));
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time start = absl::Now();
  server_->Drain();
  call.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(body.find("\"output\""), std::string::npos) << body;  // no result: cancelled
}

}  // namespace
}  // namespace sandbox
