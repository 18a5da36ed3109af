#include "common/base64.h"

#include <cctype>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace sandbox {

absl::StatusOr<std::string> DecodeBase64Strict(absl::string_view in) {
  if (in.size() % 4 != 0) {
    return absl::InvalidArgumentError("invalid base64: length is not a multiple of 4");
  }
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    const bool alpha = isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '/';
    const bool pad = c == '=' && i + 2 >= in.size() && (i + 1 == in.size() || in[i + 1] == '=');
    if (!alpha && !pad) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid base64: unexpected character at offset ", i));
    }
  }
  std::string out;
  if (!absl::Base64Unescape(in, &out)) {
    return absl::InvalidArgumentError("invalid base64");
  }
  return out;
}

}  // namespace sandbox
