#pragma once

// Invariant checks for fuzz targets: a failed check prints what broke and
// aborts, which libFuzzer (and the corpus replay test) reports as a crash.

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"

#define FUZZ_CHECK(cond)                                                          \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                               \
    }                                                                             \
  } while (0)

namespace sandbox {
namespace fuzz {

// Multi-field inputs: fields are separated by a 0xFF byte (never valid
// UTF-8, so JSON fields cannot contain it by accident).
inline absl::string_view NextField(absl::string_view* in) {
  size_t i = in->find('\xff');
  absl::string_view f = in->substr(0, i);
  in->remove_prefix(i == absl::string_view::npos ? in->size() : i + 1);
  return f;
}

}  // namespace fuzz
}  // namespace sandbox
