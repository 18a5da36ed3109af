#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "protocol/mcp_server.h"
#include "server/config/config.h"

namespace sandbox {

// The MCP endpoint's HTTP(S) listener: libevent's evhttp on one event-loop
// thread in front of McpServer. The quick steps of a request (parsing,
// auth, the MCP session table) run on mcp.max_threads workers; a tool call
// holds no thread while its tool runs: its answer, a JSON body or an SSE
// stream, is written by the loop as it comes. A client that goes away is
// noticed within McpServerOptions::liveness_interval and its call is
// cancelled. TLS with the gRPC listener's certificate settings (tls.*).
//
// Thread-safe.
class McpHttpListener {
 public:
  struct Options {
    // An idle keep-alive connection, or a request that has not arrived
    // whole, is closed after this long (not a call waiting for its tool).
    absl::Duration idle_timeout = absl::Seconds(30);
  };
  static absl::StatusOr<std::unique_ptr<McpHttpListener>> Start(McpServer* server,
                                                                const BrokerConfig& config);
  static absl::StatusOr<std::unique_ptr<McpHttpListener>> Start(McpServer* server,
                                                                const BrokerConfig& config,
                                                                const Options& options);
  ~McpHttpListener();
  int port() const { return port_; }
  // Requests accepted whose answer is not yet written and ended (or that
  // were freed unanswered at Stop), including those whose client left.
  int64_t requests_waiting() const;
  // Stops accepting, ends every open connection and joins the threads.
  // Idempotent. Answers that arrive later are dropped.
  void Stop();

  struct Impl;

 private:
  McpHttpListener() = default;
  std::shared_ptr<Impl> impl_;
  int port_ = 0;
};

// mcp.listen is on a loopback address (so only loopback Host names are
// expected, absent an allow-list).
bool IsLoopbackListen(const std::string& listen);

}  // namespace sandbox
