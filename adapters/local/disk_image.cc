#include "adapters/local/disk_image.h"

#include <fcntl.h>
#include <limits.h>
#include <linux/loop.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
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

bool MountNewImage(const std::string& image, const std::string& dir) {
  const int img = open(image.c_str(), O_RDWR | O_CLOEXEC);
  if (img < 0) return false;
  const int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
  bool ok = false;
  for (int attempt = 0; ctl >= 0 && attempt < 8; ++attempt) {
    const int n = ioctl(ctl, LOOP_CTL_GET_FREE);
    if (n < 0) break;
    const std::string dev = absl::StrCat("/dev/loop", n);
    const int lfd = open(dev.c_str(), O_RDWR | O_CLOEXEC);
    if (lfd < 0) break;
    struct loop_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    cfg.fd = static_cast<__u32>(img);
    cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR;
    strncpy(reinterpret_cast<char*>(cfg.info.lo_file_name), image.c_str(), LO_NAME_SIZE - 1);
    if (ioctl(lfd, LOOP_CONFIGURE, &cfg) != 0) {
      const int err = errno;
      close(lfd);
      if (err == EBUSY) continue;  // taken since LOOP_CTL_GET_FREE
      break;
    }
    ok = mount(dev.c_str(), dir.c_str(), "ext4", MS_NOSUID | MS_NODEV | MS_NOATIME, "") == 0;
    close(lfd);  // autoclear: the device is freed with the mount (now, if none)
    break;
  }
  if (ctl >= 0) close(ctl);
  close(img);
  return ok;
}

absl::Status MountDiskImage(const std::string& image, const std::string& dir, bool new_image) {
  // mount(8)'s reads, a line and a device per sandbox, were the largest part
  // of a create's CPU beside 500 sandboxes after bwrap's own.
  if (new_image && MountNewImage(image, dir)) return absl::OkStatus();
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

namespace {

// A mountinfo field with its octal escapes (\040 for a space, ...) undone.
std::string Unescape(absl::string_view f) {
  std::string out;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] == '\\' && i + 3 < f.size() && f[i + 1] >= '0' && f[i + 1] <= '3' && f[i + 2] >= '0' &&
        f[i + 2] <= '7' && f[i + 3] >= '0' && f[i + 3] <= '7') {
      out += static_cast<char>((f[i + 1] - '0') * 64 + (f[i + 2] - '0') * 8 + (f[i + 3] - '0'));
      i += 3;
    } else {
      out += f[i];
    }
  }
  return out;
}

std::string Resolved(const std::string& path) {
  char buf[PATH_MAX];
  return realpath(path.c_str(), buf) ? std::string(buf) : std::string();
}

}  // namespace

std::vector<std::string> MountsBelow(const std::string& root) {
  std::vector<std::string> out;
  const std::string r = Resolved(root);
  if (r.empty() || r == "/") return out;
  const std::string below = r + "/";
  std::ifstream f("/proc/self/mountinfo");
  std::string line;
  while (std::getline(f, line)) {
    // "ID PARENT MAJ:MIN ROOT MOUNT-POINT ...": the fifth field.
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
    if (parts.size() < 5) continue;
    std::string m = Unescape(parts[4]);
    if (absl::StartsWith(m, below)) out.push_back(std::move(m));
  }
  return out;
}

}  // namespace sandbox
