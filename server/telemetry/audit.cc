#include "server/telemetry/audit.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace sandbox {
absl::StatusOr<std::unique_ptr<AuditLog>> AuditLog::Open(const std::string& path, Clock* clock) {
  if (path.empty()) return std::unique_ptr<AuditLog>(new AuditLog(stderr, false, clock));
  // Owner-only: it names tenants, sessions and admins. A file left with a
  // looser mode (created by hand, or by an older build) is reset at open.
  const int fd = open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  FILE* f = fd >= 0 && fchmod(fd, 0600) == 0 ? fdopen(fd, "a") : nullptr;
  if (f == nullptr) {
    if (fd >= 0) close(fd);
    return absl::InvalidArgumentError(absl::StrCat("audit_log.path: cannot open ", path));
  }
  return std::unique_ptr<AuditLog>(new AuditLog(f, true, clock));
}

AuditLog::AuditLog(FILE* f, bool owned, Clock* clock) : clock_(clock), file_(f), owned_(owned) {}
AuditLog::AuditLog(std::function<void(absl::string_view)> sink, Clock* clock)
    : clock_(clock), sink_(std::move(sink)) {}

AuditLog::~AuditLog() {
  absl::MutexLock l(&mu_);
  if (owned_ && file_ != nullptr) fclose(file_);
}

void AuditLog::Record(const AuditEvent& e) {
  nlohmann::json j;
  j["audit"] = true;
  j["time"] = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", clock_->Now(), absl::UTCTimeZone());
  j["event"] = e.event;
  auto put = [&j](const char* k, const std::string& v) { j[k] = v.empty() ? "-" : v; };
  put("tenant", e.tenant);
  put("session_id", e.session_id);
  put("provider", e.provider);
  put("sandbox_id", e.sandbox_id);
  put("request_id", e.request_id.empty() ? CurrentRequestId() : e.request_id);
  for (const auto& [k, v] : e.fields) j[k] = v;
  // Invalid UTF-8 (never expected: fields are identifiers) is replaced.
  const std::string line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  absl::MutexLock l(&mu_);
  if (sink_) {
    sink_(line);
    return;
  }
  fwrite(line.data(), 1, line.size(), file_);
  fflush(file_);
}

}  // namespace sandbox
