#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "adapters/api/registry.h"
#include "grpcpp/server.h"
#include "prometheus/exposer.h"
#include "server/auth.h"
#include "server/broker_core.h"
#include "server/config.h"
#include "server/grpc_service.h"
#include "server/metrics.h"
#include "server/run_ledger.h"
#include "server/session_manager.h"
#include "server/session_store.h"

namespace sandbox {

// The assembled daemon: providers, session table, reaper thread and the
// gRPC server on config.listen. Used by main and by integration tests
// (listen on 127.0.0.1:0, a FakeClock, reaper driven by hand).
//
// Thread-safe.
class BrokerServer {
 public:
  struct Options {
    Clock* clock = Clock::Real();
    // Run the reaper on its own thread every reap_interval_seconds. Tests
    // turn it off and call sessions()->RunOnce().
    bool reaper_thread = true;
    // A store to use instead of the one config.state names (not owned).
    SessionStore* store = nullptr;
  };

  static absl::StatusOr<std::unique_ptr<BrokerServer>> Start(
      const BrokerConfig& config, std::unique_ptr<ProviderRegistry> providers, Options options);
  ~BrokerServer();

  // The bound port (useful with port 0).
  int port() const { return port_; }
  // The /metrics port, or 0 without admin_listen.
  int admin_port() const { return admin_port_; }
  Metrics* metrics() { return metrics_.get(); }

  // Graceful drain (SIGTERM): health goes NOT_SERVING and new calls get
  // UNAVAILABLE at once; running calls get up to drain_grace_seconds; then
  // live sandboxes are closed (drain_close_sandboxes) and the server stops.
  void Drain();
  std::string address() const;
  SessionManager* sessions() { return sessions_.get(); }
  SessionStore* store() { return store_; }
  RunLedger* runs() { return runs_.get(); }

  // Stops accepting calls, waits up to `grace` for running ones, then closes
  // every session. Idempotent.
  void Shutdown(absl::Duration grace = absl::Seconds(5));
  // Blocks until Shutdown.
  void Wait();

 private:
  BrokerServer() = default;
  void SetHealth(bool serving);

  BrokerConfig config_;
  Clock* clock_ = nullptr;
  std::unique_ptr<ProviderRegistry> providers_;
  // Declared before the session table: they outlive it.
  std::unique_ptr<SessionStore> owned_store_;
  SessionStore* store_ = nullptr;
  std::unique_ptr<RunLedger> runs_;
  std::unique_ptr<SessionManager> sessions_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<BrokerCore> core_;
  std::unique_ptr<BrokerService> service_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  int admin_port_ = 0;
  std::string host_;
  absl::Notification stop_reaper_;
  std::thread reaper_;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace sandbox
