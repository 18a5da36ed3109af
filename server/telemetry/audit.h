#pragma once

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/request_id.h"

namespace sandbox {

// One audit record. Only identifiers and the broker's own words go here:
// never code, commands, output, file contents, env values or tokens.
struct AuditEvent {
  // session.created, session.adopted, session.closed, policy.refused,
  // admin.<Method>, config.reload
  std::string event;
  std::string tenant;
  std::string session_id;
  std::string provider;
  std::string sandbox_id;
  std::string request_id;  // empty: the current call's (RequestIdScope)
  // Event-specific identifiers and broker-made text (close reason, refused
  // rule and message, admin name and outcome, reload result).
  std::map<std::string, std::string> fields;
};

// The audit log: one JSON object per line with "audit": true, "time"
// (RFC 3339, UTC), "event" and the fields above; to a file (appended,
// opened once) or to stderr.
//
// Thread-safe.
class AuditLog {
 public:
  // `path` empty = stderr.
  static absl::StatusOr<std::unique_ptr<AuditLog>> Open(const std::string& path, Clock* clock);
  // For tests: lines go to `sink`.
  AuditLog(std::function<void(absl::string_view)> sink, Clock* clock);
  ~AuditLog();

  void Record(const AuditEvent& e);

 private:
  AuditLog(FILE* f, bool owned, Clock* clock);
  Clock* const clock_;
  absl::Mutex mu_;
  FILE* file_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool owned_ = false;
  std::function<void(absl::string_view)> sink_;
};


}  // namespace sandbox
