#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sandbox {

// Maps `authorization: Bearer <token>` to a tenant. With no tokens
// configured every caller is tenant "default".
//
// Thread-safe (immutable).
class Authenticator {
 public:
  explicit Authenticator(std::map<std::string, std::string> token_to_tenant);

  bool open() const { return tokens_.empty(); }

  // `authorization` is the metadata value, or nullptr when absent.
  // UNAUTHENTICATED for a missing, malformed or unknown token; the message
  // never contains the token.
  absl::StatusOr<std::string> Authenticate(const absl::string_view* authorization) const;

 private:
  const std::map<std::string, std::string, std::less<>> tokens_;
};

}  // namespace sandbox
