#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sandbox {

// The seccomp filter of every local sandbox process, as the classic BPF
// program bubblewrap's --seccomp reads (struct sock_filter array, native
// byte order). Built with libseccomp; denied calls fail with EPERM (clone3
// with ENOSYS so libc falls back to clone, whose flags are checked), nothing
// is killed. docs/providers/local.md lists what is denied and why.
absl::StatusOr<std::string> BuildSeccompBpf();

// The names of the system calls denied outright (for tests and docs).
std::vector<std::string> DeniedSyscalls();

}  // namespace sandbox
