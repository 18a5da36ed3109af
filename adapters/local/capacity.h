#pragma once

// Host-wide admission for the local provider (providers.local.capacity;
// docs/providers/local.md#capacity). Each sandbox's limits are a
// reservation against what the host has: a create that would overcommit
// it is RESOURCE_EXHAUSTED naming the key, before anything is made. The
// parent cgroup's own limits (LocalProvider) hold the same line in the
// kernel, so a host is never asked for more than it has by sandboxes.

#include <cstdint>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace sandbox {

// What sandboxes together may reserve. 0 = no limit.
struct LocalCapacity {
  int64_t memory_bytes = 0;
  int64_t pids = 0;
  int64_t disk_bytes = 0;
  int64_t sandboxes = 0;
  // Reservations may reach capacity x ratio (>= 1), for operators who
  // choose to overcommit a resource.
  double memory_overcommit = 1.0;
  double pids_overcommit = 1.0;
  double disk_overcommit = 1.0;
};

// What one sandbox reserves: its limits.
struct CapacityAsk {
  int64_t memory_bytes = 0;
  int64_t pids = 0;
  int64_t disk_bytes = 0;
};

// The host's own, as defaults: physical memory (MemTotal in
// `proc`/meminfo) less max(1 GiB, 10%); the threads the kernel allows
// (min of kernel/pid_max and kernel/threads-max) less 10%; the free space
// of `workspace_root` less max(1 GiB, 10%). A value that cannot be read is
// 0 (no limit). `proc` is /proc (a seam for tests).
LocalCapacity HostCapacity(const std::string& proc, const std::string& workspace_root);

// Thread-safe.
class CapacityLedger {
 public:
  // Told every resource's capacity (with overcommit; 0 = none) and use
  // after each change, in order (under the ledger's lock: it must not
  // block or call back).
  using Report = std::function<void(const std::string& resource, int64_t capacity, int64_t in_use)>;

  explicit CapacityLedger(LocalCapacity capacity);

  // One sandbox's reservation, returned when it goes.
  class Hold {
   public:
    Hold() = default;
    Hold(Hold&& o) noexcept { *this = std::move(o); }
    Hold& operator=(Hold&& o) noexcept;
    ~Hold() { Release(); }
    void Release();

   private:
    friend class CapacityLedger;
    CapacityLedger* ledger_ = nullptr;
    CapacityAsk ask_;
  };

  // RESOURCE_EXHAUSTED naming providers.local.capacity.<key>, what is in
  // use and what was asked, when `ask` would pass the capacity.
  absl::StatusOr<Hold> Reserve(const CapacityAsk& ask);
  // Counted, never refused: a sandbox that exists already (attached after a
  // restart) uses the host whether or not it fits.
  Hold Force(const CapacityAsk& ask);

  void SetReport(Report report);
  const LocalCapacity& capacity() const { return capacity_; }
  CapacityAsk in_use() const;
  int64_t sandboxes() const;

 private:
  void AddLocked(const CapacityAsk& ask, int sign) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Publish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const LocalCapacity capacity_;
  mutable absl::Mutex mu_;
  CapacityAsk used_ ABSL_GUARDED_BY(mu_);
  int64_t count_ ABSL_GUARDED_BY(mu_) = 0;
  Report report_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sandbox
