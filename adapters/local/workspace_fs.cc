#include "adapters/local/workspace_fs.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "adapters/local/fs_internal.h"

namespace sandbox {
namespace {

using fs_internal::CheckRegular;
using fs_internal::Errno;
using fs_internal::Fd;
using fs_internal::kMaxComponentBytes;
using fs_internal::kMaxPathBytes;

}  // namespace

WorkspaceFs::WorkspaceFs(std::string root, std::string mount_point, int uid, int gid,
                         size_t max_file_bytes)
    : root_(std::move(root)),
      mount_point_(std::move(mount_point)),
      uid_(uid),
      gid_(gid),
      max_file_bytes_(max_file_bytes) {}

absl::StatusOr<std::vector<std::string>> WorkspaceFs::Resolve(absl::string_view path) const {
  if (path.empty()) return absl::InvalidArgumentError("path is empty");
  absl::StatusOr<std::vector<std::string>> parts = ResolveOrRoot(path);
  if (parts.ok() && parts->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("path \"", path, "\" names the workspace itself, not a file"));
  }
  return parts;
}

absl::StatusOr<std::vector<std::string>> WorkspaceFs::ResolveOrRoot(absl::string_view path) const {
  if (path.size() > kMaxPathBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("path is longer than ", kMaxPathBytes, " bytes"));
  }
  if (path.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError("path contains a NUL byte");
  }
  absl::string_view rel = path;
  if (!rel.empty() && rel.front() == '/') {
    absl::string_view mp = mount_point_;
    if (rel.substr(0, mp.size()) == mp && (rel.size() == mp.size() || rel[mp.size()] == '/')) {
      rel.remove_prefix(mp.size());
    } else {
      return absl::PermissionDeniedError(
          absl::StrCat("path \"", path, "\" is outside the workspace ", mount_point_));
    }
  }
  std::vector<std::string> parts;
  for (absl::string_view c : absl::StrSplit(rel, '/', absl::SkipEmpty())) {
    if (c == ".") continue;
    if (c == "..") {
      if (parts.empty()) {
        return absl::PermissionDeniedError(
            absl::StrCat("path \"", path, "\" escapes the workspace"));
      }
      parts.pop_back();
      continue;
    }
    if (c.size() > kMaxComponentBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("path \"", path, "\" has a component longer than 255 bytes"));
    }
    parts.emplace_back(c);
  }
  return parts;
}

absl::Status WorkspaceFs::Write(absl::string_view path, absl::string_view data) const {
  auto parts = Resolve(path);
  if (!parts.ok()) return parts.status();
  if (data.size() > max_file_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("file is ", data.size(), " bytes; the limit is ", max_file_bytes_));
  }
  absl::StatusOr<int> opened = OpenDir(*parts, parts->size() - 1, /*create=*/true, path);
  if (!opened.ok() && opened.status().code() == absl::StatusCode::kNotFound) {
    return absl::InvalidArgumentError(
        absl::StrCat("path \"", path, "\": a parent is not a directory"));
  }
  if (!opened.ok()) return opened.status();
  Fd dir(*opened);
  Fd file(openat(dir.get(), parts->back().c_str(),
                 O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644));
  if (file.get() < 0) return Errno("open", path, errno);
  if (absl::Status s = CheckRegular(file.get(), path); !s.ok()) return s;
  if (ftruncate(file.get(), 0) != 0) return Errno("truncate", path, errno);
  if (uid_ >= 0) (void)!fchown(file.get(), uid_, gid_);
  size_t off = 0;
  while (off < data.size()) {
    ssize_t w = write(file.get(), data.data() + off, data.size() - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Errno("write", path, errno);
    }
    off += static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> WorkspaceFs::Read(absl::string_view path) const {
  auto parts = Resolve(path);
  if (!parts.ok()) return parts.status();
  absl::StatusOr<int> opened = OpenDir(*parts, parts->size() - 1, /*create=*/false, path);
  if (!opened.ok() && opened.status().code() == absl::StatusCode::kNotFound) {
    return std::optional<std::string>();  // a parent is missing, or not a directory
  }
  if (!opened.ok()) return opened.status();
  Fd dir(*opened);
  Fd file(openat(dir.get(), parts->back().c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (file.get() < 0) {
    if (errno == ENOENT) return std::optional<std::string>();
    return Errno("open", path, errno);
  }
  if (absl::Status s = CheckRegular(file.get(), path); !s.ok()) return s;
  struct stat st;
  if (fstat(file.get(), &st) != 0) return Errno("stat", path, errno);
  if (static_cast<uint64_t>(st.st_size) > max_file_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("file is ", st.st_size, " bytes; the limit is ", max_file_bytes_));
  }
  std::string out;
  char buf[64 * 1024];
  while (true) {
    ssize_t r = read(file.get(), buf, sizeof(buf));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Errno("read", path, errno);
    }
    if (r == 0) break;
    out.append(buf, static_cast<size_t>(r));
    if (out.size() > max_file_bytes_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("file is larger than the limit of ", max_file_bytes_, " bytes"));
    }
  }
  return std::optional<std::string>(std::move(out));
}

absl::Status RemoveTree(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0 && errno == ENOENT) return absl::OkStatus();
  int rc = nftw(
      path.c_str(),
      [](const char* p, const struct stat*, int type, struct FTW*) -> int {
        int r = (type == FTW_DP) ? rmdir(p) : unlink(p);
        return (r != 0 && errno != ENOENT) ? -1 : 0;
      },
      64, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("remove workspace ", path, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace sandbox
