#include "server/app/provider_setup.h"

#include "absl/strings/str_cat.h"
#include "adapters/daytona/daytona_provider.h"
#include "adapters/e2b/e2b_provider.h"
#include "adapters/echo/echo_provider.h"
#include "adapters/local/local_provider.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "server/sessions/warm_pool.h"

namespace sandbox {
namespace {

absl::StatusOr<std::unique_ptr<Provider>> MakeProvider(const std::string& name,
                                                       const nlohmann::json& cfg,
                                                       const BrokerConfig& config) {
  if (name == "local") {
    ASSIGN_OR_RETURN(LocalConfig c, ParseLocalConfig(cfg));
    ASSIGN_OR_RETURN(std::unique_ptr<LocalProvider> p, LocalProvider::Create(std::move(c)));
    return std::unique_ptr<Provider>(std::move(p));
  }
  if (name == "e2b") {
    ASSIGN_OR_RETURN(E2BConfig c, ParseE2BConfig(cfg, config.idle_timeout_seconds));
    PoolConfig pool = c.pool;
    // Refills are bounded by the broker's providers.e2b.max_concurrent_creates
    // (config.cc takes the key out of the provider's section).
    if (auto m = config.max_concurrent_creates.find(name);
        m != config.max_concurrent_creates.end()) {
      pool.max_concurrent_creates = m->second;
    }
    ASSIGN_OR_RETURN(std::unique_ptr<E2BProvider> p, E2BProvider::Create(std::move(c)));
    if (pool.size > 0) return std::unique_ptr<Provider>(new WarmPool(std::move(p), pool));
    return std::unique_ptr<Provider>(std::move(p));
  }
  if (name == "echo") {
    ASSIGN_OR_RETURN(std::unique_ptr<EchoProvider> p, EchoProvider::Create(cfg));
    return std::unique_ptr<Provider>(std::move(p));
  }
  if (name == "daytona") {
    ASSIGN_OR_RETURN(DaytonaConfig c, ParseDaytonaConfig(cfg, config.idle_timeout_seconds));
    PoolConfig pool = c.pool;
    // Refills are bounded by the broker's providers.daytona.max_concurrent_creates
    // (config.cc takes the key out of the provider's section).
    if (auto m = config.max_concurrent_creates.find(name);
        m != config.max_concurrent_creates.end()) {
      pool.max_concurrent_creates = m->second;
    }
    ASSIGN_OR_RETURN(std::unique_ptr<DaytonaProvider> p, DaytonaProvider::Create(std::move(c)));
    if (pool.size > 0) return std::unique_ptr<Provider>(new WarmPool(std::move(p), pool));
    return std::unique_ptr<Provider>(std::move(p));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("providers.", name, ": unknown provider (known: local, e2b, daytona, echo)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProviderRegistry>> BuildProviders(const BrokerConfig& config) {
  auto registry = std::make_unique<ProviderRegistry>();
  nlohmann::json wanted = config.providers;
  if (!wanted.contains(config.default_provider)) {
    wanted[config.default_provider] = nlohmann::json::object();
  }
  for (auto it = wanted.begin(); it != wanted.end(); ++it) {
    const std::string& name = it.key();
    absl::StatusOr<std::unique_ptr<Provider>> p = MakeProvider(name, it.value(), config);
    if (p.ok()) {
      registry->Add(std::move(*p));
      Log(LogLevel::kInfo, "provider.ready", {{"provider", name}});
      continue;
    }
    // Config mistakes and an unusable default provider stop the daemon.
    if (p.status().code() == absl::StatusCode::kInvalidArgument ||
        name == config.default_provider) {
      return p.status();
    }
    Log(LogLevel::kWarning, "provider.unavailable",
        {{"provider", name}, {"reason", p.status().message()}});
    registry->AddUnavailable(name, std::string(p.status().message()));
  }
  return registry;
}

absl::Status CheckProviderConfigs(const BrokerConfig& config) {
  for (auto it = config.providers.begin(); it != config.providers.end(); ++it) {
    const std::string& name = it.key();
    absl::Status s;
    if (name == "local") {
      s = ParseLocalConfig(it.value()).status();
    } else if (name == "e2b") {
      s = ParseE2BConfig(it.value(), config.idle_timeout_seconds).status();
    } else if (name == "daytona") {
      s = ParseDaytonaConfig(it.value(), config.idle_timeout_seconds).status();
    } else if (name == "echo") {
      s = EchoProvider::Create(it.value()).status();
    } else {
      s = absl::InvalidArgumentError(absl::StrCat(
          "providers.", name, ": unknown provider (known: local, e2b, daytona, echo)"));
    }
    if (!s.ok() && s.code() != absl::StatusCode::kFailedPrecondition) return s;
  }
  const std::string& d = config.default_provider;
  if (d != "local" && !config.providers.contains(d)) {
    return absl::InvalidArgumentError(
        absl::StrCat("default_provider: \"", d, "\" has no providers.", d, " section"));
  }
  return absl::OkStatus();
}

}  // namespace sandbox
