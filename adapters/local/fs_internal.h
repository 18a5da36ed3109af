#pragma once

// Helpers shared by workspace_fs.cc and workspace_tree.cc (internal).

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "adapters/api/provider.h"

namespace sandbox {
namespace fs_internal {

// An entry as lstat/fstat described it (no symlink target).
inline FileEntry EntryFromStat(const struct stat& st, std::string path, std::string name) {
  FileEntry e;
  e.path = std::move(path);
  e.name = std::move(name);
  if (S_ISREG(st.st_mode)) {
    e.type = FileType::kFile;
  } else if (S_ISDIR(st.st_mode)) {
    e.type = FileType::kDir;
  } else if (S_ISLNK(st.st_mode)) {
    e.type = FileType::kSymlink;
  } else {
    e.type = FileType::kOther;
  }
  e.size = static_cast<int64_t>(st.st_size);
  e.mode = static_cast<uint32_t>(st.st_mode & 07777);
  e.mtime = absl::TimeFromTimespec(st.st_mtim);
  return e;
}

inline constexpr size_t kMaxPathBytes = 4096;
inline constexpr size_t kMaxComponentBytes = 255;

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

inline absl::Status Errno(absl::string_view what, absl::string_view path, int err) {
  std::string msg = absl::StrCat(what, " \"", path, "\": ", strerror(err));
  switch (err) {
    case ELOOP:
      return absl::PermissionDeniedError(
          absl::StrCat("path \"", path, "\" goes through a symlink (refused)"));
    case ENOTDIR:
      return absl::InvalidArgumentError(
          absl::StrCat("path \"", path, "\": a parent is not a directory"));
    case EISDIR:
      return absl::InvalidArgumentError(absl::StrCat("path \"", path, "\" is a directory"));
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return absl::ResourceExhaustedError(msg);
    case ENAMETOOLONG:
    case EINVAL:
      return absl::InvalidArgumentError(msg);
    case ENOENT:
      return absl::NotFoundError(msg);
    case EEXIST:
      return absl::AlreadyExistsError(absl::StrCat("path \"", path, "\" already exists"));
    case ENOTEMPTY:
      return absl::FailedPreconditionError(absl::StrCat("directory \"", path, "\" is not empty"));
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// After ENOTDIR/ELOOP on `name` in `dir`: a symlink is refused outright.
inline bool IsSymlink(int dir, const char* name) {
  struct stat st;
  return fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode);
}

// Checks an opened final component: a regular file with one link.
inline absl::Status CheckRegular(int fd, absl::string_view path) {
  struct stat st;
  if (fstat(fd, &st) != 0) return Errno("stat", path, errno);
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("path \"", path, "\" is a directory"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("path \"", path, "\" is not a regular file"));
  }
  if (st.st_nlink > 1) {
    return absl::PermissionDeniedError(
        absl::StrCat("path \"", path, "\" is a hard-linked file (refused)"));
  }
  return absl::OkStatus();
}

}  // namespace fs_internal
}  // namespace sandbox
