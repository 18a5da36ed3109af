#include "client/mcp_grpc_backend.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/remote_sandbox.h"
#include "common/text.h"
#include "protocol/tools.h"

namespace sandbox {
namespace {

// Cancels `ctx` once `cancelled` says so, until destroyed.
class CancelWatch {
 public:
  CancelWatch(grpc::ClientContext* ctx, std::function<bool()> cancelled) {
    if (!cancelled) return;
    thread_ = std::thread([this, ctx, cancelled] {
      while (!done_.WaitForNotificationWithTimeout(absl::Milliseconds(50))) {
        if (cancelled()) {
          ctx->TryCancel();
          return;
        }
      }
    });
  }
  ~CancelWatch() {
    done_.Notify();
    if (thread_.joinable()) thread_.join();
  }

 private:
  absl::Notification done_;
  std::thread thread_;
};

}  // namespace

void McpGrpcBackend::Prepare(grpc::ClientContext* ctx) const {
  if (!token_.empty()) ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token_));
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Hours(24)));
}

absl::StatusOr<std::vector<pb::Tool>> McpGrpcBackend::ListTools(const std::string&) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  pb::ListToolsResponse resp;
  grpc::Status s = stub_->ListTools(&ctx, pb::ListToolsRequest(), &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return std::vector<pb::Tool>(resp.tools().begin(), resp.tools().end());
}

absl::StatusOr<McpToolOutcome> McpGrpcBackend::CallTool(const McpCall& call,
                                                        const pb::CallToolRequest& req) {
  absl::StatusOr<ToolName> name = ParseToolName(req.name());
  if (call.on_output && name.ok() && (name->op == ToolOp::kRun || name->op == ToolOp::kShell)) {
    // Limits are the broker's to enforce; these only shape the request.
    ToolLimits open;
    open.max_timeout_seconds = INT32_MAX;
    absl::StatusOr<ToolArgs> args = ParseToolArgs(name->op, req.arguments_json(), open);
    if (args.ok()) {
      pb::RunRequest run;
      run.set_session_id(req.session_id());
      run.set_code(args->code);
      run.set_language(name->op == ToolOp::kShell ? pb::LANGUAGE_SHELL : args->language);
      run.set_timeout_seconds(args->timeout_seconds);
      run.mutable_spec()->set_provider(name->provider);
      return Stream(call, req, run);
    }
    // Bad arguments: let the broker word the error.
  }
  grpc::ClientContext ctx;
  Prepare(&ctx);
  CancelWatch watch(&ctx, call.cancelled);
  pb::CallToolResponse resp;
  grpc::Status s = stub_->CallTool(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  McpToolOutcome out;
  if (!resp.is_error() && name.ok()) {
    if (name->op == ToolOp::kRun || name->op == ToolOp::kShell) {
      pb::RunResult r;
      if (ParseRunResult(resp.content(), &r)) out.run = r;
    } else if (name->op == ToolOp::kReadFile) {
      out.found = resp.content() != kFileNotFound;
    }
  }
  out.response = std::move(resp);
  return out;
}

absl::StatusOr<McpToolOutcome> McpGrpcBackend::Stream(const McpCall& call,
                                                      const pb::CallToolRequest& req,
                                                      const pb::RunRequest& run) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  CancelWatch watch(&ctx, call.cancelled);
  std::unique_ptr<grpc::ClientReaderInterface<pb::RunEvent>> reader = stub_->RunStream(&ctx, run);
  pb::RunEvent ev;
  std::string output;
  pb::RunResult result;
  bool have_result = false;
  while (reader->Read(&ev)) {
    if (ev.has_output()) {
      output += ev.output().data();
      call.on_output(ev.output().data());
    } else if (ev.has_result()) {
      result = ev.result();
      have_result = true;
    }
  }
  grpc::Status s = reader->Finish();
  McpToolOutcome out;
  if (!s.ok() || !have_result) {
    absl::Status st =
        s.ok() ? absl::InternalError("the run ended without a result") : FromGrpcStatus(s);
    if (st.code() == absl::StatusCode::kCancelled) return st;
    out.response.set_is_error(true);
    out.response.set_content(ToolErrorText(st));
    return out;
  }
  result.set_output(RepairUtf8(output));
  out.response.set_content(FormatRunResult(result));
  out.run = result;
  return out;
}

void McpGrpcBackend::CloseSession(const std::string&, const std::string& session_id) {
  grpc::ClientContext ctx;
  Prepare(&ctx);
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  pb::CloseSessionRequest req;
  req.set_session_id(session_id);
  pb::CloseSessionResponse resp;
  (void)stub_->CloseSession(&ctx, req, &resp);
}

}  // namespace sandbox
