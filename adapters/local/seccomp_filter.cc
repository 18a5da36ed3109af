#include "adapters/local/seccomp_filter.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <seccomp.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"

namespace sandbox {
namespace {

// Denied with EPERM whatever their arguments: kernel attack surface no
// sandboxed program needs (io_uring, keyrings, bpf, perf), host-wide state
// (time, swap, reboot, modules, kexec, acct, quotas, the kernel log) and
// ways to rearrange the filesystem or namespaces under the sandbox.
const char* const kDenied[] = {"io_uring_setup",
                               "io_uring_enter",
                               "io_uring_register",
                               "keyctl",
                               "add_key",
                               "request_key",
                               "bpf",
                               "perf_event_open",
                               "userfaultfd",
                               "kexec_load",
                               "kexec_file_load",
                               "init_module",
                               "finit_module",
                               "delete_module",
                               "reboot",
                               "swapon",
                               "swapoff",
                               "acct",
                               "quotactl",
                               "quotactl_fd",
                               "syslog",
                               "uselib",
                               "open_by_handle_at",
                               "name_to_handle_at",
                               "lookup_dcookie",
                               "nfsservctl",
                               "mount",
                               "umount2",
                               "fsopen",
                               "fsconfig",
                               "fsmount",
                               "fspick",
                               "move_mount",
                               "open_tree",
                               "mount_setattr",
                               "pivot_root",
                               "chroot",
                               "setns",
                               "clock_settime",
                               "clock_adjtime",
                               "settimeofday",
                               "adjtimex",
                               "vm86",
                               "vm86old",
                               "iopl",
                               "ioperm"};

constexpr uint64_t kNamespaceFlags[] = {CLONE_NEWNS,     CLONE_NEWUSER, CLONE_NEWPID,
                                        CLONE_NEWNET,    CLONE_NEWIPC,  CLONE_NEWUTS,
                                        CLONE_NEWCGROUP, 0x00000080 /* CLONE_NEWTIME */};

}  // namespace

std::vector<std::string> DeniedSyscalls() {
  return std::vector<std::string>(std::begin(kDenied), std::end(kDenied));
}

absl::StatusOr<std::string> BuildSeccompBpf() {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (!ctx) return absl::InternalError("seccomp_init failed");
  absl::Cleanup release = [ctx] { seccomp_release(ctx); };
  const uint32_t eperm = SCMP_ACT_ERRNO(EPERM);
  int rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_ERRNO(ENOSYS));
  auto fail = [&](const std::string& what) {
    return absl::InternalError(absl::StrCat("seccomp: ", what, ": ", strerror(-rc)));
  };
  if (rc < 0) return fail("bad-arch action");
  for (const char* name : kDenied) {
    int nr = seccomp_syscall_resolve_name(name);
    if (nr == __NR_SCMP_ERROR) continue;  // not on this architecture
    rc = seccomp_rule_add(ctx, eperm, nr, 0);
    if (rc < 0 && rc != -EDOM) return fail(name);
  }
  // clone3 passes its flags in memory a filter cannot read: ENOSYS makes
  // glibc fall back to clone, whose flags are checked below.
  if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0)) < 0) {
    return fail("clone3");
  }
  for (uint64_t flag : kNamespaceFlags) {
    if ((rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(unshare), 1,
                               SCMP_A0(SCMP_CMP_MASKED_EQ, flag, flag))) < 0) {
      return fail("unshare");
    }
    // x86_64 and most architectures: clone(flags, ...).
    if ((rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(clone), 1,
                               SCMP_A0(SCMP_CMP_MASKED_EQ, flag, flag))) < 0) {
      return fail("clone");
    }
  }
  // personality: only the default and the harmless flags Docker allows
  // (query, UNAME26, ADDR_NO_RANDOMIZE); others (READ_IMPLIES_EXEC, ...)
  // weaken the process's own hardening.
  {
    // The gaps between the allowed values 0x0, 0x8, 0x20000, 0x20008 and
    // 0xffffffff; the kernel reads the persona as 32 bits.
    const struct {
      uint64_t lo, hi;
    } gaps[] = {{0x1, 0x7}, {0x9, 0x1ffff}, {0x20001, 0x20007}, {0x20009, 0xfffffffe}};
    for (const auto& g : gaps) {
      // Masked equality over the high bits covers aligned blocks only, so
      // walk the gap in aligned power-of-two blocks.
      uint64_t v = g.lo;
      while (v <= g.hi) {
        uint64_t size = 1;
        while ((v & (size * 2 - 1)) == 0 && v + size * 2 - 1 <= g.hi) size *= 2;
        const uint64_t mask = 0xffffffffULL & ~(size - 1);
        if ((rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(personality), 1,
                                   SCMP_A0(SCMP_CMP_MASKED_EQ, mask, v))) < 0) {
          return fail("personality");
        }
        v += size;
      }
    }
  }
  // Socket families other than unix, inet, inet6 and netlink (vsock, packet,
  // bluetooth, alg, ... : rarely audited kernel code).
  for (int af = 0; af < AF_MAX; ++af) {
    if (af == AF_UNIX || af == AF_INET || af == AF_INET6 || af == AF_NETLINK) continue;
    if ((rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(socket), 1,
                               SCMP_A0(SCMP_CMP_EQ, static_cast<uint64_t>(af)))) < 0) {
      return fail("socket");
    }
  }
  if ((rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(socket), 1,
                             SCMP_A0(SCMP_CMP_GE, static_cast<uint64_t>(AF_MAX)))) < 0) {
    return fail("socket");
  }
  // TIOCSTI pushes input into a terminal another process reads; TIOCLINUX
  // can do the same on a virtual console. The command is compared as 32
  // bits: the kernel ignores the upper half.
  for (uint64_t cmd : {static_cast<uint64_t>(TIOCSTI), static_cast<uint64_t>(TIOCLINUX)}) {
    if ((rc = seccomp_rule_add(ctx, eperm, SCMP_SYS(ioctl), 1,
                               SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffULL, cmd))) < 0) {
      return fail("ioctl");
    }
  }
  int fd = memfd_create("seccomp-bpf", MFD_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("memfd_create: ", strerror(errno)));
  absl::Cleanup close_fd = [fd] { close(fd); };
  if ((rc = seccomp_export_bpf(ctx, fd)) < 0) return fail("export");
  std::string out;
  char buf[4096];
  lseek(fd, 0, SEEK_SET);
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

}  // namespace sandbox
