#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "adapters/api/registry.h"
#include "grpcpp/server.h"
#include "prometheus/exposer.h"
#include "protocol/mcp_server.h"
#include "server/app/health_monitor.h"
#include "server/cluster/cluster.h"
#include "server/config/auth.h"
#include "server/config/config.h"
#include "server/config/policy.h"
#include "server/core/broker_core.h"
#include "server/operators/reload.h"
#include "server/operators/usage.h"
#include "server/sessions/run_ledger.h"
#include "server/sessions/session_manager.h"
#include "server/sessions/warm_pool.h"
#include "server/store/etcd/etcd_store.h"
#include "server/store/session_store.h"
#include "server/telemetry/audit.h"
#include "server/telemetry/metrics.h"
#include "server/transport/grpc/admin_service.h"
#include "server/transport/grpc/grpc_service.h"
#include "server/transport/mcp/mcp_core_backend.h"
#include "server/transport/mcp/mcp_http.h"

namespace sandbox {

struct NetworkEventSink;  // broker_server.cc

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
    // The config file, re-read by Reload (SIGHUP, Admin.ReloadConfig, a
    // change of auth.tokens_file); empty = nothing to reload.
    std::string config_path;
    std::string listen_override;  // --listen, kept across reloads
    // Poll auth.tokens_file for changes on a thread (tests call
    // reloader()->CheckTokensFile() instead).
    bool watch_tokens_file = true;
    absl::Duration watch_interval = absl::Seconds(1);
    // Instead of audit_log.path / stderr (tests).
    std::function<void(absl::string_view)> audit_sink;
    // Probe each provider on its own thread every health_probe_interval_seconds
    // (and once at start). Tests turn it off and call ProbeProviders().
    bool health_thread = true;
    // A store to use instead of the one config.state names (not owned).
    SessionStore* store = nullptr;
    // Keep warm pools (providers.<name>.pool) full on their own threads.
    // Tests turn it off and call WarmPool::Refill() (see pools()).
    bool pool_threads = true;
  };

  static absl::StatusOr<std::unique_ptr<BrokerServer>> Start(
      const BrokerConfig& config, std::unique_ptr<ProviderRegistry> providers, Options options);
  ~BrokerServer();

  // The bound port (useful with port 0).
  int port() const { return port_; }
  // The /metrics port, or 0 without admin_listen.
  int admin_port() const { return admin_port_; }
  // The MCP endpoint's port, or 0 without mcp.listen.
  int mcp_port() const { return mcp_http_ ? mcp_http_->port() : 0; }
  // The MCP protocol layer, or null without mcp.listen.
  McpServer* mcp() const { return mcp_.get(); }
  // Its HTTP listener, or null without mcp.listen.
  McpHttpListener* mcp_http() const { return mcp_http_.get(); }
  Metrics* metrics() { return metrics_.get(); }

  // Graceful drain (SIGTERM): health goes NOT_SERVING and new calls get
  // UNAVAILABLE at once; running calls get up to drain_grace_seconds; then
  // live sandboxes are closed (drain_close_sandboxes) and the server stops.
  void Drain();
  std::string address() const;
  SessionManager* sessions() { return sessions_.get(); }
  PolicyEngine* policy() { return policy_.get(); }
  UsageMeter* usage() { return usage_.get(); }
  Reloader* reloader() { return reloader_.get(); }
  // Reload without restart (see Reloader::Reload).
  absl::StatusOr<ReloadResult> Reload(const std::string& source) {
    return reloader_->Reload(source);
  }
  HealthMonitor* health() { return health_.get(); }
  // Probes the providers that are due and publishes the health statuses.
  void ProbeProviders();
  SessionStore* store() { return store_; }
  // Null unless running as one of several replicas.
  Cluster* cluster() { return cluster_.get(); }
  // The providers with a warm pool.
  std::vector<WarmPool*> pools() const;
  RunLedger* runs() { return runs_.get(); }
  BrokerService* service() { return service_.get(); }

  // Stops accepting calls, waits up to `grace` for running ones, then closes
  // every session. Idempotent.
  void Shutdown(absl::Duration grace = absl::Seconds(5));
  // Blocks until Shutdown.
  void Wait();

  // The concurrency limits' state to the metrics (the reaper tick; tests).
  void PublishLimits();

 private:
  BrokerServer() = default;
  void SetHealth(bool serving);
  // Sets every health service from serving_ and the providers' probes.
  void PublishHealth();
  // Writes the buffered usage to the store (the reaper tick, and shutdown).
  void FlushUsage();
  // Tells the providers the broker's ports and where their network events
  // go (ProviderHooks), once every listener is bound.
  void HookProviders();
  BrokerConfig config_;
  Clock* clock_ = nullptr;
  std::unique_ptr<ProviderRegistry> providers_;
  // Before sessions_ (and everything else that counts): ~SessionManager
  // closes sessions, which are counted, so it must go first.
  std::unique_ptr<Metrics> metrics_;
  // Before sessions_: its destructor closes sessions, which are metered
  // and audited.
  std::unique_ptr<AuditLog> audit_;
  // Before usage_, which adds to it until the session table is gone. Only
  // Flush() touches the store.
  std::unique_ptr<BufferedUsageStore> usage_store_;
  std::atomic<bool> usage_flush_ok_{true};
  std::unique_ptr<UsageMeter> usage_;
  std::unique_ptr<SessionAccounting> accounting_;
  // Lifecycle events to usage metering and the run ledger.
  class ServerObserver;
  std::unique_ptr<ServerObserver> observer_;
  std::unique_ptr<PolicyEngine> policy_;
  // Declared before the session table: they outlive it.
  std::unique_ptr<SessionStore> owned_store_;
  SessionStore* store_ = nullptr;
  // state.backend "etcd": this broker's hold on the prefix (released before
  // the store goes).
  std::unique_ptr<EtcdMember> etcd_lock_;
  // Cluster mode (config `cluster`): the etcd store, and this replica's
  // membership; the session table writes through cluster_->store().
  std::unique_ptr<EtcdStore> etcd_store_;
  std::unique_ptr<Cluster> cluster_;
  bool cluster_ready_ = false;  // as last published (health thread)
  std::shared_ptr<grpc::ChannelCredentials> peer_credentials_;
  std::unique_ptr<RunLedger> runs_;
  // Before the session table, which holds pointers to them.
  std::vector<std::unique_ptr<Limiter>> create_limiters_;
  std::unique_ptr<SessionManager> sessions_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<BrokerCore> core_;
  std::unique_ptr<BrokerService> service_;
  // Destroyed before the service, the core and the session table (declared
  // after them): its destructor finishes the work still queued or running,
  // which uses them.
  std::unique_ptr<WorkPool> blocking_;
  std::unique_ptr<Reloader> reloader_;
  std::unique_ptr<AdminService> admin_service_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<McpCoreBackend> mcp_backend_;
  std::unique_ptr<McpServer> mcp_;
  std::unique_ptr<McpHttpListener> mcp_http_;
  // The providers' network events into metrics_ and audit_; closed before
  // those go (providers_ outlives them).
  std::shared_ptr<NetworkEventSink> network_sink_;
  int port_ = 0;
  int admin_port_ = 0;
  std::string host_;
  absl::Notification stop_reaper_;
  std::thread reaper_;
  std::unique_ptr<HealthMonitor> health_;
  absl::Notification stop_health_;
  std::thread health_thread_;
  absl::Mutex health_mu_;
  bool serving_ ABSL_GUARDED_BY(health_mu_) = false;
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace sandbox
