#include "server/grpc_service.h"

#include "common/log.h"
#include "common/text.h"

namespace sandbox {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering. The message is cut to
  // 1 KiB of valid UTF-8: a message echoing a huge request field or provider
  // reply would exceed clients' metadata limit (8 KiB by default) and reach
  // them as RESOURCE_EXHAUSTED instead of this code.
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      QuoteForError(s.message(), kMaxStatusMessageBytes));
}

BrokerService::BrokerService(BrokerCore* core, const Authenticator* auth, Clock* clock,
                             Metrics* metrics)
    : core_(core), auth_(auth), clock_(clock), metrics_(metrics) {}

void BrokerService::StartDraining() {
  absl::MutexLock l(&mu_);
  draining_ = true;
}

bool BrokerService::draining() const {
  absl::MutexLock l(&mu_);
  return draining_;
}

int BrokerService::calls_in_flight() const {
  absl::MutexLock l(&mu_);
  return in_flight_;
}

bool BrokerService::WaitForIdle(absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&idle), timeout);
}

// A caller's x-request-id if it is sane (then echoed back), else a fresh
// one: a per-process random prefix and a counter, so no syscall per call.
std::string RequestId(const grpc::ServerContext* ctx, bool* from_client) {
  auto it = ctx->client_metadata().find("x-request-id");
  *from_client = false;
  if (it != ctx->client_metadata().end() && it->second.size() >= 1 && it->second.size() <= 64) {
    std::string id(it->second.data(), it->second.size());
    bool ok = true;
    for (char c : id) {
      ok = ok && (isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.');
    }
    if (ok) {
      *from_client = true;
      return id;
    }
  }
  static const std::string* prefix = new std::string(RandomHex(4));
  static std::atomic<uint64_t> counter{0};
  return absl::StrCat(*prefix, "-", ++counter);
}

template <typename Resp, typename Fn>
grpc::Status BrokerService::Handle(grpc::ServerContext* ctx, absl::string_view method,
                                   const std::string& session_id, Resp* resp, Fn&& fn) {
  const absl::Time start = clock_->Monotonic();
  const std::string method_name(method);
  bool echo_id = false;
  const std::string request_id = RequestId(ctx, &echo_id);
  if (echo_id) ctx->AddInitialMetadata("x-request-id", request_id);
  {
    absl::MutexLock l(&mu_);
    if (draining_) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "the broker is shutting down; retry on another instance");
    }
    ++in_flight_;
  }
  if (metrics_) metrics_->CallStarted(method_name);
  std::string provider;
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  absl::string_view value;
  if (it != md.end()) value = absl::string_view(it->second.data(), it->second.size());
  // One snapshot of tokens and policy for the whole call.
  std::shared_ptr<const OperatorSnapshot> snapshot = auth_->snapshot();
  absl::StatusOr<std::string> tenant =
      Authenticator::AuthenticateWith(*snapshot, it != md.end() ? &value : nullptr);
  absl::Status status;
  if (!tenant.ok()) {
    status = tenant.status();
  } else {
    CallContext cc;
    cc.tenant = *tenant;
    cc.cancelled = [ctx] { return ctx->IsCancelled(); };
    cc.provider = &provider;
    cc.request_id = request_id;
    cc.snapshot = std::move(snapshot);
    auto r = fn(cc);
    status = r.status();
    if (r.ok()) *resp = std::move(*r);
  }
  const absl::Duration took = clock_->Monotonic() - start;
  const std::string code = absl::StatusCodeToString(status.code());
  const LogLevel level = status.ok() ? LogLevel::kInfo : LogLevel::kWarning;
  if (LogEnabled(level)) {
    Log(level, "rpc",
        {{"request_id", request_id},
         {"method", method},
         {"tenant", tenant.ok() ? *tenant : std::string("-")},
         {"session_id", session_id.size() <= 128 ? session_id : std::string("(invalid)")},
         {"provider", provider.empty() ? std::string("-") : provider},
         {"code", code},
         {"duration_ms", absl::ToInt64Milliseconds(took)}});
  }
  if (metrics_) metrics_->CallFinished(method_name, provider, code, took);
  {
    absl::MutexLock l(&mu_);
    --in_flight_;
  }
  return ToGrpcStatus(status);
}

#define SB_HANDLE(Method, sid)           \
  return Handle(ctx, #Method, sid, resp, \
                [&](const CallContext& cc) { return core_->Method(cc, *req); })

grpc::Status BrokerService::StartSession(grpc::ServerContext* ctx,
                                         const pb::StartSessionRequest* req,
                                         pb::SessionInfo* resp) {
  SB_HANDLE(StartSession, req->session_id());
}
grpc::Status BrokerService::CloseSession(grpc::ServerContext* ctx,
                                         const pb::CloseSessionRequest* req,
                                         pb::CloseSessionResponse* resp) {
  SB_HANDLE(CloseSession, req->session_id());
}
grpc::Status BrokerService::GetSession(grpc::ServerContext* ctx, const pb::GetSessionRequest* req,
                                       pb::SessionInfo* resp) {
  SB_HANDLE(GetSession, req->session_id());
}
grpc::Status BrokerService::ListSessions(grpc::ServerContext* ctx,
                                         const pb::ListSessionsRequest* req,
                                         pb::ListSessionsResponse* resp) {
  static const std::string kNone;
  SB_HANDLE(ListSessions, kNone);
}
grpc::Status BrokerService::Run(grpc::ServerContext* ctx, const pb::RunRequest* req,
                                pb::RunResult* resp) {
  SB_HANDLE(Run, req->session_id());
}
grpc::Status BrokerService::Shell(grpc::ServerContext* ctx, const pb::ShellRequest* req,
                                  pb::RunResult* resp) {
  SB_HANDLE(Shell, req->session_id());
}
grpc::Status BrokerService::WriteFile(grpc::ServerContext* ctx, const pb::WriteFileRequest* req,
                                      pb::WriteFileResponse* resp) {
  SB_HANDLE(WriteFile, req->session_id());
}
grpc::Status BrokerService::ReadFile(grpc::ServerContext* ctx, const pb::ReadFileRequest* req,
                                     pb::ReadFileResponse* resp) {
  SB_HANDLE(ReadFile, req->session_id());
}

grpc::Status BrokerService::KeepAlive(grpc::ServerContext* ctx, const pb::KeepAliveRequest* req,
                                      pb::KeepAliveResponse* resp) {
  SB_HANDLE(KeepAlive, req->session_id());
}
grpc::Status BrokerService::ListTools(grpc::ServerContext* ctx, const pb::ListToolsRequest* req,
                                      pb::ListToolsResponse* resp) {
  static const std::string kNone;
  SB_HANDLE(ListTools, kNone);
}
grpc::Status BrokerService::CallTool(grpc::ServerContext* ctx, const pb::CallToolRequest* req,
                                     pb::CallToolResponse* resp) {
  SB_HANDLE(CallTool, req->session_id());
}

grpc::Status BrokerService::RunStream(grpc::ServerContext* ctx, const pb::RunRequest* req,
                                      grpc::ServerWriter<pb::RunEvent>* writer) {
  pb::RunEvent last;
  return Handle(ctx, "RunStream", req->session_id(), &last, [&](const CallContext& cc) {
    auto on_chunk = [writer](OutputStream stream, absl::string_view data) {
      pb::RunEvent ev;
      ev.mutable_output()->set_stream(stream == OutputStream::kStdout ? pb::OUTPUT_STREAM_STDOUT
                                                                      : pb::OUTPUT_STREAM_STDERR);
      ev.mutable_output()->set_data(data.data(), data.size());
      // A failed write means the client is gone; the run sees the
      // cancellation and is killed.
      writer->Write(ev);
    };
    absl::StatusOr<pb::RunResult> r = core_->RunStream(cc, *req, on_chunk);
    if (!r.ok()) return absl::StatusOr<pb::RunEvent>(r.status());
    pb::RunEvent ev;
    *ev.mutable_result() = std::move(*r);
    writer->Write(ev);
    return absl::StatusOr<pb::RunEvent>(std::move(ev));
  });
}

#undef SB_HANDLE

}  // namespace sandbox
