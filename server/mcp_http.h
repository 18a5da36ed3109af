#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/config.h"
#include "server/mcp_server.h"

namespace httplib {
class Server;
}

namespace sandbox {

// The MCP endpoint's HTTP(S) listener: cpp-httplib in front of McpServer.
// TLS with the gRPC listener's certificate settings (tls.*).
//
// Thread-safe.
class McpHttpListener {
 public:
  static absl::StatusOr<std::unique_ptr<McpHttpListener>> Start(McpServer* server,
                                                                const BrokerConfig& config);
  ~McpHttpListener();
  int port() const { return port_; }
  // Stops accepting and waits for running requests. Idempotent.
  void Stop();

 private:
  McpHttpListener() = default;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  int port_ = 0;
};

// mcp.listen is on a loopback address (so only loopback Host names are
// expected, absent an allow-list).
bool IsLoopbackListen(const std::string& listen);

}  // namespace sandbox
