#include "server/app/broker_server.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/event_loop.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/text.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace sandbox {

// Session lifecycle events go to usage metering and to the run ledger. A
// session closed, reaped or ended by its lifetime takes its run_id results
// with it (the store's rows go with the session's row), so a later session
// under the same id never gets an earlier sandbox's result for a run it
// never ran. A vanished sandbox (kGone) keeps them until the session goes
// on in a new sandbox (a new generation): results are bound to the sandbox
// that produced them.
class BrokerServer::ServerObserver : public SessionObserver {
 public:
  ServerObserver(SessionAccounting* accounting, RunLedger* runs)
      : accounting_(accounting), runs_(runs) {}
  void SessionCreated(const SessionView& v) override {
    accounting_->SessionCreated(v);
    // A new sandbox for a session that had one: the old one's run_id
    // results go with it.
    if (v.generation > 1) runs_->NewGeneration(v.tenant, v.session_id, v.generation);
  }
  void SessionAdopted(const SessionView& v) override { accounting_->SessionAdopted(v); }
  void SessionClosed(const SessionView& v, CloseReason reason, absl::Duration age) override {
    accounting_->SessionClosed(v, reason, age);
    if (reason != CloseReason::kGone) runs_->ForgetSession(v.tenant, v.session_id);
  }

 private:
  SessionAccounting* accounting_;
  RunLedger* runs_;
};
namespace {

// state.etcd -> the store's options (the password read from its file).
absl::StatusOr<EtcdStoreOptions> EtcdOptionsFromConfig(const BrokerConfig::StateEtcd& c) {
  EtcdStoreOptions o;
  o.prefix = c.prefix;
  o.etcd.endpoints = c.endpoints;
  o.etcd.ca_file = c.ca_file;
  o.etcd.cert_file = c.cert_file;
  o.etcd.key_file = c.key_file;
  o.etcd.username = c.username;
  if (!c.password_file.empty()) {
    std::ifstream in(c.password_file, std::ios::binary);
    if (!in) {
      return absl::FailedPreconditionError(
          absl::StrCat("state.etcd.password_file: cannot read ", c.password_file));
    }
    std::stringstream ss;
    ss << in.rdbuf();
    std::string pw = ss.str();
    while (!pw.empty() && (pw.back() == '\n' || pw.back() == '\r')) pw.pop_back();
    if (pw.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("state.etcd.password_file: ", c.password_file, " is empty"));
    }
    o.etcd.password = std::move(pw);
  }
  return o;
}

}  // namespace

absl::StatusOr<std::unique_ptr<BrokerServer>> BrokerServer::Start(
    const BrokerConfig& config, std::unique_ptr<ProviderRegistry> providers, Options options) {
  std::unique_ptr<BrokerServer> s(new BrokerServer());
  s->config_ = config;
  s->clock_ = options.clock;
  s->providers_ = std::move(providers);
  if (!s->providers_->Find(config.default_provider).ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("default_provider \"", config.default_provider,
                     "\": ", s->providers_->Find(config.default_provider).status().message()));
  }
  SessionLimits limits;
  limits.idle_timeout = absl::Seconds(config.idle_timeout_seconds);
  limits.max_lifetime = absl::Seconds(config.max_lifetime_seconds);
  limits.max_sessions_per_tenant = config.max_sessions_per_tenant;
  limits.close_wait = absl::Seconds(config.close_wait_seconds);
  const std::string instance_id = absl::StrCat("broker-", RandomHex(6));
  s->metrics_ = std::make_unique<Metrics>();
  for (const std::string& name : s->providers_->Names()) {
    std::string why = (*s->providers_->Find(name))->Degraded();
    if (!why.empty()) s->metrics_->ProviderDegraded(name, why);
  }
  // The session store: durable unless the operator opts out.
  std::string state_path;
  if (options.store != nullptr) {
    s->store_ = options.store;
  } else if (config.state_backend == "memory") {
    s->owned_store_ = NewMemoryStore(config.deployment_id);
    s->store_ = s->owned_store_.get();
    Log(LogLevel::kWarning, "state.memory",
        {{"message",
          "state.backend is \"memory\": sessions do not survive a restart, and sandboxes "
          "left by a crash are never adopted"}});
  } else if (config.state_backend == "etcd") {
    ASSIGN_OR_RETURN(EtcdStoreOptions etcd_options, EtcdOptionsFromConfig(config.state_etcd));
    ASSIGN_OR_RETURN(std::unique_ptr<EtcdStore> etcd, EtcdStore::Open(std::move(etcd_options)));
    const absl::Duration ttl = absl::Seconds(config.state_etcd.member_ttl_seconds);
    if (config.cluster.enabled) {
      // One of several replicas: sessions are claimed, writes fenced.
      ClusterOptions co;
      co.member_id = config.cluster.member_id.empty() ? instance_id : config.cluster.member_id;
      if (const char* env = getenv("SANDBOX_BROKER_MEMBER_ID"); env != nullptr && *env) {
        co.member_id = env;
      }
      co.token = config.cluster.token;
      if (!config.cluster.token_file.empty()) {
        std::ifstream in(config.cluster.token_file, std::ios::binary);
        std::stringstream ss;
        ss << in.rdbuf();
        co.token = std::string(absl::StripAsciiWhitespace(ss.str()));
        if (!in || co.token.size() < 16) {
          return absl::InvalidArgumentError(
              absl::StrCat("cluster.token_file: cannot read at least 16 characters from ",
                           config.cluster.token_file));
        }
      }
      co.member_ttl = ttl;
      co.lease_safety_margin = absl::Milliseconds(config.cluster.lease_safety_margin_ms);
      s->etcd_store_ = std::move(etcd);
      s->cluster_ = std::make_unique<Cluster>(s->etcd_store_.get(), std::move(co), s->clock_);
      s->store_ = s->cluster_->store();
    } else {
      // One broker per prefix (as SQLite's flock): wait out a crashed
      // holder's lease, then refuse.
      ASSIGN_OR_RETURN(s->etcd_lock_, etcd->LockPrefix(instance_id, ttl, ttl + absl::Seconds(2)));
      s->owned_store_ = std::move(etcd);
      s->store_ = s->owned_store_.get();
    }
  } else {
    state_path = config.state_path.empty() ? DefaultStatePath() : config.state_path;
    ASSIGN_OR_RETURN(s->owned_store_, OpenSqliteStore(state_path));
    s->store_ = s->owned_store_.get();
  }
  if (!config.deployment_id.empty() && config.deployment_id != s->store_->deployment_id()) {
    RETURN_IF_ERROR(s->store_->SetDeploymentId(config.deployment_id));
  }
  RunLedger::Options run_options;
  run_options.ttl = absl::Seconds(config.run_result_ttl_seconds);
  run_options.max_per_session = static_cast<int>(config.run_results_per_session);
  s->runs_ = std::make_unique<RunLedger>(s->store_, s->clock_, run_options);
  RETURN_IF_ERROR(s->runs_->Load());
  // Operators' control: audit log, usage meter, tenant policy snapshot.
  if (options.audit_sink) {
    s->audit_ = std::make_unique<AuditLog>(options.audit_sink, s->clock_);
  } else {
    ASSIGN_OR_RETURN(s->audit_, AuditLog::Open(config.audit_log_path, s->clock_));
  }
  std::vector<std::string> provider_names = s->providers_->Names();
  for (const auto& n : s->providers_->UnavailableNames()) provider_names.push_back(n);
  ASSIGN_OR_RETURN(std::shared_ptr<const OperatorSnapshot> snapshot,
                   Reloader::SnapshotOf(config, config, provider_names, 1));
  // Usage since the store was created: buffered in memory, flushed on the
  // reaper tick and at shutdown (FlushUsage).
  ASSIGN_OR_RETURN(s->usage_store_, BufferedUsageStore::Open(s->store_));
  s->usage_ = std::make_unique<UsageMeter>(s->metrics_->registry().get(), s->usage_store_.get(),
                                           s->clock_->Now());
  s->usage_->SetKnownTenants(snapshot->KnownTenants());
  s->accounting_ = std::make_unique<SessionAccounting>(s->usage_.get(), s->audit_.get());
  s->policy_ = std::make_unique<PolicyEngine>(s->clock_, snapshot);
  s->sessions_ = std::make_unique<SessionManager>(s->providers_.get(), s->clock_, limits,
                                                  config.default_provider, instance_id,
                                                  s->metrics_.get(), s->store_);
  s->sessions_->SetDetachOnShutdown(s->store_->durable() && !config.drain_close_sandboxes);
  // providers.<name>.max_concurrent_creates (kDefaultMaxConcurrentCreates each).
  for (const std::string& name : s->providers_->Names()) {
    auto it = config.max_concurrent_creates.find(name);
    const int64_t limit =
        it == config.max_concurrent_creates.end() ? kDefaultMaxConcurrentCreates : it->second;
    s->create_limiters_.push_back(std::make_unique<Limiter>(
        absl::StrCat("providers.", name, ".max_concurrent_creates"), limit,
        config.limits.max_queued_calls, absl::Milliseconds(config.limits.queue_timeout_ms)));
    s->sessions_->SetCreateLimiter(name, s->create_limiters_.back().get());
  }
  ASSIGN_OR_RETURN(int64_t recovered, s->sessions_->LoadFromStore());
  Log(LogLevel::kInfo, "state.opened",
      {{"backend", s->store_->backend()},
       {"path", state_path},
       {"deployment_id", s->store_->deployment_id()},
       {"sessions", recovered}});
  s->observer_ = std::make_unique<ServerObserver>(s->accounting_.get(), s->runs_.get());
  s->sessions_->set_observer(s->observer_.get());
  // Warm pools: members are tagged with this deployment and instance.
  for (WarmPool* pool : s->pools()) {
    pool->Start(s->store_->deployment_id(), instance_id, s->metrics_.get(), options.pool_threads);
  }
  s->auth_ = std::make_unique<Authenticator>(s->policy_.get());
  s->core_ = std::make_unique<BrokerCore>(config, s->providers_.get(), s->sessions_.get(),
                                          s->clock_, s->metrics_.get());
  s->core_->SetOperatorHooks({s->policy_.get(), s->usage_.get(), s->audit_.get()});
  s->core_->SetRunLedger(s->runs_.get());
  // Calls that must block run here (max_threads); runs and streams hold no
  // thread while they wait.
  s->blocking_ = std::make_unique<WorkPool>("sb-serving", static_cast<int>(config.max_threads));
  s->core_->SetBlockingPool(s->blocking_.get());
  s->reloader_ = std::make_unique<Reloader>(options.config_path, options.listen_override, config,
                                            provider_names, s->policy_.get(), s->usage_.get(),
                                            s->audit_.get());
  BrokerCore* core = s->core_.get();
  s->reloader_->SetSwapHook([core](const OperatorSnapshot& before, const OperatorSnapshot& after) {
    core->ApplyNetworkReload(before, after);
  });
  AdminService::Deps deps;
  deps.sessions = s->sessions_.get();
  deps.core = s->core_.get();
  deps.policy = s->policy_.get();
  deps.usage = s->usage_.get();
  deps.audit = s->audit_.get();
  deps.reloader = s->reloader_.get();
  deps.clock = s->clock_;
  deps.metrics = s->metrics_.get();
  s->admin_service_ = std::make_unique<AdminService>(deps);
  s->service_ = std::make_unique<BrokerService>(s->core_.get(), s->auth_.get(), s->clock_,
                                                s->metrics_.get(), config.limits);

  if (s->cluster_) {
    // Before the server starts: calls routed from the first one (a replica
    // not yet joined answers UNAVAILABLE).
    s->cluster_->SetSessions(s->sessions_.get());
    s->core_->SetCluster(s->cluster_.get());
    std::shared_ptr<grpc::ChannelCredentials> peer = grpc::InsecureChannelCredentials();
    if (!config.tls_cert_file.empty()) {
      // Replicas speak TLS to each other when clients do: trusting
      // cluster.peer_ca_file (else the system roots), presenting this
      // broker's own certificate where client certificates are required.
      grpc::SslCredentialsOptions ssl;
      auto slurp = [](const std::string& path) {
        std::ifstream in(path, std::ios::binary);
        std::stringstream ss;
        ss << in.rdbuf();
        return ss.str();
      };
      if (!config.cluster.peer_ca_file.empty())
        ssl.pem_root_certs = slurp(config.cluster.peer_ca_file);
      if (!config.tls_client_ca_file.empty()) {
        ssl.pem_cert_chain = slurp(config.tls_cert_file);
        ssl.pem_private_key = slurp(config.tls_key_file);
      }
      peer = grpc::SslCredentials(ssl);
    }
    s->service_->SetCluster(s->cluster_.get(), peer);
    s->peer_credentials_ = peer;
  }

  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!config.tls_cert_file.empty()) {
    auto read = [](const std::string& path, const char* what) -> absl::StatusOr<std::string> {
      std::ifstream in(path, std::ios::binary);
      if (!in) return absl::InvalidArgumentError(absl::StrCat(what, ": cannot read ", path));
      std::stringstream ss;
      ss << in.rdbuf();
      return ss.str();
    };
    grpc::SslServerCredentialsOptions ssl(
        config.tls_client_ca_file.empty()
            ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
            : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    ASSIGN_OR_RETURN(std::string cert, read(config.tls_cert_file, "tls.cert_file"));
    ASSIGN_OR_RETURN(std::string key, read(config.tls_key_file, "tls.key_file"));
    ssl.pem_key_cert_pairs.push_back({key, cert});
    if (!config.tls_client_ca_file.empty()) {
      ASSIGN_OR_RETURN(ssl.pem_root_certs, read(config.tls_client_ca_file, "tls.client_ca_file"));
    }
    creds = grpc::SslServerCredentials(ssl);
  }
  if (!config.admin_listen.empty()) {
    try {  // prometheus-cpp (civetweb) reports a bad address by throwing
      s->exposer_ = std::make_unique<prometheus::Exposer>(config.admin_listen);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("admin_listen: cannot listen on ", config.admin_listen));
    }
    s->exposer_->RegisterCollectable(s->metrics_->registry());
    auto ports = s->exposer_->GetListeningPorts();
    s->admin_port_ = ports.empty() ? 0 : ports[0];
  }

  grpc::EnableDefaultHealthCheckService(true);
  if (config.reflection) grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config.listen, creds, &port);
  builder.RegisterService(s->service_.get());
  builder.RegisterService(s->admin_service_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(config.max_message_bytes));
  // The thread cap of the synchronous services (Admin, health); the
  // SandboxBroker service is asynchronous and never waits on these.
  grpc::ResourceQuota quota("sandbox-broker");
  quota.SetMaxThreads(64);
  builder.SetResourceQuota(quota);
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", config.listen));
  }
  s->port_ = port;
  s->host_ = config.listen.substr(0, config.listen.rfind(':'));
  if (s->cluster_) {
    // Other replicas reach this one here (docs/cluster.md): the environment, the config, else
    // `listen` with the bound port (this host's name for a wildcard).
    std::string advertise = config.cluster.advertise_address;
    if (const char* env = getenv("SANDBOX_BROKER_ADVERTISE_ADDRESS"); env != nullptr && *env) {
      advertise = env;
    }
    if (advertise.empty()) {
      std::string host = s->host_;
      if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") {
        char name[256] = {};
        gethostname(name, sizeof(name) - 1);
        host = name;
      }
      advertise = absl::StrCat(host, ":", port);
    }
    s->cluster_->set_advertise_address(advertise);
    RETURN_IF_ERROR(s->cluster_->Join());
    s->cluster_->Start();
  }
  if (!config.mcp.listen.empty()) {
    McpServerOptions mo;
    mo.allowed_origins = config.mcp.allowed_origins;
    mo.allowed_hosts = config.mcp.allowed_hosts;
    mo.loopback_hosts_only = IsLoopbackListen(config.mcp.listen);
    mo.max_body_bytes = static_cast<size_t>(config.mcp.max_body_bytes);
    mo.max_sessions = static_cast<size_t>(config.mcp.max_sessions);
    mo.session_idle_timeout = absl::Seconds(config.idle_timeout_seconds);
    mo.keepalive_interval = absl::Seconds(config.mcp.keepalive_seconds);
    s->mcp_backend_ = std::make_unique<McpCoreBackend>(s->core_.get(), s->auth_.get(), s->clock_,
                                                       s->metrics_.get());
    if (s->cluster_) s->mcp_backend_->SetCluster(s->cluster_.get(), s->peer_credentials_);
    s->mcp_ = std::make_unique<McpServer>(s->mcp_backend_.get(), s->clock_, mo);
    ASSIGN_OR_RETURN(s->mcp_http_, McpHttpListener::Start(s->mcp_.get(), config));
  }
  s->HookProviders();
  s->health_ = std::make_unique<HealthMonitor>(s->providers_.get(), s->clock_,
                                               absl::Seconds(config.health_probe_interval_seconds));
  s->SetHealth(true);
  if (options.health_thread) {
    BrokerServer* self = s.get();
    s->health_thread_ = std::thread([self] {
      do {
        self->ProbeProviders();
      } while (!self->stop_health_.WaitForNotificationWithTimeout(self->health_->interval()));
    });
  }
  if (options.reaper_thread) {
    BrokerServer* self = s.get();
    s->reaper_ = std::thread([self] {
      // Serving has started; recovery runs here, off the request path.
      int unresolved = self->sessions_->ResolvePending();
      const absl::Duration grace = absl::Seconds(self->config_.orphan_grace_seconds);
      const int swept = self->sessions_->SweepOrphans(grace);
      Log(LogLevel::kInfo, "recovery.done", {{"orphans_destroyed", swept}});
      Clock* clock = Clock::Real();
      const absl::Duration reap_every = absl::Seconds(self->config_.reap_interval_seconds);
      const absl::Duration sweep_every = absl::Seconds(self->config_.orphan_sweep_interval_seconds);
      absl::Time next_reap = clock->Monotonic() + reap_every;
      absl::Time next_sweep = clock->Monotonic() + sweep_every;
      absl::Duration resolve_backoff = reap_every;
      absl::Time next_resolve = clock->Monotonic() + resolve_backoff;
      while (!self->stop_reaper_.WaitForNotificationWithTimeout(absl::Seconds(1))) {
        self->sessions_->FlushActivity();
        self->FlushUsage();
        self->PublishLimits();
        const absl::Time now = clock->Monotonic();
        // Rows whose provider could not be listed at start, until it can:
        // each try may block this thread for a request timeout, so they
        // back off (the reap interval, doubling, up to the sweep interval).
        if (unresolved > 0 && now >= next_resolve) {
          unresolved = self->sessions_->ResolvePending();
          resolve_backoff = std::min(resolve_backoff * 2, std::max(reap_every, sweep_every));
          next_resolve = clock->Monotonic() + resolve_backoff;
        }
        if (now >= next_reap) {
          self->sessions_->RunOnce();
          next_reap = now + reap_every;
        }
        if (now >= next_sweep) {
          self->sessions_->SweepOrphans(grace);
          next_sweep = now + sweep_every;
        }
      }
    });
  }
  // Watched whenever there is a config to reload: a reload may name a
  // tokens_file the start did not have.
  if (options.watch_tokens_file && !options.config_path.empty()) {
    s->reloader_->StartWatching(options.watch_interval);
  }
  Log(LogLevel::kInfo, "broker.serving",
      {{"address", s->address()},
       {"default_provider", config.default_provider},
       {"instance_id", instance_id},
       {"deployment_id", s->store_->deployment_id()},
       {"tls", !config.tls_cert_file.empty()},
       {"admin_port", s->admin_port_}});
  if (s->auth_->open()) {
    Log(LogLevel::kWarning, "broker.no_auth",
        {{"message", "no auth tokens configured: every caller is tenant \"default\""}});
  }
  return s;
}

std::vector<WarmPool*> BrokerServer::pools() const {
  std::vector<WarmPool*> out;
  if (providers_ == nullptr) return out;
  for (const std::string& name : providers_->Names()) {
    if (auto* pool = dynamic_cast<WarmPool*>(*providers_->Find(name))) out.push_back(pool);
  }
  return out;
}

std::string BrokerServer::address() const { return absl::StrCat(host_, ":", port_); }

void BrokerServer::SetHealth(bool serving) {
  {
    absl::MutexLock l(&health_mu_);
    serving_ = serving;
  }
  PublishHealth();
}

void BrokerServer::ProbeProviders() {
  bool changed = health_->RunOnce();
  if (cluster_) {
    const bool ready = cluster_->ready();
    changed = changed || ready != cluster_ready_;
    cluster_ready_ = ready;
  }
  if (changed) PublishHealth();
}

void BrokerServer::PublishHealth() {
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  if (health == nullptr) return;
  absl::MutexLock l(&health_mu_);
  const bool serving = serving_;
  // "" is what readiness probes ask: the broker serves and its default
  // provider can run code. The service name alone is the process (liveness).
  // A replica is ready while it is a member of the cluster (etcd answers
  // and its lease holds).
  const bool member = cluster_ == nullptr || cluster_->ready();
  health->SetServingStatus("", serving && member && health_->Healthy(config_.default_provider));
  health->SetServingStatus(pb::SandboxBroker::service_full_name(), serving);
  // Per provider: "sandboxbroker.v1.SandboxBroker/<provider>".
  for (const auto& name : providers_->Names()) {
    health->SetServingStatus(absl::StrCat(pb::SandboxBroker::service_full_name(), "/", name),
                             serving && health_->Healthy(name));
  }
  for (const auto& name : providers_->UnavailableNames()) {
    health->SetServingStatus(absl::StrCat(pb::SandboxBroker::service_full_name(), "/", name),
                             false);
  }
}

void BrokerServer::Drain() {
  Log(LogLevel::kInfo, "broker.draining",
      {{"grace_seconds", config_.drain_grace_seconds},
       {"calls_in_flight", service_->calls_in_flight()}});
  SetHealth(false);
  service_->StartDraining();
  if (mcp_) mcp_->StartDraining();
  // gRPC and MCP calls share one grace; what runs past it is cancelled
  // (runs killed).
  const absl::Time end = Clock::Real()->Now() + absl::Seconds(config_.drain_grace_seconds);
  bool idle = service_->WaitForIdle(end - Clock::Real()->Now());
  if (mcp_)
    idle = mcp_->AwaitCalls(std::max(end - Clock::Real()->Now(), absl::ZeroDuration())) && idle;
  if (!idle) {
    Log(LogLevel::kWarning, "broker.drain_grace_expired",
        {{"calls_in_flight", service_->calls_in_flight()},
         {"mcp_calls_running", mcp_ ? mcp_->calls_running() : 0}});
  }
  if (mcp_) mcp_->CancelAll();
  if (config_.drain_close_sandboxes) {
    sessions_->CloseAll();
  } else {
    Log(LogLevel::kInfo, "broker.sandboxes_left",
        {{"sessions", sessions_->size()},
         {"message", store_->durable()
                         ? "kept for the next start (durable store; drain_close_sandboxes is "
                           "false)"
                         : "left to their provider-side timeouts (drain_close_sandboxes is "
                           "false)"}});
  }
  Shutdown(absl::ZeroDuration());
}

void BrokerServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock l(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  if (!stop_reaper_.HasBeenNotified()) stop_reaper_.Notify();
  if (reloader_) reloader_->Stop();
  if (reaper_.joinable()) reaper_.join();
  if (!stop_health_.HasBeenNotified()) stop_health_.Notify();
  if (health_thread_.joinable()) health_thread_.join();
  // Calls still running at the deadline are cancelled; their runs see it.
  // A Start that failed part way (the store refused, say) has no server.
  if (server_) server_->Shutdown(absl::ToChronoTime(Clock::Real()->Now() + grace));
  if (mcp_http_) {
    mcp_->CancelAll();
    mcp_http_->Stop();
    // Cancelled calls answer quickly (their runs are killed); none may
    // answer into a core that is gone.
    if (!mcp_->AwaitCalls(absl::Seconds(30))) {
      Log(LogLevel::kWarning, "mcp.calls_outlived_shutdown", {});
    }
    mcp_->CloseAllSessions();
  }
  if (config_.drain_close_sandboxes && sessions_) sessions_->CloseAll();
  // Unclaimed pool members serve no session: destroyed, durable or not.
  for (WarmPool* pool : pools()) pool->Stop();
  if (cluster_) {
    // Let go of this replica's sessions and revoke its lease: the others
    // adopt them on their next call, without waiting for the TTL.
    if (sessions_) sessions_->DetachAll();
    cluster_->Leave();
  }
  FlushUsage();  // after the last calls and closes were metered
  // A call is answered before its task on the shared pool ends: a close's
  // task still drops the sandbox it held, a default file transfer the
  // lambda that answered. Those tails finish here, before this server's
  // parts (core, sessions, providers) go with it.
  if (!WorkPool::Shared()->Quiesce(absl::Seconds(30))) {
    Log(LogLevel::kWarning, "broker.shutdown_tasks",
        {{"message", "tasks on the shared pool still running after 30 s; stopping anyway"}});
  }
  Log(LogLevel::kInfo, "broker.stopped", {});
}

void BrokerServer::PublishLimits() {
  core_->PublishLimits();
  auto publish = [this](Limiter& l) {
    Limiter::Stats st = l.stats();
    metrics_->LimitState(l.name(), st.in_use, st.queued);
  };
  publish(*service_->call_limiter());
  for (auto& l : create_limiters_) publish(*l);
}

void BrokerServer::FlushUsage() {
  if (usage_store_ == nullptr) return;
  const absl::Status st = usage_store_->Flush();
  // Logged when it starts failing and when it recovers, not every tick.
  if (st.ok() == usage_flush_ok_.load()) return;
  usage_flush_ok_.store(st.ok());
  if (st.ok()) {
    Log(LogLevel::kInfo, "usage.flush_recovered", {});
  } else {
    Log(LogLevel::kWarning, "usage.flush_failed",
        {{"error", std::string(st.message())},
         {"message", "usage since the store was created is kept in memory and retried"}});
  }
}

void BrokerServer::Wait() { server_->Wait(); }

// ---- network events ------------------------------------------------------------

struct NetworkEventSink {
  absl::Mutex mu;
  Metrics* metrics ABSL_GUARDED_BY(mu) = nullptr;
  AuditLog* audit ABSL_GUARDED_BY(mu) = nullptr;
  UsageMeter* usage ABSL_GUARDED_BY(mu) = nullptr;

  void Close() {
    absl::MutexLock l(&mu);
    metrics = nullptr;
    audit = nullptr;
    usage = nullptr;
  }

  // Metered always; audited when denied. Identifiers and the broker's own
  // words only: never a payload.
  void Record(const std::string& provider, const NetworkEvent& e) {
    absl::MutexLock l(&mu);
    if (metrics == nullptr) return;
    if (e.kind == NetworkEvent::Kind::kClosed) {
      metrics->EgressBytes(provider, e.bytes_out, e.bytes_in);
      if (usage != nullptr) {
        UsageCounters d;
        d.egress_bytes = e.bytes_out + e.bytes_in;
        usage->Record(e.tenant, provider, d);
      }
      return;
    }
    const bool dns = e.kind == NetworkEvent::Kind::kDns;
    metrics->EgressDecision(provider, e.allowed, dns);
    if (e.allowed || audit == nullptr) return;
    AuditEvent a;
    a.event = dns ? "network.dns_denied" : "network.denied";
    a.tenant = e.tenant;
    a.session_id = e.session_id;
    a.provider = provider;
    a.sandbox_id = e.sandbox_id;
    a.fields["destination"] = e.destination;
    if (e.port > 0) a.fields["port"] = absl::StrCat(e.port);
    a.fields["rule"] = e.rule;
    audit->Record(a);
  }

  void Capacity(const std::string& provider, const std::string& resource, int64_t capacity,
                int64_t in_use) {
    absl::MutexLock l(&mu);
    if (metrics != nullptr) metrics->Capacity(provider, resource, capacity, in_use);
  }
};

void BrokerServer::HookProviders() {
  network_sink_ = std::make_shared<NetworkEventSink>();
  {
    absl::MutexLock l(&network_sink_->mu);
    network_sink_->metrics = metrics_.get();
    network_sink_->audit = audit_.get();
    network_sink_->usage = usage_.get();
  }
  std::vector<int> ports = {port_};
  if (admin_port_ > 0) ports.push_back(admin_port_);
  if (mcp_port() > 0) ports.push_back(mcp_port());
  for (const std::string& name : providers_->Names()) {
    ProviderHooks hooks;
    hooks.broker_ports = ports;
    std::shared_ptr<NetworkEventSink> sink = network_sink_;
    hooks.on_network_event = [sink, name](const NetworkEvent& e) { sink->Record(name, e); };
    hooks.on_capacity = [sink, name](const std::string& resource, int64_t capacity,
                                     int64_t in_use) {
      sink->Capacity(name, resource, capacity, in_use);
    };
    (*providers_->Find(name))->SetHooks(std::move(hooks));
  }
}

BrokerServer::~BrokerServer() {
  Shutdown(absl::ZeroDuration());
  if (network_sink_ != nullptr) network_sink_->Close();
}

}  // namespace sandbox
