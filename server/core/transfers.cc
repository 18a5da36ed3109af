// Streamed transfers (docs/api.md#streamed-transfers): the session side of
// UploadFile and DownloadFile. The start takes the file calls' one path
// (FileLeaseAsync: admission, checks, the lease, the sandbox created
// lazily); the provider's BeginUpload/BeginDownload then run on the
// blocking pool.

#include "server/core/transfers.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/request_id.h"

namespace sandbox {

void BrokerCore::BeginUploadAsync(const CallContext& ctx, const pb::UploadFileHeader& header,
                                  Done<std::unique_ptr<Upload>> done) {
  const int64_t limit = config_.max_transfer_bytes > 0 ? config_.max_transfer_bytes
                                                       : std::numeric_limits<int64_t>::max();
  auto check = [&header, limit] {
    if (header.path().empty()) return absl::InvalidArgumentError("path is empty");
    if (header.mode() > 07777) {
      return absl::InvalidArgumentError(
          absl::StrCat("mode ", header.mode(), " is more than permission bits (07777)"));
    }
    if (header.has_size() && header.size() < 0) {
      return absl::InvalidArgumentError("size is negative");
    }
    if (header.has_size() && header.size() > limit) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the upload is ", header.size(), " bytes; max_transfer_bytes is ", limit));
    }
    return absl::OkStatus();
  };
  std::optional<int64_t> size;
  if (header.has_size()) size = header.size();
  FileLeaseAsync(
      ctx, header.session_id(), header.spec(), check,
      [this, ctx, session_id = header.session_id(), path = header.path(),
       mode = header.mode() == 0 ? 0644u : header.mode(), limit, size,
       done](absl::StatusOr<std::shared_ptr<Lease>> lease) {
        if (!lease.ok()) return done(lease.status());
        std::shared_ptr<Lease> held = std::move(*lease);
        blocking_->Submit([this, ctx, session_id, path, mode, limit, size, held, done] {
          absl::StatusOr<std::unique_ptr<FileUpload>> up =
              held->sandbox()->BeginUpload(path, mode, static_cast<uint64_t>(limit));
          if (!up.ok()) {
            return FileCallFailed(ctx, session_id, held, up.status(),
                                  [done](absl::Status e) { done(e); });
          }
          done(std::make_unique<Upload>(this, ctx, session_id, held, std::move(*up), size));
        });
      });
}

void BrokerCore::BeginDownloadAsync(const CallContext& ctx, const pb::DownloadFileRequest& req,
                                    Done<std::unique_ptr<Download>> done) {
  auto check = [&req] {
    if (req.path().empty()) return absl::InvalidArgumentError("path is empty");
    if (req.offset() < 0 || req.length() < 0) {
      return absl::InvalidArgumentError("offset and length must not be negative");
    }
    return absl::OkStatus();
  };
  FileLeaseAsync(
      ctx, req.session_id(), req.spec(), check,
      [this, ctx, session_id = req.session_id(), path = req.path(), offset = req.offset(),
       length = req.length(), done](absl::StatusOr<std::shared_ptr<Lease>> lease) {
        if (!lease.ok()) return done(lease.status());
        std::shared_ptr<Lease> held = std::move(*lease);
        blocking_->Submit([this, ctx, session_id, path, offset, length, held, done] {
          absl::StatusOr<std::unique_ptr<FileDownload>> d =
              held->sandbox()->BeginDownload(path, offset, length);
          if (!d.ok()) {
            return FileCallFailed(ctx, session_id, held, d.status(),
                                  [done](absl::Status e) { done(e); });
          }
          done(std::make_unique<Download>(this, ctx, session_id, held, std::move(*d)));
        });
      });
}

BrokerCore::Upload::Upload(BrokerCore* core, CallContext ctx, std::string session_id,
                           std::shared_ptr<Lease> lease, std::unique_ptr<FileUpload> upload,
                           std::optional<int64_t> expected_size)
    : core_(core),
      ctx_(std::move(ctx)),
      session_id_(std::move(session_id)),
      lease_(std::move(lease)),
      upload_(std::move(upload)),
      expected_size_(expected_size) {}

BrokerCore::Upload::~Upload() {
  upload_.reset();  // before the lease: it uses the sandbox
  lease_->Release();
}

absl::Status BrokerCore::Upload::Append(absl::string_view chunk) {
  if (upload_ == nullptr) return absl::FailedPreconditionError("the upload has failed");
  if (expected_size_ && bytes_ + static_cast<int64_t>(chunk.size()) > *expected_size_) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("more bytes came than the header's size (", *expected_size_, ")")));
  }
  if (absl::Status s = upload_->Append(chunk); !s.ok()) return Fail(std::move(s));
  bytes_ += static_cast<int64_t>(chunk.size());
  return absl::OkStatus();
}

absl::StatusOr<int64_t> BrokerCore::Upload::Commit() {
  if (upload_ == nullptr) return absl::FailedPreconditionError("the upload has failed");
  if (expected_size_ && bytes_ != *expected_size_) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("the header's size was ", *expected_size_, " bytes; ", bytes_, " came")));
  }
  if (absl::Status s = upload_->Commit(); !s.ok()) return Fail(std::move(s));
  upload_.reset();
  UsageCounters d;
  d.file_transfer_bytes = bytes_;
  core_->RecordUsage(ctx_, lease_->provider(), d);
  return bytes_;
}

absl::Status BrokerCore::Upload::Fail(absl::Status status) {
  upload_.reset();
  if (status.code() == absl::StatusCode::kResourceExhausted) {
    core_->metrics_->QuotaHit(lease_->provider(), "disk");
  }
  if (!IsSandboxGone(status)) return status;
  return core_->DropIfGone(ctx_, session_id_, std::move(*lease_), status);
}

BrokerCore::Download::Download(BrokerCore* core, CallContext ctx, std::string session_id,
                               std::shared_ptr<Lease> lease, std::unique_ptr<FileDownload> download)
    : core_(core),
      ctx_(std::move(ctx)),
      session_id_(std::move(session_id)),
      lease_(std::move(lease)),
      download_(std::move(download)) {}

BrokerCore::Download::~Download() {
  download_.reset();
  if (bytes_ > 0) {
    UsageCounters d;
    d.file_transfer_bytes = bytes_;
    core_->RecordUsage(ctx_, lease_->provider(), d);
  }
  lease_->Release();
}

absl::Status BrokerCore::Download::Next(size_t max, std::string* chunk) {
  chunk->clear();
  if (download_ == nullptr) return absl::OkStatus();
  absl::Status s = download_->Read(max, chunk);
  if (s.ok()) {
    bytes_ += static_cast<int64_t>(chunk->size());
    return s;
  }
  download_.reset();
  if (!IsSandboxGone(s)) return s;
  return core_->DropIfGone(ctx_, session_id_, std::move(*lease_), s);
}

}  // namespace sandbox
