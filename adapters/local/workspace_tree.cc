// The file API over a workspace (WorkspaceFs::Apply): list, stat, mkdir,
// remove, move. Every directory is opened relative to its parent with
// O_NOFOLLOW, as for Write and Read (workspace_fs.cc): sandboxed code that
// swaps a directory for a symlink mid-call gets a refusal, never a path
// outside the workspace. Symlinks are listed and removed, never followed.

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "adapters/local/fs_internal.h"
#include "adapters/local/workspace_fs.h"

namespace sandbox {
namespace {

using fs_internal::EntryFromStat;
using fs_internal::Errno;
using fs_internal::Fd;
using fs_internal::IsSymlink;

// A recursive remove goes this deep at most (one descriptor per level).
constexpr int kMaxRemoveDepth = 256;

// `name` in `dir`, described without following it.
absl::StatusOr<std::optional<FileEntry>> Describe(int dir, const std::string& name,
                                                  std::string sandbox_path) {
  struct stat st;
  if (fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return std::optional<FileEntry>();
    return Errno("stat", sandbox_path, errno);
  }
  FileEntry e = EntryFromStat(st, std::move(sandbox_path), name);
  if (e.type == FileType::kSymlink) {
    char target[4096];
    ssize_t n = readlinkat(dir, name.c_str(), target, sizeof(target));
    if (n > 0) e.symlink_target.assign(target, static_cast<size_t>(n));
  }
  return std::optional<FileEntry>(std::move(e));
}

// The names in directory `fd` (not "." or ".."), sorted.
absl::StatusOr<std::vector<std::string>> Names(int fd, absl::string_view path) {
  int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return Errno("open", path, errno);
  DIR* d = fdopendir(copy);
  if (d == nullptr) {
    close(copy);
    return Errno("open", path, errno);
  }
  rewinddir(d);
  std::vector<std::string> names;
  while (struct dirent* ent = readdir(d)) {
    absl::string_view n = ent->d_name;
    if (n != "." && n != "..") names.emplace_back(n);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

// Directory `fd` (at sandbox path `at`) listed into `out`, `depth` levels,
// in listing order, skipping what is not after `page.after` without a stat,
// and stopping once `page.limit` entries are out (then *more says so).
struct PageHint {
  const std::string& after;
  size_t limit;  // 0 = all
};

absl::Status ListInto(int fd, const std::string& at, int depth, const PageHint& page,
                      std::vector<FileEntry>* out, bool* more) {
  absl::StatusOr<std::vector<std::string>> names = Names(fd, at);
  if (!names.ok()) return names.status();
  for (const std::string& name : *names) {
    const std::string path = at == "/" ? "/" + name : absl::StrCat(at, "/", name);
    // Listed on an earlier page: skip it, but go into the directory the
    // last page ended in or under (a file there fails to open: skipped).
    const bool listed = !page.after.empty() && !ListingLess(page.after, path);
    const bool holds_after =
        listed && (page.after == path || absl::StartsWith(page.after, path + "/"));
    if (listed && !holds_after) continue;
    if (!listed && page.limit > 0 && out->size() >= page.limit) {
      *more = true;
      return absl::OkStatus();
    }
    if (out->size() >= kMaxListedEntries) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the listing has more than ", kMaxListedEntries,
                       " entries; list a narrower path or a smaller depth"));
    }
    bool dir = holds_after;
    if (!listed) {
      absl::StatusOr<std::optional<FileEntry>> e = Describe(fd, name, path);
      if (!e.ok()) return e.status();
      if (!e->has_value()) continue;  // removed while we listed
      dir = (*e)->type == FileType::kDir;
      out->push_back(std::move(**e));
    }
    if (!dir || depth <= 1) continue;
    Fd sub(openat(fd, name.c_str(), O_DIRECTORY | O_NOFOLLOW | O_RDONLY | O_CLOEXEC));
    if (sub.get() < 0) continue;  // replaced or removed while we listed
    if (absl::Status s = ListInto(sub.get(), path, depth - 1, page, out, more); !s.ok()) {
      return s;
    }
    if (*more) return absl::OkStatus();
  }
  return absl::OkStatus();
}

// Removes `name` in `dir`, and what is in it when it is a directory.
absl::Status RemoveAt(int dir, const std::string& name, const std::string& path, int depth) {
  if (unlinkat(dir, name.c_str(), 0) == 0 || errno == ENOENT) return absl::OkStatus();
  if (errno != EISDIR) return Errno("remove", path, errno);
  if (depth >= kMaxRemoveDepth) {
    return absl::FailedPreconditionError(absl::StrCat(
        "\"", path, "\" is more than ", kMaxRemoveDepth, " directories deep; remove it in parts"));
  }
  Fd sub(openat(dir, name.c_str(), O_DIRECTORY | O_NOFOLLOW | O_RDONLY | O_CLOEXEC));
  if (sub.get() < 0) return errno == ENOENT ? absl::OkStatus() : Errno("open", path, errno);
  absl::StatusOr<std::vector<std::string>> names = Names(sub.get(), path);
  if (!names.ok()) return names.status();
  for (const std::string& n : *names) {
    if (absl::Status s = RemoveAt(sub.get(), n, absl::StrCat(path, "/", n), depth + 1); !s.ok()) {
      return s;
    }
  }
  if (unlinkat(dir, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    return Errno("remove", path, errno);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> WorkspaceFs::OpenDir(const std::vector<std::string>& parts, size_t n,
                                         bool create, absl::string_view path) const {
  Fd dir(open(root_.c_str(), O_DIRECTORY | O_RDONLY | O_CLOEXEC));
  if (dir.get() < 0) return Errno("open workspace", path, errno);
  for (size_t i = 0; i < n; ++i) {
    const char* name = parts[i].c_str();
    int fd = openat(dir.get(), name, O_DIRECTORY | O_NOFOLLOW | O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT && create) {
      if (mkdirat(dir.get(), name, 0755) != 0 && errno != EEXIST) {
        return Errno("mkdir", path, errno);
      }
      fd = openat(dir.get(), name, O_DIRECTORY | O_NOFOLLOW | O_RDONLY | O_CLOEXEC);
      if (fd >= 0 && uid_ >= 0) (void)!fchown(fd, uid_, gid_);
    }
    if (fd < 0 && (errno == ENOTDIR || errno == ELOOP) && IsSymlink(dir.get(), name)) {
      return Errno("open", path, ELOOP);
    }
    if (fd < 0 && errno == ENOTDIR) {
      return absl::NotFoundError(absl::StrCat("path \"", path, "\": a parent is not a directory"));
    }
    if (fd < 0) return Errno("open", path, errno);
    dir.reset(fd);
  }
  return dir.release();
}

std::string WorkspaceFs::SandboxPath(const std::vector<std::string>& parts) const {
  if (parts.empty()) return mount_point_;
  return absl::StrCat(mount_point_ == "/" ? "" : mount_point_, "/", absl::StrJoin(parts, "/"));
}

absl::StatusOr<FileOpResult> WorkspaceFs::Apply(const FileOp& op) const {
  switch (op.kind) {
    case FileOp::Kind::kList:
      return List(op);
    case FileOp::Kind::kStat:
      return Stat(op);
    case FileOp::Kind::kMakeDir:
      return MakeDir(op);
    case FileOp::Kind::kRemove:
      return Remove(op);
    case FileOp::Kind::kMove:
      return Move(op);
  }
  return absl::InvalidArgumentError("unknown file operation");
}

absl::StatusOr<FileOpResult> WorkspaceFs::List(const FileOp& op) const {
  if (op.depth < 1 || op.depth > kMaxListDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("depth ", op.depth, " is out of range: 1 to ", kMaxListDepth));
  }
  absl::StatusOr<std::vector<std::string>> parts = ResolveOrRoot(op.path);
  if (!parts.ok()) return parts.status();
  FileOpResult r;
  absl::StatusOr<int> dir = OpenDir(*parts, parts->size(), false, op.path);
  if (!dir.ok() && dir.status().code() == absl::StatusCode::kNotFound) {
    // Missing (an answer), or a file where a directory is meant.
    absl::StatusOr<FileOpResult> st = Stat(op);
    if (!st.ok() || !st->found) return st;
    return absl::InvalidArgumentError(absl::StrCat("path \"", op.path, "\" is not a directory"));
  }
  if (!dir.ok()) return dir.status();
  Fd fd(*dir);
  const PageHint page{op.after, op.limit};
  if (absl::Status s = ListInto(fd.get(), SandboxPath(*parts), op.depth, page, &r.entries, &r.more);
      !s.ok()) {
    return s;
  }
  return r;
}

absl::StatusOr<FileOpResult> WorkspaceFs::Stat(const FileOp& op) const {
  absl::StatusOr<std::vector<std::string>> parts = ResolveOrRoot(op.path);
  if (!parts.ok()) return parts.status();
  FileOpResult r;
  if (parts->empty()) {
    Fd root(open(root_.c_str(), O_DIRECTORY | O_RDONLY | O_CLOEXEC));
    if (root.get() < 0) return Errno("open workspace", op.path, errno);
    absl::StatusOr<std::optional<FileEntry>> e = Describe(root.get(), ".", mount_point_);
    if (!e.ok()) return e.status();
    (*e)->name = mount_point_.substr(mount_point_.rfind('/') + 1);
    r.entries.push_back(std::move(**e));
    return r;
  }
  absl::StatusOr<int> dir = OpenDir(*parts, parts->size() - 1, false, op.path);
  if (!dir.ok() && dir.status().code() == absl::StatusCode::kNotFound) {
    r.found = false;
    return r;
  }
  if (!dir.ok()) return dir.status();
  Fd fd(*dir);
  absl::StatusOr<std::optional<FileEntry>> e =
      Describe(fd.get(), parts->back(), SandboxPath(*parts));
  if (!e.ok()) return e.status();
  r.found = e->has_value();
  if (r.found) r.entries.push_back(std::move(**e));
  return r;
}

absl::StatusOr<FileOpResult> WorkspaceFs::MakeDir(const FileOp& op) const {
  absl::StatusOr<std::vector<std::string>> parts = Resolve(op.path);
  if (!parts.ok()) return parts.status();
  absl::StatusOr<int> dir = OpenDir(*parts, parts->size() - 1, op.parents, op.path);
  if (!dir.ok()) return dir.status();
  Fd fd(*dir);
  const char* name = parts->back().c_str();
  if (mkdirat(fd.get(), name, 0755) != 0) {
    const int err = errno;
    struct stat st;
    const bool is_dir = err == EEXIST && fstatat(fd.get(), name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                        S_ISDIR(st.st_mode);
    if (is_dir && op.parents) return FileOpResult();
    if (err == EEXIST && !is_dir) {
      return absl::AlreadyExistsError(
          absl::StrCat("path \"", op.path, "\" already exists and is not a directory"));
    }
    return Errno("mkdir", op.path, err);
  }
  if (uid_ >= 0) (void)!fchownat(fd.get(), name, uid_, gid_, AT_SYMLINK_NOFOLLOW);
  return FileOpResult();
}

absl::StatusOr<FileOpResult> WorkspaceFs::Remove(const FileOp& op) const {
  absl::StatusOr<std::vector<std::string>> parts = Resolve(op.path);
  if (!parts.ok()) return parts.status();
  FileOpResult r;
  absl::StatusOr<int> dir = OpenDir(*parts, parts->size() - 1, false, op.path);
  if (!dir.ok() && dir.status().code() == absl::StatusCode::kNotFound) {
    r.found = false;
    return r;
  }
  if (!dir.ok()) return dir.status();
  Fd fd(*dir);
  const std::string& name = parts->back();
  struct stat st;
  if (fstatat(fd.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno != ENOENT) return Errno("stat", op.path, errno);
    r.found = false;
    return r;
  }
  if (!S_ISDIR(st.st_mode)) {
    if (unlinkat(fd.get(), name.c_str(), 0) != 0 && errno != ENOENT) {
      return Errno("remove", op.path, errno);
    }
    return r;
  }
  if (!op.recursive) {
    if (unlinkat(fd.get(), name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
      if (errno == ENOTEMPTY || errno == EEXIST) {
        return absl::FailedPreconditionError(absl::StrCat(
            "directory \"", op.path, "\" is not empty; remove it with recursive to delete it all"));
      }
      return Errno("remove", op.path, errno);
    }
    return r;
  }
  if (absl::Status s = RemoveAt(fd.get(), name, SandboxPath(*parts), 0); !s.ok()) return s;
  return r;
}

absl::StatusOr<FileOpResult> WorkspaceFs::Move(const FileOp& op) const {
  absl::StatusOr<std::vector<std::string>> from = Resolve(op.path);
  if (!from.ok()) return from.status();
  absl::StatusOr<std::vector<std::string>> to = Resolve(op.destination);
  if (!to.ok()) return to.status();
  absl::StatusOr<int> from_dir = OpenDir(*from, from->size() - 1, false, op.path);
  if (!from_dir.ok() && from_dir.status().code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(absl::StrCat("source \"", op.path, "\" does not exist"));
  }
  if (!from_dir.ok()) return from_dir.status();
  Fd src(*from_dir);
  absl::StatusOr<int> to_dir = OpenDir(*to, to->size() - 1, true, op.destination);
  if (!to_dir.ok()) return to_dir.status();
  Fd dst(*to_dir);
  const unsigned flags = op.overwrite ? 0 : RENAME_NOREPLACE;
  if (renameat2(src.get(), from->back().c_str(), dst.get(), to->back().c_str(), flags) != 0) {
    switch (errno) {
      case ENOENT:
        return absl::NotFoundError(absl::StrCat("source \"", op.path, "\" does not exist"));
      case EEXIST:
        return absl::AlreadyExistsError(absl::StrCat(
            "destination \"", op.destination, "\" exists; move with overwrite to replace it"));
      case EINVAL:
        return absl::InvalidArgumentError(
            absl::StrCat("cannot move \"", op.path, "\" into itself (\"", op.destination, "\")"));
      case EISDIR:
      case ENOTDIR:
        return absl::InvalidArgumentError(absl::StrCat("cannot replace \"", op.destination,
                                                       "\": one is a directory, the other not"));
      default:
        return Errno("move", op.path, errno);
    }
  }
  return FileOpResult();
}

}  // namespace sandbox
