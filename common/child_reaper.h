#pragma once

#include <sys/types.h>

#include <functional>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace sandbox {

// Reaps every child process this process is handed, without stealing the
// exit status of a child someone waits for by pid.
//
// A process that starts sandboxes (bubblewrap's monitor exits before its
// namespace init is reaped; code may double-fork) is handed orphans: as
// PID 1 in a container always, and outside one once it is a child subreaper
// (PR_SET_CHILD_SUBREAPER). Each becomes a zombie until its parent waits
// for it. A plain waitpid(-1) loop would also collect the children that
// RunProcess waits for by pid; so children are forked through ForkClaimed(),
// which records the pid before any scan can see it, and the reaper waits
// only for unclaimed children, each by its own pid.
//
// Process-wide; thread-safe.
class ChildReaper {
 public:
  // Makes this process a child subreaper and starts a thread that reaps
  // unclaimed children on SIGCHLD and at least every `backstop`. SIGCHLD
  // must be blocked in every thread (main blocks it before starting any):
  // the thread takes it with sigtimedwait. Idempotent.
  static absl::Status Start(absl::Duration backstop = absl::Seconds(1));

  // fork() with the child's pid claimed before any reap scan runs. In the
  // child, returns 0 (async-signal-safe code only, as after any fork).
  // The owner waits for the pid itself, then calls Release(pid).
  static pid_t ForkClaimed();
  static void Release(pid_t pid);

  // Reaps every unclaimed child that has exited; returns how many. Start's
  // thread calls it; tests call it directly.
  static int ReapOnce();

  // Reaped unclaimed children since the process started.
  static uint64_t reaped_total();
};

}  // namespace sandbox
