// The file API (docs/api.md#files): ListFiles, StatFile, MakeDir,
// RemoveFile, MoveFile. Each turns its request into one FileOp and takes the
// one path, FilesAsync (LeasedCallAsync, which code contexts share): admission, the request's own
// checks, the session's lease (its sandbox created lazily, as for WriteFile), the provider's
// FilesAsync, the answer. ListFiles pages here, over the provider's sorted
// listing, so every provider pages alike.

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/request_id.h"
#include "server/core/broker_core.h"

namespace sandbox {
namespace {

constexpr int kDefaultFilePageSize = 1000;
constexpr int kMaxFilePageSize = 1000;

absl::Status Required(const std::string& path, absl::string_view what) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  return absl::OkStatus();
}

pb::FileType ToProto(FileType t) {
  switch (t) {
    case FileType::kFile:
      return pb::FILE_TYPE_FILE;
    case FileType::kDir:
      return pb::FILE_TYPE_DIR;
    case FileType::kSymlink:
      return pb::FILE_TYPE_SYMLINK;
    case FileType::kOther:
      return pb::FILE_TYPE_OTHER;
  }
  return pb::FILE_TYPE_UNSPECIFIED;
}

}  // namespace

void ToProto(const FileEntry& e, pb::FileEntry* out) {
  out->set_path(e.path);
  out->set_name(e.name);
  out->set_type(ToProto(e.type));
  out->set_size(e.size);
  out->set_mode(e.mode);
  const absl::Duration since = e.mtime - absl::UnixEpoch();
  const int64_t seconds = absl::ToInt64Seconds(since);
  out->mutable_mtime()->set_seconds(seconds);
  out->mutable_mtime()->set_nanos(
      static_cast<int32_t>(absl::ToInt64Nanoseconds(since - absl::Seconds(seconds))));
  if (e.type == FileType::kSymlink) out->set_symlink_target(e.symlink_target);
}

namespace {

// ListFiles' paging: the page size (0 = the default) and the path the
// previous page ended at (the token; "" = from the start).
struct Page {
  int size = kDefaultFilePageSize;
  std::string after;
};

absl::StatusOr<Page> ToPage(const pb::ListFilesRequest& req) {
  Page p;
  if (req.page_size() < 0) return absl::InvalidArgumentError("page_size is negative");
  if (req.page_size() > 0) p.size = std::min(req.page_size(), kMaxFilePageSize);
  if (!req.page_token().empty() &&
      (!absl::WebSafeBase64Unescape(req.page_token(), &p.after) || p.after.empty())) {
    return absl::InvalidArgumentError("invalid page_token");
  }
  return p;
}

}  // namespace

void BrokerCore::FileCallFailed(const CallContext& ctx, const std::string& session_id,
                                std::shared_ptr<Lease> lease, absl::Status status,
                                std::function<void(absl::Status)> done) {
  if (status.code() != absl::StatusCode::kUnimplemented) {
    return FailAsync(ctx, session_id, std::move(lease), std::move(status), std::move(done));
  }
  const std::string provider = lease->provider();
  lease->Release();
  done(absl::UnimplementedError(absl::StrCat("provider ", provider, ": ", status.message())));
}

template <typename R>
void BrokerCore::LeasedCallAsync(const CallContext& ctx, const std::string& session_id,
                                 const pb::SessionSpec& spec,
                                 const std::function<absl::Status()>& check, SandboxCall<R> call,
                                 Done<R> done) {
  FileLeaseAsync(ctx, session_id, spec, check,
                 [this, ctx, session_id, call = std::move(call),
                  done = std::move(done)](absl::StatusOr<std::shared_ptr<Lease>> lease) mutable {
                   if (!lease.ok()) return done(lease.status());
                   std::shared_ptr<Lease> held = std::move(*lease);
                   call(held->sandbox(),
                        WithRequestId([this, ctx, session_id, held, done](absl::StatusOr<R> r) {
                          if (r.ok()) {
                            held->Release();
                            return done(std::move(r));
                          }
                          FileCallFailed(ctx, session_id, held, r.status(),
                                         [done](absl::Status e) { done(e); });
                        }));
                 });
}

void BrokerCore::FilesAsync(const CallContext& ctx, const std::string& session_id,
                            const pb::SessionSpec& spec, FileOp op,
                            const std::function<absl::Status()>& check, Done<FileOpResult> done) {
  LeasedCallAsync<FileOpResult>(
      ctx, session_id, spec, check,
      [op = std::move(op)](Sandbox* sandbox, Sandbox::FilesDone then) {
        sandbox->FilesAsync(op, std::move(then));
      },
      std::move(done));
}

void BrokerCore::ContextsAsync(const CallContext& ctx, const std::string& session_id,
                               const pb::SessionSpec& spec, CodeOp op,
                               const std::function<absl::Status()>& check,
                               Done<CodeOpResult> done) {
  op.max_contexts = static_cast<int>(config_.max_contexts_per_session);
  LeasedCallAsync<CodeOpResult>(
      ctx, session_id, spec, check,
      [op = std::move(op)](Sandbox* sandbox, Sandbox::CodeDone then) {
        sandbox->CodeAsync(op, std::move(then));
      },
      std::move(done));
}

void BrokerCore::ListFilesAsync(const CallContext& ctx, const pb::ListFilesRequest& req,
                                Done<pb::ListFilesResponse> done) {
  FileOp op;
  op.kind = FileOp::Kind::kList;
  op.path = req.path();
  op.depth = req.depth() == 0 ? 1 : req.depth();
  absl::StatusOr<Page> page = ToPage(req);
  absl::Status valid = page.status();
  if (op.depth < 1 || op.depth > kMaxListDepth) {
    valid = absl::InvalidArgumentError(
        absl::StrCat("depth ", req.depth(), " is out of range: 1 to ", kMaxListDepth));
  }
  if (page.ok()) {
    // The provider may stop early (a hint); this page is cut here either way.
    op.after = page->after;
    op.limit = static_cast<size_t>(page->size);
  }
  FilesAsync(
      ctx, req.session_id(), req.spec(), op, [valid] { return valid; },
      [page = page.value_or(Page()), done](absl::StatusOr<FileOpResult> r) {
        if (!r.ok()) return done(r.status());
        pb::ListFilesResponse resp;
        resp.set_found(r->found);
        const std::vector<FileEntry>& all = r->entries;
        auto it = all.begin();
        if (!page.after.empty()) {
          it = std::upper_bound(all.begin(), all.end(), page.after,
                                [](const std::string& after, const FileEntry& e) {
                                  return ListingLess(after, e.path);
                                });
        }
        for (; it != all.end() && resp.entries_size() < page.size; ++it) {
          ToProto(*it, resp.add_entries());
        }
        if ((it != all.end() || r->more) && resp.entries_size() > 0) {
          resp.set_next_page_token(
              absl::WebSafeBase64Escape(resp.entries(resp.entries_size() - 1).path()));
        }
        done(std::move(resp));
      });
}

void BrokerCore::StatFileAsync(const CallContext& ctx, const pb::StatFileRequest& req,
                               Done<pb::StatFileResponse> done) {
  FileOp op;
  op.kind = FileOp::Kind::kStat;
  op.path = req.path();
  FilesAsync(
      ctx, req.session_id(), req.spec(), op, [] { return absl::OkStatus(); },
      [done](absl::StatusOr<FileOpResult> r) {
        if (!r.ok()) return done(r.status());
        pb::StatFileResponse resp;
        resp.set_found(r->found && !r->entries.empty());
        if (resp.found()) ToProto(r->entries.front(), resp.mutable_entry());
        done(std::move(resp));
      });
}

void BrokerCore::MakeDirAsync(const CallContext& ctx, const pb::MakeDirRequest& req,
                              Done<pb::MakeDirResponse> done) {
  FileOp op;
  op.kind = FileOp::Kind::kMakeDir;
  op.path = req.path();
  op.parents = req.parents();
  FilesAsync(
      ctx, req.session_id(), req.spec(), op, [&req] { return Required(req.path(), "path"); },
      [done](absl::StatusOr<FileOpResult> r) {
        if (!r.ok()) return done(r.status());
        done(pb::MakeDirResponse());
      });
}

void BrokerCore::RemoveFileAsync(const CallContext& ctx, const pb::RemoveFileRequest& req,
                                 Done<pb::RemoveFileResponse> done) {
  FileOp op;
  op.kind = FileOp::Kind::kRemove;
  op.path = req.path();
  op.recursive = req.recursive();
  FilesAsync(
      ctx, req.session_id(), req.spec(), op, [&req] { return Required(req.path(), "path"); },
      [done](absl::StatusOr<FileOpResult> r) {
        if (!r.ok()) return done(r.status());
        pb::RemoveFileResponse resp;
        resp.set_existed(r->found);
        done(std::move(resp));
      });
}

void BrokerCore::MoveFileAsync(const CallContext& ctx, const pb::MoveFileRequest& req,
                               Done<pb::MoveFileResponse> done) {
  FileOp op;
  op.kind = FileOp::Kind::kMove;
  op.path = req.source();
  op.destination = req.destination();
  op.overwrite = req.overwrite();
  auto check = [&req] {
    if (absl::Status s = Required(req.source(), "source"); !s.ok()) return s;
    return Required(req.destination(), "destination");
  };
  FilesAsync(ctx, req.session_id(), req.spec(), op, check, [done](absl::StatusOr<FileOpResult> r) {
    if (!r.ok()) return done(r.status());
    done(pb::MoveFileResponse());
  });
}

}  // namespace sandbox
