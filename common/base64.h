#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sandbox {

// Standard base64 (RFC 4648 section 4, '=' padding required), strictly: no
// whitespace, no URL-safe alphabet, no data after padding.
// INVALID_ARGUMENT naming the first bad offset otherwise.
absl::StatusOr<std::string> DecodeBase64Strict(absl::string_view in);

}  // namespace sandbox
