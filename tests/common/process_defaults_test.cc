#include "common/process_defaults.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "absl/synchronization/mutex.h"

namespace sandbox {
namespace {

// Runs in a child process (the defaults are process-wide; the rest of this
// binary keeps absl's deadlock detection).
[[noreturn]] void ApplyThenLockBothOrders() {
  const ServingDefaults d = ApplyServingDefaults();
  if (!d.deadlock_detection_off) std::_Exit(1);
  // Both orders: a cycle the detector, when on, aborts on (after adding both
  // edges to its graph).
  absl::Mutex a;
  absl::Mutex b;
  {
    absl::MutexLock la(&a);
    absl::MutexLock lb(&b);
  }
  {
    absl::MutexLock lb(&b);
    absl::MutexLock la(&a);
  }
  std::_Exit(0);
}

TEST(ApplyServingDefaults, KeepsNoLockGraph) {
  EXPECT_EXIT(ApplyThenLockBothOrders(), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace sandbox
