#pragma once

// Streamed transfers (docs/api.md#streamed-transfers): UploadFile and
// DownloadFile as the core sees them. Each holds its session's lease until
// it is destroyed, so a session is never reaped mid-transfer; the provider
// moves one chunk per call, so the broker holds a chunk, never a file.
// Their calls block: the transport runs them on the blocking pool, one at a
// time per transfer.

#include <memory>
#include <optional>
#include <string>

#include "server/core/broker_core.h"

namespace sandbox {

// A FileEntry as the API shows it (files.cc).
void ToProto(const FileEntry& e, pb::FileEntry* out);

class BrokerCore::Upload {
 public:
  Upload(BrokerCore* core, CallContext ctx, std::string session_id, std::shared_ptr<Lease> lease,
         std::unique_ptr<FileUpload> upload, std::optional<int64_t> expected_size);
  // Uncommitted: the provider leaves nothing behind.
  ~Upload();
  Upload(const Upload&) = delete;
  Upload& operator=(const Upload&) = delete;

  // RESOURCE_EXHAUSTED past max_transfer_bytes or the workspace's quota.
  absl::Status Append(absl::string_view chunk);
  // The file, whole, under its name; returns the bytes written.
  // INVALID_ARGUMENT when the header's size was not what came.
  absl::StatusOr<int64_t> Commit();

 private:
  // Drops what was written; a lost sandbox closes the session.
  absl::Status Fail(absl::Status status);

  BrokerCore* const core_;
  const CallContext ctx_;
  const std::string session_id_;
  std::shared_ptr<Lease> lease_;
  std::unique_ptr<FileUpload> upload_;
  const std::optional<int64_t> expected_size_;
  int64_t bytes_ = 0;
};

class BrokerCore::Download {
 public:
  // `download` null: the file does not exist (an answer).
  Download(BrokerCore* core, CallContext ctx, std::string session_id, std::shared_ptr<Lease> lease,
           std::unique_ptr<FileDownload> download);
  ~Download();
  Download(const Download&) = delete;
  Download& operator=(const Download&) = delete;

  bool found() const { return download_ != nullptr; }
  // found() only.
  const FileEntry& entry() const { return download_->entry(); }
  // The next chunk, at most `max` bytes; empty at the end.
  absl::Status Next(size_t max, std::string* chunk);

 private:
  BrokerCore* const core_;
  const CallContext ctx_;
  const std::string session_id_;
  std::shared_ptr<Lease> lease_;
  std::unique_ptr<FileDownload> download_;
  int64_t bytes_ = 0;
};

}  // namespace sandbox
