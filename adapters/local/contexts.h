// Code contexts on the local provider (docs/api.md#code-contexts): the
// broker's side of the context supervisor (context_driver.py), which runs
// inside the session's container and keeps its IPython kernels.
//
// The broker talks to it on a unix socket in a directory of the container's
// /tmp, reached from the host through the sandbox's own descriptor for that
// /tmp: opened with O_NOFOLLOW at each step, and connected to only if it is a
// socket owned by the sandbox's uid, so sandboxed code can make the broker
// connect to nothing but its own sockets. Everything the supervisor answers
// is sandbox input: parsed with typed reads and size limits, never trusted.
#pragma once

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "adapters/api/provider.h"

namespace sandbox {

// context_driver.py, embedded at build time.
extern const char kContextDriverSource[];

// The supervisor's directory, inside the container.
inline constexpr char kContextDirName[] = ".sandbox-contexts";

// The one JSON line of a request for `op`.
std::string ContextRequest(const CodeOp& op);

// The supervisor's answer (JSON lines, the last one "done") folded into a
// result. Output past op.max_output_bytes is cut. A malformed answer is
// UNAVAILABLE; a refusal carries the code the supervisor named.
absl::StatusOr<CodeOpResult> ParseContextAnswer(const CodeOp& op, absl::string_view answer);

// Connects to `dir_name`/ctl.sock under `parent_fd` (see above). NOT_FOUND
// when no supervisor listens there yet.
absl::StatusOr<int> ConnectContextSupervisor(int parent_fd, const char* dir_name, uid_t uid);

// Sends `request` on `fd` and reads its answer, through the empty line that
// ends it: at most `max_bytes`, until `deadline`. The connection stays open
// for the next request (the caller closes it after an error).
// *answered: whether any byte of an answer came (a connection that ends
// before one may be retried: the supervisor died before it read the
// request, or while it ran, its contexts lost either way).
absl::StatusOr<std::string> ExchangeWithSupervisor(int fd, const std::string& request,
                                                   absl::Time deadline, size_t max_bytes,
                                                   bool* answered);

// Whether an idle connection is still open (the supervisor may have died or
// been killed by the sandbox's code since).
bool SupervisorConnectionOpen(int fd);

// How long a call may wait for the supervisor: the run's timeout plus the
// interrupt's grace and a kernel's start.
absl::Duration ContextCallBudget(const CodeOp& op);

}  // namespace sandbox
