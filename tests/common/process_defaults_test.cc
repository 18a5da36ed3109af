#include "common/process_defaults.h"

#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/resource.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace sandbox {
namespace {

TEST(ServingArenaMax, BoundsArenasUnlessTheEnvironmentChose) {
  EXPECT_EQ(ServingArenaMax(nullptr, nullptr), kServingArenaMax);
  EXPECT_EQ(ServingArenaMax("", nullptr), kServingArenaMax);
  EXPECT_EQ(ServingArenaMax(nullptr, "glibc.malloc.tcache_count=0"), kServingArenaMax);
  EXPECT_EQ(ServingArenaMax("8", nullptr), 0);
  EXPECT_EQ(ServingArenaMax(nullptr, "glibc.malloc.arena_max=4"), 0);
  EXPECT_EQ(ServingArenaMax(nullptr, "glibc.malloc.tcache_count=0:glibc.malloc.arena_max=1"), 0);
}

TEST(OpenFilesTarget, TheHardLimitUpToTheKernelDefaultNeverLower) {
  EXPECT_EQ(OpenFilesTarget(1024, 524288), 524288u);
  EXPECT_EQ(OpenFilesTarget(1024, 1024), 1024u);
  EXPECT_EQ(OpenFilesTarget(1024, RLIM_INFINITY), kMaxOpenFiles);
  EXPECT_EQ(OpenFilesTarget(1024, kMaxOpenFiles * 4), kMaxOpenFiles);
  EXPECT_EQ(OpenFilesTarget(kMaxOpenFiles * 2, kMaxOpenFiles * 4), kMaxOpenFiles * 2);
}

// Runs in a child process (the defaults are process-wide; the rest of this
// binary keeps absl's deadlock detection).
[[noreturn]] void ApplyThenLockBothOrders() {
  // Started as most hosts start a process: a soft limit of 1024 under a
  // higher hard one (where this machine's hard limit allows).
  struct rlimit before {};
  if (getrlimit(RLIMIT_NOFILE, &before) != 0) std::_Exit(3);
  const bool raisable = before.rlim_max > 1024;
  if (raisable) {
    before.rlim_cur = 1024;
    if (setrlimit(RLIMIT_NOFILE, &before) != 0) std::_Exit(3);
  }
  const ServingDefaults d = ApplyServingDefaults();
  if (!d.deadlock_detection_off) std::_Exit(1);
  struct rlimit after {};
  if (getrlimit(RLIMIT_NOFILE, &after) != 0 || d.open_files != after.rlim_cur ||
      (raisable &&
       (d.open_files_before != 1024 || after.rlim_cur != OpenFilesTarget(1024, before.rlim_max)))) {
    std::_Exit(4);
  }
#if !defined(SANDBOX_BROKER_ASAN) && !defined(SANDBOX_BROKER_TSAN)
  // (Under a sanitizer its own allocator replaces glibc's malloc: mallopt
  // does nothing there and arena_max stays 0.)
  if (getenv("MALLOC_ARENA_MAX") == nullptr && getenv("GLIBC_TUNABLES") == nullptr &&
      d.arena_max != kServingArenaMax) {
    std::_Exit(2);
  }
#endif
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

TEST(ApplyServingDefaults, RaisesOpenFilesKeepsNoLockGraphAndBoundsArenas) {
#if defined(SANDBOX_BROKER_TSAN)
  // TSan's own deadlock detector (it sees absl::Mutex through
  // tests/sanitizers/tsan_absl_shim.cc) would report the deliberate
  // inversion, and its allocator replaces malloc: nothing left to check.
  GTEST_SKIP() << "not meaningful under ThreadSanitizer";
#endif
  EXPECT_EXIT(ApplyThenLockBothOrders(), ::testing::ExitedWithCode(0), "");
}

// Free memory scattered between live blocks stays in glibc's heap until
// trimmed: ReleaseFreeHeap hands it back (the daemon calls it once a minute).
TEST(ReleaseFreeHeap, ReturnsFreeMemoryBetweenLiveBlocks) {
#if defined(SANDBOX_BROKER_ASAN) || defined(SANDBOX_BROKER_TSAN) || !defined(__GLIBC__)
  GTEST_SKIP() << "a sanitizer's allocator replaces glibc's malloc";
#else
  // 32 MiB in 16 KiB blocks (below the mmap threshold: in the heap), then
  // every block but each 64th freed: the free space is not at the top, so
  // free() alone returns none of it.
  std::vector<char*> blocks;
  for (int i = 0; i < 2048; ++i) {
    char* b = static_cast<char*>(malloc(16 << 10));
    memset(b, 1, 16 << 10);  // resident
    blocks.push_back(b);
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (i % 64 != 0) free(blocks[i]);
  }
  const size_t before = mallinfo2().keepcost + mallinfo2().fordblks;
  ASSERT_GT(before, size_t{24} << 20);
  auto resident = [] {
    long pages = 0, rss = 0;
    FILE* f = fopen("/proc/self/statm", "r");
    if (f == nullptr || fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = -1;
    if (f != nullptr) fclose(f);
    return static_cast<int64_t>(rss) * 4096;
  };
  const int64_t rss_before = resident();
  ReleaseFreeHeap();
  const int64_t rss_after = resident();
  EXPECT_GT(rss_before - rss_after, int64_t{16} << 20) << rss_before << " -> " << rss_after;
  for (size_t i = 0; i < blocks.size(); i += 64) free(blocks[i]);
#endif
}

}  // namespace
}  // namespace sandbox
