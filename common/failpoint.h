#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sandbox {

// Failpoints: named places in the code where a crash test can stop the
// daemon, the way etcd's gofail and TiKV's fail-rs do. Off unless the
// environment variable SANDBOX_BROKER_FAILPOINTS names some, e.g.
//
//   SANDBOX_BROKER_FAILPOINTS="create.after_intent=sleep(30000);close.before_destroy=kill"
//
// Actions: sleep(MS) (the calling thread waits, up to 600000 ms) and kill
// (the process sends itself SIGKILL). A failpoint that is hit logs
// `failpoint.hit name=...` at warning before it acts, so a test can wait for
// that line and then kill the daemon for real inside the window it opened.
// Points (server/sessions/session_manager.cc):
//   create.after_intent   the creating row is written, the provider not called
//   create.before_ready   the provider created the sandbox, the ready row not written
//   close.before_destroy  the closing row is written, the provider not called
//   sweep.after_destroy   the orphan sweep destroyed one orphan, not the rest
//
// Thread-safe; the variable is read once, at the first hit or at
// FailpointsFromEnvironment().
void Failpoint(absl::string_view name);

// Parses SANDBOX_BROKER_FAILPOINTS (main calls it at startup, so a typo
// stops the daemon rather than silently arming nothing): the error names
// the bad entry. Returns a description of the armed points ("" if none).
absl::StatusOr<std::string> FailpointsFromEnvironment();

// For tests: parses `spec` (the variable's syntax) and arms it, replacing
// whatever was armed; "" disarms all.
absl::Status SetFailpoints(absl::string_view spec);

}  // namespace sandbox
