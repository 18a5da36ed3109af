#pragma once

#include <chrono>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace sandbox {

// The one source of time. Wall time is for timestamps shown to people;
// monotonic time is for intervals, deadlines and expiry. Nothing else in the
// broker calls absl::Now() or steady_clock directly, so tests can drive time.
//
// Thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  // Wall-clock time (may jump).
  virtual absl::Time Now() = 0;
  // Monotonic time: never goes backwards; its epoch is arbitrary.
  virtual absl::Time Monotonic() = 0;

  // The process-wide real clock.
  static Clock* Real();
};

class RealClock final : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }
  absl::Time Monotonic() override {
    return absl::UnixEpoch() +
           absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
  }
};

inline Clock* Clock::Real() {
  static RealClock* clock = new RealClock();
  return clock;
}

// A clock that moves only when told to. Both wall and monotonic time advance
// together.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1800000000))
      : wall_(start), mono_(absl::UnixEpoch() + absl::Hours(1)) {}
  absl::Time Now() override {
    absl::MutexLock l(&mu_);
    return wall_;
  }
  absl::Time Monotonic() override {
    absl::MutexLock l(&mu_);
    return mono_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock l(&mu_);
    wall_ += d;
    mono_ += d;
  }

 private:
  absl::Mutex mu_;
  absl::Time wall_ ABSL_GUARDED_BY(mu_);
  absl::Time mono_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sandbox
