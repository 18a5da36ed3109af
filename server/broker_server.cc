#include "server/broker_server.h"

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/text.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace sandbox {

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
  s->sessions_ = std::make_unique<SessionManager>(s->providers_.get(), s->clock_, limits,
                                                  config.default_provider, instance_id);
  s->auth_ = std::make_unique<Authenticator>(config.tokens);
  s->core_ =
      std::make_unique<BrokerCore>(config, s->providers_.get(), s->sessions_.get(), s->clock_);
  s->service_ = std::make_unique<BrokerService>(s->core_.get(), s->auth_.get(), s->clock_);

  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(config.listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(s->service_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(config.max_message_bytes));
  grpc::ResourceQuota quota("sandbox-broker");
  quota.SetMaxThreads(static_cast<int>(config.max_threads));
  builder.SetResourceQuota(quota);
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", config.listen));
  }
  s->port_ = port;
  s->host_ = config.listen.substr(0, config.listen.rfind(':'));
  if (options.reaper_thread) {
    BrokerServer* self = s.get();
    s->reaper_ = std::thread([self] {
      const absl::Duration every = absl::Seconds(self->config_.reap_interval_seconds);
      while (!self->stop_reaper_.WaitForNotificationWithTimeout(every)) {
        self->sessions_->RunOnce();
      }
    });
  }
  Log(LogLevel::kInfo, "broker.serving",
      {{"address", s->address()},
       {"default_provider", config.default_provider},
       {"instance_id", instance_id}});
  if (s->auth_->open()) {
    Log(LogLevel::kWarning, "broker.no_auth",
        {{"message", "no auth tokens configured: every caller is tenant \"default\""}});
  }
  return s;
}

std::string BrokerServer::address() const { return absl::StrCat(host_, ":", port_); }

void BrokerServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock l(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  if (!stop_reaper_.HasBeenNotified()) stop_reaper_.Notify();
  if (reaper_.joinable()) reaper_.join();
  // Calls still running at the deadline are cancelled; their runs see it.
  server_->Shutdown(absl::ToChronoTime(Clock::Real()->Now() + grace));
  sessions_->CloseAll();
  Log(LogLevel::kInfo, "broker.stopped", {});
}

void BrokerServer::Wait() { server_->Wait(); }

BrokerServer::~BrokerServer() { Shutdown(absl::ZeroDuration()); }

}  // namespace sandbox
