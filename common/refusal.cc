#include "common/refusal.h"

#include "absl/strings/cord.h"

namespace sandbox {
namespace {
constexpr absl::string_view kRuleUrl = "type.sandbox-broker.dev/refusing-rule";
}  // namespace

absl::Status RefusedBy(absl::Status status, absl::string_view rule) {
  status.SetPayload(kRuleUrl, absl::Cord(rule));
  return status;
}

std::optional<std::string> RefusingRule(const absl::Status& status) {
  absl::optional<absl::Cord> rule = status.GetPayload(kRuleUrl);
  if (!rule) return std::nullopt;
  return std::string(*rule);
}

}  // namespace sandbox
