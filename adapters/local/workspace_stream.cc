// Streamed transfers over a workspace (WorkspaceFs::BeginUpload,
// BeginDownload): one chunk at a time, whatever the file's size. An upload
// writes a hidden file beside its target and renames it over the target at
// Commit, so the file appears whole or not at all; an upload dropped
// uncommitted removes its hidden file. Paths are walked as for Write and
// Read (no symlink is followed, a hard-linked file is never read).

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "adapters/local/fs_internal.h"
#include "adapters/local/workspace_fs.h"
#include "common/text.h"

namespace sandbox {
namespace {

using fs_internal::CheckRegular;
using fs_internal::EntryFromStat;
using fs_internal::Errno;
using fs_internal::Fd;

class WorkspaceUpload final : public FileUpload {
 public:
  WorkspaceUpload(int dir, int file, std::string temp, std::string name, std::string path,
                  uint32_t mode, uint64_t max_bytes)
      : dir_(dir),
        file_(file),
        temp_(std::move(temp)),
        name_(std::move(name)),
        path_(std::move(path)),
        mode_(mode),
        max_bytes_(max_bytes) {}

  ~WorkspaceUpload() override {
    if (!committed_) unlinkat(dir_.get(), temp_.c_str(), 0);
  }

  absl::Status Append(absl::string_view chunk) override {
    if (committed_) return absl::FailedPreconditionError("the upload is committed");
    if (written_ + chunk.size() > max_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "upload of \"", path_, "\" is larger than max_transfer_bytes (", max_bytes_, ")"));
    }
    size_t off = 0;
    while (off < chunk.size()) {
      ssize_t w = write(file_.get(), chunk.data() + off, chunk.size() - off);
      if (w < 0) {
        if (errno == EINTR) continue;
        return Errno("write", path_, errno);
      }
      off += static_cast<size_t>(w);
    }
    written_ += chunk.size();
    return absl::OkStatus();
  }

  absl::Status Commit() override {
    if (committed_) return absl::OkStatus();
    if (fchmod(file_.get(), mode_) != 0) return Errno("chmod", path_, errno);
    if (renameat(dir_.get(), temp_.c_str(), dir_.get(), name_.c_str()) != 0) {
      return Errno("rename", path_, errno);
    }
    committed_ = true;
    return absl::OkStatus();
  }

 private:
  Fd dir_;
  Fd file_;
  const std::string temp_;
  const std::string name_;
  const std::string path_;
  const uint32_t mode_;
  const uint64_t max_bytes_;
  uint64_t written_ = 0;
  bool committed_ = false;
};

class WorkspaceDownload final : public FileDownload {
 public:
  WorkspaceDownload(int file, FileEntry entry, int64_t offset, int64_t end)
      : file_(file), entry_(std::move(entry)), next_(offset), end_(end) {}

  const FileEntry& entry() const override { return entry_; }

  absl::Status Read(size_t max, std::string* out) override {
    const size_t want = static_cast<size_t>(std::min<int64_t>(max, end_ - next_));
    out->resize(want);
    size_t got = 0;
    while (got < want) {
      ssize_t r = pread(file_.get(), out->data() + got, want - got, next_ + got);
      if (r < 0) {
        if (errno == EINTR) continue;
        return Errno("read", entry_.path, errno);
      }
      if (r == 0) break;  // the file shrank: its end is here
      got += static_cast<size_t>(r);
    }
    out->resize(got);
    next_ += static_cast<int64_t>(got);
    if (got < want) end_ = next_;
    return absl::OkStatus();
  }

 private:
  Fd file_;
  const FileEntry entry_;
  int64_t next_;
  int64_t end_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<FileUpload>> WorkspaceFs::BeginUpload(absl::string_view path,
                                                                     uint32_t mode,
                                                                     uint64_t max_bytes) const {
  absl::StatusOr<std::vector<std::string>> parts = Resolve(path);
  if (!parts.ok()) return parts.status();
  absl::StatusOr<int> opened = OpenDir(*parts, parts->size() - 1, true, path);
  if (!opened.ok() && opened.status().code() == absl::StatusCode::kNotFound) {
    return absl::InvalidArgumentError(
        absl::StrCat("path \"", path, "\": a parent is not a directory"));
  }
  if (!opened.ok()) return opened.status();
  Fd dir(*opened);
  const std::string& name = parts->back();
  struct stat st;
  if (fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("path \"", path, "\" is a directory"));
  }
  const std::string temp = absl::StrCat(".upload-", RandomHex(8));
  Fd file(
      openat(dir.get(), temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (file.get() < 0) return Errno("create", path, errno);
  if (uid_ >= 0) (void)!fchown(file.get(), uid_, gid_);
  return std::unique_ptr<FileUpload>(new WorkspaceUpload(
      dir.release(), file.release(), temp, name, std::string(path), mode & 07777, max_bytes));
}

absl::StatusOr<std::unique_ptr<FileDownload>> WorkspaceFs::BeginDownload(absl::string_view path,
                                                                         int64_t offset,
                                                                         int64_t length) const {
  if (offset < 0 || length < 0) {
    return absl::InvalidArgumentError("offset and length must not be negative");
  }
  absl::StatusOr<std::vector<std::string>> parts = Resolve(path);
  if (!parts.ok()) return parts.status();
  absl::StatusOr<int> opened = OpenDir(*parts, parts->size() - 1, false, path);
  if (!opened.ok() && opened.status().code() == absl::StatusCode::kNotFound) {
    return std::unique_ptr<FileDownload>();
  }
  if (!opened.ok()) return opened.status();
  Fd dir(*opened);
  Fd file(openat(dir.get(), parts->back().c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (file.get() < 0) {
    if (errno == ENOENT) return std::unique_ptr<FileDownload>();
    return Errno("open", path, errno);
  }
  if (absl::Status s = CheckRegular(file.get(), path); !s.ok()) return s;
  struct stat st;
  if (fstat(file.get(), &st) != 0) return Errno("stat", path, errno);
  if (offset > st.st_size) {
    return absl::OutOfRangeError(
        absl::StrCat("offset ", offset, " is past the end of \"", path, "\" (", st.st_size, ")"));
  }
  const int64_t end = length == 0 || length > st.st_size - offset ? st.st_size : offset + length;
  FileEntry entry = EntryFromStat(st, SandboxPath(*parts), parts->back());
  return std::unique_ptr<FileDownload>(
      new WorkspaceDownload(file.release(), std::move(entry), offset, end));
}

}  // namespace sandbox
