#include "common/text.h"

#include <sys/random.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "absl/strings/escaping.h"

namespace sandbox {
namespace {

// Length of the well-formed UTF-8 sequence at in[i], or 0 if it is not one.
size_t ValidSequenceLength(absl::string_view in, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(in[k]); };
  const uint8_t c = b(i);
  if (c < 0x80) return 1;
  size_t n;
  uint8_t lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > in.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  }
  return n;
}

}  // namespace

bool IsValidUtf8(absl::string_view in) {
  for (size_t i = 0; i < in.size();) {
    // Eight ASCII bytes at a time (most program output is ASCII).
    if (i + 8 <= in.size()) {
      uint64_t word;
      memcpy(&word, in.data() + i, 8);
      if ((word & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    size_t n = ValidSequenceLength(in, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string RepairUtf8(absl::string_view in) {
  if (IsValidUtf8(in)) return std::string(in);
  std::string out;
  out.reserve(in.size() + 16);
  for (size_t i = 0; i < in.size();) {
    size_t n = ValidSequenceLength(in, i);
    if (n == 0) {
      out.append("\xEF\xBF\xBD");
      ++i;
    } else {
      out.append(in.data() + i, n);
      i += n;
    }
  }
  return out;
}

std::string QuoteForError(absl::string_view in, size_t max_bytes) {
  std::string out = RepairUtf8(in.substr(0, max_bytes + 4));
  if (out.size() <= max_bytes && in.size() <= max_bytes) return out;
  size_t cut = std::min(out.size(), max_bytes);
  while (cut > 0 && (static_cast<uint8_t>(out[cut]) & 0xC0) == 0x80) --cut;  // continuation
  out.resize(cut);
  out.append("...");
  return out;
}

std::string RandomHex(int bytes) {
  std::string buf(static_cast<size_t>(bytes), '\0');
  size_t got = 0;
  while (got < buf.size()) {
    ssize_t r = getrandom(buf.data() + got, buf.size() - got, 0);
    if (r < 0) continue;  // EINTR; getrandom never fails otherwise here
    got += static_cast<size_t>(r);
  }
  return absl::BytesToHexString(buf);
}

}  // namespace sandbox
