#pragma once

// Small helpers shared by the remote providers (E2B, Daytona). No I/O.

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "adapters/api/provider.h"

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

// A listed remote sandbox, from its tags (E2B metadata, Daytona labels) and
// its RFC 3339 creation time ("" = unknown).
inline OwnedSandbox OwnedFromTags(const std::string& sandbox_id,
                                  const std::map<std::string, std::string>& tags,
                                  const std::string& created_rfc3339) {
  auto tag = [&tags](const char* k) {
    auto it = tags.find(k);
    return it == tags.end() ? std::string() : it->second;
  };
  OwnedSandbox o;
  o.sandbox_id = sandbox_id;
  o.attempt_id = tag(kAttemptTag);
  o.tenant = tag("sandbox-broker.tenant");
  o.session_id = tag("sandbox-broker.session-id");
  absl::Time t;
  std::string err;
  if (!created_rfc3339.empty() && absl::ParseTime(absl::RFC3339_full, created_rfc3339, &t, &err)) {
    o.created_at = t;
  }
  return o;
}

}  // namespace sandbox
