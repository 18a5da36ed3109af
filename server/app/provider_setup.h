#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "adapters/api/registry.h"
#include "server/config/config.h"

namespace sandbox {

// Builds the providers named in config.providers (plus the default
// provider). The default provider must come up or this fails; any other
// provider that cannot is registered as unavailable with its reason.
absl::StatusOr<std::unique_ptr<ProviderRegistry>> BuildProviders(const BrokerConfig& config);

// Parses every provider section without creating anything (for
// --check-config). A missing API key is not an error here: keys usually
// come from the environment at run time.
absl::Status CheckProviderConfigs(const BrokerConfig& config);

}  // namespace sandbox
