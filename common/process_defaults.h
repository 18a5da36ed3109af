#pragma once

#include <cstdint>

namespace sandbox {

// Process-wide settings for a long-running daemon, applied first thing in
// main() (before any thread starts). Tests and tools keep the defaults.
struct ServingDefaults {
  bool deadlock_detection_off = false;
  int arena_max = 0;  // the malloc arena bound set here; 0 = left to the environment
  // The soft RLIMIT_NOFILE before and after (equal when it was not raised).
  uint64_t open_files_before = 0;
  uint64_t open_files = 0;
};

// The soft open-files limit the daemon gives itself: its hard limit (at
// most kMaxOpenFiles, the kernel's default fs.nr_open), never lower than the
// soft limit it started with. Every gRPC connection, MCP connection, provider
// HTTP transfer and sandbox pipe holds a descriptor; the soft limit most
// hosts start a process with (1024) would refuse the broker's connections
// well before a thousand calls in flight. The daemon uses epoll and
// close_range only (nothing scales with the limit itself), and each sandbox
// sets its own limit (limits.open_files).
inline constexpr uint64_t kMaxOpenFiles = uint64_t{1} << 20;
uint64_t OpenFilesTarget(uint64_t soft, uint64_t hard);

// glibc malloc arenas the daemon allows itself (glibc's default is up to 8
// per core). gRPC's threads each settle on an arena; memory freed into one
// arena serves only the threads on it, so with many arenas the heap they
// hold (not what is in use, which stays flat) crept up for as long as the
// broker served. Two arenas keep that free memory shared.
inline constexpr int kServingArenaMax = 2;

// Raises the soft open-files limit (OpenFilesTarget), turns off absl::Mutex
// deadlock detection and bounds malloc arenas to
// kServingArenaMax unless the environment chose a bound (MALLOC_ARENA_MAX,
// or glibc.malloc.arena_max in GLIBC_TUNABLES). The deadlock detector is a
// debugging aid, and it is on in an absl built without NDEBUG (Debian's
// libabsl is): every lock taken while another is held, gRPC's included, then
// adds edges to a global lock graph held in memory that is never returned to
// the system (LowLevelAlloc), so the daemon's RSS grew for as long as it
// served. (In an ASan or TSan build the sanitizer's allocator replaces
// glibc's malloc; mallopt does nothing there and arena_max stays 0.)
ServingDefaults ApplyServingDefaults();

// Gives the free memory malloc holds inside its heaps back to the system
// (glibc's malloc_trim(0): free pages anywhere in an arena, not only above its
// top). Memory freed between live blocks otherwise stays resident, and the
// main arena's share of it ratchets up in steps (a burst of frees, then the
// same load reallocated more scattered): the echo soak's residual RSS slope,
// with the heap in use flat. The daemon calls it every kReleaseFreeHeapSeconds
// (main.cc); a call took 1.0 ms under the 8-worker echo soak.
// Does nothing without glibc.
inline constexpr int kReleaseFreeHeapSeconds = 60;
void ReleaseFreeHeap();

// The arena bound ApplyServingDefaults sets given those two environment
// variables (null = unset): 0 when the environment chose.
int ServingArenaMax(const char* malloc_arena_max, const char* glibc_tunables);

}  // namespace sandbox
