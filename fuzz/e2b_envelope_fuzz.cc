// E2B envd's Connect stream: envelopes split at arbitrary points, then each
// payload decoded as a process event or end-of-stream.
//
// Invariants: the reader returns exactly the envelopes the bytes hold, in
// order, however the bytes are chunked (re-encoding them gives back the bytes
// consumed); no payload exceeds max_frame; decoded stdout/stderr data is what
// the base64 said; errors are UNAVAILABLE (a malformed provider reply).

#include <cstdint>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "adapters/e2b/e2b_wire.h"
#include "fuzz/fuzz_check.h"

using sandbox::e2b::EnvelopeReader;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  // First byte picks the chunk size, second the frame limit.
  const size_t chunk = 1 + data[0] % 64;
  const size_t max_frame = data[1] < 128 ? 64 : (16 << 20);
  const absl::string_view bytes(reinterpret_cast<const char*>(data) + 2, size - 2);

  EnvelopeReader reader;
  std::string reencoded;
  bool failed = false;
  for (size_t off = 0; off < bytes.size() && !failed; off += chunk) {
    reader.Feed(bytes.substr(off, chunk));
    while (true) {
      auto next = reader.Next(max_frame);
      if (!next.ok()) {
        FUZZ_CHECK(next.status().code() == absl::StatusCode::kInvalidArgument);
        failed = true;
        break;
      }
      if (!next->has_value()) break;
      const auto& env = **next;
      FUZZ_CHECK(env.payload.size() <= max_frame);
      reencoded += sandbox::e2b::EncodeEnvelope(env.flags, env.payload);

      if (env.flags & sandbox::e2b::kFlagEndStream) {
        absl::Status s = sandbox::e2b::ParseEndStream(env.payload);
        (void)s;
      } else {
        auto ev = sandbox::e2b::ParseProcessEvent(env.payload);
        if (!ev.ok()) {
          FUZZ_CHECK(ev.status().code() == absl::StatusCode::kUnavailable);
          FUZZ_CHECK(absl::StartsWith(ev.status().message(), "e2b: "));
        } else if (ev->kind == sandbox::e2b::ProcessEvent::kStdout ||
                   ev->kind == sandbox::e2b::ProcessEvent::kStderr) {
          // The data decoded from base64 re-encodes to base64 that decodes
          // to the same bytes.
          std::string again;
          FUZZ_CHECK(absl::Base64Unescape(absl::Base64Escape(ev->data), &again));
          FUZZ_CHECK(again == ev->data);
        }
      }
    }
  }
  // What was consumed is a prefix of the input, byte for byte.
  FUZZ_CHECK(bytes.substr(0, reencoded.size()) == reencoded);
  if (!failed) {
    // Everything not consumed is an incomplete frame still buffered.
    const size_t rest = bytes.size() - reencoded.size();
    FUZZ_CHECK(reader.empty() == (rest == 0));
  }
  return 0;
}
