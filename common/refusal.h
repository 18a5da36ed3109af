#pragma once

// Which configured rule refused a call, carried on the status itself (an
// Abseil status payload), so callers decide on a typed value and never on
// the message text, which is for people.

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace sandbox {

// `status` tagged with the rule (a config key such as "max_sessions" or
// "run_rate") that refused it.
absl::Status RefusedBy(absl::Status status, absl::string_view rule);
// The rule a status was tagged with, if any.
std::optional<std::string> RefusingRule(const absl::Status& status);

}  // namespace sandbox
