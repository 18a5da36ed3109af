#include "adapters/local/disk_image.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "adapters/local/process_runner.h"

namespace sandbox {
namespace {

#ifdef STATX_ATTR_MOUNT_ROOT
constexpr uint64_t kStatxMountRoot = STATX_ATTR_MOUNT_ROOT;
#else
constexpr uint64_t kStatxMountRoot = 0x00002000;  // linux/stat.h, 5.8
#endif

absl::Status Tool(const std::vector<std::string>& argv) {
  ProcessSpec p;
  p.argv = argv;
  p.env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
  p.timeout = absl::Seconds(60);
  auto r = RunProcess(p);
  if (!r.ok()) return r.status();
  if (r->exit_code != 0) {
    std::string out = r->output;
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    return absl::FailedPreconditionError(
        absl::StrCat(argv[0], " failed (exit ", r->exit_code, "): ", out));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CreateDiskImage(const std::string& image, int64_t bytes, int64_t inodes, int uid) {
  int fd = open(image.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("disk: cannot create ", image, ": ", strerror(errno)));
  }
  int rc = ftruncate(fd, bytes);
  int err = errno;
  close(fd);
  if (rc != 0) {
    unlink(image.c_str());
    return absl::FailedPreconditionError(
        absl::StrCat("disk: cannot size ", image, ": ", strerror(err)));
  }
  const int owner = uid >= 0 ? uid : 0;
  // A small disk cannot hold a large inode table: at most one per 8 KiB.
  if (inodes <= 0 || inodes > bytes / 8192) inodes = std::max<int64_t>(bytes / 8192, 16);
  // No journal, no reserved blocks, lazy inode tables: a scratch disk that
  // is ready in tens of milliseconds.
  absl::Status s =
      Tool({"/usr/sbin/mkfs.ext4", "-F", "-q", "-m", "0", "-N", absl::StrCat(inodes), "-O",
            "^has_journal", "-E",
            absl::StrCat("lazy_itable_init=1,nodiscard,root_owner=", owner, ":", owner), image});
  if (!s.ok()) unlink(image.c_str());
  return s;
}

absl::Status MountDiskImage(const std::string& image, const std::string& dir) {
  return Tool({"/usr/bin/mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noatime", image, dir});
}

bool IsMountPoint(const std::string& dir) {
  // statx answers from the inode (Linux 5.8+): no scan of a mount table
  // that holds a line per sandbox, on every create and close.
  struct statx sx;
  if (statx(AT_FDCWD, dir.c_str(), AT_SYMLINK_NOFOLLOW, 0, &sx) == 0 &&
      (sx.stx_attributes_mask & kStatxMountRoot) != 0) {
    return (sx.stx_attributes & kStatxMountRoot) != 0;
  }
  std::ifstream f("/proc/self/mountinfo");
  std::string line;
  while (std::getline(f, line)) {
    std::vector<std::string> parts = absl::StrSplit(line, ' ');
    if (parts.size() > 4 && parts[4] == dir) return true;
  }
  return false;
}

absl::Status UnmountDisk(const std::string& dir) {
  while (IsMountPoint(dir)) {
    if (umount2(dir.c_str(), 0) == 0) continue;
    if (errno == EBUSY && umount2(dir.c_str(), MNT_DETACH) == 0) continue;
    return absl::InternalError(absl::StrCat("disk: cannot unmount ", dir, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace sandbox
