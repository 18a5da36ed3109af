#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "adapters/api/provider.h"

namespace sandbox {

// The providers a broker can use, filled in main (and in tests). A provider
// that is configured but unusable (e.g. a missing API key) is registered as
// unavailable with its reason, so callers get that reason instead of
// "unknown provider".
//
// Not thread-safe for mutation; immutable once the broker serves.
class ProviderRegistry {
 public:
  void Add(std::unique_ptr<Provider> provider);
  void AddUnavailable(std::string name, std::string reason);

  // FAILED_PRECONDITION with the reason for an unknown or unusable provider.
  absl::StatusOr<Provider*> Find(absl::string_view name) const;
  // Names of usable providers, sorted.
  std::vector<std::string> Names() const;
  // Names of configured but unusable providers, sorted.
  std::vector<std::string> UnavailableNames() const;

 private:
  std::map<std::string, std::unique_ptr<Provider>, std::less<>> providers_;
  std::map<std::string, std::string, std::less<>> unavailable_;
};

}  // namespace sandbox
