#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/config/policy.h"

namespace sandbox {

// Maps `authorization: Bearer <token>` to a tenant. With no tokens
// configured every caller is tenant "default".
//
// Thread-safe. Built on a PolicyEngine, it reads the engine's current
// snapshot, so reloaded tokens apply to the next call.
class Authenticator {
 public:
  explicit Authenticator(std::map<std::string, std::string> token_to_tenant);
  explicit Authenticator(const PolicyEngine* engine);

  bool open() const { return snapshot()->tokens.empty(); }
  std::shared_ptr<const OperatorSnapshot> snapshot() const;

  // `authorization` is the metadata value, or nullptr when absent.
  // UNAUTHENTICATED for a missing, malformed or unknown token; the message
  // never contains the token.
  absl::StatusOr<std::string> Authenticate(const absl::string_view* authorization) const;
  static absl::StatusOr<std::string> AuthenticateWith(const OperatorSnapshot& snapshot,
                                                      const absl::string_view* authorization);
  // For the Admin service: the admin's name. UNAUTHENTICATED without a token
  // or with an unknown one; PERMISSION_DENIED for a tenant token or when no
  // admin tokens are configured.
  static absl::StatusOr<std::string> AuthenticateAdmin(const OperatorSnapshot& snapshot,
                                                       const absl::string_view* authorization);

 private:
  std::shared_ptr<const OperatorSnapshot> fixed_;
  const PolicyEngine* const engine_ = nullptr;
};

}  // namespace sandbox
