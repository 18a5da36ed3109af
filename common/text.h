#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace sandbox {

// Returns `in` as valid UTF-8: every byte sequence that is not well-formed
// UTF-8 (including overlongs, surrogates and a sequence cut at the end)
// becomes U+FFFD. Valid input is returned unchanged.
std::string RepairUtf8(absl::string_view in);

// True when `in` is well-formed UTF-8.
bool IsValidUtf8(absl::string_view in);

// A provider's text quoted in an error message: valid UTF-8 (as RepairUtf8),
// cut to at most `max_bytes` bytes of it at a character boundary, with "..."
// appended when cut. Error bodies can be megabytes; gRPC clients refuse
// status messages beyond their metadata limit (8 KiB by default).
std::string QuoteForError(absl::string_view in, size_t max_bytes = 200);

// 32 hex characters from the kernel's random source; for ids that must never
// repeat or be guessed.
std::string RandomHex(int bytes = 16);

}  // namespace sandbox
