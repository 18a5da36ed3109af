#pragma once

// Where sandbox-init comes from, and how every sandbox's uid reaches it.

#include <string>

#include "absl/status/statusor.h"

namespace sandbox {

// The first directory on the way to `path` (itself included) that a
// process of another uid cannot search; empty when there is none.
std::string FirstDirClosedToOthers(const std::string& path);

// sandbox-init is bound into each container by path, as the sandbox's own
// uid: a copy in workspace_root (which that uid must reach anyway) rather
// than the build or install directory, which may sit under a directory
// closed to it (a clone in /root, mode 0700). Replaced by rename when it
// differs, so a running container's copy is never rewritten in place.
// Returns the copy's path.
absl::StatusOr<std::string> CopyInitIntoWorkspaceRoot(const std::string& init_path,
                                                      const std::string& root);

// sandbox-init next to this executable (a build tree), else where
// `cmake --install` puts it: <prefix>/libexec/sandbox-broker/ beside
// <prefix>/bin/.
std::string DefaultInitPath();

}  // namespace sandbox
