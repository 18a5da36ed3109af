#include "protocol/mcp_server.h"

#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/log.h"
#include "common/text.h"
#include "protocol/tools.h"

namespace sandbox {
namespace {

using json = nlohmann::json;

constexpr int kParseError = -32700;
constexpr int kInvalidRequest = -32600;
constexpr int kMethodNotFound = -32601;
constexpr int kInvalidParams = -32602;
constexpr int kInternalError = -32603;
constexpr int kHeaderMismatch = -32020;
constexpr int kUnsupportedVersion = -32022;
constexpr char kMetaVersion[] = "io.modelcontextprotocol/protocolVersion";
constexpr char kMetaCaps[] = "io.modelcontextprotocol/clientCapabilities";
constexpr char kMetaServerInfo[] = "io.modelcontextprotocol/serverInfo";
constexpr char kModernSession[] = "mcp";

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Messages nested deeper than this are rejected before parsing: parsing is
// iterative, but serializing (arguments are re-serialized) recurses.
constexpr int kMaxJsonDepth = 64;

bool JsonDepthOk(absl::string_view text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxJsonDepth) return false;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return true;
}

McpHttpResponse JsonResponse(int status, const json& body) {
  McpHttpResponse r;
  r.status = status;
  r.content_type = "application/json";
  r.body = Dump(body);
  return r;
}

McpHttpResponse Empty(int status) {
  McpHttpResponse r;
  r.status = status;
  return r;
}

bool Contains(const std::vector<std::string>& v, absl::string_view s) {
  for (const auto& x : v) {
    if (x == s) return true;
  }
  return false;
}

bool IsLoopbackName(absl::string_view host) {
  return absl::EqualsIgnoreCase(host, "localhost") || host == "127.0.0.1" || host == "[::1]" ||
         host == "::1";
}

// "host:port" / "[v6]:port" / "host" -> host.
std::string HostPart(absl::string_view hostport) {
  if (absl::StartsWith(hostport, "[")) {
    size_t end = hostport.find(']');
    return std::string(end == absl::string_view::npos ? hostport : hostport.substr(0, end + 1));
  }
  size_t colon = hostport.rfind(':');
  return std::string(colon == absl::string_view::npos ? hostport : hostport.substr(0, colon));
}

bool IsNotification(const json& msg) { return !msg.contains("id"); }

const json& Params(const json& msg) {
  static const json* empty = new json(json::object());
  auto it = msg.find("params");
  return it != msg.end() && it->is_object() ? *it : *empty;
}

const json* Meta(const json& msg) {
  const json& p = Params(msg);
  auto it = p.find("_meta");
  return it != p.end() && it->is_object() ? &*it : nullptr;
}

// The body's modern protocol version, or "".
std::string MetaVersion(const json& msg) {
  const json* m = Meta(msg);
  if (m == nullptr) return "";
  auto it = m->find(kMetaVersion);
  return it != m->end() && it->is_string() ? it->get<std::string>() : "";
}

// Decodes the =?base64?...?= sentinel form of a mirrored header value.
bool DecodeHeaderValue(absl::string_view v, std::string* out) {
  if (absl::StartsWith(v, "=?base64?") && absl::EndsWith(v, "?=") && v.size() >= 11) {
    return absl::Base64Unescape(v.substr(9, v.size() - 11), out);
  }
  for (char c : v) {
    if (static_cast<unsigned char>(c) < 0x20 && c != '\t') return false;
    if (static_cast<unsigned char>(c) >= 0x7f) return false;
  }
  *out = std::string(v);
  return true;
}

std::string SseFrame(const json& msg) {
  return absl::StrCat("event: message\ndata: ", Dump(msg), "\n\n");
}

json Result(const json& id, json result) {
  return {{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}};
}

bool AcceptsSse(const McpHttpRequest& req) {
  const std::string* a = req.Header("accept");
  return a != nullptr && absl::StrContains(*a, "text/event-stream");
}

json OutputSchema(ToolOp op) {
  json props;
  json required = json::array();
  switch (op) {
    case ToolOp::kRun:
    case ToolOp::kShell:
      props["output"] = {{"type", "string"}, {"description", "stdout and stderr combined"}};
      props["exitCode"] = {{"type", "integer"}};
      props["timedOut"] = {{"type", "boolean"}};
      props["truncated"] = {{"type", "boolean"}};
      props["oomKilled"] = {{"type", "boolean"}};
      required = {"output", "exitCode", "timedOut", "truncated", "session"};
      break;
    case ToolOp::kWriteFile:
      props["ok"] = {{"type", "boolean"}};
      required = {"ok", "session"};
      break;
    case ToolOp::kReadFile:
      props["content"] = {{"type", "string"}};
      props["found"] = {{"type", "boolean"}};
      required = {"content", "found", "session"};
      break;
  }
  props["session"] = {{"type", "string"}, {"description", "The broker session used."}};
  return {{"type", "object"}, {"properties", props}, {"required", required}};
}

}  // namespace

json McpError(const json& id, int code, const std::string& message, const json& data) {
  json e = {{"code", code}, {"message", message}};
  if (!data.is_null()) e["data"] = data;
  json r = {{"jsonrpc", "2.0"}, {"error", e}};
  if (!id.is_null()) r["id"] = id;
  return r;
}

const std::vector<std::string>& McpLegacyVersions() {
  static const auto* v =
      new std::vector<std::string>{"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"};
  return *v;
}

const std::vector<std::string>& McpSupportedVersions() {
  static const auto* v = [] {
    auto* all = new std::vector<std::string>{kMcpModernVersion};
    for (const auto& l : McpLegacyVersions()) all->push_back(l);
    return all;
  }();
  return *v;
}

namespace {

// A callback run once: by Run, or when the last holder lets go.
struct Once {
  absl::Mutex mu;
  std::function<void()> f;
  void Run() {
    std::function<void()> g;
    {
      absl::MutexLock l(&mu);
      g = std::exchange(f, nullptr);
    }
    if (g) g();
  }
  ~Once() { Run(); }
};

}  // namespace

struct McpServer::CallCount {
  absl::Mutex mu;
  int n ABSL_GUARDED_BY(mu) = 0;
};

McpServer::McpServer(McpBackend* backend, Clock* clock, McpServerOptions options)
    : backend_(backend),
      clock_(clock),
      options_(std::move(options)),
      calls_(std::make_shared<CallCount>()) {}

McpServer::~McpServer() {
  AwaitCalls(absl::InfiniteDuration());
  {
    absl::MutexLock l(&streams_mu_);
    watcher_stop_ = true;
  }
  if (watcher_.joinable()) watcher_.join();
}

// An SSE response in progress.
struct McpServer::Stream {
  absl::Mutex mu;
  std::shared_ptr<McpEventSink> sink;
  bool dead ABSL_GUARDED_BY(mu) = false;
  absl::Time next_keepalive ABSL_GUARDED_BY(mu);
  bool Write(absl::string_view bytes) {
    absl::MutexLock l(&mu);
    if (!dead && !sink->Write(bytes)) dead = true;
    return !dead;
  }
  bool Dead() {
    absl::MutexLock l(&mu);
    return dead;
  }
};

void McpServer::Watch(std::shared_ptr<Stream> s) {
  absl::MutexLock l(&streams_mu_);
  {
    absl::MutexLock sl(&s->mu);
    s->next_keepalive = absl::Now() + options_.keepalive_interval;
  }
  streams_.push_back(std::move(s));
  if (!watcher_.joinable()) watcher_ = std::thread([this] { WatchLoop(); });
}

void McpServer::Unwatch(const std::shared_ptr<Stream>& s) {
  absl::MutexLock l(&streams_mu_);
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (streams_[i] == s) {
      streams_[i] = std::move(streams_.back());
      streams_.pop_back();
      break;
    }
  }
}

void McpServer::WatchLoop() {
  absl::MutexLock l(&streams_mu_);
  while (
      !streams_mu_.AwaitWithTimeout(absl::Condition(&watcher_stop_), options_.liveness_interval)) {
    const absl::Time now = absl::Now();
    for (const std::shared_ptr<Stream>& s : streams_) {
      absl::MutexLock sl(&s->mu);
      if (s->dead) continue;
      if (!s->sink->Alive()) {
        s->dead = true;
      } else if (now >= s->next_keepalive) {
        if (!s->sink->Write(": keep-alive\n\n")) s->dead = true;
        s->next_keepalive = now + options_.keepalive_interval;
      }
    }
  }
}

bool McpServer::HostAllowed(const std::string* host) const {
  if (host == nullptr) return !options_.loopback_hosts_only && options_.allowed_hosts.empty();
  const std::string name = absl::AsciiStrToLower(HostPart(*host));
  if (Contains(options_.allowed_hosts, name)) return true;
  if (IsLoopbackName(name)) return true;
  return !options_.loopback_hosts_only && options_.allowed_hosts.empty();
}

bool McpServer::OriginAllowed(const std::string* origin) const {
  if (origin == nullptr) return true;
  if (Contains(options_.allowed_origins, *origin)) return true;
  // Exactly scheme://host[:port] (RFC 6454): "http://[::1]x" or
  // "http://localhost:1@evil.example" is not a loopback origin.
  absl::string_view o = *origin;
  if (!absl::ConsumePrefix(&o, "http://") && !absl::ConsumePrefix(&o, "https://")) return false;
  absl::string_view host = o, port;
  if (absl::StartsWith(o, "[")) {
    const size_t end = o.find(']');
    if (end == absl::string_view::npos) return false;
    host = o.substr(0, end + 1);
    port = o.substr(end + 1);
  } else if (const size_t colon = o.find(':'); colon != absl::string_view::npos) {
    host = o.substr(0, colon);
    port = o.substr(colon);
  }
  if (!port.empty()) {
    if (!absl::ConsumePrefix(&port, ":") || port.empty()) return false;
    for (char c : port) {
      if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
    }
  }
  return host != "::1" && IsLoopbackName(host);
}

McpHttpResponse McpServer::HandleRequest(const McpHttpRequest& req) {
  if (req.body.size() > options_.max_body_bytes) {
    return JsonResponse(
        413, McpError(nullptr, kInvalidRequest,
                      absl::StrCat("request body exceeds ", options_.max_body_bytes, " bytes")));
  }
  if (!HostAllowed(req.Header("host"))) {
    return JsonResponse(403, McpError(nullptr, kInvalidRequest, "Host not allowed"));
  }
  if (!OriginAllowed(req.Header("origin"))) {
    return JsonResponse(403, McpError(nullptr, kInvalidRequest, "Origin not allowed"));
  }
  if (req.method != "POST" && req.method != "GET" && req.method != "DELETE") {
    McpHttpResponse r = JsonResponse(405, McpError(nullptr, kInvalidRequest, "method not allowed"));
    r.headers.push_back({"Allow", "POST, DELETE"});
    return r;
  }
  if (draining_ && req.method == "POST") {
    McpHttpResponse r =
        JsonResponse(503, McpError(nullptr, kInternalError,
                                   "the broker is shutting down; retry on another instance"));
    r.headers.push_back({"Retry-After", "1"});
    return r;
  }
  absl::StatusOr<std::string> tenant = backend_->Authenticate(req.Header("authorization"));
  if (!tenant.ok()) {
    McpHttpResponse r = JsonResponse(
        401, McpError(nullptr, kInvalidRequest, std::string(tenant.status().message())));
    r.headers.push_back(
        {"WWW-Authenticate", req.Header("authorization") == nullptr
                                 ? "Bearer realm=\"sandbox-broker\""
                                 : "Bearer realm=\"sandbox-broker\", error=\"invalid_token\""});
    return r;
  }
  bool sweep = false;
  {
    absl::MutexLock l(&mu_);
    if (clock_->Now() - last_sweep_ >= absl::Seconds(1)) {
      last_sweep_ = clock_->Now();
      sweep = true;
    }
  }
  if (sweep) ExpireSessions();
  if (req.method == "GET") {
    // No server-initiated messages: no standalone stream (both eras allow 405).
    McpHttpResponse r = JsonResponse(
        405, McpError(nullptr, kInvalidRequest, "this server offers no standalone SSE stream"));
    r.headers.push_back({"Allow", "POST, DELETE"});
    return r;
  }
  if (req.method == "DELETE") return Delete(req, *tenant);
  return Post(req, *tenant);
}

McpHttpResponse McpServer::Delete(const McpHttpRequest& req, const std::string& tenant) {
  const std::string* sid = req.Header("mcp-session-id");
  if (sid == nullptr) {
    McpHttpResponse r = JsonResponse(
        405, McpError(nullptr, kInvalidRequest, "DELETE needs an Mcp-Session-Id (2025-11-25)"));
    r.headers.push_back({"Allow", "POST"});
    return r;
  }
  std::string broker_session;
  {
    absl::MutexLock l(&mu_);
    auto it = sessions_.find(*sid);
    if (it == sessions_.end() || it->second.tenant != tenant) {
      return JsonResponse(404, McpError(nullptr, kInvalidRequest, "session not found"));
    }
    for (auto& [id, flag] : it->second.calls) flag->store(true);
    if (it->second.used) broker_session = it->second.broker_session;
    sessions_.erase(it);
  }
  if (!broker_session.empty()) backend_->CloseSession(tenant, broker_session);
  Log(LogLevel::kDebug, "mcp.session_deleted", {{"tenant", tenant}});
  return Empty(200);
}

void McpServer::ExpireSessions() {
  std::vector<std::pair<std::string, std::string>> close;  // tenant, broker session
  {
    absl::MutexLock l(&mu_);
    const absl::Time now = clock_->Now();
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      auto cur = it++;
      if (cur->second.in_flight == 0 &&
          now - cur->second.last_used >= options_.session_idle_timeout) {
        if (cur->second.used) close.push_back({cur->second.tenant, cur->second.broker_session});
        sessions_.erase(cur);
      }
    }
  }
  for (const auto& [tenant, bs] : close) backend_->CloseSession(tenant, bs);
}

void McpServer::CloseAllSessions() {
  std::vector<std::pair<std::string, std::string>> close;
  {
    absl::MutexLock l(&mu_);
    for (auto& [sid, s] : sessions_) {
      for (auto& [id, flag] : s.calls) flag->store(true);
      if (s.used) close.push_back({s.tenant, s.broker_session});
    }
    sessions_.clear();
  }
  for (const auto& [tenant, bs] : close) backend_->CloseSession(tenant, bs);
}

size_t McpServer::session_count() {
  absl::MutexLock l(&mu_);
  return sessions_.size();
}

McpHttpResponse McpServer::Post(const McpHttpRequest& req, const std::string& tenant) {
  if (const std::string* ct = req.Header("content-type");
      ct != nullptr && !absl::StrContains(absl::AsciiStrToLower(*ct), "application/json")) {
    return JsonResponse(
        415, McpError(nullptr, kInvalidRequest, "Content-Type must be application/json"));
  }
  if (!JsonDepthOk(req.body)) {
    return JsonResponse(400, McpError(nullptr, kInvalidRequest,
                                      absl::StrCat("Invalid Request: JSON nested deeper than ",
                                                   kMaxJsonDepth, " levels")));
  }
  json msg = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (msg.is_discarded()) {
    return JsonResponse(400, McpError(nullptr, kParseError, "Parse error: body is not JSON"));
  }
  if (!msg.is_object()) {
    return JsonResponse(400, McpError(nullptr, kInvalidRequest,
                                      "Invalid Request: send one JSON-RPC message (no batches)"));
  }
  json id = msg.contains("id") ? msg["id"] : json();
  if (!id.is_null() && !id.is_string() && !id.is_number_integer()) {
    return JsonResponse(400, McpError(nullptr, kInvalidRequest, "Invalid Request: bad id"));
  }
  if (msg.value("jsonrpc", json()) != "2.0") {
    return JsonResponse(400,
                        McpError(id, kInvalidRequest, "Invalid Request: jsonrpc must be \"2.0\""));
  }
  const bool has_method = msg.contains("method") && msg["method"].is_string();
  const std::string* sid = req.Header("mcp-session-id");
  if (!has_method) {
    if (msg.contains("result") || msg.contains("error")) {
      // A response to a request we never send: accept and drop (legacy).
      if (sid != nullptr) return Empty(202);
    }
    return JsonResponse(400, McpError(id, kInvalidRequest, "Invalid Request: no method"));
  }
  const std::string method = msg["method"].get<std::string>();
  const std::string* header_version = req.Header("mcp-protocol-version");
  // Legacy requests may carry _meta too (progressToken); the version key
  // is what marks the stateless revision.
  const bool modern_body = !MetaVersion(msg).empty();
  if (sid != nullptr && !modern_body) return Legacy(req, msg, tenant, *sid);
  if (method == "initialize" && !modern_body &&
      (header_version == nullptr || Contains(McpLegacyVersions(), *header_version))) {
    return Initialize(msg, tenant);
  }
  if (!modern_body && header_version != nullptr && Contains(McpLegacyVersions(), *header_version)) {
    return JsonResponse(400, McpError(id, kInvalidRequest,
                                      "Bad Request: Mcp-Session-Id header is required (send "
                                      "initialize first, or use protocol version 2026-07-28)"));
  }
  if (!modern_body && header_version == nullptr) {
    return JsonResponse(
        400, McpError(id, kInvalidRequest,
                      absl::StrCat("Bad Request: send initialize (2025-11-25) or per-request "
                                   "_meta (2026-07-28); supported versions: ",
                                   absl::StrJoin(McpSupportedVersions(), ", "))));
  }
  return Modern(req, msg, tenant);
}

McpHttpResponse McpServer::Initialize(const json& msg, const std::string& tenant) {
  json id = msg.contains("id") ? msg["id"] : json();
  if (id.is_null()) {
    return JsonResponse(400, McpError(nullptr, kInvalidRequest, "initialize must be a request"));
  }
  const json& p = Params(msg);
  auto v = p.find("protocolVersion");
  if (v == p.end() || !v->is_string()) {
    return JsonResponse(400, McpError(id, kInvalidParams,
                                      "Invalid params: protocolVersion (a string) is required"));
  }
  const std::string requested = v->get<std::string>();
  const std::string version =
      Contains(McpLegacyVersions(), requested) ? requested : McpLegacyVersions().front();
  std::string sid = RandomHex(16);
  {
    absl::MutexLock l(&mu_);
    if (sessions_.size() >= options_.max_sessions) {
      return JsonResponse(503, McpError(id, kInternalError, "too many MCP sessions; retry later"));
    }
    Session& s = sessions_[sid];
    s.tenant = tenant;
    s.version = version;
    s.broker_session = absl::StrCat("mcp-", RandomHex(8));
    s.last_used = clock_->Now();
  }
  json result = {
      {"protocolVersion", version},
      {"capabilities", {{"tools", {{"listChanged", false}}}, {"logging", json::object()}}},
      {"serverInfo", {{"name", options_.server_name}, {"version", options_.server_version}}},
      {"instructions",
       "Each tool runs in an isolated sandbox. Without a `session` argument every call in this "
       "MCP session uses one sandbox of its own, so files and installed packages persist "
       "between calls."}};
  McpHttpResponse r = JsonResponse(200, Result(id, result));
  r.headers.push_back({"Mcp-Session-Id", sid});
  Log(LogLevel::kDebug, "mcp.session_started", {{"tenant", tenant}, {"version", version}});
  return r;
}

McpHttpResponse McpServer::Legacy(const McpHttpRequest& req, const json& msg,
                                  const std::string& tenant, const std::string& sid) {
  json id = msg.contains("id") ? msg["id"] : json();
  const std::string method = msg["method"].get<std::string>();
  Dispatch d;
  d.tenant = tenant;
  std::shared_ptr<std::atomic<bool>> flag = std::make_shared<std::atomic<bool>>(false);
  const std::string key = Dump(id);
  {
    absl::MutexLock l(&mu_);
    auto it = sessions_.find(sid);
    if (it == sessions_.end() || it->second.tenant != tenant ||
        clock_->Now() - it->second.last_used >= options_.session_idle_timeout) {
      return JsonResponse(404, McpError(id, kInvalidRequest, "session not found"));
    }
    Session& s = it->second;
    if (const std::string* hv = req.Header("mcp-protocol-version");
        hv != nullptr && *hv != s.version) {
      return JsonResponse(
          400, McpError(id, kInvalidRequest,
                        absl::StrCat("Bad Request: MCP-Protocol-Version ", RepairUtf8(*hv),
                                     " is not this session's (", s.version,
                                     "); supported: ", absl::StrJoin(McpLegacyVersions(), ", "))));
    }
    s.last_used = clock_->Now();
    if (method == "initialize") {
      return JsonResponse(400, McpError(id, kInvalidRequest, "session already initialized"));
    }
    if (method == "notifications/cancelled") {
      const json& p = Params(msg);
      auto rid = p.find("requestId");
      if (rid != p.end()) {
        auto c = s.calls.find(Dump(*rid));
        if (c != s.calls.end()) c->second->store(true);
      }
      return Empty(202);
    }
    if (IsNotification(msg)) return Empty(202);
    d.default_session = s.broker_session;
    if (method == "tools/call") {
      s.in_flight++;
      s.calls[key] = flag;
    }
  }
  d.on_default_used = [this, sid] {
    absl::MutexLock l(&mu_);
    auto it = sessions_.find(sid);
    if (it != sessions_.end()) it->second.used = true;
  };
  if (method != "tools/call") {
    json resp = Call(msg, d, nullptr);
    McpHttpResponse r = JsonResponse(200, resp);
    return r;
  }
  auto done = [this, sid, key] {
    absl::MutexLock l(&mu_);
    auto it = sessions_.find(sid);
    if (it == sessions_.end()) return;
    it->second.in_flight--;
    it->second.calls.erase(key);
    it->second.last_used = clock_->Now();
  };
  if (AcceptsSse(req)) return Streamed(msg, d, flag, done, sid);
  d.cancelled = [this, flag] { return flag->load() || stopping_; };
  // `done` runs once: when answered, or when the response is dropped
  // before the shell asked for it.
  auto once = std::make_shared<Once>();
  once->f = std::move(done);
  McpHttpResponse r;
  r.later = [this, msg, d, once, id](McpHttpResponse::Reply reply,
                                     std::function<bool()> alive) mutable {
    if (alive) d.cancelled = [prev = d.cancelled, alive] { return prev() || !alive(); };
    CallAsync(msg, d, [once, id, reply](json resp, int) {
      once->Run();
      if (resp.is_null()) resp = McpError(id, kInternalError, "request cancelled");
      reply(JsonResponse(200, resp));
    });
  };
  return r;
}

json McpServer::CheckModernMeta(const json& msg) {
  json id = msg.contains("id") ? msg["id"] : json();
  const json* meta = Meta(msg);
  if (meta == nullptr) {
    return McpError(id, kInvalidParams, "Invalid params: params._meta is required");
  }
  auto v = meta->find(kMetaVersion);
  if (v == meta->end() || !v->is_string()) {
    return McpError(id, kInvalidParams,
                    absl::StrCat("Invalid params: _meta[\"", kMetaVersion, "\"] is required"));
  }
  auto caps = meta->find(kMetaCaps);
  if (caps == meta->end() || !caps->is_object()) {
    return McpError(id, kInvalidParams,
                    absl::StrCat("Invalid params: _meta[\"", kMetaCaps, "\"] is required"));
  }
  return nullptr;
}

json McpServer::CheckModernVersion(const json& msg) {
  json id = msg.contains("id") ? msg["id"] : json();
  const std::string version = MetaVersion(msg);
  if (version != kMcpModernVersion) {
    return McpError(id, kUnsupportedVersion, "Unsupported protocol version",
                    {{"supported", McpSupportedVersions()}, {"requested", RepairUtf8(version)}});
  }
  return nullptr;
}

McpHttpResponse McpServer::Modern(const McpHttpRequest& req, const json& msg,
                                  const std::string& tenant) {
  json id = msg.contains("id") ? msg["id"] : json();
  const std::string method = msg["method"].get<std::string>();
  if (json err = CheckModernMeta(msg); !err.is_null()) return JsonResponse(400, err);
  auto mismatch = [&](const std::string& what) {
    return JsonResponse(400,
                        McpError(id, kHeaderMismatch, absl::StrCat("Header mismatch: ", what)));
  };
  const std::string* hv = req.Header("mcp-protocol-version");
  if (hv == nullptr) return mismatch("MCP-Protocol-Version header is required");
  if (*hv != MetaVersion(msg)) {
    return mismatch(absl::StrCat("MCP-Protocol-Version header '", RepairUtf8(*hv),
                                 "' does not match body value '", MetaVersion(msg), "'"));
  }
  const std::string* hm = req.Header("mcp-method");
  if (hm == nullptr) return mismatch("Mcp-Method header is required");
  if (*hm != method) {
    return mismatch(absl::StrCat("Mcp-Method header '", RepairUtf8(*hm),
                                 "' does not match body value '", RepairUtf8(method), "'"));
  }
  const json& p = Params(msg);
  const bool named = method == "tools/call" || method == "prompts/get";
  const bool uri = method == "resources/read";
  if (named || uri) {
    auto f = p.find(named ? "name" : "uri");
    if (f != p.end() && f->is_string()) {
      const std::string* hn = req.Header("mcp-name");
      if (hn == nullptr) return mismatch("Mcp-Name header is required");
      std::string decoded;
      if (!DecodeHeaderValue(*hn, &decoded)) return mismatch("Mcp-Name header value is invalid");
      if (decoded != f->get<std::string>()) {
        return mismatch(absl::StrCat("Mcp-Name header value '", RepairUtf8(decoded),
                                     "' does not match body value '",
                                     RepairUtf8(f->get<std::string>()), "'"));
      }
    }
  }
  if (json err = CheckModernVersion(msg); !err.is_null()) return JsonResponse(400, err);
  if (IsNotification(msg)) return Empty(202);
  Dispatch d;
  d.modern = true;
  d.tenant = tenant;
  d.default_session = kModernSession;
  if (method == "tools/call" && AcceptsSse(req)) {
    return Streamed(msg, d, std::make_shared<std::atomic<bool>>(false), nullptr, "");
  }
  if (method == "tools/call") {
    d.cancelled = [this] { return stopping_.load(); };
    McpHttpResponse r;
    r.later = [this, msg, d](McpHttpResponse::Reply reply, std::function<bool()> alive) mutable {
      if (alive) d.cancelled = [prev = d.cancelled, alive] { return prev() || !alive(); };
      CallAsync(msg, d, [reply](json resp, int status) { reply(JsonResponse(status, resp)); });
    };
    return r;
  }
  int status = 200;
  json resp = Call(msg, d, &status);
  return JsonResponse(status, resp);
}

McpHttpResponse McpServer::Streamed(const json& msg, Dispatch d,
                                    std::shared_ptr<std::atomic<bool>> flag,
                                    std::function<void()> on_done, std::string sid) {
  McpHttpResponse r;
  r.status = 200;
  r.content_type = "text/event-stream";
  r.headers.push_back({"Cache-Control", "no-cache"});
  r.headers.push_back({"X-Accel-Buffering", "no"});
  if (!sid.empty()) r.headers.push_back({"Mcp-Session-Id", sid});
  // on_done runs once: after the stream, or when the response is dropped
  // unsent (the client went away before the stream started).
  auto once = std::make_shared<Once>();
  once->f = std::move(on_done);
  r.stream = [this, msg, d, flag, once](std::shared_ptr<McpEventSink> sink) mutable {
    auto st = std::make_shared<Stream>();
    st->sink = std::move(sink);
    Watch(st);
    d.cancelled = [this, flag, st] { return flag->load() || stopping_ || st->Dead(); };
    d.notify = [st](const json& n) { st->Write(SseFrame(n)); };
    d.output_ready = [st](std::function<void()> resume) {
      return st->sink->Ready(std::move(resume));
    };
    CallAsync(msg, d, [this, st, flag, once](json resp, int) {
      // A cancelled request gets no response (the client stopped waiting).
      if (!resp.is_null() && !flag->load()) st->Write(SseFrame(resp));
      Unwatch(st);
      once->Run();
      st->sink->Close();
    });
  };
  return r;
}

json McpServer::Answer(const json& msg, const Dispatch& d, int* http_status) {
  json id = msg.contains("id") ? msg["id"] : json();
  const std::string method = msg.value("method", "");
  auto set_status = [&](int s) {
    if (http_status) *http_status = s;
  };
  json resp;
  if (method == "tools/list") {
    resp = ToolsList(d, id);
    if (d.modern && resp.contains("result")) {
      // Caching hints (2026-07-28): the list changes only with the config.
      resp["result"]["ttlMs"] = 60000;
      resp["result"]["cacheScope"] = "private";
    }
  } else if (method == "tools/call") {
    return nullptr;
  } else if (!d.modern && method == "ping") {
    resp = Result(id, json::object());
  } else if (!d.modern && method == "logging/setLevel") {
    static const std::vector<std::string> kLevels = {"debug", "info",     "notice", "warning",
                                                     "error", "critical", "alert",  "emergency"};
    auto lvl = Params(msg).find("level");
    if (lvl == Params(msg).end() || !lvl->is_string() ||
        !Contains(kLevels, lvl->get<std::string>())) {
      resp = McpError(id, kInvalidParams, "Invalid params: level must be a syslog level name");
    } else {
      resp = Result(id, json::object());
    }
  } else if (d.modern && method == "server/discover") {
    resp = Result(id, {{"supportedVersions", McpSupportedVersions()},
                       {"capabilities", {{"tools", {{"listChanged", false}}}}},
                       {"_meta",
                        {{kMetaServerInfo,
                          {{"name", options_.server_name}, {"version", options_.server_version}}}}},
                       {"instructions",
                        "Each tool runs in an isolated sandbox. Tool calls without a `session` "
                        "argument share this tenant's session \"mcp\"; pass `session` to keep "
                        "a conversation's files apart."},
                       {"ttlMs", 300000},
                       {"cacheScope", "private"}});
  } else {
    set_status(404);
    return McpError(id, kMethodNotFound, absl::StrCat("Method not found: ", RepairUtf8(method)));
  }
  Finalize(d, &resp, http_status);
  return resp;
}

void McpServer::Finalize(const Dispatch& d, json* resp, int* http_status) const {
  if (resp->is_null()) return;
  if (http_status) *http_status = resp->contains("error") ? 400 : 200;
  if (d.modern && resp->contains("result") && (*resp)["result"].is_object()) {
    (*resp)["result"]["resultType"] = "complete";
  }
}

// What a tools/call needs between its checks and its answer.
struct McpServer::ToolCall {
  json id;
  ToolOp op = ToolOp::kRun;
  std::string session;
  pb::CallToolRequest req;
  McpCall call;
};

void McpServer::CallAsync(const json& msg, const Dispatch& d, CallDone done) {
  if (msg.value("method", "") != "tools/call") {
    int status = 200;
    json resp = Answer(msg, d, &status);
    return done(std::move(resp), status);
  }
  auto call = std::make_shared<ToolCall>();
  if (json now = PrepareToolsCall(msg, d, call.get()); !now.is_null()) {
    int status = 200;
    Finalize(d, &now, &status);
    return done(std::move(now), status);
  }
  McpCall mc = call->call;
  pb::CallToolRequest req = call->req;
  {
    absl::MutexLock l(&calls_->mu);
    calls_->n++;
  }
  backend_->CallToolAsync(
      std::move(mc), std::move(req),
      [this, call, d, done, count = calls_](absl::StatusOr<McpToolOutcome> out) {
        json resp = ToolsCallResult(*call, d, std::move(out));
        int status = 200;
        Finalize(d, &resp, &status);
        done(std::move(resp), status);
        // Last: once counted out, the server may be destroyed.
        absl::MutexLock l(&count->mu);
        count->n--;
      });
}

bool McpServer::AwaitCalls(absl::Duration timeout) {
  absl::MutexLock l(&calls_->mu);
  return calls_->mu.AwaitWithTimeout(absl::Condition(
                                         +[](int* n) { return *n == 0; }, &calls_->n),
                                     timeout);
}

int McpServer::calls_running() {
  absl::MutexLock l(&calls_->mu);
  return calls_->n;
}

json McpServer::Call(const json& msg, const Dispatch& d, int* http_status) {
  absl::Notification answered;
  json resp;
  int status = 200;
  CallAsync(msg, d, [&](json r, int st) {
    resp = std::move(r);
    status = st;
    answered.Notify();
  });
  answered.WaitForNotification();
  if (http_status) *http_status = status;
  return resp;
}

json McpServer::ToolsList(const Dispatch& d, const json& id) {
  absl::StatusOr<std::vector<pb::Tool>> tools = backend_->ListTools(d.tenant);
  if (!tools.ok()) return McpError(id, kInternalError, std::string(tools.status().message()));
  json list = json::array();
  for (const pb::Tool& t : *tools) {
    absl::StatusOr<ToolName> name = ParseToolName(t.name());
    json schema = json::parse(t.parameters_json_schema(), nullptr, false);
    if (!name.ok() || !schema.is_object()) continue;
    schema["properties"]["session"] = {
        {"type", "string"},
        {"description",
         "Optional broker session (1-128 of [A-Za-z0-9._:-]) whose sandbox to use. Default: "
         "this conversation's own sandbox."}};
    list.push_back({{"name", t.name()},
                    {"description", t.description()},
                    {"inputSchema", schema},
                    {"outputSchema", OutputSchema(name->op)}});
  }
  return Result(id, {{"tools", list}});
}

json McpServer::PrepareToolsCall(const json& msg, const Dispatch& d, ToolCall* tc) {
  json id = msg.contains("id") ? msg["id"] : json();
  tc->id = id;
  const json& p = Params(msg);
  auto n = p.find("name");
  if (n == p.end() || !n->is_string()) {
    return McpError(id, kInvalidParams, "Invalid params: name (a string) is required");
  }
  const std::string name = n->get<std::string>();
  json args = json::object();
  if (auto a = p.find("arguments"); a != p.end() && !a->is_null()) {
    if (!a->is_object())
      return McpError(id, kInvalidParams, "Invalid params: arguments must be an object");
    args = *a;
  }
  absl::StatusOr<ToolName> tool = ParseToolName(name);
  bool known = false;
  if (tool.ok()) {
    absl::StatusOr<std::vector<pb::Tool>> tools = backend_->ListTools(d.tenant);
    if (tools.ok()) {
      for (const auto& t : *tools) known = known || t.name() == name;
    }
  }
  if (!known) return McpError(id, kInvalidParams, absl::StrCat("Unknown tool: ", RepairUtf8(name)));
  auto text_result = [&](const std::string& text, bool is_error) {
    json content = json::array({{{"type", "text"}, {"text", text}}});
    json r = {{"content", content}, {"isError", is_error}};
    return Result(id, r);
  };
  std::string session = d.default_session;
  bool defaulted = true;
  if (auto s = args.find("session"); s != args.end()) {
    if (!s->is_null()) {
      if (!s->is_string()) return text_result("error: argument \"session\" must be a string", true);
      session = s->get<std::string>();
      defaulted = false;
    }
    args.erase("session");
  }
  if (defaulted && d.on_default_used) d.on_default_used();
  pb::CallToolRequest req;
  req.set_name(name);
  req.set_session_id(session);
  req.set_arguments_json(Dump(args));
  McpCall call;
  call.tenant = d.tenant;
  call.cancelled = d.cancelled;
  json progress_token;
  if (const json* meta = Meta(msg)) {
    auto t = meta->find("progressToken");
    if (t != meta->end() && (t->is_string() || t->is_number_integer())) progress_token = *t;
  }
  if (!progress_token.is_null() && d.notify &&
      (tool->op == ToolOp::kRun || tool->op == ToolOp::kShell)) {
    auto total = std::make_shared<int64_t>(0);
    call.on_output = [notify = d.notify, progress_token, total](absl::string_view chunk) {
      if (chunk.empty()) return;
      *total += static_cast<int64_t>(chunk.size());
      notify({{"jsonrpc", "2.0"},
              {"method", "notifications/progress"},
              {"params",
               {{"progressToken", progress_token},
                {"progress", *total},
                {"message", RepairUtf8(chunk)}}}});
    };
    call.output_ready = d.output_ready;
  }
  tc->op = tool->op;
  tc->session = session;
  tc->req = std::move(req);
  tc->call = std::move(call);
  return nullptr;
}

json McpServer::ToolsCallResult(const ToolCall& tc, const Dispatch& d,
                                absl::StatusOr<McpToolOutcome> out) {
  const json& id = tc.id;
  auto text_result = [&](const std::string& text, bool is_error) {
    json content = json::array({{{"type", "text"}, {"text", text}}});
    json r = {{"content", content}, {"isError", is_error}};
    return Result(id, r);
  };
  if (!out.ok() && out.status().code() == absl::StatusCode::kCancelled && d.cancelled &&
      d.cancelled()) {
    return nullptr;
  }
  if (!out.ok()) return text_result(ToolErrorText(out.status()), true);
  const pb::CallToolResponse& r = out->response;
  json result = json::parse(Dump(text_result(r.content(), r.is_error())), nullptr, false);
  if (!r.is_error()) {
    json sc;
    switch (tc.op) {
      case ToolOp::kRun:
      case ToolOp::kShell: {
        pb::RunResult rr = out->run.value_or(pb::RunResult());
        sc = {{"output", rr.output()},
              {"exitCode", rr.exit_code()},
              {"timedOut", rr.timed_out()},
              {"truncated", rr.truncated()}};
        if (rr.oom_killed()) sc["oomKilled"] = true;
        break;
      }
      case ToolOp::kWriteFile:
        sc = {{"ok", true}};
        break;
      case ToolOp::kReadFile:
        sc = {{"content", out->found.value_or(true) ? r.content() : ""},
              {"found", out->found.value_or(true)}};
        break;
    }
    sc["session"] = tc.session;
    result["result"]["structuredContent"] = sc;
  }
  return result;
}

// ---- stdio ------------------------------------------------------------------

McpStdio::McpStdio(McpServer* server, std::string tenant,
                   std::function<void(const std::string&)> write_line)
    : server_(server),
      tenant_(std::move(tenant)),
      write_line_(std::move(write_line)),
      broker_session_(absl::StrCat("mcp-", RandomHex(8))) {}

McpStdio::~McpStdio() { Finish(); }

void McpStdio::Send(const json& msg) {
  absl::MutexLock l(&write_mu_);
  write_line_(Dump(msg));
}

void McpStdio::HandleLine(const std::string& line) {
  if (absl::StripAsciiWhitespace(line).empty()) return;
  if (!JsonDepthOk(line)) {
    return Send(McpError(nullptr, kInvalidRequest, "Invalid Request: JSON nested too deeply"));
  }
  json msg = json::parse(line, nullptr, false);
  if (msg.is_discarded()) return Send(McpError(nullptr, kParseError, "Parse error"));
  if (!msg.is_object()) return Send(McpError(nullptr, kInvalidRequest, "Invalid Request"));
  json id = msg.contains("id") ? msg["id"] : json();
  if (!msg.contains("method") || !msg["method"].is_string()) {
    if (msg.contains("result") || msg.contains("error")) return;  // a response: ignore
    return Send(McpError(id, kInvalidRequest, "Invalid Request: no method"));
  }
  const std::string method = msg["method"].get<std::string>();
  if (method == "notifications/cancelled") {
    const json& p = Params(msg);
    auto rid = p.find("requestId");
    if (rid != p.end()) {
      absl::MutexLock l(&mu_);
      auto c = calls_.find(Dump(*rid));
      if (c != calls_.end()) c->second->store(true);
    }
    return;
  }
  const bool modern = Meta(msg) != nullptr && !MetaVersion(msg).empty();
  if (IsNotification(msg)) return;
  if (!modern && method == "initialize") {
    const json& p = Params(msg);
    auto v = p.find("protocolVersion");
    if (v == p.end() || !v->is_string()) {
      return Send(McpError(id, kInvalidParams, "Invalid params: protocolVersion is required"));
    }
    const std::string requested = v->get<std::string>();
    {
      absl::MutexLock l(&mu_);
      legacy_ = true;
    }
    return Send(Result(
        id, {{"protocolVersion",
              Contains(McpLegacyVersions(), requested) ? requested : McpLegacyVersions().front()},
             {"capabilities", {{"tools", {{"listChanged", false}}}, {"logging", json::object()}}},
             {"serverInfo", {{"name", "sandboxctl-mcp"}, {"version", "0.1.0"}}}}));
  }
  McpServer::Dispatch d;
  d.tenant = tenant_;
  d.modern = modern;
  if (modern) {
    if (json err = McpServer::CheckModernMeta(msg); !err.is_null()) return Send(err);
    if (json err = McpServer::CheckModernVersion(msg); !err.is_null()) return Send(err);
    d.default_session = "mcp";
  } else {
    absl::MutexLock l(&mu_);
    if (!legacy_) {
      // Neither initialized nor modern: name what we speak.
      return Send(McpError(id, kUnsupportedVersion, "Unsupported protocol version",
                           {{"supported", McpSupportedVersions()}, {"requested", nullptr}}));
    }
    d.default_session = broker_session_;
  }
  d.on_default_used = [this] {
    absl::MutexLock l(&mu_);
    used_ = true;
  };
  auto flag = std::make_shared<std::atomic<bool>>(false);
  const std::string key = Dump(id);
  {
    absl::MutexLock l(&mu_);
    calls_[key] = flag;
    running_++;
  }
  d.cancelled = [flag] { return flag->load(); };
  d.notify = [this](const json& n) { Send(n); };
  requests_.Submit([this, msg, d, key, flag] {
    json resp = server_->Call(msg, d, nullptr);
    if (!resp.is_null() && !flag->load()) Send(resp);
    absl::MutexLock l(&mu_);
    calls_.erase(key);
    running_--;
  });
}

void McpStdio::Finish() {
  bool close = false;
  {
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(
        +[](int* running) { return *running == 0; }, &running_));
    close = used_ && legacy_;
    used_ = false;
  }
  if (close) server_->backend()->CloseSession(tenant_, broker_session_);
}

}  // namespace sandbox
