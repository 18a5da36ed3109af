// E2B control-plane and envd JSON replies: sandbox objects, process events,
// end-of-stream payloads and HTTP error bodies.
//
// Invariants: a parsed sandbox has an id; every error a reply can cause is
// UNAVAILABLE (malformed reply) or the HTTP status's mapped code, and its
// message names the provider and operation; a non-JSON error body is quoted
// to at most 200 bytes.

#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "adapters/e2b/e2b_wire.h"
#include "common/text.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view in(reinterpret_cast<const char*>(data), size);

  auto sb = sandbox::e2b::ParseSandbox(in);
  if (sb.ok()) {
    FUZZ_CHECK(!sb->sandbox_id.empty());
  } else {
    FUZZ_CHECK(sb.status().code() == absl::StatusCode::kUnavailable);
    FUZZ_CHECK(absl::StartsWith(sb.status().message(), "e2b: "));
  }

  auto ev = sandbox::e2b::ParseProcessEvent(in);
  if (!ev.ok()) FUZZ_CHECK(ev.status().code() == absl::StatusCode::kUnavailable);

  absl::Status end = sandbox::e2b::ParseEndStream(in);
  if (!end.ok()) {
    FUZZ_CHECK(absl::StartsWith(end.message(), "e2b: ") || absl::StartsWith(end.message(), "["));
    FUZZ_CHECK(end.message().size() <= 300);
  }

  for (int status : {400, 401, 404, 429, 500, 502, 503, 418}) {
    absl::Status s = sandbox::e2b::HttpError("create sandbox", status, in);
    FUZZ_CHECK(!s.ok());
    FUZZ_CHECK(absl::StartsWith(s.message(), "e2b: create sandbox: "));
    FUZZ_CHECK(s.message().size() <= 300);
    FUZZ_CHECK(sandbox::IsValidUtf8(s.message()));
    if (status >= 500 && status != 507) FUZZ_CHECK(s.code() == absl::StatusCode::kUnavailable);
    (void)sandbox::e2b::IsSandboxGone(status, in);
  }
  return 0;
}
