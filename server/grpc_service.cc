#include "server/grpc_service.h"

#include <deque>

#include "common/log.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"
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
                             Metrics* metrics, const BrokerConfig::Limits& limits)
    : core_(core),
      auth_(auth),
      clock_(clock),
      metrics_(metrics),
      calls_("max_calls_in_flight", limits.max_calls_in_flight, limits.max_queued_calls,
             absl::Milliseconds(limits.queue_timeout_ms)) {
  // The method indices are the proto's order (broker.proto).
  using M = Mode;
  // The handlers hold the core, not this service: work still running on the
  // pool at shutdown never touches a destroyed service.
  auto blocking = [core](auto call) {
    return [core, call](const CallContext& cc, auto req, auto done) {
      core->blocking_pool()->Submit([core, call, cc, req, done] { done((core->*call)(cc, *req)); });
    };
  };
  auto inline_ = [core](auto call) {
    return [core, call](const CallContext& cc, auto req, auto done) {
      done((core->*call)(cc, *req));
    };
  };
  (void)sizeof(M);
  RegisterUnary<pb::StartSessionRequest, pb::SessionInfo>(0, "StartSession",
                                                          blocking(&BrokerCore::StartSession));
  RegisterUnary<pb::CloseSessionRequest, pb::CloseSessionResponse>(
      1, "CloseSession", blocking(&BrokerCore::CloseSession));
  RegisterUnary<pb::GetSessionRequest, pb::SessionInfo>(2, "GetSession",
                                                        inline_(&BrokerCore::GetSession));
  RegisterUnary<pb::ListSessionsRequest, pb::ListSessionsResponse>(
      3, "ListSessions", inline_(&BrokerCore::ListSessions));
  RegisterUnary<pb::RunRequest, pb::RunResult>(
      4, "Run", [core](const CallContext& cc, auto req, auto done) {
        core->RunAsync(cc, *req, [req, done](absl::StatusOr<pb::RunResult> r) { done(std::move(r)); });
      });
  RegisterUnary<pb::ShellRequest, pb::RunResult>(
      5, "Shell", [core](const CallContext& cc, auto req, auto done) {
        core->ShellAsync(cc, *req,
                          [req, done](absl::StatusOr<pb::RunResult> r) { done(std::move(r)); });
      });
  RegisterUnary<pb::WriteFileRequest, pb::WriteFileResponse>(6, "WriteFile",
                                                             blocking(&BrokerCore::WriteFile));
  RegisterUnary<pb::ReadFileRequest, pb::ReadFileResponse>(7, "ReadFile",
                                                           blocking(&BrokerCore::ReadFile));
  MarkMethodRawCallback(
      8, new grpc::internal::CallbackServerStreamingHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
             [this](grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
               return RunStream(ctx, request);
             }));
  RegisterUnary<pb::KeepAliveRequest, pb::KeepAliveResponse>(9, "KeepAlive",
                                                             blocking(&BrokerCore::KeepAlive));
  RegisterUnary<pb::ListToolsRequest, pb::ListToolsResponse>(10, "ListTools",
                                                             inline_(&BrokerCore::ListTools));
  using CallToolFn = absl::StatusOr<pb::CallToolResponse> (BrokerCore::*)(
      const CallContext&, const pb::CallToolRequest&);
  RegisterUnary<pb::CallToolRequest, pb::CallToolResponse>(
      11, "CallTool", blocking(static_cast<CallToolFn>(&BrokerCore::CallTool)));
}

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
std::string RequestId(const grpc::ServerContextBase* ctx, bool* from_client) {
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

struct BrokerService::Call {
  grpc::CallbackServerContext* ctx = nullptr;
  std::string method;
  std::string session_id;
  std::string request_id;
  absl::Time start;
  std::string tenant = "-";
  std::string provider;  // CallContext::provider points here
  bool counted = false;  // in in_flight_
  LimitSlot slot;        // max_calls_in_flight
};

void BrokerService::Begin(const std::shared_ptr<Call>& call,
                          std::function<void(const CallContext&)> go,
                          std::function<void(absl::Status)> fail) {
  grpc::CallbackServerContext* ctx = call->ctx;
  call->start = clock_->Monotonic();
  bool echo_id = false;
  call->request_id = RequestId(ctx, &echo_id);
  if (echo_id) ctx->AddInitialMetadata("x-request-id", call->request_id);
  {
    absl::MutexLock l(&mu_);
    if (draining_) {
      fail(absl::UnavailableError("the broker is shutting down; retry on another instance"));
      return;
    }
    ++in_flight_;
    call->counted = true;
  }
  if (metrics_) metrics_->CallStarted(call->method);
  calls_.Acquire([this, call, go = std::move(go), fail = std::move(fail)](absl::Status admitted) {
    if (!admitted.ok()) {
      if (metrics_) metrics_->LimitRefused(calls_.name());
      fail(admitted);
      return;
    }
    call->slot = LimitSlot(&calls_);
    const auto& md = call->ctx->client_metadata();
    auto it = md.find("authorization");
    absl::string_view value;
    if (it != md.end()) value = absl::string_view(it->second.data(), it->second.size());
    // One snapshot of tokens and policy for the whole call.
    std::shared_ptr<const OperatorSnapshot> snapshot = auth_->snapshot();
    absl::StatusOr<std::string> tenant =
        Authenticator::AuthenticateWith(*snapshot, it != md.end() ? &value : nullptr);
    if (!tenant.ok()) {
      fail(tenant.status());
      return;
    }
    call->tenant = *tenant;
    CallContext cc;
    cc.tenant = *tenant;
    grpc::CallbackServerContext* sctx = call->ctx;
    cc.cancelled = [sctx] { return sctx->IsCancelled(); };
    cc.provider = &call->provider;
    cc.request_id = call->request_id;
    cc.snapshot = std::move(snapshot);
    go(cc);
  });
}

grpc::Status BrokerService::End(Call& call, const absl::Status& status) {
  const absl::Duration took = clock_->Monotonic() - call.start;
  const std::string code = absl::StatusCodeToString(status.code());
  const LogLevel level = status.ok() ? LogLevel::kInfo : LogLevel::kWarning;
  if (LogEnabled(level)) {
    const std::string& sid = call.session_id;
    Log(level, "rpc",
        {{"request_id", call.request_id},
         {"method", call.method},
         {"tenant", call.tenant},
         {"session_id", sid.size() <= 128 ? sid : std::string("(invalid)")},
         {"provider", call.provider.empty() ? std::string("-") : call.provider},
         {"code", code},
         {"duration_ms", absl::ToInt64Milliseconds(took)}});
  }
  call.slot.Release();
  if (call.counted) {
    if (metrics_) metrics_->CallFinished(call.method, call.provider, code, took);
    absl::MutexLock l(&mu_);
    --in_flight_;
    call.counted = false;
  }
  return ToGrpcStatus(status);
}

namespace {

// The session id of a request, for the log line (none for the listings).
template <typename Req>
std::string SessionOf(const Req& r) {
  return r.session_id();
}
template <>
std::string SessionOf(const pb::ListSessionsRequest&) {
  return "";
}
template <>
std::string SessionOf(const pb::ListToolsRequest&) {
  return "";
}

template <typename Req>
absl::Status Parse(const grpc::ByteBuffer* in, Req* req) {
  grpc::ByteBuffer copy(*in);
  grpc::Status s = grpc::GenericDeserialize<grpc::ProtoBufferReader, Req>(&copy, req);
  if (s.ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("the request is not a valid ", Req::descriptor()->full_name(),
                   " (string fields must be valid UTF-8)"));
}

template <typename Resp>
void Serialize(const Resp& r, grpc::ByteBuffer* out) {
  bool own = false;
  grpc::GenericSerialize<grpc::ProtoBufferWriter, Resp>(r, out, &own);
}

}  // namespace

template <typename Req, typename Resp, typename Handler>
void BrokerService::RegisterUnary(int index, const char* method, Handler handler) {
  MarkMethodRawCallback(
      index,
      new grpc::internal::CallbackUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
          [this, method, handler](grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                  grpc::ByteBuffer* out) {
            auto req = std::make_shared<Req>();
            absl::Status parsed = Parse(in, req.get());
            if (!parsed.ok()) {
              grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
              auto call = std::make_shared<Call>();
              call->ctx = ctx;
              call->method = method;
              call->start = clock_->Monotonic();
              reactor->Finish(End(*call, parsed));
              return reactor;
            }
            Store<Resp> store = [out](Resp&& r) { Serialize(r, out); };
            return UnaryAsync<Resp>(
                ctx, method, SessionOf(*req), std::move(store),
                [handler, req](const CallContext& cc,
                               std::function<void(absl::StatusOr<Resp>)> done) {
                  handler(cc, std::shared_ptr<const Req>(req), std::move(done));
                });
          }));
}

template <typename Resp, typename AsyncFn>
grpc::ServerUnaryReactor* BrokerService::UnaryAsync(grpc::CallbackServerContext* ctx,
                                                    absl::string_view method,
                                                    const std::string& session_id,
                                                    Store<Resp> store, AsyncFn fn) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto call = std::make_shared<Call>();
  call->ctx = ctx;
  call->method = std::string(method);
  call->session_id = session_id;
  auto finish = [this, call, reactor](absl::Status st) { reactor->Finish(End(*call, st)); };
  Begin(
      call,
      [fn = std::move(fn), store = std::move(store), finish](const CallContext& cc) mutable {
        fn(cc, [store, finish](absl::StatusOr<Resp> r) {
          if (r.ok()) store(std::move(*r));
          finish(r.status());
        });
      },
      finish);
  return reactor;
}

namespace {

// RunStream's writer: output chunks queue here and go out one write at a
// time. Past kMaxBuffered bytes not yet written (a slow reader) the run's
// producer is paused (ExecRequest::output_ready) until the queue drains to
// half. Deletes itself when gRPC is done with the call.
class RunStreamReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  static constexpr size_t kMaxBuffered = 256 * 1024;

  explicit RunStreamReactor(std::function<void(bool)> on_done) : on_done_(std::move(on_done)) {}

  void Chunk(OutputStream stream, absl::string_view data) {
    pb::RunEvent ev;
    ev.mutable_output()->set_stream(stream == OutputStream::kStdout ? pb::OUTPUT_STREAM_STDOUT
                                                                    : pb::OUTPUT_STREAM_STDERR);
    ev.mutable_output()->set_data(data.data(), data.size());
    Enqueue(std::move(ev), data.size());
  }

  // ExecRequest::output_ready.
  bool Ready(std::function<void()> resume) {
    absl::MutexLock l(&mu_);
    if (buffered_ <= kMaxBuffered || broken_) return true;
    resume_ = std::move(resume);
    return false;
  }

  // The run's end: the result event (when OK), then the status.
  void Complete(absl::StatusOr<pb::RunResult> r, grpc::Status status) {
    if (r.ok()) {
      pb::RunEvent ev;
      *ev.mutable_result() = std::move(*r);
      Enqueue(std::move(ev), 0);
    }
    bool finish;
    {
      absl::MutexLock l(&mu_);
      final_ = std::move(status);
      has_final_ = true;
      finish = ShouldFinishLocked();
    }
    if (finish) Finish(final_);
  }

  // gRPC calls are made with no lock held; writing_ keeps one write out at
  // a time, and queued events never move (a deque).
  void OnWriteDone(bool ok) override {
    std::function<void()> resume;
    grpc::ByteBuffer* next = nullptr;
    bool finish = false;
    {
      absl::MutexLock l(&mu_);
      buffered_ -= sizes_.front();
      sizes_.pop_front();
      queue_.pop_front();
      if (!ok) {
        // The client is gone: drop the rest (the run sees the
        // cancellation and is killed).
        broken_ = true;
        queue_.clear();
        sizes_.clear();
        buffered_ = 0;
      }
      writing_ = !queue_.empty();
      if (writing_) {
        next = &queue_.front();
      } else {
        finish = ShouldFinishLocked();
      }
      if (resume_ && buffered_ <= kMaxBuffered / 2) resume = std::move(resume_);
    }
    if (next) StartWrite(next);
    if (finish) Finish(final_);
    if (resume) resume();
  }

  void OnDone() override {
    if (on_done_) on_done_(true);
    delete this;
  }

 private:
  void Enqueue(pb::RunEvent ev, size_t bytes) {
    grpc::ByteBuffer bb;
    Serialize(ev, &bb);
    grpc::ByteBuffer* first = nullptr;
    {
      absl::MutexLock l(&mu_);
      if (broken_) return;
      queue_.push_back(std::move(bb));
      sizes_.push_back(bytes);
      buffered_ += bytes;
      if (!writing_) {
        writing_ = true;
        first = &queue_.front();
      }
    }
    if (first) StartWrite(first);
  }

  bool ShouldFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (has_final_ && !writing_ && !finished_) {
      finished_ = true;
      return true;
    }
    return false;
  }

  std::function<void(bool)> on_done_;
  absl::Mutex mu_;
  std::deque<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(mu_);
  std::deque<size_t> sizes_ ABSL_GUARDED_BY(mu_);
  size_t buffered_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool has_final_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_ ABSL_GUARDED_BY(mu_);
  std::function<void()> resume_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* BrokerService::RunStream(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
  auto* reactor = new RunStreamReactor(nullptr);
  auto call = std::make_shared<Call>();
  call->ctx = ctx;
  call->method = "RunStream";
  auto req = std::make_shared<pb::RunRequest>();
  if (absl::Status parsed = Parse(request, req.get()); !parsed.ok()) {
    call->start = clock_->Monotonic();
    reactor->Complete(absl::StatusOr<pb::RunResult>(parsed), End(*call, parsed));
    return reactor;
  }
  call->session_id = req->session_id();
  auto fail = [this, call, reactor](absl::Status st) {
    reactor->Complete(absl::StatusOr<pb::RunResult>(st), End(*call, st));
  };
  Begin(
      call,
      [this, req, call, reactor](const CallContext& cc) {
        core_->RunStreamAsync(
            cc, *req,
            [reactor](OutputStream stream, absl::string_view data) {
              reactor->Chunk(stream, data);
            },
            [reactor](std::function<void()> resume) { return reactor->Ready(std::move(resume)); },
            [this, call, reactor, req](absl::StatusOr<pb::RunResult> r) {
              grpc::Status st = End(*call, r.status());
              reactor->Complete(std::move(r), std::move(st));
            });
      },
      fail);
  return reactor;
}

}  // namespace sandbox
