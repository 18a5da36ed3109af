#pragma once

namespace sandbox {

// Process-wide settings for a long-running daemon, applied first thing in
// main() (before any thread starts). Tests and tools keep the defaults.
struct ServingDefaults {
  bool deadlock_detection_off = false;
};

// Turns off absl::Mutex deadlock detection. It is a debugging aid, and it is
// on in an absl built without NDEBUG (Debian's libabsl is): every lock taken
// while another is held, gRPC's included, then adds edges to a global lock
// graph held in memory that is never returned to the system (LowLevelAlloc),
// so the daemon's RSS grew for as long as it served.
ServingDefaults ApplyServingDefaults();

}  // namespace sandbox
