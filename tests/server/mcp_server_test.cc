// The MCP protocol layer without a network: HandleRequest for each HTTP
// rule of both eras, the real BrokerCore behind it for sessions and tenants,
// a scripted backend for progress ordering and cancellation, and stdio.

#include "protocol/mcp_server.h"

#include <gtest/gtest.h>

#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "adapters/echo/echo_provider.h"
#include "protocol/tools.h"
#include "server/config/auth.h"
#include "server/core/broker_core.h"
#include "server/transport/mcp/mcp_core_backend.h"
#include "server/transport/mcp/mcp_http.h"
#include "tests/testing/fake_provider.h"
#include "tests/testing/threads.h"

namespace sandbox {
namespace {

using json = nlohmann::json;

constexpr char kTokenA[] = "token-a-123456";
constexpr char kTokenB[] = "token-b-123456";

json ModernMeta() {
  return {{"io.modelcontextprotocol/protocolVersion", "2026-07-28"},
          {"io.modelcontextprotocol/clientCapabilities", json::object()}};
}

class StringSink final : public McpEventSink {
 public:
  bool Write(absl::string_view b) override {
    absl::MutexLock l(&mu_);
    data_.append(b.data(), b.size());
    return alive_;
  }
  bool Alive() override {
    absl::MutexLock l(&mu_);
    return alive_;
  }
  void Kill() {
    absl::MutexLock l(&mu_);
    alive_ = false;
  }
  void Close() override { closed_.Notify(); }
  void WaitClosed() { closed_.WaitForNotification(); }
  std::string data() {
    absl::MutexLock l(&mu_);
    return data_;
  }
  // The JSON messages of the stream, in order (comments skipped).
  std::vector<json> Messages() {
    std::vector<json> out;
    for (absl::string_view line : absl::StrSplit(data(), '\n')) {
      if (absl::ConsumePrefix(&line, "data: ")) out.push_back(json::parse(line));
    }
    return out;
  }

 private:
  absl::Mutex mu_;
  std::string data_;
  absl::Notification closed_;
  bool alive_ = true;
};

// A response as its client gets it: a `later` one answered.
McpHttpResponse McpAnswered(McpHttpResponse r) {
  if (!r.later) return r;
  absl::Notification answered;
  McpHttpResponse out;
  auto later = std::move(r.later);
  later(
      [&](McpHttpResponse x) {
        out = std::move(x);
        answered.Notify();
      },
      nullptr);
  answered.WaitForNotification();
  return out;
}

// A stream response run until its producer closes it.
std::shared_ptr<StringSink> McpStreamed(const McpHttpResponse& r) {
  auto sink = std::make_shared<StringSink>();
  r.stream(sink);
  sink->WaitClosed();
  return sink;
}

// The real broker core over a fake provider, as the daemon wires it.
class McpServerTest : public ::testing::Test {
 protected:
  McpServerTest() {
    auto provider = std::make_unique<FakeProvider>("fake");
    counters_ = provider->counters();
    registry_.Add(std::move(provider));
    config_.default_provider = "fake";
    SessionLimits limits;
    sessions_ = std::make_unique<SessionManager>(&registry_, &clock_, limits, "fake", "test");
    core_ = std::make_unique<BrokerCore>(config_, &registry_, sessions_.get(), &clock_);
    backend_ = std::make_unique<McpCoreBackend>(core_.get(), &auth_);
    McpServerOptions o;
    o.allowed_origins = {"https://app.example"};
    o.loopback_hosts_only = true;
    o.max_body_bytes = 4096;
    o.session_idle_timeout = absl::Minutes(5);
    server_ = std::make_unique<McpServer>(backend_.get(), &clock_, o);
  }

  McpHttpRequest Post(const json& body, const std::string& token = kTokenA) {
    McpHttpRequest r;
    r.method = "POST";
    r.headers["host"] = "127.0.0.1:1234";
    r.headers["content-type"] = "application/json";
    r.headers["accept"] = "application/json, text/event-stream";
    if (!token.empty()) r.headers["authorization"] = "Bearer " + token;
    r.body = body.dump();
    return r;
  }
  McpHttpRequest ModernPost(const std::string& method, json params,
                            const std::string& token = kTokenA) {
    params["_meta"] = ModernMeta();
    McpHttpRequest r =
        Post({{"jsonrpc", "2.0"}, {"id", 7}, {"method", method}, {"params", params}}, token);
    r.headers["mcp-protocol-version"] = "2026-07-28";
    r.headers["mcp-method"] = method;
    if (params.contains("name")) r.headers["mcp-name"] = params["name"].get<std::string>();
    return r;
  }
  static std::string HeaderOf(const McpHttpResponse& r, const std::string& name) {
    for (const auto& [k, v] : r.headers) {
      if (absl::EqualsIgnoreCase(k, name)) return v;
    }
    return "";
  }
  // initialize -> the Mcp-Session-Id.
  std::string Initialize(const std::string& token = kTokenA) {
    McpHttpResponse r = server_->HandleRequest(
        Post({{"jsonrpc", "2.0"},
              {"id", 1},
              {"method", "initialize"},
              {"params", {{"protocolVersion", "2025-11-25"}, {"capabilities", json::object()}}}},
             token));
    EXPECT_EQ(r.status, 200) << r.body;
    return HeaderOf(r, "Mcp-Session-Id");
  }
  McpHttpRequest LegacyPost(const std::string& sid, const json& body,
                            const std::string& token = kTokenA) {
    McpHttpRequest r = Post(body, token);
    r.headers["mcp-session-id"] = sid;
    r.headers["mcp-protocol-version"] = "2025-11-25";
    return r;
  }
  // Runs a response to completion: its body, or its stream's messages.
  json Final(McpHttpResponse r) {
    if (!r.stream) return json::parse(McpAnswered(std::move(r)).body);
    std::vector<json> m = McpStreamed(r)->Messages();
    return m.empty() ? json() : m.back();
  }
  int BrokerSessions(const std::string& tenant) {
    bool more = false;
    return static_cast<int>(sessions_->List(tenant, "", 100, &more).size());
  }

  FakeClock clock_;
  ProviderRegistry registry_;
  std::shared_ptr<FakeProvider::Counters> counters_;
  BrokerConfig config_;
  Authenticator auth_{{{kTokenA, "alpha"}, {kTokenB, "beta"}}};
  std::unique_ptr<SessionManager> sessions_;
  std::unique_ptr<BrokerCore> core_;
  std::unique_ptr<McpCoreBackend> backend_;
  std::unique_ptr<McpServer> server_;
};

TEST_F(McpServerTest, ForeignOriginAndHostGet403) {
  McpHttpRequest r = Post({{"jsonrpc", "2.0"}, {"id", 1}, {"method", "ping"}});
  r.headers["origin"] = "http://evil.example";
  EXPECT_EQ(server_->HandleRequest(r).status, 403);
  r.headers["origin"] = "https://app.example";  // the allow-list
  EXPECT_NE(server_->HandleRequest(r).status, 403);
  r.headers["origin"] = "http://localhost:3000";
  EXPECT_NE(server_->HandleRequest(r).status, 403);
  r.headers.erase("origin");
  r.headers["host"] = "evil.example:1234";  // DNS rebinding onto loopback
  EXPECT_EQ(server_->HandleRequest(r).status, 403);
}

TEST_F(McpServerTest, BodyLimit) {
  McpHttpRequest r = Post({{"jsonrpc", "2.0"}, {"id", 1}, {"method", std::string(5000, 'x')}});
  EXPECT_EQ(server_->HandleRequest(r).status, 413);
}

TEST_F(McpServerTest, AuthFailuresGet401WithBearerChallenge) {
  McpHttpResponse none = server_->HandleRequest(Post({{"jsonrpc", "2.0"}, {"id", 1}}, ""));
  EXPECT_EQ(none.status, 401);
  EXPECT_TRUE(absl::StartsWith(HeaderOf(none, "WWW-Authenticate"), "Bearer ")) << none.body;
  McpHttpResponse bad =
      server_->HandleRequest(Post({{"jsonrpc", "2.0"}, {"id", 1}}, "nope-nope-1"));
  EXPECT_EQ(bad.status, 401);
  EXPECT_TRUE(absl::StrContains(HeaderOf(bad, "WWW-Authenticate"), "invalid_token"));
  EXPECT_FALSE(absl::StrContains(bad.body, "nope-nope-1"));
}

TEST_F(McpServerTest, MalformedBodies) {
  McpHttpRequest r = Post({});
  r.body = "{not json";
  McpHttpResponse resp = server_->HandleRequest(r);
  EXPECT_EQ(resp.status, 400);
  EXPECT_EQ(json::parse(resp.body)["error"]["code"], -32700);
  r.body = "[]";
  resp = server_->HandleRequest(r);
  EXPECT_EQ(resp.status, 400);
  EXPECT_EQ(json::parse(resp.body)["error"]["code"], -32600);
  // Deep nesting is refused before parsing (re-serializing would recurse).
  r.body = R"({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sandbox_fake_run",)"
           R"("arguments":{"code":"x","deep":)" +
           std::string(1000, '[') + std::string(1000, ']') + "}}}";
  resp = server_->HandleRequest(r);
  EXPECT_EQ(resp.status, 400);
  EXPECT_EQ(json::parse(resp.body)["error"]["code"], -32600);
  r.headers["content-type"] = "text/plain";
  EXPECT_EQ(server_->HandleRequest(r).status, 415);
}

TEST_F(McpServerTest, LegacyVersionNegotiation) {
  auto init = [&](const json& params) {
    return server_->HandleRequest(
        Post({{"jsonrpc", "2.0"}, {"id", 1}, {"method", "initialize"}, {"params", params}}));
  };
  McpHttpResponse older = init({{"protocolVersion", "2025-06-18"}});
  EXPECT_EQ(json::parse(older.body)["result"]["protocolVersion"], "2025-06-18");
  McpHttpResponse unknown = init({{"protocolVersion", "1999-01-01"}});
  EXPECT_EQ(json::parse(unknown.body)["result"]["protocolVersion"], "2025-11-25");
  EXPECT_FALSE(HeaderOf(unknown, "Mcp-Session-Id").empty());
  McpHttpResponse missing = init(json::object());
  EXPECT_EQ(missing.status, 400);
  EXPECT_EQ(json::parse(missing.body)["error"]["code"], -32602);
}

TEST_F(McpServerTest, LegacySessionHeaderRules) {
  const std::string sid = Initialize();
  ASSERT_EQ(sid.size(), 32u);
  json ping = {{"jsonrpc", "2.0"}, {"id", 2}, {"method", "ping"}};
  EXPECT_EQ(server_->HandleRequest(LegacyPost(sid, ping)).status, 200);
  // No session id on a legacy request.
  McpHttpRequest no_sid = Post(ping);
  no_sid.headers["mcp-protocol-version"] = "2025-11-25";
  EXPECT_EQ(server_->HandleRequest(no_sid).status, 400);
  // Unknown session; another tenant's session.
  EXPECT_EQ(server_->HandleRequest(LegacyPost("0123", ping)).status, 404);
  EXPECT_EQ(server_->HandleRequest(LegacyPost(sid, ping, kTokenB)).status, 404);
  // A protocol version other than the session's.
  McpHttpRequest wrong = LegacyPost(sid, ping);
  wrong.headers["mcp-protocol-version"] = "2025-06-18";
  EXPECT_EQ(server_->HandleRequest(wrong).status, 400);
  // Notifications get 202; GET has no stream.
  EXPECT_EQ(server_
                ->HandleRequest(
                    LegacyPost(sid, {{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}}))
                .status,
            202);
  McpHttpRequest get = LegacyPost(sid, ping);
  get.method = "GET";
  get.body.clear();
  EXPECT_EQ(server_->HandleRequest(get).status, 405);
  // DELETE: another tenant cannot; the owner can, once.
  McpHttpRequest del = LegacyPost(sid, ping, kTokenB);
  del.method = "DELETE";
  EXPECT_EQ(server_->HandleRequest(del).status, 404);
  del.headers["authorization"] = std::string("Bearer ") + kTokenA;
  EXPECT_EQ(server_->HandleRequest(del).status, 200);
  EXPECT_EQ(server_->HandleRequest(del).status, 404);
  EXPECT_EQ(server_->HandleRequest(LegacyPost(sid, ping)).status, 404);
}

TEST_F(McpServerTest, ModernMetaAndHeaderRules) {
  auto code = [](const McpHttpResponse& r) { return json::parse(r.body)["error"]["code"]; };
  McpHttpRequest ok = ModernPost("server/discover", json::object());
  McpHttpResponse d = server_->HandleRequest(ok);
  ASSERT_EQ(d.status, 200) << d.body;
  json result = json::parse(d.body)["result"];
  EXPECT_EQ(result["resultType"], "complete");
  EXPECT_EQ(result["supportedVersions"][0], "2026-07-28");
  EXPECT_TRUE(result["capabilities"].contains("tools"));
  EXPECT_TRUE(HeaderOf(d, "Mcp-Session-Id").empty());

  McpHttpRequest no_meta = ok;
  no_meta.body = json({{"jsonrpc", "2.0"}, {"id", 7}, {"method", "server/discover"}}).dump();
  McpHttpResponse r = server_->HandleRequest(no_meta);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(code(r), -32602);

  McpHttpRequest no_caps = ok;
  json body = json::parse(ok.body);
  body["params"]["_meta"].erase("io.modelcontextprotocol/clientCapabilities");
  no_caps.body = body.dump();
  EXPECT_EQ(code(server_->HandleRequest(no_caps)), -32602);

  McpHttpRequest unsupported = ok;
  body = json::parse(ok.body);
  body["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = "1999-01-01";
  unsupported.body = body.dump();
  unsupported.headers["mcp-protocol-version"] = "1999-01-01";
  r = server_->HandleRequest(unsupported);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(code(r), -32022);
  EXPECT_EQ(json::parse(r.body)["error"]["data"]["requested"], "1999-01-01");
  EXPECT_EQ(json::parse(r.body)["error"]["data"]["supported"][0], "2026-07-28");
  EXPECT_EQ(json::parse(r.body)["id"], 7);

  // Headers must mirror the body.
  McpHttpRequest mismatch = unsupported;
  mismatch.headers["mcp-protocol-version"] = "2026-07-28";
  EXPECT_EQ(code(server_->HandleRequest(mismatch)), -32020);
  McpHttpRequest no_version = ok;
  no_version.headers.erase("mcp-protocol-version");
  EXPECT_EQ(code(server_->HandleRequest(no_version)), -32020);
  McpHttpRequest method = ok;
  method.headers["mcp-method"] = "tools/list";
  EXPECT_EQ(code(server_->HandleRequest(method)), -32020);
  McpHttpRequest name = ModernPost("tools/call", {{"name", "sandbox_fake_run"}});
  name.headers["mcp-name"] = "sandbox_fake_shell";
  r = server_->HandleRequest(name);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(code(r), -32020);
  name.headers.erase("mcp-name");
  EXPECT_EQ(code(server_->HandleRequest(name)), -32020);

  // Removed and unknown methods: 404 with -32601.
  for (const char* m : {"ping", "initialize", "resources/list"}) {
    r = server_->HandleRequest(ModernPost(m, json::object()));
    EXPECT_EQ(r.status, 404) << m;
    EXPECT_EQ(code(r), -32601) << m;
  }
}

TEST_F(McpServerTest, ModernNameHeaderMayBeBase64) {
  McpHttpRequest r = ModernPost(
      "tools/call", {{"name", "sandbox_fake_run"}, {"arguments", {{"code", "print(1)"}}}});
  r.headers["mcp-name"] = "=?base64?c2FuZGJveF9mYWtlX3J1bg==?=";
  r.headers["accept"] = "application/json";
  McpHttpResponse resp = McpAnswered(server_->HandleRequest(r));
  EXPECT_EQ(resp.status, 200) << resp.body;
  EXPECT_EQ(json::parse(resp.body)["result"]["isError"], false) << resp.body;
}

TEST_F(McpServerTest, ToolsListHasOutputSchemasAndSessionArgument) {
  json r = Final(server_->HandleRequest(ModernPost("tools/list", json::object())));
  ASSERT_EQ(r["result"]["tools"].size(), 4u) << r;
  for (const json& t : r["result"]["tools"]) {
    EXPECT_EQ(t["outputSchema"]["type"], "object");
    EXPECT_TRUE(t["inputSchema"]["properties"].contains("session"));
  }
  EXPECT_GE(r["result"]["ttlMs"].get<int>(), 0);
  EXPECT_EQ(r["result"]["cacheScope"], "private");
}

TEST_F(McpServerTest, LegacySessionMapsToOwnBrokerSessionClosedOnDelete) {
  const std::string a = Initialize(), b = Initialize();
  auto run = [&](const std::string& sid, const json& args) {
    return Final(server_->HandleRequest(
        LegacyPost(sid, {{"jsonrpc", "2.0"},
                         {"id", 3},
                         {"method", "tools/call"},
                         {"params", {{"name", "sandbox_fake_run"}, {"arguments", args}}}})));
  };
  json ra = run(a, {{"code", "print(1)"}});
  json rb = run(b, {{"code", "print(2)"}});
  const std::string sa = ra["result"]["structuredContent"]["session"];
  const std::string sb = rb["result"]["structuredContent"]["session"];
  EXPECT_TRUE(absl::StartsWith(sa, "mcp-"));
  EXPECT_NE(sa, sb);
  EXPECT_EQ(ra["result"]["structuredContent"]["output"], "print(1)");  // the fake echoes
  EXPECT_EQ(ra["result"]["isError"], false);
  EXPECT_EQ(BrokerSessions("alpha"), 2);
  // An explicit session is used as given, and not closed with the MCP session.
  json rc = run(a, {{"code", "x"}, {"session", "shared"}});
  EXPECT_EQ(rc["result"]["structuredContent"]["session"], "shared");
  EXPECT_EQ(BrokerSessions("alpha"), 3);
  McpHttpRequest del = LegacyPost(a, json::object());
  del.method = "DELETE";
  EXPECT_EQ(server_->HandleRequest(del).status, 200);
  EXPECT_EQ(BrokerSessions("alpha"), 2);
  EXPECT_EQ(counters_->destroys.load(), 1);
}

TEST_F(McpServerTest, IdleLegacySessionExpiresWithItsBrokerSession) {
  const std::string sid = Initialize();
  json call = {{"jsonrpc", "2.0"},
               {"id", 3},
               {"method", "tools/call"},
               {"params", {{"name", "sandbox_fake_shell"}, {"arguments", {{"command", "ls"}}}}}};
  Final(server_->HandleRequest(LegacyPost(sid, call)));
  EXPECT_EQ(BrokerSessions("alpha"), 1);
  clock_.Advance(absl::Minutes(4));
  EXPECT_EQ(
      server_->HandleRequest(LegacyPost(sid, {{"jsonrpc", "2.0"}, {"id", 4}, {"method", "ping"}}))
          .status,
      200);
  clock_.Advance(absl::Minutes(5));
  EXPECT_EQ(server_->HandleRequest(LegacyPost(sid, call)).status, 404);
  server_->ExpireSessions();
  EXPECT_EQ(server_->session_count(), 0u);
  EXPECT_EQ(BrokerSessions("alpha"), 0);
}

TEST_F(McpServerTest, UnsentStreamReleasesItsSession) {
  const std::string sid = Initialize();
  {
    McpHttpResponse r = server_->HandleRequest(LegacyPost(
        sid, {{"jsonrpc", "2.0"},
              {"id", 3},
              {"method", "tools/call"},
              {"params", {{"name", "sandbox_fake_shell"}, {"arguments", {{"command", "ls"}}}}}}));
    ASSERT_TRUE(r.stream);
  }  // dropped: the client went away before the stream started
  clock_.Advance(absl::Minutes(6));
  server_->ExpireSessions();
  EXPECT_EQ(server_->session_count(), 0u);
}

TEST_F(McpServerTest, StatelessDefaultSessionIsTheTenantsMcpSession) {
  McpHttpRequest w = ModernPost("tools/call", {{"name", "sandbox_fake_write_file"},
                                               {"arguments", {{"path", "f"}, {"contents", "A"}}}});
  json r = Final(server_->HandleRequest(w));
  EXPECT_EQ(r["result"]["structuredContent"]["session"], "mcp");
  EXPECT_EQ(r["result"]["resultType"], "complete");
  auto read = [&](const std::string& token) {
    return Final(server_->HandleRequest(
        ModernPost("tools/call",
                   {{"name", "sandbox_fake_read_file"}, {"arguments", {{"path", "f"}}}}, token)));
  };
  EXPECT_EQ(read(kTokenA)["result"]["structuredContent"]["content"], "A");
  json other = read(kTokenB);  // tenant beta's own "mcp" session
  EXPECT_EQ(other["result"]["structuredContent"]["found"], false);
  EXPECT_EQ(other["result"]["content"][0]["text"], kFileNotFound);
}

TEST_F(McpServerTest, ToolErrorsAndUnknownTools) {
  json bad = Final(server_->HandleRequest(
      ModernPost("tools/call", {{"name", "sandbox_fake_run"}, {"arguments", {{"code", 5}}}})));
  EXPECT_EQ(bad["result"]["isError"], true);
  EXPECT_FALSE(bad["result"].contains("structuredContent"));
  EXPECT_TRUE(absl::StartsWith(bad["result"]["content"][0]["text"].get<std::string>(), "error: "));
  json bad_session = Final(server_->HandleRequest(ModernPost(
      "tools/call",
      {{"name", "sandbox_fake_run"}, {"arguments", {{"code", "x"}, {"session", "no spaces"}}}})));
  EXPECT_EQ(bad_session["result"]["isError"], true);
  json unknown = Final(server_->HandleRequest(
      ModernPost("tools/call", {{"name", "sandbox_nope_run"}, {"arguments", json::object()}})));
  EXPECT_EQ(unknown["error"]["code"], -32602);
}

// A backend whose runs print scripted chunks, or block until cancelled.
class ScriptedBackend final : public McpBackend {
 public:
  absl::StatusOr<std::string> Authenticate(const std::string*) override { return "t"; }
  absl::StatusOr<std::vector<pb::Tool>> ListTools(const std::string&) override {
    return BuildTools({"fake"}, "", ToolLimits());
  }
  absl::StatusOr<McpToolOutcome> CallTool(const McpCall& call,
                                          const pb::CallToolRequest& req) override {
    if (!started.HasBeenNotified()) started.Notify();
    McpToolOutcome out;
    pb::RunResult r;
    for (const auto& c : chunks) {
      if (call.on_output) call.on_output(c);
      r.mutable_output()->append(c);
    }
    if (block) {
      while (!call.cancelled()) absl::SleepFor(absl::Milliseconds(2));
      cancelled = true;
      return absl::CancelledError("killed");
    }
    out.response.set_content(FormatRunResult(r));
    out.run = r;
    return out;
  }
  void CallToolAsync(McpCall call, pb::CallToolRequest req, ToolDone done) override {
    pool_.Submit([this, call = std::move(call), req = std::move(req), done = std::move(done)] {
      done(CallTool(call, req));
    });
  }
  void CloseSession(const std::string&, const std::string&) override {}

  std::vector<std::string> chunks;
  bool block = false;
  std::atomic<bool> cancelled{false};
  absl::Notification started;

 private:
  WorkPool pool_{"scripted-backend", 8};
};

class McpStreamTest : public ::testing::Test {
 protected:
  McpStreamTest() {
    McpServerOptions o;
    o.liveness_interval = absl::Milliseconds(5);
    server_ = std::make_unique<McpServer>(&backend_, &clock_, o);
  }
  McpHttpRequest Request(json body, const std::string& sid) {
    McpHttpRequest r;
    r.method = "POST";
    r.headers["accept"] = "application/json, text/event-stream";
    if (sid.empty()) {
      body["params"]["_meta"] = ModernMeta();
      body["params"]["_meta"]["progressToken"] = "p1";
      r.headers["mcp-protocol-version"] = "2026-07-28";
      r.headers["mcp-method"] = body["method"].get<std::string>();
      if (body["params"].contains("name")) {
        r.headers["mcp-name"] = body["params"]["name"].get<std::string>();
      }
    } else {
      r.headers["mcp-session-id"] = sid;
      if (body.contains("params")) body["params"]["_meta"] = {{"progressToken", "p1"}};
    }
    r.body = body.dump();
    return r;
  }
  json RunCall() {
    return {{"jsonrpc", "2.0"},
            {"id", 5},
            {"method", "tools/call"},
            {"params", {{"name", "sandbox_fake_run"}, {"arguments", {{"code", "x"}}}}}};
  }
  std::string Init() {
    McpHttpRequest r;
    r.method = "POST";
    r.body = json({{"jsonrpc", "2.0"},
                   {"id", 1},
                   {"method", "initialize"},
                   {"params", {{"protocolVersion", "2025-11-25"}}}})
                 .dump();
    McpHttpResponse resp = server_->HandleRequest(r);
    for (const auto& [k, v] : resp.headers) {
      if (k == "Mcp-Session-Id") return v;
    }
    return "";
  }

  FakeClock clock_;
  ScriptedBackend backend_;
  std::unique_ptr<McpServer> server_;
};

TEST_F(McpStreamTest, ProgressNotificationsPrecedeTheResultAndIncrease) {
  backend_.chunks = {"a", "bb", "ccc"};
  for (const std::string& sid : {std::string(), Init()}) {
    McpHttpResponse r = server_->HandleRequest(Request(RunCall(), sid));
    ASSERT_TRUE(r.stream) << r.body;
    EXPECT_EQ(r.content_type, "text/event-stream");
    std::shared_ptr<StringSink> sink = McpStreamed(r);
    std::vector<json> m = sink->Messages();
    ASSERT_EQ(m.size(), 4u) << sink->data();
    std::string joined;
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(m[i]["method"], "notifications/progress");
      EXPECT_EQ(m[i]["params"]["progressToken"], "p1");
      joined += m[i]["params"]["message"].get<std::string>();
    }
    EXPECT_EQ(m[0]["params"]["progress"], 1);
    EXPECT_EQ(m[1]["params"]["progress"], 3);
    EXPECT_EQ(m[2]["params"]["progress"], 6);
    EXPECT_EQ(joined, "abbccc");
    EXPECT_EQ(m[3]["id"], 5);
    EXPECT_EQ(m[3]["result"]["structuredContent"]["output"], "abbccc");
  }
}

TEST_F(McpStreamTest, LegacyCancelledNotificationKillsTheRun) {
  backend_.block = true;
  const std::string sid = Init();
  McpHttpResponse r = server_->HandleRequest(Request(RunCall(), sid));
  ASSERT_TRUE(r.stream);
  auto sink = std::make_shared<StringSink>();
  r.stream(sink);  // returns at once: the run goes on without this thread
  backend_.started.WaitForNotification();
  McpHttpRequest cancel = Request({{"jsonrpc", "2.0"},
                                   {"method", "notifications/cancelled"},
                                   {"params", {{"requestId", 5}, {"reason", "user"}}}},
                                  sid);
  EXPECT_EQ(server_->HandleRequest(cancel).status, 202);
  sink->WaitClosed();
  EXPECT_TRUE(backend_.cancelled);
  EXPECT_TRUE(sink->Messages().empty()) << sink->data();  // no response after a cancel
}

TEST_F(McpStreamTest, ClosedStreamCancelsTheRun) {
  backend_.block = true;
  McpHttpResponse r = server_->HandleRequest(Request(RunCall(), ""));
  ASSERT_TRUE(r.stream);
  auto sink = std::make_shared<StringSink>();
  r.stream(sink);
  backend_.started.WaitForNotification();
  sink->Kill();  // the client closed the response stream
  sink->WaitClosed();
  EXPECT_TRUE(backend_.cancelled);
}

TEST_F(McpStreamTest, StdioBothEras) {
  std::vector<std::string> out;
  absl::Mutex mu;
  {
    McpStdio stdio(server_.get(), "t", [&](const std::string& line) {
      absl::MutexLock l(&mu);
      out.push_back(line);
    });
    stdio.HandleLine("not json");
    stdio.HandleLine(json({{"jsonrpc", "2.0"}, {"id", 1}, {"method", "tools/list"}}).dump());
    stdio.HandleLine(json({{"jsonrpc", "2.0"},
                           {"id", 2},
                           {"method", "server/discover"},
                           {"params", {{"_meta", ModernMeta()}}}})
                         .dump());
    stdio.Finish();
    stdio.HandleLine(json({{"jsonrpc", "2.0"},
                           {"id", 3},
                           {"method", "initialize"},
                           {"params", {{"protocolVersion", "2025-11-25"}}}})
                         .dump());
    backend_.chunks = {"hi"};
    json call = RunCall();
    call["params"]["_meta"] = {{"progressToken", 9}};
    stdio.HandleLine(call.dump());
    stdio.Finish();
  }
  ASSERT_EQ(out.size(), 6u);
  EXPECT_EQ(json::parse(out[0])["error"]["code"], -32700);
  EXPECT_EQ(json::parse(out[1])["error"]["code"], -32022);  // neither initialized nor modern
  EXPECT_EQ(json::parse(out[2])["result"]["resultType"], "complete");
  EXPECT_EQ(json::parse(out[3])["result"]["protocolVersion"], "2025-11-25");
  EXPECT_EQ(json::parse(out[4])["method"], "notifications/progress");
  EXPECT_EQ(json::parse(out[5])["result"]["structuredContent"]["output"], "hi");
}

TEST(McpConfigTest, ParsesTheMcpKeys) {
  auto c = ParseConfig(R"({"mcp": {"listen": "127.0.0.1:0", "path": "/x",
      "allowed_origins": ["https://app.example"], "allowed_hosts": ["broker.internal"],
      "max_body_bytes": 2048, "keepalive_seconds": 3}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mcp.listen, "127.0.0.1:0");
  EXPECT_EQ(c->mcp.path, "/x");
  EXPECT_EQ(c->mcp.allowed_origins, std::vector<std::string>{"https://app.example"});
  EXPECT_EQ(c->mcp.allowed_hosts, std::vector<std::string>{"broker.internal"});
  EXPECT_EQ(c->mcp.max_body_bytes, 2048);
  EXPECT_EQ(c->mcp.keepalive_seconds, 3);
  auto off = ParseConfig("{}");
  ASSERT_TRUE(off.ok());
  EXPECT_TRUE(off->mcp.listen.empty());
  for (const char* bad : {R"({"mcp": {"bogus": 1}})", R"({"mcp": {"path": "mcp"}})",
                          R"({"mcp": {"max_body_bytes": 10}})", R"({"mcp": []})"}) {
    auto r = ParseConfig(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_TRUE(absl::StrContains(r.status().message(), "mcp")) << r.status();
  }
}

}  // namespace
}  // namespace sandbox

namespace sandbox {
namespace {

// Tool calls in flight hold no thread of the MCP layer: the echo provider
// answers each run after hold_ms on a timer, and 300 calls (JSON answers
// and SSE streams, both eras' shapes) wait together on the core's fixed
// threads.
// A broker core on the echo provider (answers after hold_ms) behind an MCP
// server, with no transport.
struct EchoMcpStack {
  static BrokerConfig Config(const std::string& mcp_listen) {
    BrokerConfig c;
    c.default_provider = "echo";
    c.mcp.listen = mcp_listen;
    return c;
  }
  static ProviderRegistry* Echo(ProviderRegistry* r, int hold_ms) {
    r->Add(std::make_unique<EchoProvider>(hold_ms));
    return r;
  }
  explicit EchoMcpStack(int hold_ms, const std::string& mcp_listen = "")
      : config(Config(mcp_listen)),
        sessions(Echo(&registry, hold_ms), &clock, SessionLimits(), "echo", "test"),
        core(config, &registry, &sessions, &clock),
        auth(std::map<std::string, std::string>{{kTokenA, "alpha"}}),
        backend(&core, &auth),
        server(&backend, &clock, McpServerOptions()) {}
  FakeClock clock;
  ProviderRegistry registry;
  BrokerConfig config;
  SessionManager sessions;
  BrokerCore core;
  Authenticator auth;
  McpCoreBackend backend;
  McpServer server;
};

TEST(McpAsyncTest, ToolCallsInFlightHoldNoThread) {
  EchoMcpStack stack(/*hold_ms=*/3000);
  McpServer& server = stack.server;
  constexpr int kSessions = 10;
  auto call = [&](int i, const std::string& code, bool sse) {
    json params = {{"name", "sandbox_echo_run"},
                   {"arguments", {{"code", code}, {"session", absl::StrCat("s", i % kSessions)}}},
                   {"_meta", ModernMeta()}};
    McpHttpRequest r;
    r.method = "POST";
    r.headers["content-type"] = "application/json";
    r.headers["accept"] = sse ? "application/json, text/event-stream" : "application/json";
    r.headers["authorization"] = absl::StrCat("Bearer ", kTokenA);
    r.headers["mcp-protocol-version"] = "2026-07-28";
    r.headers["mcp-method"] = "tools/call";
    r.headers["mcp-name"] = "sandbox_echo_run";
    r.body =
        json({{"jsonrpc", "2.0"}, {"id", i}, {"method", "tools/call"}, {"params", params}}).dump();
    return server.HandleRequest(r);
  };
  // The sessions exist first (their creates' threads are the core's pool's,
  // started on demand, not the calls').
  std::vector<std::shared_ptr<StringSink>> warm;
  for (int i = 0; i < kSessions; ++i) {
    warm.push_back(std::make_shared<StringSink>());
    call(i, "warm", true).stream(warm.back());
  }
  for (auto& sink : warm) {
    sink->WaitClosed();
    ASSERT_FALSE(sink->Messages().empty());
  }
  const int before = ProcessThreadCount();
  constexpr int kCalls = 300;
  absl::Mutex mu;
  std::vector<std::string> answers(kCalls);
  int answered = 0;
  std::vector<std::shared_ptr<StringSink>> sinks(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    McpHttpResponse resp = call(i, absl::StrCat("call ", i), i % 2 == 0);
    if (resp.later) {
      resp.later(
          [&, i](McpHttpResponse x) {
            absl::MutexLock l(&mu);
            answers[i] = x.body;
            answered++;
          },
          nullptr);
    } else {
      ASSERT_TRUE(resp.stream) << resp.status << " " << resp.body;
      sinks[i] = std::make_shared<StringSink>();
      resp.stream(sinks[i]);
    }
  }
  const int during = ProcessThreadCount();
  // A thread per call would be up to 300.
  EXPECT_LT(during - before, 8) << before << " -> " << during;
  {
    absl::MutexLock l(&mu);
    mu.Await(absl::Condition(
        +[](int* n) { return *n == kCalls / 2; }, &answered));
  }
  for (int i = 0; i < kCalls; ++i) {
    json answer;
    if (sinks[i]) {
      sinks[i]->WaitClosed();
      std::vector<json> m = sinks[i]->Messages();
      ASSERT_FALSE(m.empty()) << i;
      answer = m.back();
    } else {
      absl::MutexLock l(&mu);
      answer = json::parse(answers[i]);
    }
    EXPECT_EQ(answer["id"], i);
    EXPECT_EQ(answer["result"]["structuredContent"]["output"], absl::StrCat("call ", i)) << answer;
  }
}

// Stop right after Start, before the loop thread may have entered its
// loop, returns: a loopbreak asked for that early was lost (the loop resets
// it on entry) and Stop waited for the loop thread for ever.
TEST(McpHttpListenerTest, StopRightAfterStartReturns) {
  EchoMcpStack stack(/*hold_ms=*/0, "127.0.0.1:0");
  for (int i = 0; i < 200; ++i) {
    absl::StatusOr<std::unique_ptr<McpHttpListener>> l =
        McpHttpListener::Start(&stack.server, stack.config);
    ASSERT_TRUE(l.ok()) << l.status();
    (*l)->Stop();
  }
}

}  // namespace
}  // namespace sandbox
