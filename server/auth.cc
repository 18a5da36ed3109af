#include "server/auth.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace sandbox {

Authenticator::Authenticator(std::map<std::string, std::string> token_to_tenant)
    : tokens_(token_to_tenant.begin(), token_to_tenant.end()) {}

absl::StatusOr<std::string> Authenticator::Authenticate(
    const absl::string_view* authorization) const {
  if (tokens_.empty()) return std::string("default");
  if (authorization == nullptr) {
    return absl::UnauthenticatedError("missing \"authorization: Bearer <token>\" metadata");
  }
  absl::string_view v = absl::StripAsciiWhitespace(*authorization);
  constexpr absl::string_view kBearer = "bearer ";
  if (v.size() <= kBearer.size() || !absl::StartsWithIgnoreCase(v, kBearer)) {
    return absl::UnauthenticatedError("authorization must be \"Bearer <token>\"");
  }
  absl::string_view token = absl::StripAsciiWhitespace(v.substr(kBearer.size()));
  auto it = tokens_.find(token);
  if (it == tokens_.end()) return absl::UnauthenticatedError("unknown token");
  return it->second;
}

}  // namespace sandbox
