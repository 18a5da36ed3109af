#include "server/config/auth.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace sandbox {
namespace {

absl::StatusOr<absl::string_view> BearerToken(const absl::string_view* authorization) {
  if (authorization == nullptr) {
    return absl::UnauthenticatedError("missing \"authorization: Bearer <token>\" metadata");
  }
  absl::string_view v = absl::StripAsciiWhitespace(*authorization);
  constexpr absl::string_view kBearer = "bearer ";
  if (v.size() <= kBearer.size() || !absl::StartsWithIgnoreCase(v, kBearer)) {
    return absl::UnauthenticatedError("authorization must be \"Bearer <token>\"");
  }
  return absl::StripAsciiWhitespace(v.substr(kBearer.size()));
}

}  // namespace

Authenticator::Authenticator(std::map<std::string, std::string> token_to_tenant)
    : fixed_(MakeOperatorSnapshot(std::move(token_to_tenant), {}, {}, {}, "", 1)) {}

Authenticator::Authenticator(const PolicyEngine* engine) : engine_(engine) {}

std::shared_ptr<const OperatorSnapshot> Authenticator::snapshot() const {
  return engine_ != nullptr ? engine_->Current() : fixed_;
}

absl::StatusOr<std::string> Authenticator::Authenticate(
    const absl::string_view* authorization) const {
  return AuthenticateWith(*snapshot(), authorization);
}

absl::StatusOr<std::string> Authenticator::AuthenticateWith(
    const OperatorSnapshot& snap, const absl::string_view* authorization) {
  if (snap.tokens.empty()) return std::string("default");
  absl::StatusOr<absl::string_view> token = BearerToken(authorization);
  if (!token.ok()) return token.status();
  auto it = snap.tokens.find(*token);
  if (it == snap.tokens.end()) return absl::UnauthenticatedError("unknown token");
  return it->second;
}

absl::StatusOr<std::string> Authenticator::AuthenticateAdmin(
    const OperatorSnapshot& snap, const absl::string_view* authorization) {
  absl::StatusOr<absl::string_view> token = BearerToken(authorization);
  if (!token.ok()) return token.status();
  auto it = snap.admin_tokens.find(*token);
  if (it != snap.admin_tokens.end()) return it->second;
  if (snap.tokens.find(*token) != snap.tokens.end()) {
    return absl::PermissionDeniedError("the Admin API needs an admin token, not a tenant token");
  }
  if (snap.admin_tokens.empty()) {
    return absl::PermissionDeniedError("the Admin API is off: no auth.admin_tokens are configured");
  }
  return absl::UnauthenticatedError("unknown token");
}

}  // namespace sandbox
