// The daemon's MCP endpoint over real HTTP(S): the listener BrokerServer
// starts from mcp.listen, TLS and mutual TLS with the gRPC settings, and a
// drain that ends a running MCP call.

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "tests/testing/broker_fixture.h"
#include "tests/testing/test_cert.h"
#include "tests/testing/threads.h"

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
    nlohmann::json meta = {
        {"io.modelcontextprotocol/protocolVersion", "2026-07-28"},
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
  // A raw HTTP/1.1 connection to the MCP port with one request written
  // (no client thread waits on it); -1 on failure. `rcvbuf` > 0 sets the
  // socket's receive buffer (a small window: little in flight).
  int SendRaw(const std::string& body, const std::string& tool, bool sse, int rcvbuf = 0) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(server_->mcp_port()));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      if (fd >= 0) close(fd);
      return -1;
    }
    std::string req = absl::StrCat(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer token-alpha-123\r\n",
        "Accept: application/json", sse ? ", text/event-stream" : "",
        "\r\nContent-Type: application/json\r\nMCP-Protocol-Version: 2026-07-28\r\n",
        "Mcp-Method: tools/call\r\nMcp-Name: ", tool, "\r\nConnection: close\r\n",
        "Content-Length: ", body.size(), "\r\n\r\n", body);
    if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
      close(fd);
      return -1;
    }
    return fd;
  }
  // Everything the server sends until it closes.
  static std::string ReadAll(int fd) {
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
    close(fd);
    return out;
  }
  // Polls `done` until true or `limit` passes.
  static bool Until(const std::function<bool()>& done, absl::Duration limit = absl::Seconds(30)) {
    const absl::Time end = absl::Now() + limit;
    while (!done()) {
      if (absl::Now() > end) return false;
      absl::SleepFor(absl::Milliseconds(2));
    }
    return true;
  }
  static std::string CallBody(const std::string& tool, const std::string& code, int id) {
    nlohmann::json body = nlohmann::json::parse(RunBody(code));
    body["id"] = id;
    body["params"]["name"] = tool;
    return body.dump();
  }
  // The body of a chunked HTTP/1.1 response (headers and all); "" if it is
  // cut short.
  static std::string Dechunk(const std::string& http) {
    size_t at = http.find("\r\n\r\n");
    if (at == std::string::npos) return "";
    at += 4;
    std::string body;
    while (at < http.size()) {
      const size_t eol = http.find("\r\n", at);
      if (eol == std::string::npos) return "";
      const size_t n = std::stoul(http.substr(at, eol - at), nullptr, 16);
      if (n == 0) return body;
      if (eol + 2 + n > http.size()) return "";
      body.append(http, eol + 2, n);
      at = eol + 2 + n + 2;
    }
    return "";
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
    auto r = http.Post("/mcp", Headers(),
                       RunBody("import time\nprint('started', flush=True)\ntime.sleep(20)"),
                       "application/json");
    if (r) body = r->body;
  });
  // Wait until the run is in flight.
  for (int i = 0; i < 200 && server_->sessions()->size() == 0; ++i)
    absl::SleepFor(absl::Milliseconds(20));
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time start = absl::Now();
  server_->Drain();
  call.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(body.find("\"output\""), std::string::npos) << body;  // no result: cancelled
}

// A drain gives running MCP calls the same grace as gRPC calls (a rolling
// update must not kill every agent's call), and new MCP requests get a 503
// with Retry-After meanwhile.
TEST_F(McpHttpTest, DrainGivesRunningCallsTheirGraceAndRefusesNewOnes) {
  StartBroker(R"({"mcp": {"listen": "127.0.0.1:0"}, "drain_grace_seconds": 60,
      "default_provider": "echo", "providers": {"echo": {"hold_ms": 3000}}})");
  const int fd =
      SendRaw(CallBody("sandbox_echo_run", "held-through-drain", 1), "sandbox_echo_run", false);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(Until([&] { return server_->mcp()->calls_running() == 1; }));
  std::thread drain([&] { server_->Drain(); });
  httplib::Client http("127.0.0.1", server_->mcp_port());
  // Until the drain has begun: a request that is answered at once either
  // way (not JSON-RPC: 400 before, 503 after).
  ASSERT_TRUE(Until([&] {
    auto r = http.Post("/mcp", Headers(), "{}", "application/json");
    return r && r->status == 503;
  }));
  httplib::Result refused =
      http.Post("/mcp", Headers(), CallBody("sandbox_echo_run", "late", 2), "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503);
  EXPECT_EQ(refused->get_header_value("Retry-After"), "1");
  EXPECT_NE(refused->body.find("shutting down"), std::string::npos) << refused->body;
  EXPECT_EQ(server_->mcp()->calls_running(), 1);  // still running when refused
  const std::string reply = ReadAll(fd);
  EXPECT_TRUE(absl::StartsWith(reply, "HTTP/1.1 200")) << reply;
  EXPECT_NE(reply.find("\"output\":\"held-through-drain\""), std::string::npos) << reply;
  drain.join();
}

// Calls in flight over real HTTP hold no thread: 300 connections, each a
// tools/call the echo provider answers after 3 s, half as JSON and half as
// SSE. No client thread waits either (raw sockets, read afterwards).
TEST_F(McpHttpTest, CallsInFlightHoldNoThread) {
  StartBroker(R"({"mcp": {"listen": "127.0.0.1:0"}, "default_provider": "echo",
      "providers": {"echo": {"hold_ms": 3000}}})");
  ReadAll(SendRaw(CallBody("sandbox_echo_run", "warm", 0), "sandbox_echo_run", false));
  const int before = ProcessThreadCount();
  constexpr int kCalls = 300;
  std::vector<int> fds;
  for (int i = 0; i < kCalls; ++i) {
    fds.push_back(SendRaw(CallBody("sandbox_echo_run", absl::StrCat("call-", i), i + 1),
                          "sandbox_echo_run", i % 2 == 0));
    ASSERT_GE(fds.back(), 0) << i;
  }
  ASSERT_TRUE(Until([&] { return server_->mcp()->calls_running() == kCalls; }))
      << server_->mcp()->calls_running();
  const int during = ProcessThreadCount();
  // A thread per connection (the cpp-httplib listener) would be 300.
  EXPECT_LT(during - before, 16) << before << " -> " << during;
  for (int i = 0; i < kCalls; ++i) {
    const std::string reply = ReadAll(fds[i]);
    EXPECT_TRUE(absl::StartsWith(reply, "HTTP/1.1 200")) << reply;
    EXPECT_NE(reply.find(absl::StrCat("\"output\":\"call-", i, "\"")), std::string::npos)
        << i << ": " << reply;
  }
}

// A client that goes away while its call runs (a JSON answer: nothing is
// written until the end) gets its run killed, not finished.
TEST_F(McpHttpTest, AClientThatHangsUpCancelsItsRun) {
  StartBroker(R"({"mcp": {"listen": "127.0.0.1:0"}})");
  const int fd = SendRaw(CallBody("sandbox_local_run", "import time\ntime.sleep(60)", 1),
                         "sandbox_local_run", false);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(Until([&] { return server_->mcp()->calls_running() == 1; }));
  close(fd);
  // Well before the run's 60 s.
  EXPECT_TRUE(Until([&] { return server_->mcp()->calls_running() == 0; }));
}

// A client that stops reading an SSE answer and then leaves while the
// answer's last bytes are still unsent (its end waits for them): the
// listener ends and frees the request. It used to wait for a write report
// that a closed connection never gives, keeping the request for ever.
TEST_F(McpHttpTest, AnSseAnswerLeftUnreadIsFreedWhenItsClientLeaves) {
  StartBroker(R"({"mcp": {"listen": "127.0.0.1:0"}, "max_output_bytes": 33554432})");
  ASSERT_NE(server_->mcp_http(), nullptr);
  // 32 MiB in the answer: more than the client's and the server's socket
  // buffers hold, so its write stays in flight while the client reads
  // nothing.
  const int fd =
      SendRaw(CallBody("sandbox_local_run", "import sys\nsys.stdout.write('x' * (32 << 20))", 1),
              "sandbox_local_run", true);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(Until([&] { return server_->mcp()->calls_running() == 1; }));
  ASSERT_TRUE(Until([&] { return server_->mcp()->calls_running() == 0; }));
  EXPECT_EQ(server_->mcp_http()->requests_waiting(), 1);
  close(fd);
  EXPECT_TRUE(Until([&] { return server_->mcp_http()->requests_waiting() == 0; }))
      << server_->mcp_http()->requests_waiting();
}

// SSE flow control (docs/mcp.md): a client that stops reading a run's
// progress stream makes the broker stop reading the program's output once
// the answer's bounded buffer is full, so the program blocks on its pipe
// instead of the broker's memory growing by the output's size; when the
// client reads again, every byte arrives in order.
TEST_F(McpHttpTest, ASlowSseReaderPausesTheProgramAndLosesNothing) {
  constexpr int kChunk = 64 * 1024, kChunks = 256;  // 16 MiB in all
  StartBroker(
      R"({"mcp": {"listen": "127.0.0.1:0"}, "max_output_bytes": 67108864,
          "max_timeout_seconds": 300})");
  auto sb = Client("slow-sse");
  ASSERT_TRUE(sb->Start().ok());
  const std::string code = ChunkWriter(kChunks, kChunk);
  nlohmann::json body = nlohmann::json::parse(CallBody("sandbox_local_run", code, 7));
  body["params"]["arguments"]["session"] = "slow-sse";
  body["params"]["arguments"]["timeoutSeconds"] = 300;
  body["params"]["_meta"]["progressToken"] = "p";
  const int fd = SendRaw(body.dump(), "sandbox_local_run", true, 64 << 10);
  ASSERT_GE(fd, 0);
  // Read nothing: the program must come to a stop, well short of the end.
  const int last = ChunksWhenPaused(sb.get(), absl::Seconds(120));
  ASSERT_GE(last, 0) << "the program never paused";
  // In flight: the answer's 256 KiB, the pipe, both sockets' buffers.
  printf("slow SSE reader: the program paused after %d of %d chunks of 64 KiB\n", last, kChunks);
  EXPECT_LT(last, kChunks / 2) << last << " of " << kChunks << " chunks written with no reader";
  EXPECT_EQ(server_->mcp()->calls_running(), 1);
  // Read again: every chunk, in order, in the progress notifications, then
  // the result.
  const std::string sse = Dechunk(ReadAll(fd));
  ASSERT_FALSE(sse.empty());
  std::string streamed;
  nlohmann::json result;
  for (absl::string_view ev : absl::StrSplit(sse, "\n\n", absl::SkipEmpty())) {
    absl::ConsumePrefix(&ev, "event: message\n");
    if (!absl::ConsumePrefix(&ev, "data: ")) continue;  // a keep-alive comment
    nlohmann::json j = nlohmann::json::parse(ev, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << ev.substr(0, 200);
    if (j.value("method", "") == "notifications/progress") {
      streamed += j["params"]["message"].get<std::string>();
    } else {
      result = j;
    }
  }
  ASSERT_EQ(streamed.size(), static_cast<size_t>(kChunk) * kChunks);
  for (int i = 0; i < kChunks; ++i) {
    ASSERT_TRUE(absl::StartsWith(absl::string_view(streamed).substr(size_t{1} * i * kChunk),
                                 absl::StrCat(i, ".")))
        << "chunk " << i;
  }
  ASSERT_TRUE(result.contains("result")) << result.dump().substr(0, 300);
  EXPECT_EQ(result["result"]["structuredContent"]["output"].get<std::string>(), streamed);
  EXPECT_EQ(result["result"]["structuredContent"]["exitCode"], 0);
}

}  // namespace
}  // namespace sandbox
