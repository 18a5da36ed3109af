// The MCP endpoint's HTTP/JSON-RPC handling (protocol/mcp_server.cc), both
// protocol eras, without a network: McpServer::HandleRequest on a fresh
// server per input, a deterministic backend (two tenants' tokens, the local
// provider's tools, a run that prints two chunks) and a FakeClock. A
// streamed reply's stream function is run with a sink that records it.
//
// Input: a presence byte pair (bit i set: header i is sent), then fields
// separated by 0xFF: method, the headers in kHeaders order, body. A
// mcp-session-id of "$SID" is replaced by the id a real initialize (tenant
// a, 2025-11-25) returned, so the legacy session paths are reachable.
//
// Invariants: the status is one docs/mcp.md documents; a JSON body is a
// JSON-RPC 2.0 response object with exactly one of result/error (the server
// takes no batches), a result has an id, and an error has an integer code and a string message;
// 202 and DELETE's 200 have no body; a foreign Origin (anything but the
// allowed one or http(s)://loopback[:port]) never gets 2xx; no valid token,
// no 2xx; a response to a request with a valid id carries that id; an SSE
// stream is data frames of JSON-RPC messages, notifications then the
// response with the request's id.

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "fuzz/fuzz_check.h"
#include "nlohmann/json.hpp"
#include "protocol/mcp_server.h"
#include "protocol/tools.h"

namespace {

using json = nlohmann::json;
using sandbox::McpHttpRequest;
using sandbox::McpHttpResponse;

constexpr char kTokenA[] = "Bearer tok-a-123456";
constexpr char kTokenB[] = "Bearer tok-b-123456";
constexpr char kAllowedOrigin[] = "https://app.example";

const char* const kHeaders[] = {
    "origin",       "host",   "authorization", "mcp-session-id", "mcp-protocol-version",
    "content-type", "accept", "mcp-method",    "mcp-name"};
constexpr int kNumHeaders = sizeof(kHeaders) / sizeof(kHeaders[0]);

class FuzzBackend final : public sandbox::McpBackend {
 public:
  absl::StatusOr<std::string> Authenticate(const std::string* authorization) override {
    if (authorization == nullptr) return absl::UnauthenticatedError("missing bearer token");
    if (*authorization == kTokenA) return std::string("a");
    if (*authorization == kTokenB) return std::string("b");
    return absl::UnauthenticatedError("invalid token");
  }
  absl::StatusOr<std::vector<sandbox::pb::Tool>> ListTools(const std::string&) override {
    return sandbox::BuildTools({"local"}, "", sandbox::ToolLimits());
  }
  absl::StatusOr<sandbox::McpToolOutcome> CallTool(
      const sandbox::McpCall& call, const sandbox::pb::CallToolRequest& req) override {
    sandbox::McpToolOutcome out;
    if (absl::EndsWith(req.name(), "_read_file")) {
      out.response.set_content("file contents");
      out.found = true;
      return out;
    }
    if (absl::EndsWith(req.name(), "_write_file")) {
      out.response.set_content("ok");
      return out;
    }
    if (absl::StrContains(req.arguments_json(), "fail")) {
      return absl::UnavailableError("provider down");
    }
    sandbox::pb::RunResult r;
    for (const char* c : {"hello ", "\xff\xfe world\n"}) {
      if (call.on_output) call.on_output(c);
      r.mutable_output()->append(c);
    }
    out.response.set_content(sandbox::FormatRunResult(r));
    out.run = r;
    return out;
  }
  // Answers on the calling thread (no thread per input).
  void CallToolAsync(sandbox::McpCall call, sandbox::pb::CallToolRequest req,
                     ToolDone done) override {
    done(CallTool(call, req));
  }
  void CloseSession(const std::string&, const std::string&) override {}
};

class RecordingSink final : public sandbox::McpEventSink {
 public:
  bool Write(absl::string_view b) override {
    absl::MutexLock l(&mu_);
    data_.append(b.data(), b.size());
    return true;
  }
  bool Alive() override { return true; }
  void Close() override { closed_.Notify(); }
  std::string data() {
    absl::MutexLock l(&mu_);
    return data_;
  }
  void WaitClosed() { closed_.WaitForNotification(); }

 private:
  absl::Mutex mu_;
  std::string data_;
  absl::Notification closed_;
};

bool IsLoopbackHost(absl::string_view h) {
  return absl::EqualsIgnoreCase(h, "localhost") || h == "127.0.0.1" || h == "[::1]";
}

// The oracle's own reading of "same-machine origin": exactly
// http(s)://loopback-host with an optional all-digit port.
bool TrustedOrigin(const std::string& origin) {
  if (origin == kAllowedOrigin) return true;
  absl::string_view o = origin;
  if (!absl::ConsumePrefix(&o, "http://") && !absl::ConsumePrefix(&o, "https://")) return false;
  absl::string_view host = o, port;
  if (absl::StartsWith(o, "[")) {
    size_t end = o.find(']');
    if (end == absl::string_view::npos) return false;
    host = o.substr(0, end + 1);
    absl::string_view rest = o.substr(end + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') return false;
      port = rest.substr(1);
      if (port.empty()) return false;
    }
  } else if (size_t colon = o.find(':'); colon != absl::string_view::npos) {
    host = o.substr(0, colon);
    port = o.substr(colon + 1);
    if (port.empty()) return false;
  }
  for (char c : port) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return IsLoopbackHost(host);
}

// A JSON-RPC 2.0 response object; its id is returned in *id.
void CheckResponse(const json& r, json* id) {
  FUZZ_CHECK(r.is_object());
  FUZZ_CHECK(r.contains("jsonrpc") && r["jsonrpc"] == "2.0");
  FUZZ_CHECK(r.contains("result") != r.contains("error"));
  // MCP's schema: a result has the request's id; an error whose request
  // had no usable id has none (MCP ids are never null).
  FUZZ_CHECK(r.contains("id") || r.contains("error"));
  if (!r.contains("id")) {
    *id = nullptr;
  } else {
    FUZZ_CHECK(r["id"].is_string() || r["id"].is_number_integer());
  }
  if (r.contains("error")) {
    const json& e = r["error"];
    FUZZ_CHECK(e.is_object());
    FUZZ_CHECK(e.contains("code") && e["code"].is_number_integer());
    FUZZ_CHECK(e.contains("message") && e["message"].is_string());
  } else {
    FUZZ_CHECK(r["result"].is_object());
  }
  if (r.contains("id")) *id = r["id"];
}

std::string Initialize(sandbox::McpServer* server) {
  McpHttpRequest r;
  r.method = "POST";
  r.headers["host"] = "127.0.0.1:8080";
  r.headers["authorization"] = kTokenA;
  r.headers["content-type"] = "application/json";
  r.headers["accept"] = "application/json, text/event-stream";
  r.body = R"({"jsonrpc":"2.0","id":0,"method":"initialize",)"
           R"("params":{"protocolVersion":"2025-11-25","capabilities":{}}})";
  McpHttpResponse resp = server->HandleRequest(r);
  FUZZ_CHECK(resp.status == 200);
  for (const auto& [k, v] : resp.headers) {
    if (k == "Mcp-Session-Id") return v;
  }
  FUZZ_CHECK(false && "initialize gave no Mcp-Session-Id");
  return "";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const unsigned present = data[0] | (static_cast<unsigned>(data[1]) << 8);
  absl::string_view in(reinterpret_cast<const char*>(data) + 2, size - 2);

  sandbox::FakeClock clock(absl::FromUnixSeconds(1767225600));
  FuzzBackend backend;
  sandbox::McpServerOptions o;
  o.allowed_origins = {kAllowedOrigin};
  o.loopback_hosts_only = true;
  o.max_body_bytes = 16384;
  o.liveness_interval = absl::Milliseconds(1);
  sandbox::McpServer server(&backend, &clock, o);
  const std::string sid = Initialize(&server);

  McpHttpRequest req;
  req.method = std::string(sandbox::fuzz::NextField(&in));
  for (int i = 0; i < kNumHeaders; ++i) {
    std::string v(sandbox::fuzz::NextField(&in));
    if (!(present & (1u << i))) continue;
    if (i == 3 && v == "$SID") v = sid;
    req.headers[kHeaders[i]] = v;
  }
  req.body = std::string(in);

  McpHttpResponse resp = server.HandleRequest(req);
  if (resp.later) {
    // A tool call answered as JSON: the whole response arrives later.
    FUZZ_CHECK(resp.status == 200 && resp.body.empty() && !resp.stream);
    McpHttpResponse::Reply reply = [&resp](McpHttpResponse r) { resp = std::move(r); };
    auto later = std::move(resp.later);
    later(reply, nullptr);
    FUZZ_CHECK(!resp.later && !resp.stream);
  }

  static const std::set<int> kStatuses = {200, 202, 400, 401, 403, 404, 405, 413, 415, 503};
  FUZZ_CHECK(kStatuses.count(resp.status) == 1);
  const bool ok2xx = resp.status >= 200 && resp.status < 300;

  const std::string* origin = req.Header("origin");
  if (origin != nullptr && !TrustedOrigin(*origin)) FUZZ_CHECK(!ok2xx);
  const std::string* auth = req.Header("authorization");
  if (auth == nullptr || (*auth != kTokenA && *auth != kTokenB)) FUZZ_CHECK(!ok2xx);
  if (resp.status == 401) {
    bool www = false;
    for (const auto& [k, v] : resp.headers) www = www || k == "WWW-Authenticate";
    FUZZ_CHECK(www);
  }

  // The request's id, when it is a valid one.
  json req_msg = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  json req_id;
  bool has_id = false;
  if (req_msg.is_object() && req_msg.contains("id") &&
      (req_msg["id"].is_string() || req_msg["id"].is_number_integer())) {
    req_id = req_msg["id"];
    has_id = true;
  }

  if (resp.status == 202) FUZZ_CHECK(resp.body.empty() && !resp.stream);
  if (!resp.body.empty()) {
    FUZZ_CHECK(resp.content_type == "application/json");
    FUZZ_CHECK(!resp.stream);
    json r = json::parse(resp.body, nullptr, false);
    FUZZ_CHECK(!r.is_discarded());
    json id;
    CheckResponse(r, &id);
    if (!id.is_null()) FUZZ_CHECK(has_id && id == req_id);
    // A 200 answers a parsed request (the legacy era sends JSON-RPC errors
    // with 200 too): it carries the request's id.
    if (resp.status == 200) FUZZ_CHECK(has_id && id == req_id);
    if (!ok2xx) FUZZ_CHECK(r.contains("error"));
  } else if (resp.status == 200 && !resp.stream) {
    FUZZ_CHECK(req.method == "DELETE");
  }

  if (resp.stream) {
    FUZZ_CHECK(resp.status == 200);
    FUZZ_CHECK(resp.content_type == "text/event-stream");
    FUZZ_CHECK(has_id);
    auto rec = std::make_shared<RecordingSink>();
    resp.stream(rec);
    rec->WaitClosed();
    RecordingSink& sink = *rec;
    std::vector<json> msgs;
    for (absl::string_view line : absl::StrSplit(sink.data(), '\n')) {
      if (line.empty() || absl::StartsWith(line, ":") || line == "event: message") continue;
      FUZZ_CHECK(absl::ConsumePrefix(&line, "data: "));
      json m = json::parse(line, nullptr, false);
      FUZZ_CHECK(m.is_object());
      msgs.push_back(std::move(m));
    }
    // Nothing cancels this call: it ends with its response.
    FUZZ_CHECK(!msgs.empty());
    for (size_t i = 0; i + 1 < msgs.size(); ++i) {
      FUZZ_CHECK(msgs[i].value("jsonrpc", "") == "2.0");
      FUZZ_CHECK(msgs[i].contains("method") && !msgs[i].contains("id"));
    }
    json id;
    CheckResponse(msgs.back(), &id);
    FUZZ_CHECK(id == req_id);
  }
  return 0;
}
