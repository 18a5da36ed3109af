#pragma once

// Small helpers shared by the remote providers (E2B, Daytona). No I/O.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace sandbox {

// `s` single-quoted for bash: any bytes but NUL survive exactly.
inline std::string ShellQuote(absl::string_view s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out.push_back(c);
    }
  }
  out += "'";
  return out;
}

// argv as one bash command line.
inline std::string ShellJoin(const std::vector<std::string>& argv) {
  std::vector<std::string> q;
  for (const auto& a : argv) q.push_back(ShellQuote(a));
  return absl::StrJoin(q, " ");
}

// A path a remote sandbox can be asked about: not empty, no NUL.
inline absl::Status CheckRemotePath(absl::string_view path) {
  if (path.empty()) return absl::InvalidArgumentError("path is empty");
  if (path.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError("path contains a NUL byte");
  }
  return absl::OkStatus();
}

}  // namespace sandbox
