#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "adapters/api/provider.h"

namespace sandbox {

// File access confined to one workspace directory, safe against paths and
// symlinks chosen by untrusted code: every component is opened relative to
// its parent with O_NOFOLLOW, so nothing outside the workspace is read,
// written or created, even if sandboxed code swaps directories for symlinks
// concurrently. Symlinks, hard-linked files, devices and FIFOs are refused.
//
// Thread-safe (stateless apart from constants).
class WorkspaceFs {
 public:
  // `root` is the workspace on the host; `mount_point` is where sandboxed
  // code sees it (absolute paths under it are accepted). New files and
  // directories are owned by uid/gid (-1 = leave as created).
  WorkspaceFs(std::string root, std::string mount_point, int uid, int gid, size_t max_file_bytes);

  // The path's components relative to the workspace. INVALID_ARGUMENT for an
  // empty or malformed path, PERMISSION_DENIED for one that leaves the
  // workspace (absolute elsewhere, or ".." above the root).
  absl::StatusOr<std::vector<std::string>> Resolve(absl::string_view path) const;

  // Writes `data` (replacing any file there), creating parent directories.
  absl::Status Write(absl::string_view path, absl::string_view data) const;

  // The file's bytes, or nullopt when it (or a parent) does not exist.
  // RESOURCE_EXHAUSTED when it is larger than max_file_bytes.
  absl::StatusOr<std::optional<std::string>> Read(absl::string_view path) const;

  // One call of the file API (FileOp: list, stat, mkdir, remove, move) by
  // the same no-follow, descriptor-relative walk (workspace_tree.cc).
  // Entries name paths as the sandbox sees them (under mount_point).
  absl::StatusOr<FileOpResult> Apply(const FileOp& op) const;

  // Streamed transfers (workspace_stream.cc): an upload through a hidden
  // file beside `path`, renamed over it at Commit (parents created); a
  // download of a regular, singly linked file, or null when it is missing.
  absl::StatusOr<std::unique_ptr<FileUpload>> BeginUpload(absl::string_view path, uint32_t mode,
                                                          uint64_t max_bytes) const;
  absl::StatusOr<std::unique_ptr<FileDownload>> BeginDownload(absl::string_view path,
                                                              int64_t offset, int64_t length) const;

 private:
  // The path's components; "" and the mount point itself are the root ({}).
  absl::StatusOr<std::vector<std::string>> ResolveOrRoot(absl::string_view path) const;
  // The directory parts[0, n) opened without following symlinks (an owned
  // descriptor); missing ones created (owned by uid/gid) when `create`.
  // NOT_FOUND when one is missing, PERMISSION_DENIED for a symlink.
  absl::StatusOr<int> OpenDir(const std::vector<std::string>& parts, size_t n, bool create,
                              absl::string_view path) const;
  std::string SandboxPath(const std::vector<std::string>& parts) const;
  absl::StatusOr<FileOpResult> List(const FileOp& op) const;
  absl::StatusOr<FileOpResult> Stat(const FileOp& op) const;
  absl::StatusOr<FileOpResult> MakeDir(const FileOp& op) const;
  absl::StatusOr<FileOpResult> Remove(const FileOp& op) const;
  absl::StatusOr<FileOpResult> Move(const FileOp& op) const;

  const std::string root_;
  const std::string mount_point_;
  const int uid_;
  const int gid_;
  const size_t max_file_bytes_;
};

// Removes a directory tree without following symlinks. Missing is success.
absl::Status RemoveTree(const std::string& path);

}  // namespace sandbox
