// Daytona control-plane and toolbox JSON replies: sandbox DTOs, execute and
// code-run results, error bodies.
//
// Invariants: a parsed sandbox has an id; malformed replies are UNAVAILABLE
// naming the provider; error messages name provider and operation and stay
// short (the quoted body is bounded) and valid UTF-8, whatever the body.

#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "adapters/daytona/daytona_wire.h"
#include "common/text.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view in(reinterpret_cast<const char*>(data), size);

  auto sb = sandbox::daytona::ParseSandbox(in);
  if (sb.ok()) {
    FUZZ_CHECK(!sb->id.empty());
  } else {
    FUZZ_CHECK(sb.status().code() == absl::StatusCode::kUnavailable);
    FUZZ_CHECK(absl::StartsWith(sb.status().message(), "daytona: "));
  }

  auto ex = sandbox::daytona::ParseExecuteResult(in);
  if (!ex.ok()) {
    FUZZ_CHECK(ex.status().code() == absl::StatusCode::kUnavailable);
    FUZZ_CHECK(absl::StartsWith(ex.status().message(), "daytona: "));
  }

  for (int status : {400, 401, 404, 408, 409, 429, 500, 502, 418}) {
    absl::Status s = sandbox::daytona::HttpError("execute", status, in);
    FUZZ_CHECK(!s.ok());
    FUZZ_CHECK(absl::StartsWith(s.message(), "daytona: execute: "));
    FUZZ_CHECK(s.message().size() <= 300);
    FUZZ_CHECK(sandbox::IsValidUtf8(s.message()));
    if (status >= 500) FUZZ_CHECK(s.code() == absl::StatusCode::kUnavailable);
  }
  return 0;
}
