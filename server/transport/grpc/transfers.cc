// UploadFile and DownloadFile (docs/api.md#streamed-transfers): gRPC
// streams over the core's transfers (server/core/transfers.h). One message
// is in flight at a time in each direction, and the provider's blocking
// call for it runs on the blocking pool: the broker holds a chunk or two,
// whatever the file's size, and a slow peer slows the transfer instead of
// filling memory (gRPC's flow control does the rest).

#include "server/core/transfers.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"
#include "server/transport/grpc/grpc_service.h"

namespace sandbox {
namespace {

// The size of a download's chunks (and the bytes a download holds at once):
// 1 MiB, or less when max_message_bytes is smaller.
size_t DownloadChunkBytes(int64_t max_message_bytes) {
  return static_cast<size_t>(std::min<int64_t>(1 << 20, max_message_bytes - 1024));
}

template <typename Msg>
bool ParseBuffer(grpc::ByteBuffer* in, Msg* msg) {
  return grpc::GenericDeserialize<grpc::ProtoBufferReader, Msg>(in, msg).ok();
}

template <typename Msg>
void SerializeInto(const Msg& m, grpc::ByteBuffer* out) {
  bool own = false;
  (void)grpc::GenericSerialize<grpc::ProtoBufferWriter, Msg>(m, out, &own);
}

absl::Status NotForwarded(const ClusterRoute& route) {
  return absl::FailedPreconditionError(absl::StrCat(
      "streamed transfers are served by the session's owner only; it is ", route.address));
}

// An upload's server side: the header, then each chunk appended on the
// blocking pool before the next is read, then the commit message. A stream
// that ends before it (a cancel, a client gone, a message too large) keeps
// nothing: the end of a stream alone cannot tell a cancel from a finish.
// Deletes itself when gRPC is done with the call.
class UploadReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  // `start` admits the call and begins the upload (then `Started`);
  // `end` turns the final status into what is sent.
  using Start = std::function<void(const pb::UploadFileHeader&, UploadReactor*)>;
  UploadReactor(grpc::ByteBuffer* response, WorkPool* pool, Start start,
                std::function<grpc::Status(absl::Status)> end)
      : response_(response), pool_(pool), start_(std::move(start)), end_(std::move(end)) {
    StartRead(&in_);
  }

  void Started(absl::StatusOr<std::unique_ptr<BrokerCore::Upload>> upload) {
    if (!upload.ok()) return Done(upload.status());
    upload_ = std::move(*upload);
    StartRead(&in_);
  }

  void Done(absl::Status status) {
    upload_.reset();  // an uncommitted upload leaves nothing behind
    Finish(end_(status));
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      if (upload_ == nullptr) return Done(absl::InvalidArgumentError("the upload has no header"));
      return Done(absl::InvalidArgumentError(
          "the upload ended without its commit message; nothing was kept"));
    }
    auto msg = std::make_shared<pb::UploadFileRequest>();
    if (!ParseBuffer(&in_, msg.get())) {
      return Done(absl::InvalidArgumentError("a message is not a valid UploadFileRequest"));
    }
    if (upload_ == nullptr) {
      if (!msg->has_header()) {
        return Done(absl::InvalidArgumentError("the first message must be the header"));
      }
      return start_(msg->header(), this);
    }
    if (msg->has_header()) return Done(absl::InvalidArgumentError("a second header"));
    if (msg->part_case() == pb::UploadFileRequest::kCommit) {
      return pool_->Submit([this] {
        absl::StatusOr<int64_t> n = upload_->Commit();
        if (n.ok()) {
          pb::UploadFileResponse resp;
          resp.set_bytes_written(*n);
          SerializeInto(resp, response_);
        }
        Done(n.status());
      });
    }
    pool_->Submit([this, msg] {
      if (absl::Status s = upload_->Append(msg->chunk()); !s.ok()) return Done(s);
      StartRead(&in_);
    });
  }

  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer* const response_;
  WorkPool* const pool_;
  const Start start_;
  const std::function<grpc::Status(absl::Status)> end_;
  grpc::ByteBuffer in_;
  std::unique_ptr<BrokerCore::Upload> upload_;
};

// A download's server side: the header, then each chunk read on the
// blocking pool once the previous one is written.
class DownloadReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  DownloadReactor(WorkPool* pool, size_t chunk_bytes, std::function<grpc::Status(absl::Status)> end)
      : pool_(pool), chunk_bytes_(chunk_bytes), end_(std::move(end)) {}

  void Started(absl::StatusOr<std::unique_ptr<BrokerCore::Download>> download) {
    if (!download.ok()) return Done(download.status());
    download_ = std::move(*download);
    pb::DownloadFileResponse header;
    header.mutable_header()->set_found(download_->found());
    if (download_->found()) ToProto(download_->entry(), header.mutable_header()->mutable_entry());
    Write(header);
  }

  void Done(absl::Status status) {
    download_.reset();
    Finish(end_(status));
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return Done(absl::CancelledError("the client went away"));
    if (!download_->found()) return Done(absl::OkStatus());
    pool_->Submit([this] {
      std::string chunk;
      if (absl::Status s = download_->Next(chunk_bytes_, &chunk); !s.ok()) return Done(s);
      if (chunk.empty()) return Done(absl::OkStatus());
      pb::DownloadFileResponse msg;
      msg.set_chunk(std::move(chunk));
      Write(msg);
    });
  }

  void OnDone() override { delete this; }

 private:
  void Write(const pb::DownloadFileResponse& msg) {
    out_.Clear();
    SerializeInto(msg, &out_);
    StartWrite(&out_);
  }

  WorkPool* const pool_;
  const size_t chunk_bytes_;
  const std::function<grpc::Status(absl::Status)> end_;
  grpc::ByteBuffer out_;
  std::unique_ptr<BrokerCore::Download> download_;
};

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* BrokerService::UploadFile(
    grpc::CallbackServerContext* ctx, grpc::ByteBuffer* response) {
  auto call = std::make_shared<Call>();
  call->ctx = ctx;
  call->method = "UploadFile";
  call->start = clock_->Monotonic();
  auto start = [this, call](const pb::UploadFileHeader& header, UploadReactor* reactor) {
    call->session_id = header.session_id();
    auto fail = [reactor](absl::Status s) { reactor->Done(s); };
    Begin(
        call,
        [this, call, header, reactor, fail](const CallContext& cc) {
          auto local = [this, cc, header, reactor] {
            core_->BeginUploadAsync(
                cc, header, [reactor](auto upload) { reactor->Started(std::move(upload)); });
          };
          if (cluster_ == nullptr) return local();
          Route(
              call, cc, header.spec().provider(), /*may_create=*/true, std::move(local),
              [fail](const ClusterRoute& route) { fail(NotForwarded(route)); }, fail);
        },
        fail);
  };
  return new UploadReactor(response, core_->blocking_pool(), std::move(start),
                           [this, call](absl::Status s) { return End(*call, s); });
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* BrokerService::DownloadFile(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
  auto call = std::make_shared<Call>();
  call->ctx = ctx;
  call->method = "DownloadFile";
  call->start = clock_->Monotonic();
  auto* reactor =
      new DownloadReactor(core_->blocking_pool(), DownloadChunkBytes(core_->max_message_bytes()),
                          [this, call](absl::Status s) { return End(*call, s); });
  auto req = std::make_shared<pb::DownloadFileRequest>();
  grpc::ByteBuffer copy(*request);
  if (!ParseBuffer(&copy, req.get())) {
    reactor->Done(absl::InvalidArgumentError(
        "the request is not a valid sandboxbroker.v1.DownloadFileRequest"));
    return reactor;
  }
  call->session_id = req->session_id();
  auto fail = [reactor](absl::Status s) { reactor->Done(s); };
  Begin(
      call,
      [this, call, req, reactor, fail](const CallContext& cc) {
        auto local = [this, cc, req, reactor] {
          core_->BeginDownloadAsync(
              cc, *req, [reactor](auto download) { reactor->Started(std::move(download)); });
        };
        if (cluster_ == nullptr) return local();
        Route(
            call, cc, req->spec().provider(), /*may_create=*/true, std::move(local),
            [fail](const ClusterRoute& route) { fail(NotForwarded(route)); }, fail);
      },
      fail);
  return reactor;
}

}  // namespace sandbox
