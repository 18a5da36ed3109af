// Base64 for file contents (common/base64.cc DecodeBase64Strict, used by
// WriteFile/CallTool with encoding=base64).
//
// Invariants: decode(encode(x)) == x for any bytes x; whatever the strict
// decoder accepts is well-formed (length a multiple of 4, only the standard
// alphabet, padding only at the end), decodes to the length the padding says,
// and re-encodes to text that decodes to the same bytes; anything else is
// INVALID_ARGUMENT.

#include <cstdint>
#include <string>

#include "absl/strings/escaping.h"
#include "common/base64.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view in(reinterpret_cast<const char*>(data), size);

  const std::string encoded = absl::Base64Escape(in);
  auto round = sandbox::DecodeBase64Strict(encoded);
  FUZZ_CHECK(round.ok());
  FUZZ_CHECK(*round == in);

  auto d = sandbox::DecodeBase64Strict(in);
  if (!d.ok()) {
    FUZZ_CHECK(d.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  FUZZ_CHECK(in.size() % 4 == 0);
  size_t pad = 0;
  while (pad < in.size() && in[in.size() - 1 - pad] == '=') ++pad;
  FUZZ_CHECK(pad <= 2);
  for (size_t i = 0; i + pad < in.size(); ++i) {
    const char c = in[i];
    FUZZ_CHECK((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
               c == '+' || c == '/');
  }
  FUZZ_CHECK(d->size() == in.size() / 4 * 3 - pad);
  auto again = sandbox::DecodeBase64Strict(absl::Base64Escape(*d));
  FUZZ_CHECK(again.ok() && *again == *d);
  return 0;
}
