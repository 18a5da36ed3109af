#include "common/process_defaults.h"

#include "absl/synchronization/mutex.h"

namespace sandbox {

ServingDefaults ApplyServingDefaults() {
  ServingDefaults d;
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  d.deadlock_detection_off = true;
  return d;
}

}  // namespace sandbox
