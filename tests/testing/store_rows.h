#pragma once

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/store/session_store.h"

namespace sandbox {

// `n` ready session rows (s0, s1, ...) on `provider`, with sandbox ids made
// by `sandbox_id(i)`: what a broker with n live sessions leaves in its store.
template <typename IdFn>
std::vector<SessionRecord> ReadyRows(int n, const std::string& tenant, const std::string& provider,
                                     absl::Time at, IdFn sandbox_id) {
  std::vector<SessionRecord> rows;
  rows.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    SessionRecord& r = rows.emplace_back();
    r.tenant = tenant;
    r.session_id = absl::StrCat("s", i);
    r.provider = provider;
    r.attempt_id = absl::StrCat("a", i);
    r.sandbox_id = sandbox_id(i);
    r.state = StoredState::kReady;
    r.created_at = r.last_active_at = at;
  }
  return rows;
}

}  // namespace sandbox
