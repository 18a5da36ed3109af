#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "server/config/policy.h"

namespace sandbox {

// providers.<name>.max_concurrent_creates when the key is absent.
inline constexpr int64_t kDefaultMaxConcurrentCreates = 64;

// The daemon's configuration (a JSON file; see docs/config.md).
// Unknown keys and bad values are errors that name the key.
struct BrokerConfig {
  std::string listen = "127.0.0.1:50051";
  std::string default_provider = "local";
  int64_t idle_timeout_seconds = 300;
  int64_t reap_interval_seconds = 10;
  // How often each provider's health probe runs (Provider::CheckHealth).
  int64_t health_probe_interval_seconds = 10;
  int64_t max_lifetime_seconds = 0;  // 0 = none
  int64_t max_sessions_per_tenant = 100;
  int64_t default_timeout_seconds = 30;
  int64_t max_timeout_seconds = 900;
  int64_t max_output_bytes = 65536;
  // Largest gRPC message accepted or sent (bigger: RESOURCE_EXHAUSTED).
  int64_t max_message_bytes = int64_t{32} << 20;
  // The largest streamed upload (UploadFile); 0 = no limit of the broker's
  // own (the workspace's quota still applies).
  int64_t max_transfer_bytes = 0;
  // Code contexts a session may hold at once (CreateContext, and each
  // language's default context); more is RESOURCE_EXHAUSTED naming the key.
  int64_t max_contexts_per_session = 8;
  // How long CloseSession waits for in-flight calls before destroying.
  int64_t close_wait_seconds = 10;
  // Threads for the calls that must block (file transfers, creates and
  // attaches, session admin); runs and streams hold none while they wait.
  int64_t max_threads = 256;
  // Backpressure (docs/operations.md): past a limit a call waits up to
  // queue_timeout_ms in a queue of at most max_queued_calls, then gets
  // RESOURCE_EXHAUSTED naming the limit. 0 = unlimited.
  struct Limits {
    int64_t max_calls_in_flight = 20000;             // whole broker
    int64_t max_concurrent_runs_per_tenant = 10000;  // Run, Shell, RunStream
    int64_t max_queued_calls = 10000;                // per limit
    int64_t queue_timeout_ms = 5000;
  } limits;
  // providers.<name>.max_concurrent_creates (read here, not by the
  // provider): session creates at once per provider, absent =
  // kDefaultMaxConcurrentCreates; also bounds the provider's warm-pool
  // refills when set (absent: 4 at once).
  std::map<std::string, int64_t> max_concurrent_creates;
  // providers.<name>.network (read here, not by the provider): what its
  // sessions may reach when the tenant's policy says nothing
  // (docs/network.md). Absent = no network.
  std::map<std::string, NetworkPolicy> provider_network;
  // Serve grpc.reflection (grpcurl-style tools can list and call the API).
  bool reflection = true;
  // Prometheus /metrics listener (host:port; port 0 picks one); "" = off.
  std::string admin_listen;
  // On SIGTERM/SIGINT: how long running calls may finish, and whether every
  // live sandbox is then closed (else left to the provider-side timeout).
  int64_t drain_grace_seconds = 30;
  // Default: false with a durable store (sandboxes stay for the next start),
  // true with the memory store.
  bool drain_close_sandboxes = true;
  bool drain_close_sandboxes_set = false;
  // Durable sessions (docs/durability.md). state.backend: "sqlite"
  // (default), "memory" or "etcd"; state.path: the SQLite file ("" = the default,
  // see DefaultStatePath).
  std::string state_backend = "sqlite";
  std::string state_path;
  // state.etcd, for backend "etcd" (docs/durability.md):
  // one broker per prefix for now (it holds <prefix>lock under a lease).
  struct StateEtcd {
    std::vector<std::string> endpoints;  // http(s)://host:port, at least one
    std::string prefix = "/sandbox-broker/";
    int64_t member_ttl_seconds = 10;
    // TLS (https endpoints): CA bundle, client certificate and key.
    std::string ca_file;
    std::string cert_file;
    std::string key_file;
    // etcd auth: the user, and a file holding its password.
    std::string username;
    std::string password_file;
  } state_etcd;
  // cluster (docs/cluster.md): with state.backend
  // "etcd" and a token, replicas share sessions (server/cluster/cluster.h).
  struct Cluster {
    bool enabled = false;  // a token or token_file was given
    // "" = the broker's instance id; $SANDBOX_BROKER_MEMBER_ID overrides.
    std::string member_id;
    // host:port other replicas reach this one on; "" = `listen` unless it
    // is a wildcard or port 0 (then the bound port on this host's name);
    // $SANDBOX_BROKER_ADVERTISE_ADDRESS overrides.
    std::string advertise_address;
    // The shared secret replicas present on forwarded calls (or a file
    // holding it). Never logged.
    std::string token;
    std::string token_file;
    // How much earlier than etcd's lease expiry (the TTL from the last
    // renewal that succeeded) this replica stops acting on its sessions:
    // room for clock drift and pauses. Below 2/3 of the TTL (renewals go
    // every TTL/3). -1 (the default): a tenth of the TTL, 1000 ms at the
    // default TTL. docs/cluster.md#store-outages.
    int64_t lease_safety_margin_ms = -1;
    // With tls.cert_file: the CA replicas verify each other's certificate
    // with ("" = the system roots).
    std::string peer_ca_file;
  } cluster;
  // Names this broker's sandboxes at the providers; "" = the id kept in the
  // store (random when it was created).
  std::string deployment_id;
  int64_t orphan_sweep_interval_seconds = 300;
  int64_t orphan_grace_seconds = 300;
  // How long a finished run_id/call_id result is kept for retries.
  int64_t run_result_ttl_seconds = 600;
  int64_t run_results_per_session = 256;
  // TLS for the gRPC listener; off when cert_file is empty. With
  // client_ca_file, clients must present a certificate it signed.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  std::string log_format = "text";  // text | json
  std::string log_level = "info";   // debug | info | warning | error
  // Bearer token -> tenant. Empty: one tenant, "default", no auth.
  std::map<std::string, std::string> tokens;
  // The MCP endpoint (docs/mcp.md); off when mcp.listen is empty.
  struct Mcp {
    std::string listen;  // host:port (port 0 picks one)
    std::string path = "/mcp";
    std::vector<std::string> allowed_origins;  // besides loopback origins
    std::vector<std::string> allowed_hosts;    // Host names accepted (empty: see docs/config.md)
    int64_t max_body_bytes = int64_t{4} << 20;
    int64_t max_sessions = 10000;    // legacy MCP sessions, all tenants
    int64_t keepalive_seconds = 15;  // SSE comment interval on long calls
    int64_t max_threads = 8;  // workers for requests' quick steps (a running call holds none)
  } mcp;
  // providers.<name>: each provider reads its own object.
  nlohmann::json providers = nlohmann::json::object();
  // Operators' control (docs/operators.md).
  // auth.admin_tokens: bearer token -> admin name, for the Admin service.
  std::map<std::string, std::string> admin_tokens;
  std::string tokens_file;     // auth.tokens_file (watched for changes)
  PolicyConfig policy;         // tenant_defaults + tenants
  std::string audit_log_path;  // audit_log.path; empty = stderr
  // The file as parsed, to tell which keys a reload changed.
  nlohmann::json raw = nlohmann::json::object();
};

absl::StatusOr<BrokerConfig> ParseConfig(absl::string_view json_text);
absl::StatusOr<BrokerConfig> LoadConfigFile(const std::string& path);

// A tenant name: 1-64 of [A-Za-z0-9._-].
bool IsValidTenant(absl::string_view tenant);

}  // namespace sandbox
