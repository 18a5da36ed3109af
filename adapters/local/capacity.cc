#include "adapters/local/capacity.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace sandbox {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

int64_t ReadInt(const std::string& path) {
  std::ifstream in(path);
  int64_t v = 0;
  return in >> v ? v : 0;
}

// MemTotal in bytes, or 0.
int64_t MemTotal(const std::string& proc) {
  std::ifstream in(proc + "/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (in >> key >> kib >> unit) {
    if (key == "MemTotal:") return kib * 1024;
  }
  return 0;
}

// `total` less max(1 GiB, 10%), or 0 when nothing is left (no limit).
int64_t LessReserve(int64_t total) {
  const int64_t left = total - std::max(kGiB, total / 10);
  return left > 0 ? left : 0;
}

// The most reservations may reach: capacity x ratio (0 = no limit).
int64_t Limit(int64_t capacity, double ratio) {
  if (capacity <= 0) return 0;
  const double v = static_cast<double>(capacity) * std::max(1.0, ratio);
  return v >= 9.2e18 ? INT64_MAX : static_cast<int64_t>(v);
}

}  // namespace

LocalCapacity HostCapacity(const std::string& proc, const std::string& workspace_root) {
  LocalCapacity c;
  c.memory_bytes = LessReserve(MemTotal(proc));
  const int64_t pid_max = ReadInt(proc + "/sys/kernel/pid_max");
  const int64_t threads_max = ReadInt(proc + "/sys/kernel/threads-max");
  const int64_t threads = pid_max > 0 && threads_max > 0 ? std::min(pid_max, threads_max)
                                                         : std::max(pid_max, threads_max);
  c.pids = threads - threads / 10;
  struct statvfs fs;
  if (statvfs(workspace_root.c_str(), &fs) == 0) {
    c.disk_bytes =
        LessReserve(static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize));
  }
  return c;
}

CapacityLedger::CapacityLedger(LocalCapacity capacity) : capacity_(capacity) {}

CapacityLedger::Hold& CapacityLedger::Hold::operator=(Hold&& o) noexcept {
  if (this != &o) {
    Release();
    ledger_ = o.ledger_;
    ask_ = o.ask_;
    o.ledger_ = nullptr;
  }
  return *this;
}

void CapacityLedger::Hold::Release() {
  if (ledger_ == nullptr) return;
  absl::MutexLock l(&ledger_->mu_);
  ledger_->AddLocked(ask_, -1);
  ledger_ = nullptr;
}

absl::StatusOr<CapacityLedger::Hold> CapacityLedger::Reserve(const CapacityAsk& ask) {
  absl::MutexLock l(&mu_);
  auto over = [&](const char* key, int64_t used, int64_t asked, int64_t limit,
                  const char* unit) -> absl::Status {
    if (limit <= 0 || asked <= limit - used) return absl::OkStatus();
    return absl::ResourceExhaustedError(
        absl::StrCat("local: providers.local.capacity.", key, " reached: ", used, unit,
                     " in use by ", count_, " sandboxes, ", asked, unit, " asked, ", limit, unit,
                     " in all (capacity x overcommit); close a session first"));
  };
  absl::Status s = over("sandboxes", count_, 1, capacity_.sandboxes, "");
  if (s.ok()) {
    s = over("memory_bytes", used_.memory_bytes, ask.memory_bytes,
             Limit(capacity_.memory_bytes, capacity_.memory_overcommit), " bytes");
  }
  if (s.ok()) {
    s = over("pids", used_.pids, ask.pids, Limit(capacity_.pids, capacity_.pids_overcommit), "");
  }
  if (s.ok()) {
    s = over("disk_bytes", used_.disk_bytes, ask.disk_bytes,
             Limit(capacity_.disk_bytes, capacity_.disk_overcommit), " bytes");
  }
  if (!s.ok()) return s;
  AddLocked(ask, +1);
  Hold h;
  h.ledger_ = this;
  h.ask_ = ask;
  return h;
}

CapacityLedger::Hold CapacityLedger::Force(const CapacityAsk& ask) {
  absl::MutexLock l(&mu_);
  AddLocked(ask, +1);
  Hold h;
  h.ledger_ = this;
  h.ask_ = ask;
  return h;
}

void CapacityLedger::AddLocked(const CapacityAsk& ask, int sign) {
  used_.memory_bytes += sign * ask.memory_bytes;
  used_.pids += sign * ask.pids;
  used_.disk_bytes += sign * ask.disk_bytes;
  count_ += sign;
  Publish();
}

void CapacityLedger::Publish() {
  if (!report_) return;
  report_("sandboxes", capacity_.sandboxes, count_);
  report_("memory_bytes", Limit(capacity_.memory_bytes, capacity_.memory_overcommit),
          used_.memory_bytes);
  report_("pids", Limit(capacity_.pids, capacity_.pids_overcommit), used_.pids);
  report_("disk_bytes", Limit(capacity_.disk_bytes, capacity_.disk_overcommit), used_.disk_bytes);
}

void CapacityLedger::SetReport(Report report) {
  absl::MutexLock l(&mu_);
  report_ = std::move(report);
  Publish();
}

CapacityAsk CapacityLedger::in_use() const {
  absl::MutexLock l(&mu_);
  return used_;
}

int64_t CapacityLedger::sandboxes() const {
  absl::MutexLock l(&mu_);
  return count_;
}

}  // namespace sandbox
