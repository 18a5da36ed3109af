#include "common/process_defaults.h"

#include <malloc.h>
#include <sys/resource.h>

#include <cstdlib>
#include <cstring>

#include "absl/synchronization/mutex.h"

namespace sandbox {

int ServingArenaMax(const char* malloc_arena_max, const char* glibc_tunables) {
  if (malloc_arena_max != nullptr && malloc_arena_max[0] != '\0') return 0;
  if (glibc_tunables != nullptr && strstr(glibc_tunables, "glibc.malloc.arena_max") != nullptr) {
    return 0;
  }
  return kServingArenaMax;
}

uint64_t OpenFilesTarget(uint64_t soft, uint64_t hard) {
  const uint64_t target = hard < kMaxOpenFiles ? hard : kMaxOpenFiles;
  return target > soft ? target : soft;
}

ServingDefaults ApplyServingDefaults() {
  ServingDefaults d;
  struct rlimit rl {};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    d.open_files_before = d.open_files = rl.rlim_cur;
    const uint64_t target = OpenFilesTarget(rl.rlim_cur, rl.rlim_max);
    if (target != rl.rlim_cur) {
      rl.rlim_cur = target;
      if (setrlimit(RLIMIT_NOFILE, &rl) == 0) d.open_files = target;
    }
  }
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  d.deadlock_detection_off = true;
  const int arena_max = ServingArenaMax(getenv("MALLOC_ARENA_MAX"), getenv("GLIBC_TUNABLES"));
#ifdef M_ARENA_MAX
  if (arena_max > 0 && mallopt(M_ARENA_MAX, arena_max) == 1) d.arena_max = arena_max;
#endif
  return d;
}

void ReleaseFreeHeap() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

}  // namespace sandbox
