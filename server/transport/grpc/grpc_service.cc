#include "server/transport/grpc/grpc_service.h"

#include <deque>

#include "common/log.h"
#include "common/request_id.h"
#include "common/text.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"

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

namespace {

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

}  // namespace

BrokerService::BrokerService(BrokerCore* core, const Authenticator* auth, Clock* clock,
                             Metrics* metrics, const BrokerConfig::Limits& limits)
    : core_(core),
      auth_(auth),
      clock_(clock),
      metrics_(metrics != nullptr ? metrics : Metrics::Discard()),
      calls_("max_calls_in_flight", limits.max_calls_in_flight, limits.max_queued_calls,
             absl::Milliseconds(limits.queue_timeout_ms)) {
  // The method indices are the proto's order (broker.proto).
  using M = Mode;
  // The handlers hold the core, not this service: work still running on the
  // pool at shutdown never touches a destroyed service.
  auto inline_ = [core](auto call) {
    return
        [core, call](const CallContext& cc, auto req, auto done) { done((core->*call)(cc, *req)); };
  };
  (void)sizeof(M);
  // A new session's create holds no thread while the provider works; the
  // short rest of StartSession runs on the pool.
  auto creating = [core](auto call, auto valid) {
    return [core, call, valid](const CallContext& cc, auto req, auto done) {
      core->EnsureSessionAsync(
          cc, req->session_id(), req->spec(), [&req, &valid] { return valid(*req); },
          [core, call, cc, req, done](absl::Status created) {
            if (!created.ok()) return done(created);
            core->blocking_pool()->Submit(
                [core, call, cc, req, done] { done((core->*call)(cc, *req)); });
          });
    };
  };
  RegisterUnary<pb::StartSessionRequest, pb::SessionInfo>(
      0, "StartSession",
      creating(&BrokerCore::StartSession, [](const pb::StartSessionRequest&) { return true; }));
  RegisterUnary<pb::CloseSessionRequest, pb::CloseSessionResponse>(
      1, "CloseSession", [core](const CallContext& cc, auto req, auto done) {
        core->CloseSessionAsync(cc, *req, [req, done](auto r) { done(std::move(r)); });
      });
  RegisterUnary<pb::GetSessionRequest, pb::SessionInfo>(2, "GetSession",
                                                        inline_(&BrokerCore::GetSession));
  // With more than one broker the listing reads etcd: on the pool.
  RegisterUnary<pb::ListSessionsRequest, pb::ListSessionsResponse>(
      3, "ListSessions", [core](const CallContext& cc, auto req, auto done) {
        if (core->cluster() == nullptr) {
          done(core->ListSessions(cc, *req));
          return;
        }
        core->blocking_pool()->Submit(
            [core, cc, req, done] { done(core->ListSessions(cc, *req)); });
      });
  RegisterUnary<pb::RunRequest, pb::RunResult>(
      4, "Run", [core](const CallContext& cc, auto req, auto done) {
        core->RunAsync(cc, *req,
                       [req, done](absl::StatusOr<pb::RunResult> r) { done(std::move(r)); });
      });
  RegisterUnary<pb::ShellRequest, pb::RunResult>(
      5, "Shell", [core](const CallContext& cc, auto req, auto done) {
        core->ShellAsync(cc, *req,
                         [req, done](absl::StatusOr<pb::RunResult> r) { done(std::move(r)); });
      });
  // File transfers wait on the provider holding no thread: a new session's
  // create and the transfer itself are callbacks.
  RegisterUnary<pb::WriteFileRequest, pb::WriteFileResponse>(
      6, "WriteFile", [core](const CallContext& cc, auto req, auto done) {
        core->WriteFileAsync(cc, *req, [req, done](auto r) { done(std::move(r)); });
      });
  RegisterUnary<pb::ReadFileRequest, pb::ReadFileResponse>(
      7, "ReadFile", [core](const CallContext& cc, auto req, auto done) {
        core->ReadFileAsync(cc, *req, [req, done](auto r) { done(std::move(r)); });
      });
  MarkMethodRawCallback(
      8, new grpc::internal::CallbackServerStreamingHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
             [this](grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
               return RunStream(ctx, request);
             }));
  RegisterUnary<pb::KeepAliveRequest, pb::KeepAliveResponse>(
      9, "KeepAlive", [core](const CallContext& cc, auto req, auto done) {
        core->KeepAliveAsync(cc, *req, [req, done](auto r) { done(std::move(r)); });
      });
  RegisterUnary<pb::ListToolsRequest, pb::ListToolsResponse>(10, "ListTools",
                                                             inline_(&BrokerCore::ListTools));
  RegisterUnary<pb::CallToolRequest, pb::CallToolResponse>(
      11, "CallTool", [core](const CallContext& cc, auto req, auto done) {
        core->CallToolAsync(cc, *req, [req, done](auto r) { done(std::move(r)); });
      });
  // The file API, as WriteFile: no thread held while the provider works.
  RegisterUnary<pb::ListFilesRequest, pb::ListFilesResponse>(
      12, "ListFiles", [core](const CallContext& cc, auto req, auto done) {
        core->ListFilesAsync(cc, *req, [req, done](auto r) { done(std::move(r)); });
      });
  RegisterUnary<pb::StatFileRequest, pb::StatFileResponse>(
      13, "StatFile", [core](const CallContext& cc, auto req, auto done) {
        core->StatFileAsync(cc, *req, [req, done](auto r) { done(std::move(r)); });
      });
  RegisterUnary<pb::MakeDirRequest, pb::MakeDirResponse>(
      14, "MakeDir", [core](const CallContext& cc, auto req, auto done) {
        core->MakeDirAsync(cc, *req, [req, done](auto r) { done(std::move(r)); });
      });
  RegisterUnary<pb::RemoveFileRequest, pb::RemoveFileResponse>(
      15, "RemoveFile", [core](const CallContext& cc, auto req, auto done) {
        core->RemoveFileAsync(cc, *req, [req, done](auto r) { done(std::move(r)); });
      });
  RegisterUnary<pb::MoveFileRequest, pb::MoveFileResponse>(
      16, "MoveFile", [core](const CallContext& cc, auto req, auto done) {
        core->MoveFileAsync(cc, *req, [req, done](auto r) { done(std::move(r)); });
      });
  MarkMethodRawCallback(
      17, new grpc::internal::CallbackClientStreamingHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
              [this](grpc::CallbackServerContext* ctx, grpc::ByteBuffer* response) {
                return UploadFile(ctx, response);
              }));
  MarkMethodRawCallback(
      18, new grpc::internal::CallbackServerStreamingHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
              [this](grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
                return DownloadFile(ctx, request);
              }));
  // Code contexts: a RunCode waits on the blocking pool for its execution.
  RegisterUnary<pb::CreateContextRequest, pb::Context>(
      19, "CreateContext", [core](const CallContext& cc, auto req, auto done) {
        core->CreateContextAsync(cc, *req, [req, done](auto r) { done(std::move(r)); });
      });
  RegisterUnary<pb::ListContextsRequest, pb::ListContextsResponse>(
      20, "ListContexts", [core](const CallContext& cc, auto req, auto done) {
        core->ListContextsAsync(cc, *req, [req, done](auto r) { done(std::move(r)); });
      });
  RegisterUnary<pb::RestartContextRequest, pb::Context>(
      21, "RestartContext", [core](const CallContext& cc, auto req, auto done) {
        core->RestartContextAsync(cc, *req, [req, done](auto r) { done(std::move(r)); });
      });
  RegisterUnary<pb::DeleteContextRequest, pb::DeleteContextResponse>(
      22, "DeleteContext", [core](const CallContext& cc, auto req, auto done) {
        core->DeleteContextAsync(cc, *req, [req, done](auto r) { done(std::move(r)); });
      });
  RegisterUnary<pb::RunCodeRequest, pb::Execution>(
      23, "RunCode", [core](const CallContext& cc, auto req, auto done) {
        core->RunCodeAsync(cc, *req, [req, done](auto r) { done(std::move(r)); });
      });
  RegisterUnary<pb::UpdateSessionNetworkRequest, pb::SessionInfo>(
      24, "UpdateSessionNetwork", [core](const CallContext& cc, auto req, auto done) {
        core->UpdateSessionNetworkAsync(cc, *req, [req, done](auto r) { done(std::move(r)); });
      });
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
  metrics_->CallStarted(call->method);
  calls_.Acquire([this, call, go = std::move(go), fail = std::move(fail)](absl::Status admitted) {
    if (!admitted.ok()) {
      metrics_->LimitRefused(calls_.name());
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
    absl::StatusOr<std::string> tenant;
    auto peer = md.find(kClusterTokenHeader);
    if (peer != md.end()) {
      // A call another replica forwarded: the cluster token is the proof,
      // and the tenant is the one that replica authenticated.
      auto t = md.find(kClusterTenantHeader);
      const absl::string_view presented(peer->second.data(), peer->second.size());
      if (cluster_ == nullptr || !ConstantTimeEquals(presented, cluster_->token()) ||
          t == md.end() || t->second.empty() || t->second.size() > 256) {
        tenant = absl::UnauthenticatedError("invalid cluster credentials");
      } else {
        tenant = std::string(t->second.data(), t->second.size());
        call->forwarded = true;
      }
    } else {
      tenant = Authenticator::AuthenticateWith(*snapshot, it != md.end() ? &value : nullptr);
    }
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
    cc.session_id = AuditableSessionId(call->session_id);
    cc.snapshot = std::move(snapshot);
    // Installed once, here: every pool, loop and provider callback after it
    // carries it (common/request_id.h).
    RequestIdScope scope(cc.request_id);
    go(cc);
  });
}

grpc::Status BrokerService::End(Call& call, const absl::Status& status) {
  const absl::Duration took = clock_->Monotonic() - call.start;
  const std::string code = absl::StatusCodeToString(status.code());
  const LogLevel level = status.ok() ? LogLevel::kInfo : LogLevel::kWarning;
  if (LogEnabled(level)) {
    Log(level, "rpc",
        {{"request_id", call.request_id},
         {"method", call.method},
         {"tenant", call.tenant},
         {"session_id", AuditableSessionId(call.session_id)},
         {"provider", call.provider.empty() ? std::string("-") : call.provider},
         {"code", code},
         {"duration_ms", absl::ToInt64Milliseconds(took)}});
  }
  call.slot.Release();
  if (call.counted) {
    metrics_->CallFinished(call.method, call.provider, code, took);
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

// Whether a request carries a SessionSpec (then the call may create the
// session), and the provider it asks for.
template <typename Req, typename = void>
struct HasSpec : std::false_type {};
template <typename Req>
struct HasSpec<Req, std::void_t<decltype(std::declval<const Req&>().spec())>> : std::true_type {};
template <typename Req>
std::string SpecProvider(const Req& r) {
  if constexpr (HasSpec<Req>::value) {
    return r.spec().provider();
  } else {
    return "";
  }
}

template <typename Req>
absl::Status Parse(const grpc::ByteBuffer* in, Req* req) {
  grpc::ByteBuffer copy(*in);
  grpc::Status s = grpc::GenericDeserialize<grpc::ProtoBufferReader, Req>(&copy, req);
  if (s.ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("the request is not a valid ",
                                                 Req::descriptor()->full_name(),
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
      index, new grpc::internal::CallbackUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
                 [this, method, handler](grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
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
                   Raw raw{in, out, SpecProvider(*req), HasSpec<Req>::value};
                   return UnaryAsync<Resp>(
                       ctx, method, SessionOf(*req), std::move(store),
                       [handler, req](const CallContext& cc,
                                      std::function<void(absl::StatusOr<Resp>)> done) {
                         handler(cc, std::shared_ptr<const Req>(req), std::move(done));
                       },
                       std::move(raw));
                 }));
}

template <typename Resp, typename AsyncFn>
grpc::ServerUnaryReactor* BrokerService::UnaryAsync(grpc::CallbackServerContext* ctx,
                                                    absl::string_view method,
                                                    const std::string& session_id,
                                                    Store<Resp> store, AsyncFn fn, Raw raw) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto call = std::make_shared<Call>();
  call->ctx = ctx;
  call->method = std::string(method);
  call->session_id = session_id;
  auto finish = [this, call, reactor](absl::Status st) { reactor->Finish(End(*call, st)); };
  Begin(
      call,
      [this, call, raw = std::move(raw), fn = std::move(fn), store = std::move(store),
       finish](const CallContext& cc) mutable {
        auto local = [cc, fn = std::move(fn), store = std::move(store), finish]() mutable {
          fn(cc, [store, finish](absl::StatusOr<Resp> r) {
            if (r.ok()) store(std::move(*r));
            finish(r.status());
          });
        };
        if (cluster_ == nullptr || raw.in == nullptr || call->session_id.empty()) {
          local();
          return;
        }
        Route(
            call, cc, raw.provider, raw.may_create, std::move(local),
            [this, call, tenant = cc.tenant, raw, finish](const ClusterRoute& route) {
              ForwardUnary(call, tenant, route, raw.in, raw.out, finish);
            },
            finish);
      },
      finish);
  return reactor;
}

void BrokerService::SetCluster(Cluster* cluster,
                               std::shared_ptr<grpc::ChannelCredentials> peer_credentials) {
  cluster_ = cluster;
  peer_credentials_ = std::move(peer_credentials);
}

void BrokerService::Route(const std::shared_ptr<Call>& call, const CallContext& cc,
                          const std::string& requested_provider, bool may_create,
                          std::function<void()> local,
                          std::function<void(const ClusterRoute&)> forward,
                          std::function<void(absl::Status)> fail) {
  // An invalid session id never reaches etcd: the core refuses it here.
  if (!ValidateSessionId(call->session_id).ok() ||
      cluster_->ServesLocally(cc.tenant, call->session_id)) {
    local();
    return;
  }
  // Finding the owner reads etcd (and may claim and take over): off the
  // gRPC thread, on the blocking pool.
  std::string provider = core_->ProviderFor(cc, requested_provider);
  core_->blocking_pool()->Submit([this, call, tenant = cc.tenant, provider = std::move(provider),
                                  may_create, local = std::move(local),
                                  forward = std::move(forward), fail = std::move(fail)] {
    absl::StatusOr<ClusterRoute> r =
        cluster_->Resolve(tenant, call->session_id, provider, may_create, call->forwarded);
    if (!r.ok()) {
      fail(r.status());
    } else if (r->local) {
      local();
    } else {
      forward(*r);
    }
  });
}

std::shared_ptr<grpc::GenericStub> BrokerService::PeerStub(const std::string& address) {
  absl::MutexLock l(&peers_mu_);
  auto it = peers_.find(address);
  if (it != peers_.end()) return it->second;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  auto stub = std::make_shared<grpc::GenericStub>(grpc::CreateCustomChannel(
      address, peer_credentials_ ? peer_credentials_ : grpc::InsecureChannelCredentials(), args));
  peers_[address] = stub;
  return stub;
}

namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// One forwarded call's client side; deleted when the call is done.
struct ForwardedCall {
  std::unique_ptr<grpc::ClientContext> ctx;
  grpc::ByteBuffer request;
  grpc::ByteBuffer response;
  std::shared_ptr<grpc::GenericStub> stub;  // keeps the channel
};

// The client context of a forwarded call: the caller's deadline and
// cancellation (propagated from the server call), tenant and request id.
std::unique_ptr<grpc::ClientContext> ForwardContext(grpc::CallbackServerContext* server,
                                                    const Cluster& cluster,
                                                    const std::string& tenant,
                                                    const std::string& request_id) {
  std::unique_ptr<grpc::ClientContext> ctx =
      grpc::ClientContext::FromCallbackServerContext(*server);
  ctx->AddMetadata(kClusterTokenHeader, cluster.token());
  ctx->AddMetadata(kClusterTenantHeader, tenant);
  ctx->AddMetadata(kClusterFromHeader, cluster.member_id());
  ctx->AddMetadata("x-request-id", request_id);
  return ctx;
}

}  // namespace

void BrokerService::ForwardUnary(const std::shared_ptr<Call>& call, const std::string& tenant,
                                 const ClusterRoute& route, const grpc::ByteBuffer* in,
                                 grpc::ByteBuffer* out, std::function<void(absl::Status)> finish) {
  auto* f = new ForwardedCall;
  f->ctx = ForwardContext(call->ctx, *cluster_, tenant, call->request_id);
  f->request = *in;
  f->stub = PeerStub(route.address);
  const std::string path =
      absl::StrCat("/", pb::SandboxBroker::service_full_name(), "/", call->method);
  f->stub->UnaryCall(f->ctx.get(), path, grpc::StubOptions(), &f->request, &f->response,
                     [this, f, call, tenant, route, out, finish](grpc::Status s) {
                       if (s.ok()) {
                         out->Swap(&f->response);
                       } else if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
                         cluster_->ForgetRoute(tenant, call->session_id);
                       }
                       delete f;
                       finish(FromGrpc(s));
                     });
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

  // An event another replica sent (a forwarded RunStream), as it came.
  void Relay(grpc::ByteBuffer bb) {
    const size_t bytes = bb.Length();
    EnqueueBytes(std::move(bb), bytes);
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
      resume_ = nullptr;  // the producer is done
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
    EnqueueBytes(std::move(bb), bytes);
  }

  void EnqueueBytes(grpc::ByteBuffer bb, size_t bytes) {
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

// A forwarded RunStream's client side: reads the owner's events one at a
// time into the caller's stream, reading the next only while the caller's
// queue is below RunStreamReactor::kMaxBuffered (a slow reader slows the
// owner's run, as it would locally). Deletes itself when done.
class RunStreamRelay final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  RunStreamRelay(RunStreamReactor* server, std::unique_ptr<grpc::ClientContext> ctx,
                 std::shared_ptr<grpc::GenericStub> stub, grpc::ByteBuffer request,
                 std::function<void(grpc::Status)> done)
      : server_(server),
        ctx_(std::move(ctx)),
        stub_(std::move(stub)),
        request_(std::move(request)),
        done_(std::move(done)) {}

  void Start() {
    stub_->PrepareBidiStreamingCall(
        ctx_.get(), absl::StrCat("/", pb::SandboxBroker::service_full_name(), "/RunStream"),
        grpc::StubOptions(), this);
    StartWriteLast(&request_, grpc::WriteOptions());
    StartRead(&event_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended: OnDone has the status
    server_->Relay(std::move(event_));
    event_.Clear();
    if (server_->Ready([this] { StartRead(&event_); })) StartRead(&event_);
  }

  void OnDone(const grpc::Status& s) override {
    done_(s);
    delete this;
  }

 private:
  RunStreamReactor* const server_;
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::shared_ptr<grpc::GenericStub> stub_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer event_;
  std::function<void(grpc::Status)> done_;
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
      [this, req, call, reactor, request, fail](const CallContext& cc) {
        auto local = [this, req, call, reactor, cc] {
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
        };
        if (cluster_ == nullptr) {
          local();
          return;
        }
        Route(
            call, cc, req->spec().provider(), /*may_create=*/true, std::move(local),
            [this, call, reactor, request, tenant = cc.tenant](const ClusterRoute& route) {
              auto* relay = new RunStreamRelay(
                  reactor, ForwardContext(call->ctx, *cluster_, tenant, call->request_id),
                  PeerStub(route.address), *request, [this, call, reactor, tenant](grpc::Status s) {
                    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
                      cluster_->ForgetRoute(tenant, call->session_id);
                    }
                    const absl::Status st = FromGrpc(s);
                    reactor->Complete(
                        absl::StatusOr<pb::RunResult>(st.ok() ? absl::UnknownError("relayed") : st),
                        End(*call, st));
                  });
              relay->Start();
            },
            fail);
      },
      fail);
  return reactor;
}

}  // namespace sandbox
