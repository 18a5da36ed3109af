#pragma once

// The Model Context Protocol over the broker, without a transport: the
// Streamable HTTP rules of both protocol eras (2025-11-25 with initialize and
// Mcp-Session-Id; the stateless 2026-07-28 with per-request _meta and
// mirrored headers) and JSON-RPC dispatch shared with stdio. The evhttp
// shell (server/transport/mcp/mcp_http.h) and `sandboxctl mcp` (stdio) are thin layers on
// top; tests and fuzzers call HandleRequest directly.

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/event_loop.h"
#include "nlohmann/json.hpp"
#include "protocol/mcp_backend.h"

namespace sandbox {

// The stateless revision, then the initialize-based ones, newest first.
inline constexpr char kMcpModernVersion[] = "2026-07-28";
const std::vector<std::string>& McpLegacyVersions();
const std::vector<std::string>& McpSupportedVersions();

struct McpServerOptions {
  std::string server_name = "sandbox-broker";
  std::string server_version = "0.1.0";
  // Origins accepted besides http(s)://localhost|127.0.0.1|[::1][:port].
  std::vector<std::string> allowed_origins;
  // Host header names accepted (port ignored). Empty: any host, unless
  // loopback_hosts_only.
  std::vector<std::string> allowed_hosts;
  // Listening on loopback: only loopback Host names (DNS rebinding).
  bool loopback_hosts_only = false;
  size_t max_body_bytes = 4 << 20;
  size_t max_sessions = 10000;
  // A legacy MCP session unused this long is gone (the broker's idle timeout).
  absl::Duration session_idle_timeout = absl::Minutes(5);
  // SSE comment interval while a call runs.
  absl::Duration keepalive_interval = absl::Seconds(15);
  // How often a streaming call checks that its client is still there.
  absl::Duration liveness_interval = absl::Milliseconds(100);
};

struct McpHttpRequest {
  std::string method;  // POST, GET, DELETE, ...
  // Header names in lower case.
  std::map<std::string, std::string> headers;
  std::string body;
  const std::string* Header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? nullptr : &it->second;
  }
};

// Where a streamed (SSE) response goes. The producer calls Write from any
// thread (one at a time), then Close once.
class McpEventSink {
 public:
  virtual ~McpEventSink() = default;
  // Bytes of the event stream; false once the client is gone. Must not
  // block (the transport queues).
  virtual bool Write(absl::string_view bytes) = 0;
  // False once the client is known to be gone. Must not block.
  virtual bool Alive() = 0;
  // The response is complete.
  virtual void Close() = 0;
  // Flow control (ExecRequest::output_ready): false once the bytes written
  // and not yet sent pass the transport's bound; it then calls `resume`
  // (once, from any thread) when they have drained, or the client is gone.
  // Must not block. The default never pushes back.
  virtual bool Ready(std::function<void()> resume) {
    (void)resume;
    return true;
  }
};

struct McpHttpResponse {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string content_type;  // "" with an empty body
  std::string body;
  // Set for an SSE response: the shell sends status and headers, then calls
  // this once with the stream. It returns at once; the response is complete
  // when the producer closes the sink (from any thread). No thread waits
  // while the tool runs.
  std::function<void(std::shared_ptr<McpEventSink>)> stream;
  // Set for a response that is not ready yet (a tool call answered as
  // JSON): the shell calls this once; `reply` gets the whole response
  // exactly once, maybe on another thread, maybe before this returns.
  // `alive` (may be null; must not block) says whether the client is still
  // there: once false the call is cancelled.
  using Reply = std::function<void(McpHttpResponse)>;
  std::function<void(Reply reply, std::function<bool()> alive)> later;
};

// Thread-safe.
class McpServer {
 public:
  McpServer(McpBackend* backend, Clock* clock, McpServerOptions options);
  ~McpServer();

  // One HTTP request to the MCP endpoint. Never throws; any input gets a
  // well-formed response (the fuzz entry point). Returns without waiting
  // for a tool: a tools/call's answer is a `stream` or `later` response.
  McpHttpResponse HandleRequest(const McpHttpRequest& req);

  // Drops legacy sessions idle past session_idle_timeout, closing their
  // broker sessions. Also done lazily by HandleRequest.
  void ExpireSessions();
  // Ends every legacy session (drain), closing their broker sessions.
  void CloseAllSessions();
  size_t session_count();
  // Drain, first step: every new POST is answered 503 with Retry-After
  // (the client retries on another instance); running calls go on.
  void StartDraining() { draining_ = true; }
  // Drain, at the end of its grace: every running call is cancelled (its
  // run killed).
  void CancelAll() { stopping_ = true; }
  // Waits until no tool call is running (the backend has answered each);
  // false at the timeout. A server's shutdown calls it after CancelAll, so
  // no answer outlives the core it comes from.
  bool AwaitCalls(absl::Duration timeout);
  // Tool calls the backend has not answered yet.
  int calls_running();

  // What a stdio transport needs (McpStdio): JSON-RPC on one message.
  struct Dispatch {
    bool modern = false;
    std::string tenant;
    // The broker session a tool call without `session` uses; `on_default`
    // is told when it is used.
    std::string default_session;
    std::function<void()> on_default_used;
    std::function<bool()> cancelled;
    // Sends a notification for this request (null: no streaming), and
    // the stream's flow control (McpEventSink::Ready; null: none).
    std::function<void(const nlohmann::json&)> notify;
    std::function<bool(std::function<void()>)> output_ready;
  };
  // The JSON-RPC response to request `msg` (null for no response: a
  // cancelled call), passed to `done` with the HTTP status the modern era
  // gives it, exactly once, maybe on another thread: a tools/call holds no
  // thread while its tool runs.
  using CallDone = std::function<void(nlohmann::json resp, int http_status)>;
  void CallAsync(const nlohmann::json& msg, const Dispatch& d, CallDone done);
  // CallAsync, waiting for the answer. `http_status` may be null.
  nlohmann::json Call(const nlohmann::json& msg, const Dispatch& d, int* http_status);
  // Validates a modern request's required _meta fields: a -32602 error
  // response, or null when present.
  static nlohmann::json CheckModernMeta(const nlohmann::json& msg);
  // -32022 naming the supported versions, or null for 2026-07-28.
  static nlohmann::json CheckModernVersion(const nlohmann::json& msg);
  McpBackend* backend() { return backend_; }
  const McpServerOptions& options() const { return options_; }

 private:
  struct Session {
    std::string tenant;
    std::string version;
    std::string broker_session;
    bool used = false;
    absl::Time last_used;
    int in_flight = 0;
    // Request id (JSON text) -> its cancel flag.
    std::map<std::string, std::shared_ptr<std::atomic<bool>>> calls;
  };

  McpHttpResponse Post(const McpHttpRequest& req, const std::string& tenant);
  McpHttpResponse Delete(const McpHttpRequest& req, const std::string& tenant);
  McpHttpResponse Legacy(const McpHttpRequest& req, const nlohmann::json& msg,
                         const std::string& tenant, const std::string& sid);
  McpHttpResponse Initialize(const nlohmann::json& msg, const std::string& tenant);
  McpHttpResponse Modern(const McpHttpRequest& req, const nlohmann::json& msg,
                         const std::string& tenant);
  // A tools/call answered as an SSE stream.
  McpHttpResponse Streamed(const nlohmann::json& msg, Dispatch d,
                           std::shared_ptr<std::atomic<bool>> flag, std::function<void()> on_done,
                           std::string sid);
  bool HostAllowed(const std::string* host) const;
  bool OriginAllowed(const std::string* origin) const;
  nlohmann::json ToolsList(const Dispatch& d, const nlohmann::json& id);
  // The answer of every method but tools/call (null for tools/call).
  nlohmann::json Answer(const nlohmann::json& msg, const Dispatch& d, int* http_status);
  // Status and era fields of a finished answer.
  void Finalize(const Dispatch& d, nlohmann::json* resp, int* http_status) const;
  struct ToolCall;
  // tools/call's checks: an answer now, or null with `call` ready.
  nlohmann::json PrepareToolsCall(const nlohmann::json& msg, const Dispatch& d, ToolCall* call);
  nlohmann::json ToolsCallResult(const ToolCall& call, const Dispatch& d,
                                 absl::StatusOr<McpToolOutcome> out);

  // SSE streams in progress: one thread checks that their clients are
  // there and sends keep-alives, for all of them.
  struct Stream;
  void Watch(std::shared_ptr<Stream> s);
  void Unwatch(const std::shared_ptr<Stream>& s);
  void WatchLoop();

  McpBackend* const backend_;
  Clock* const clock_;
  const McpServerOptions options_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
  absl::Time last_sweep_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stopping_{false};
  std::atomic<bool> draining_{false};
  // Tool calls not yet answered. Shared with each call's answer, which
  // counts itself out last (after it is done with this server).
  struct CallCount;
  const std::shared_ptr<CallCount> calls_;
  absl::Mutex streams_mu_;
  std::vector<std::shared_ptr<Stream>> streams_ ABSL_GUARDED_BY(streams_mu_);
  bool watcher_stop_ ABSL_GUARDED_BY(streams_mu_) = false;
  std::thread watcher_;  // started with the first stream
};

// MCP over a stdio-style transport (one JSON-RPC message per line, both
// eras): requests run concurrently; notifications/cancelled kills a run.
//
// Thread-safe.
class McpStdio {
 public:
  // Requests served at once; more wait their turn.
  static constexpr int kMaxStdioRequests = 64;
  // `write_line` gets each outgoing message (without the newline); calls
  // to it are serialized.
  McpStdio(McpServer* server, std::string tenant,
           std::function<void(const std::string&)> write_line);
  ~McpStdio();
  void HandleLine(const std::string& line);
  // Waits for running requests; closes the legacy session's broker session.
  void Finish();

 private:
  void Send(const nlohmann::json& msg);

  McpServer* const server_;
  const std::string tenant_;
  const std::function<void(const std::string&)> write_line_;
  const std::string broker_session_;
  absl::Mutex write_mu_;
  absl::Mutex mu_;
  bool legacy_ ABSL_GUARDED_BY(mu_) = false;
  bool used_ ABSL_GUARDED_BY(mu_) = false;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::shared_ptr<std::atomic<bool>>> calls_ ABSL_GUARDED_BY(mu_);
  // Requests run here, not on threads of their own; last, so it is joined
  // before the members its tasks use go.
  WorkPool requests_{"mcp-stdio", kMaxStdioRequests};
};

// JSON-RPC error response.
nlohmann::json McpError(const nlohmann::json& id, int code, const std::string& message,
                        const nlohmann::json& data = nullptr);

}  // namespace sandbox
