// The operator's inputs: the daemon config (server/config/config.cc over
// common/config_reader.cc), the tokens file it names, and the
// `authorization` metadata checked against the tokens (server/config/auth.cc).
//
// Input: mode byte, then the text.
// Mode 0: the text is the config. An accepted config holds every value in
//   its documented bounds, only valid tenants and tokens of 8+ bytes.
// Mode 1: the text is a tokens file, named by a config. Error messages never
//   contain a token (a key of the file of 8+ bytes).
// Mode 2: the text is an authorization value against fixed tokens. A tenant
//   is returned only for "Bearer <token>" of a configured token (any case of
//   "bearer", surrounding whitespace); errors never contain the token.

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_check.h"
#include "nlohmann/json.hpp"
#include "server/config/auth.h"
#include "server/config/config.h"

namespace {

void CheckAccepted(const sandbox::BrokerConfig& c) {
  constexpr int64_t kDay = 86400;
  FUZZ_CHECK(!c.listen.empty() && !c.default_provider.empty());
  FUZZ_CHECK(c.idle_timeout_seconds >= 1 && c.idle_timeout_seconds <= 30 * kDay);
  FUZZ_CHECK(c.reap_interval_seconds >= 1 && c.reap_interval_seconds <= kDay);
  FUZZ_CHECK(c.max_lifetime_seconds >= 0);
  FUZZ_CHECK(c.max_sessions_per_tenant >= 1);
  FUZZ_CHECK(c.default_timeout_seconds >= 1 && c.default_timeout_seconds <= c.max_timeout_seconds);
  FUZZ_CHECK(c.max_output_bytes >= 1 && c.max_message_bytes >= 4096);
  FUZZ_CHECK(c.max_threads >= 4);
  FUZZ_CHECK(c.tls_cert_file.empty() == c.tls_key_file.empty());
  FUZZ_CHECK(c.log_format == "text" || c.log_format == "json");
  FUZZ_CHECK(c.providers.is_object());
  for (const auto& [token, tenant] : c.tokens) {
    FUZZ_CHECK(token.size() >= 8);
    FUZZ_CHECK(sandbox::IsValidTenant(tenant));
  }
}

const std::string& TokensPath() {
  static const std::string* path = [] {
    char tmpl[] = "/tmp/sb-fuzz-tokens-XXXXXX";
    int fd = mkstemp(tmpl);
    FUZZ_CHECK(fd >= 0);
    close(fd);
    auto* p = new std::string(tmpl);
    std::atexit([] { unlink(TokensPath().c_str()); });
    return p;
  }();
  return *path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int mode = data[0] % 3;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);

  if (mode == 0) {
    auto c = sandbox::ParseConfig(text);
    if (c.ok()) {
      CheckAccepted(*c);
    } else {
      FUZZ_CHECK(c.status().code() == absl::StatusCode::kInvalidArgument);
    }
    return 0;
  }

  if (mode == 1) {
    { std::ofstream(TokensPath(), std::ios::binary | std::ios::trunc) << text; }
    auto c = sandbox::ParseConfig(
        nlohmann::json({{"auth", {{"tokens_file", TokensPath()}}}}).dump());
    if (c.ok()) {
      CheckAccepted(*c);
      return 0;
    }
    FUZZ_CHECK(c.status().code() == absl::StatusCode::kInvalidArgument);
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (!j.is_discarded() && j.is_object()) {
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (it.key().size() < 8) continue;
        // A tenant may legitimately be quoted; only skip a token that also
        // appears as some tenant or in the key path itself.
        bool quoted_elsewhere = absl::StrContains(
            "auth.tokens_file: must hold a JSON object of token -> tenant"
            "auth.tokens_file: tokens must be at least 8 characters"
            "\" must be 1-64 characters of [A-Za-z0-9._-]",
            it.key());
        for (auto t = j.begin(); t != j.end(); ++t) {
          if (t.value().is_string() &&
              absl::StrContains(t.value().get<std::string>(), it.key())) {
            quoted_elsewhere = true;
          }
        }
        if (!quoted_elsewhere) FUZZ_CHECK(!absl::StrContains(c.status().message(), it.key()));
      }
    }
    return 0;
  }

  static const sandbox::Authenticator* auth = new sandbox::Authenticator(
      {{"token-alpha-123", "alpha"}, {"tok en with spaces", "spaced"}, {"BETA-token-xyz", "beta"}});
  const absl::string_view v(text);
  auto tenant = auth->Authenticate(&v);
  const absl::string_view stripped = absl::StripAsciiWhitespace(v);
  if (tenant.ok()) {
    FUZZ_CHECK(absl::StartsWithIgnoreCase(stripped, "bearer "));
    const absl::string_view token = absl::StripAsciiWhitespace(stripped.substr(7));
    FUZZ_CHECK((token == "token-alpha-123" && *tenant == "alpha") ||
               (token == "tok en with spaces" && *tenant == "spaced") ||
               (token == "BETA-token-xyz" && *tenant == "beta"));
  } else {
    // The messages are fixed texts: nothing of the caller's value is echoed.
    FUZZ_CHECK(tenant.status().code() == absl::StatusCode::kUnauthenticated);
    const absl::string_view m = tenant.status().message();
    FUZZ_CHECK(m == "unknown token" || m == "authorization must be \"Bearer <token>\"");
  }
  return 0;
}
