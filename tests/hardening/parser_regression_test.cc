// Regressions for what fuzzing and the hostile-input tests found in the
// parsers (docs/hardening.md). Crashing inputs found by libFuzzer live in
// fuzz/regressions/<target>/ and are replayed by the fuzz_replay_* ctests.

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "adapters/daytona/daytona_wire.h"
#include "adapters/e2b/e2b_wire.h"
#include "common/base64.h"
#include "common/text.h"

namespace sandbox {
namespace {

TEST(HardeningRegression, QuoteForErrorIsBoundedValidUtf8CutAtACharacter) {
  EXPECT_EQ(QuoteForError("short"), "short");
  EXPECT_EQ(QuoteForError(std::string(200, 'a')), std::string(200, 'a'));
  EXPECT_EQ(QuoteForError(std::string(201, 'a')), std::string(200, 'a') + "...");
  // A two-byte character straddling the limit is dropped whole.
  const std::string s = std::string(199, 'a') + "\xC3\xA9" + "tail";
  EXPECT_EQ(QuoteForError(s), std::string(199, 'a') + "...");
  EXPECT_EQ(QuoteForError("a\xFF"), "a\xEF\xBF\xBD");
  EXPECT_TRUE(IsValidUtf8(QuoteForError(std::string(5000, '\xFF'))));
  EXPECT_LE(QuoteForError(std::string(5000, '\xFF')).size(), 203u);
}

// Before: HttpError dumped a JSON body without a message back to text,
// recursing once per nesting level (a deep reply overflowed the stack), and
// quoted messages of any size (a megabyte message became a status message no
// gRPC client accepts).
TEST(HardeningRegression, DaytonaErrorBodiesAreBoundedAndNeverRecurse) {
  const std::string deep = "{\"a\":" + std::string(300000, '[') + std::string(300000, ']') + "}";
  absl::Status s = daytona::HttpError("execute", 500, deep);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_LE(s.message().size(), 300u);
  EXPECT_TRUE(absl::StartsWith(s.message(), "daytona: execute: 500 {\"a\":[[["));
  const std::string big = "{\"message\":\"" + std::string(1 << 20, 'm') + "\"}";
  EXPECT_LE(daytona::HttpError("execute", 400, big).message().size(), 300u);
  EXPECT_TRUE(IsValidUtf8(daytona::HttpError("x", 502, "\xFF\xFE<html>").message()));
}

TEST(HardeningRegression, E2BErrorBodiesAndStreamErrorsAreBounded) {
  const std::string big = "{\"message\":\"" + std::string(1 << 20, 'm') + "\"}";
  EXPECT_LE(e2b::HttpError("create sandbox", 500, big).message().size(), 300u);
  EXPECT_TRUE(IsValidUtf8(e2b::HttpError("x", 502, std::string(1000, '\xC0')).message()));
  const std::string end = "{\"error\":{\"code\":\"" + std::string(100000, 'c') +
                          "\",\"message\":\"" + std::string(100000, 'm') + "\"}}";
  absl::Status s = e2b::ParseEndStream(end);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnknown);
  EXPECT_LE(s.message().size(), 300u);
  // Deep nesting in a process event is parsed iteratively: no crash.
  const std::string deep =
      "{\"event\":" + std::string(300000, '[') + std::string(300000, ']') + "}";
  EXPECT_TRUE(e2b::ParseProcessEvent(deep).ok());
}

TEST(HardeningRegression, StrictBase64RoundTripsAndRefusesTheRest) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  for (size_t n = 0; n <= all.size(); n += 37) {
    auto d = DecodeBase64Strict(absl::Base64Escape(all.substr(0, n)));
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(*d, all.substr(0, n));
  }
  for (const char* bad : {"A===", "====", "aGk", "aG k=", "aGk=aGk=", "-_-_", "AA=A"}) {
    EXPECT_EQ(DecodeBase64Strict(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace sandbox
