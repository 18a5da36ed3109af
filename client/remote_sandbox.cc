#include "client/remote_sandbox.h"

#include <algorithm>
#include <istream>
#include <ostream>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace sandbox {
namespace {
// RPCs without a run timeout.
constexpr absl::Duration kCallTimeout = absl::Seconds(120);
// Added to a run's own timeout for the RPC deadline.
constexpr absl::Duration kRunMargin = absl::Seconds(60);
}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

RemoteSandbox::RemoteSandbox(std::shared_ptr<pb::SandboxBroker::StubInterface> stub,
                             std::string session_id, std::string token, pb::SessionSpec spec)
    : stub_(std::move(stub)),
      session_id_(std::move(session_id)),
      token_(std::move(token)),
      spec_(std::move(spec)) {}

std::shared_ptr<grpc::Channel> RemoteSandbox::MakeChannel(const std::string& address,
                                                          const Tls& tls) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (tls.enabled) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = tls.root_certs_pem;
    o.pem_cert_chain = tls.client_cert_pem;
    o.pem_private_key = tls.client_key_pem;
    creds = grpc::SslCredentials(o);
  }
  return grpc::CreateCustomChannel(address, creds, args);
}

std::unique_ptr<RemoteSandbox> RemoteSandbox::Connect(const std::string& address,
                                                      const std::string& token,
                                                      const std::string& session_id,
                                                      pb::SessionSpec spec, const Tls& tls) {
  return std::make_unique<RemoteSandbox>(pb::SandboxBroker::NewStub(MakeChannel(address, tls)),
                                         session_id, token, std::move(spec));
}

absl::StatusOr<std::string> RemoteSandbox::Health(const std::shared_ptr<grpc::Channel>& channel,
                                                  const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status s = stub->Check(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status());
}

void RemoteSandbox::Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const {
  if (!token_.empty()) ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token_));
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

absl::StatusOr<pb::SessionInfo> RemoteSandbox::Start() {
  grpc::ClientContext ctx;
  Prepare(&ctx, kCallTimeout);
  pb::StartSessionRequest req;
  req.set_session_id(session_id_);
  *req.mutable_spec() = spec_;
  pb::SessionInfo resp;
  grpc::Status s = stub_->StartSession(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

pb::RunRequest RemoteSandbox::PrepareRun(grpc::ClientContext* ctx, const std::string& code,
                                         const RemoteRunOptions& options) const {
  // The broker's own default timeout is at most its max; allow for it.
  const int t = options.timeout_seconds > 0 ? options.timeout_seconds : 3600;
  Prepare(ctx, absl::Seconds(t) + kRunMargin);
  pb::RunRequest req;
  req.set_session_id(session_id_);
  req.set_code(code);
  req.set_language(options.language);
  req.set_timeout_seconds(options.timeout_seconds);
  req.mutable_env()->insert(options.env.begin(), options.env.end());
  *req.mutable_spec() = spec_;
  return req;
}

absl::StatusOr<pb::RunResult> RemoteSandbox::Run(const std::string& code,
                                                 const RemoteRunOptions& options) {
  grpc::ClientContext ctx;
  pb::RunRequest req = PrepareRun(&ctx, code, options);
  pb::RunResult resp;
  grpc::Status s = stub_->Run(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::StatusOr<pb::RunResult> RemoteSandbox::Shell(const std::string& command, int timeout_seconds,
                                                   const std::map<std::string, std::string>& env) {
  grpc::ClientContext ctx;
  const int t = timeout_seconds > 0 ? timeout_seconds : 3600;
  Prepare(&ctx, absl::Seconds(t) + kRunMargin);
  pb::ShellRequest req;
  req.set_session_id(session_id_);
  req.set_command(command);
  req.set_timeout_seconds(timeout_seconds);
  req.mutable_env()->insert(env.begin(), env.end());
  *req.mutable_spec() = spec_;
  pb::RunResult resp;
  grpc::Status s = stub_->Shell(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::Status RemoteSandbox::WriteFile(const std::string& path, const std::string& contents,
                                      pb::Encoding encoding) {
  grpc::ClientContext ctx;
  Prepare(&ctx, kCallTimeout);
  pb::WriteFileRequest req;
  req.set_session_id(session_id_);
  req.set_path(path);
  req.set_contents(contents);
  req.set_encoding(encoding);
  *req.mutable_spec() = spec_;
  pb::WriteFileResponse resp;
  return FromGrpcStatus(stub_->WriteFile(&ctx, req, &resp));
}

absl::StatusOr<std::optional<std::string>> RemoteSandbox::ReadFile(const std::string& path,
                                                                   pb::Encoding encoding) {
  grpc::ClientContext ctx;
  Prepare(&ctx, kCallTimeout);
  pb::ReadFileRequest req;
  req.set_session_id(session_id_);
  req.set_path(path);
  req.set_encoding(encoding);
  *req.mutable_spec() = spec_;
  pb::ReadFileResponse resp;
  grpc::Status s = stub_->ReadFile(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  if (!resp.found()) return std::optional<std::string>();
  return std::optional<std::string>(std::move(*resp.mutable_contents()));
}

absl::StatusOr<bool> RemoteSandbox::Close() {
  grpc::ClientContext ctx;
  Prepare(&ctx, kCallTimeout);
  pb::CloseSessionRequest req;
  req.set_session_id(session_id_);
  pb::CloseSessionResponse resp;
  grpc::Status s = stub_->CloseSession(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp.existed();
}

absl::StatusOr<pb::SessionInfo> RemoteSandbox::Info() {
  grpc::ClientContext ctx;
  Prepare(&ctx, kCallTimeout);
  pb::GetSessionRequest req;
  req.set_session_id(session_id_);
  pb::SessionInfo resp;
  grpc::Status s = stub_->GetSession(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::StatusOr<pb::RunResult> RemoteSandbox::RunStream(
    const std::string& code, const RemoteRunOptions& options,
    const std::function<void(pb::OutputStream, const std::string&)>& on_chunk) {
  grpc::ClientContext ctx;
  pb::RunRequest req = PrepareRun(&ctx, code, options);
  auto reader = stub_->RunStream(&ctx, req);
  pb::RunEvent ev;
  std::optional<pb::RunResult> result;
  while (reader->Read(&ev)) {
    if (ev.has_output()) {
      if (on_chunk) on_chunk(ev.output().stream(), ev.output().data());
    } else if (ev.has_result()) {
      result = std::move(*ev.mutable_result());
    }
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) return FromGrpcStatus(s);
  if (!result) return absl::InternalError("stream ended without a result");
  return *result;
}

absl::StatusOr<int64_t> RemoteSandbox::KeepAlive() {
  grpc::ClientContext ctx;
  Prepare(&ctx, kCallTimeout);
  pb::KeepAliveRequest req;
  req.set_session_id(session_id_);
  pb::KeepAliveResponse resp;
  grpc::Status s = stub_->KeepAlive(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp.idle_expires_at().seconds();
}

absl::StatusOr<std::vector<pb::Tool>> RemoteSandbox::ListTools(const std::string& provider,
                                                               const std::string& dialect) {
  grpc::ClientContext ctx;
  Prepare(&ctx, kCallTimeout);
  pb::ListToolsRequest req;
  req.set_provider(provider);
  req.set_dialect(dialect);
  pb::ListToolsResponse resp;
  grpc::Status s = stub_->ListTools(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return std::vector<pb::Tool>(resp.tools().begin(), resp.tools().end());
}

absl::StatusOr<pb::CallToolResponse> RemoteSandbox::CallTool(const std::string& name,
                                                             const std::string& arguments_json) {
  grpc::ClientContext ctx;
  Prepare(&ctx, absl::Seconds(3600) + kRunMargin);
  pb::CallToolRequest req;
  req.set_session_id(session_id_);
  req.set_name(name);
  req.set_arguments_json(arguments_json);
  *req.mutable_spec() = spec_;
  pb::CallToolResponse resp;
  grpc::Status s = stub_->CallTool(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::StatusOr<std::optional<std::vector<pb::FileEntry>>> RemoteSandbox::ListFiles(
    const std::string& path, int depth) {
  std::vector<pb::FileEntry> out;
  auto req = FileRequest<pb::ListFilesRequest>();
  req.set_path(path);
  req.set_depth(depth);
  do {
    grpc::ClientContext ctx;
    Prepare(&ctx, kCallTimeout);
    pb::ListFilesResponse resp;
    grpc::Status s = stub_->ListFiles(&ctx, req, &resp);
    if (!s.ok()) return FromGrpcStatus(s);
    if (!resp.found()) return std::optional<std::vector<pb::FileEntry>>();
    for (auto& e : *resp.mutable_entries()) out.push_back(std::move(e));
    req.set_page_token(resp.next_page_token());
  } while (!req.page_token().empty());
  return std::optional<std::vector<pb::FileEntry>>(std::move(out));
}

absl::StatusOr<std::optional<pb::FileEntry>> RemoteSandbox::StatFile(const std::string& path) {
  grpc::ClientContext ctx;
  Prepare(&ctx, kCallTimeout);
  auto req = FileRequest<pb::StatFileRequest>();
  req.set_path(path);
  pb::StatFileResponse resp;
  grpc::Status s = stub_->StatFile(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  if (!resp.found()) return std::optional<pb::FileEntry>();
  return std::optional<pb::FileEntry>(std::move(*resp.mutable_entry()));
}

absl::Status RemoteSandbox::MakeDir(const std::string& path, bool parents) {
  grpc::ClientContext ctx;
  Prepare(&ctx, kCallTimeout);
  auto req = FileRequest<pb::MakeDirRequest>();
  req.set_path(path);
  req.set_parents(parents);
  pb::MakeDirResponse resp;
  return FromGrpcStatus(stub_->MakeDir(&ctx, req, &resp));
}

absl::StatusOr<bool> RemoteSandbox::RemoveFile(const std::string& path, bool recursive) {
  grpc::ClientContext ctx;
  Prepare(&ctx, kCallTimeout);
  auto req = FileRequest<pb::RemoveFileRequest>();
  req.set_path(path);
  req.set_recursive(recursive);
  pb::RemoveFileResponse resp;
  grpc::Status s = stub_->RemoveFile(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp.existed();
}

absl::Status RemoteSandbox::MoveFile(const std::string& source, const std::string& destination,
                                     bool overwrite) {
  grpc::ClientContext ctx;
  Prepare(&ctx, kCallTimeout);
  auto req = FileRequest<pb::MoveFileRequest>();
  req.set_source(source);
  req.set_destination(destination);
  req.set_overwrite(overwrite);
  pb::MoveFileResponse resp;
  return FromGrpcStatus(stub_->MoveFile(&ctx, req, &resp));
}

absl::StatusOr<pb::Context> RemoteSandbox::CreateContext(pb::Language language,
                                                         const std::string& cwd) {
  grpc::ClientContext ctx;
  Prepare(&ctx, kCallTimeout);
  auto req = FileRequest<pb::CreateContextRequest>();
  req.set_language(language);
  req.set_cwd(cwd);
  pb::Context resp;
  grpc::Status s = stub_->CreateContext(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::StatusOr<std::vector<pb::Context>> RemoteSandbox::ListContexts() {
  grpc::ClientContext ctx;
  Prepare(&ctx, kCallTimeout);
  auto req = FileRequest<pb::ListContextsRequest>();
  pb::ListContextsResponse resp;
  grpc::Status s = stub_->ListContexts(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return std::vector<pb::Context>(resp.contexts().begin(), resp.contexts().end());
}

absl::StatusOr<pb::Context> RemoteSandbox::RestartContext(const std::string& context_id) {
  grpc::ClientContext ctx;
  Prepare(&ctx, kCallTimeout);
  auto req = FileRequest<pb::RestartContextRequest>();
  req.set_context_id(context_id);
  pb::Context resp;
  grpc::Status s = stub_->RestartContext(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::StatusOr<bool> RemoteSandbox::DeleteContext(const std::string& context_id) {
  grpc::ClientContext ctx;
  Prepare(&ctx, kCallTimeout);
  auto req = FileRequest<pb::DeleteContextRequest>();
  req.set_context_id(context_id);
  pb::DeleteContextResponse resp;
  grpc::Status s = stub_->DeleteContext(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp.existed();
}

absl::StatusOr<pb::Execution> RemoteSandbox::RunCode(const std::string& code,
                                                     const std::string& context_id,
                                                     int timeout_seconds) {
  grpc::ClientContext ctx;
  // The execution's own timeout, then the interrupt's grace and a kernel's
  // start.
  Prepare(&ctx, kCallTimeout + absl::Seconds(timeout_seconds));
  auto req = FileRequest<pb::RunCodeRequest>();
  req.set_code(code);
  req.set_context_id(context_id);
  req.set_timeout_seconds(timeout_seconds);
  pb::Execution resp;
  grpc::Status s = stub_->RunCode(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::StatusOr<int64_t> RemoteSandbox::UploadFile(const std::string& path, std::istream& in,
                                                  const TransferOptions& options) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options.timeout);
  pb::UploadFileResponse resp;
  std::unique_ptr<grpc::ClientWriterInterface<pb::UploadFileRequest>> writer =
      stub_->UploadFile(&ctx, &resp);
  pb::UploadFileRequest msg;
  pb::UploadFileHeader* h = msg.mutable_header();
  h->set_session_id(session_id_);
  h->set_path(path);
  h->set_mode(options.mode);
  if (options.size) h->set_size(*options.size);
  *h->mutable_spec() = spec_;
  bool open = writer->Write(msg);
  std::string chunk(std::max<size_t>(options.chunk_bytes, 1), '\0');
  int64_t sent = 0;
  while (open && in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    const size_t n = static_cast<size_t>(in.gcount());
    if (n == 0) break;
    msg.set_chunk(chunk.data(), n);
    open = writer->Write(msg);
    sent += static_cast<int64_t>(n);
    if (open && options.progress) options.progress(sent);
  }
  if (in.bad()) {
    ctx.TryCancel();
    (void)writer->Finish();
    return absl::DataLossError("reading the local file failed; the upload was cancelled");
  }
  msg.set_commit(true);
  if (open) (void)writer->Write(msg);
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  if (!s.ok()) return FromGrpcStatus(s);
  return resp.bytes_written();
}

absl::StatusOr<std::optional<pb::FileEntry>> RemoteSandbox::DownloadFile(
    const std::string& path, std::ostream& out, const TransferOptions& options) {
  grpc::ClientContext ctx;
  Prepare(&ctx, options.timeout);
  auto req = FileRequest<pb::DownloadFileRequest>();
  req.set_path(path);
  req.set_offset(options.offset);
  req.set_length(options.length);
  std::unique_ptr<grpc::ClientReaderInterface<pb::DownloadFileResponse>> reader =
      stub_->DownloadFile(&ctx, req);
  pb::DownloadFileResponse msg;
  std::optional<pb::FileEntry> entry;
  int64_t received = 0;
  while (reader->Read(&msg)) {
    if (msg.has_header()) {
      if (msg.header().found()) entry = msg.header().entry();
      continue;
    }
    out.write(msg.chunk().data(), static_cast<std::streamsize>(msg.chunk().size()));
    if (!out) {
      ctx.TryCancel();
      (void)reader->Finish();
      return absl::DataLossError("writing the local file failed; the download was cancelled");
    }
    received += static_cast<int64_t>(msg.chunk().size());
    if (options.progress) options.progress(received);
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) return FromGrpcStatus(s);
  return entry;
}

absl::StatusOr<std::vector<pb::SessionInfo>> RemoteSandbox::ListSessions() {
  std::vector<pb::SessionInfo> out;
  std::string token;
  do {
    grpc::ClientContext ctx;
    Prepare(&ctx, kCallTimeout);
    pb::ListSessionsRequest req;
    req.set_page_token(token);
    pb::ListSessionsResponse resp;
    grpc::Status s = stub_->ListSessions(&ctx, req, &resp);
    if (!s.ok()) return FromGrpcStatus(s);
    for (auto& info : *resp.mutable_sessions()) out.push_back(std::move(info));
    token = resp.next_page_token();
  } while (!token.empty());
  return out;
}

}  // namespace sandbox
