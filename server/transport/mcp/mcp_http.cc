#include "server/transport/mcp/mcp_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>
#include <event2/util.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/event_loop.h"
#include "common/log.h"

namespace sandbox {

// One request waiting for its answer. `req`, `conn`, `fd` and `streaming`
// belong to the loop thread; the rest is shared with the producer.
struct McpExchange {
  // Null once answered. evhttp keeps a request whose connection failed
  // before its answer (detached) until it is answered, so it is answered
  // even when the client is gone.
  evhttp_request* req = nullptr;
  evhttp_connection* conn = nullptr;  // null once closed
  evutil_socket_t fd = -1;
  bool streaming = false;
  // A chunk handed to evhttp whose write has not been reported done. The
  // next chunk, or the end, waits for that report: evhttp runs a write's
  // done-callback deferred, after the watermark check, so an end queued
  // behind it would be taken as written and the connection closed with the
  // terminating chunk unsent (seen with TLS bufferevents).
  bool writing = false;
  std::atomic<bool> gone{false};  // the client went away
  absl::Mutex mu;
  std::string pending ABSL_GUARDED_BY(mu);  // SSE bytes not yet handed to evhttp
  // Handed to evhttp and not yet reported written (the chunk in flight).
  size_t handed ABSL_GUARDED_BY(mu) = 0;
  // A producer paused by Ready (flow control), resumed once pending and
  // handed have drained to half the bound, or the client is gone.
  std::function<void()> resume ABSL_GUARDED_BY(mu);
  bool closed ABSL_GUARDED_BY(mu) = false;
  bool flush_posted ABSL_GUARDED_BY(mu) = false;

  // The most an SSE answer buffers (pending + handed) before its producer
  // is paused: a slow reader costs the broker this much, not the output's
  // size (RunStream's bound, server/transport/grpc/grpc_service.cc).
  static constexpr size_t kMaxBuffered = 256 * 1024;
  // Resumes a paused producer when the buffer has drained (or `always`:
  // the client is gone, so the producer must run on to see it).
  void MaybeResume(bool always) {
    std::function<void()> r;
    {
      absl::MutexLock l(&mu);
      if (resume && (always || pending.size() + handed <= kMaxBuffered / 2)) r.swap(resume);
    }
    if (r) r();
  }
};

struct McpHttpListener::Impl : std::enable_shared_from_this<McpHttpListener::Impl> {
  McpServer* server = nullptr;
  std::string path;
  absl::Duration liveness;
  event_base* base = nullptr;
  evhttp* http = nullptr;
  SSL_CTX* ssl = nullptr;
  event* wake = nullptr;
  event* tick = nullptr;
  std::thread loop;
  std::unique_ptr<WorkPool> workers;

  absl::Mutex mu;
  bool running ABSL_GUARDED_BY(mu) = false;
  std::vector<std::function<void()>> tasks ABSL_GUARDED_BY(mu);

  // Loop thread only: the requests of open connections awaiting answers,
  // and those whose connection closed first (evhttp keeps such a request,
  // detached, until it is answered; Stop frees the ones still waiting).
  std::map<evhttp_connection*, std::shared_ptr<McpExchange>> open;
  std::set<std::shared_ptr<McpExchange>> detached;
  // Requests accepted and not yet answered (or freed), any thread may read.
  std::atomic<int64_t> waiting{0};

  ~Impl() { Free(); }

  // Runs `fn` on the loop thread (dropped once stopped).
  void Post(std::function<void()> fn) {
    absl::MutexLock l(&mu);
    if (!running) return;
    const bool first = tasks.empty();
    tasks.push_back(std::move(fn));
    if (first) event_active(wake, EV_READ, 0);
  }
  void RunTasks() {
    std::vector<std::function<void()>> now;
    {
      absl::MutexLock l(&mu);
      now.swap(tasks);
    }
    for (auto& fn : now) fn();
  }

  void OnRequest(evhttp_request* req);
  void Answer(const std::shared_ptr<McpExchange>& x, const McpHttpResponse& r);
  void StartStream(const std::shared_ptr<McpExchange>& x, const McpHttpResponse& r);
  void Flush(const std::shared_ptr<McpExchange>& x);
  void SendChunk(McpExchange* x, absl::string_view bytes);
  void Forget(const std::shared_ptr<McpExchange>& x) {
    auto it = x->conn != nullptr ? open.find(x->conn) : open.end();
    if (it != open.end() && it->second == x) open.erase(it);
    detached.erase(x);
    if (x->req != nullptr) --waiting;
    x->req = nullptr;
  }
  void OnClose(evhttp_connection* conn) {
    // evhttp closes the socket next. A TLS client gets close_notify (not a
    // bare FIN), and bytes it sent that were never read are drained first:
    // closing with unread data sends a reset, which can destroy the end of
    // the answer still in flight to the client.
    if (bufferevent* bev = evhttp_connection_get_bufferevent(conn)) {
      if (ssl != nullptr) {
        if (SSL* s = bufferevent_openssl_get_ssl(bev)) {
          SSL_shutdown(s);
          ERR_clear_error();  // the loop thread's queue: later reads consult it
        }
      }
      const evutil_socket_t fd = bufferevent_getfd(bev);
      char drain[4096];
      while (fd >= 0 && recv(fd, drain, sizeof(drain), MSG_DONTWAIT) > 0) {
      }
    }
    auto it = open.find(conn);
    if (it == open.end()) return;
    std::shared_ptr<McpExchange> x = it->second;
    open.erase(it);
    x->gone = true;
    x->conn = nullptr;
    x->fd = -1;
    x->writing = false;  // its done-callback will not come
    x->MaybeResume(true);
    if (x->req == nullptr) return;
    detached.insert(x);
    // A stream whose chunk was in flight: no done-callback will flush it
    // again, so flush here (it drops what is pending and, once the
    // producer has closed, ends and frees the request; until then the
    // producer's Close posts the flush that does).
    if (x->streaming) Flush(x);
  }
  // A client that closed its end while waiting (evhttp reads nothing
  // while a request is answered, so it would not notice).
  void CheckLiveness() {
    for (auto& [conn, x] : open) {
      if (x->gone || x->fd < 0) continue;
      char c;
      const ssize_t n = recv(x->fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        x->gone = true;
      }
    }
  }
  void Free() {
    if (http != nullptr) evhttp_free(http);
    http = nullptr;
    if (wake != nullptr) event_free(wake);
    wake = nullptr;
    if (tick != nullptr) event_free(tick);
    tick = nullptr;
    if (base != nullptr) event_base_free(base);
    base = nullptr;
    if (ssl != nullptr) SSL_CTX_free(ssl);
    ssl = nullptr;
  }
};

namespace {

// The producer's side of an SSE answer: never blocks; the loop writes.
class LoopSink final : public McpEventSink {
 public:
  LoopSink(std::shared_ptr<McpHttpListener::Impl> impl, std::shared_ptr<McpExchange> x)
      : impl_(std::move(impl)), x_(std::move(x)) {}
  bool Write(absl::string_view bytes) override {
    if (x_->gone) return false;
    absl::MutexLock l(&x_->mu);
    x_->pending.append(bytes.data(), bytes.size());
    PostFlush();
    return true;
  }
  bool Alive() override { return !x_->gone; }
  bool Ready(std::function<void()> resume) override {
    // `gone` read under the lock: the loop sets it before it takes the lock
    // to resume, so a resume stored here is never missed.
    absl::MutexLock l(&x_->mu);
    if (x_->gone || x_->pending.size() + x_->handed <= McpExchange::kMaxBuffered) return true;
    // A flush is posted (pending) or a write is in flight (handed); either
    // ends in Flush, which resumes. A client that leaves resumes too.
    x_->resume = std::move(resume);
    return false;
  }
  void Close() override {
    absl::MutexLock l(&x_->mu);
    x_->closed = true;
    PostFlush();
  }

 private:
  void PostFlush() ABSL_EXCLUSIVE_LOCKS_REQUIRED(x_->mu) {
    if (x_->flush_posted) return;
    x_->flush_posted = true;
    impl_->Post([impl = impl_, x = x_] { impl->Flush(x); });
  }
  const std::shared_ptr<McpHttpListener::Impl> impl_;
  const std::shared_ptr<McpExchange> x_;
};

const char* MethodName(evhttp_cmd_type t) {
  switch (t) {
    case EVHTTP_REQ_GET:
      return "GET";
    case EVHTTP_REQ_POST:
      return "POST";
    case EVHTTP_REQ_HEAD:
      return "HEAD";
    case EVHTTP_REQ_PUT:
      return "PUT";
    case EVHTTP_REQ_DELETE:
      return "DELETE";
    case EVHTTP_REQ_OPTIONS:
      return "OPTIONS";
    case EVHTTP_REQ_PATCH:
      return "PATCH";
    default:
      return "OTHER";
  }
}

void SetHeaders(evhttp_request* req, const McpHttpResponse& r) {
  evkeyvalq* out = evhttp_request_get_output_headers(req);
  for (const auto& [k, v] : r.headers) evhttp_add_header(out, k.c_str(), v.c_str());
  if (!r.content_type.empty()) evhttp_add_header(out, "Content-Type", r.content_type.c_str());
}

bufferevent* TlsBufferevent(event_base* base, void* arg) {
  SSL* ssl = SSL_new(static_cast<SSL_CTX*>(arg));
  if (ssl == nullptr) return nullptr;
  return bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                        BEV_OPT_CLOSE_ON_FREE);
}

absl::StatusOr<SSL_CTX*> MakeTlsContext(const BrokerConfig& config) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) return absl::InternalError("mcp: cannot create a TLS context");
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  bool ok = SSL_CTX_use_certificate_chain_file(ctx, config.tls_cert_file.c_str()) == 1 &&
            SSL_CTX_use_PrivateKey_file(ctx, config.tls_key_file.c_str(), SSL_FILETYPE_PEM) == 1 &&
            SSL_CTX_check_private_key(ctx) == 1;
  if (ok && !config.tls_client_ca_file.empty()) {
    ok = SSL_CTX_load_verify_locations(ctx, config.tls_client_ca_file.c_str(), nullptr) == 1;
    if (ok) {
      if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(config.tls_client_ca_file.c_str())) {
        SSL_CTX_set_client_CA_list(ctx, names);
      }
      SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    }
  }
  if (!ok) {
    SSL_CTX_free(ctx);
    return absl::InvalidArgumentError("mcp: cannot load tls.cert_file / key_file / client_ca_file");
  }
  return ctx;
}

// A listening socket with a deep backlog (evhttp's own takes 128).
absl::StatusOr<evutil_socket_t> Listen(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res) != 0 ||
      res == nullptr) {
    return absl::UnavailableError(absl::StrCat("mcp.listen: cannot resolve ", host));
  }
  evutil_socket_t fd = -1;
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 4096) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) return absl::UnavailableError("cannot bind");
  return fd;
}

int BoundPort(evutil_socket_t fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

}  // namespace

void McpHttpListener::Impl::OnRequest(evhttp_request* req) {
  const evhttp_uri* uri = evhttp_request_get_evhttp_uri(req);
  const char* p = uri != nullptr ? evhttp_uri_get_path(uri) : nullptr;
  if (p == nullptr || path != p) {
    evhttp_send_error(req, HTTP_NOTFOUND, nullptr);
    return;
  }
  McpHttpRequest hreq;
  hreq.method = MethodName(evhttp_request_get_command(req));
  evkeyvalq* in = evhttp_request_get_input_headers(req);
  for (evkeyval* kv = in->tqh_first; kv != nullptr; kv = kv->next.tqe_next) {
    hreq.headers.emplace(absl::AsciiStrToLower(kv->key), kv->value);
  }
  evbuffer* body = evhttp_request_get_input_buffer(req);
  hreq.body.resize(evbuffer_get_length(body));
  if (!hreq.body.empty()) evbuffer_copyout(body, hreq.body.data(), hreq.body.size());

  auto x = std::make_shared<McpExchange>();
  x->req = req;
  ++waiting;
  x->conn = evhttp_request_get_connection(req);
  if (bufferevent* bev = evhttp_connection_get_bufferevent(x->conn)) x->fd = bufferevent_getfd(bev);
  open[x->conn] = x;
  evhttp_connection_set_closecb(
      x->conn, [](evhttp_connection* conn, void* arg) { static_cast<Impl*>(arg)->OnClose(conn); },
      this);
  workers->Submit([self = shared_from_this(), x, hreq = std::move(hreq)] {
    McpHttpResponse r = self->server->HandleRequest(hreq);
    if (r.later) {
      // The tool's answer, whenever it comes; no thread waits for it.
      auto later = std::move(r.later);
      later(
          [self, x](McpHttpResponse a) {
            self->Post([self, x, a = std::move(a)] { self->Answer(x, a); });
          },
          [x] { return !x->gone; });
      return;
    }
    if (r.stream) {
      auto stream = std::move(r.stream);
      r.stream = nullptr;
      // The status and headers go first: the stream's writes are posted
      // after this.
      self->Post([self, x, r] { self->StartStream(x, r); });
      stream(std::make_shared<LoopSink>(self, x));
      return;
    }
    self->Post([self, x, r = std::move(r)] { self->Answer(x, r); });
  });
}

void McpHttpListener::Impl::Answer(const std::shared_ptr<McpExchange>& x,
                                   const McpHttpResponse& r) {
  if (x->req == nullptr) return;
  // Forgotten first: sending may close the connection at once (HTTP/1.0,
  // Connection: close), and its close callback runs inside the send.
  evhttp_request* req = x->req;
  Forget(x);
  SetHeaders(req, r);
  evbuffer* buf = evbuffer_new();
  if (buf != nullptr) evbuffer_add(buf, r.body.data(), r.body.size());
  evhttp_send_reply(req, r.status, nullptr, buf);  // also frees a detached request
  if (buf != nullptr) evbuffer_free(buf);
}

void McpHttpListener::Impl::StartStream(const std::shared_ptr<McpExchange>& x,
                                        const McpHttpResponse& r) {
  if (x->req == nullptr) return;
  SetHeaders(x->req, r);
  evhttp_send_reply_start(x->req, r.status, nullptr);
  x->streaming = true;
  // An SSE comment, so the headers' write is tracked like every chunk's.
  SendChunk(x.get(), ":\n\n");
}

void McpHttpListener::Impl::SendChunk(McpExchange* x, absl::string_view bytes) {
  // A closed connection (the request detached): evhttp would drop the
  // chunk and never report it written.
  if (x->conn == nullptr) return;
  evbuffer* buf = evbuffer_new();
  if (buf == nullptr) return;
  evbuffer_add(buf, bytes.data(), bytes.size());
  x->writing = true;
  evhttp_send_reply_chunk_with_cb(
      x->req, buf,
      [](evhttp_connection* conn, void* arg) {
        Impl* self = static_cast<Impl*>(arg);
        auto it = self->open.find(conn);
        if (it == self->open.end()) return;
        std::shared_ptr<McpExchange> x = it->second;
        x->writing = false;
        self->Flush(x);
      },
      this);
  evbuffer_free(buf);
}

void McpHttpListener::Impl::Flush(const std::shared_ptr<McpExchange>& x) {
  // StartStream, or the write in progress (or the connection's close),
  // flushes again.
  if (x->req == nullptr || !x->streaming || x->writing) return;
  std::string out;
  bool closed = false;
  const bool send = !x->gone && x->conn != nullptr;
  {
    absl::MutexLock l(&x->mu);
    x->flush_posted = false;
    out.swap(x->pending);
    closed = x->closed;
    x->handed = send ? out.size() : 0;
  }
  x->MaybeResume(!send);
  if (!out.empty() && send) {
    SendChunk(x.get(), out);  // the end, if closed, after it is written
    return;
  }
  if (closed) {
    // Forgotten first, as in Answer: the close callback (which flushes a
    // stream it finds open) may run inside the end.
    evhttp_request* req = x->req;
    Forget(x);
    evhttp_send_reply_end(req);  // also frees a detached request
  }
}

bool IsLoopbackListen(const std::string& listen) {
  std::string host = listen.substr(0, listen.rfind(':'));
  return host == "127.0.0.1" || host == "localhost" || host == "[::1]" || host == "::1";
}

absl::StatusOr<std::unique_ptr<McpHttpListener>> McpHttpListener::Start(
    McpServer* server, const BrokerConfig& config) {
  return Start(server, config, Options());
}

absl::StatusOr<std::unique_ptr<McpHttpListener>> McpHttpListener::Start(McpServer* server,
                                                                        const BrokerConfig& config,
                                                                        const Options& options) {
  static std::once_flag once;
  std::call_once(once, [] {
    evthread_use_pthreads();
    // A client gone mid-answer must not kill the daemon (evbuffer writes
    // with writev, which raises SIGPIPE).
    signal(SIGPIPE, SIG_IGN);
  });
  const BrokerConfig::Mcp& mc = config.mcp;
  const size_t colon = mc.listen.rfind(':');
  int port = -1;
  if (colon == std::string::npos || !absl::SimpleAtoi(mc.listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("mcp.listen: \"", mc.listen, "\" is not host:port"));
  }
  std::string host = mc.listen.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  auto impl = std::make_shared<Impl>();
  impl->server = server;
  impl->path = mc.path;
  impl->liveness = server->options().liveness_interval;
  if (!config.tls_cert_file.empty()) {
    absl::StatusOr<SSL_CTX*> ctx = MakeTlsContext(config);
    if (!ctx.ok()) return ctx.status();
    impl->ssl = *ctx;
  }
  impl->base = event_base_new();
  impl->http = impl->base != nullptr ? evhttp_new(impl->base) : nullptr;
  if (impl->http == nullptr) return absl::InternalError("mcp: cannot create the HTTP server");
  Impl* raw = impl.get();
  impl->wake = event_new(
      impl->base, -1, EV_PERSIST,
      [](evutil_socket_t, short, void* arg) { static_cast<Impl*>(arg)->RunTasks(); }, raw);
  impl->tick = event_new(
      impl->base, -1, EV_PERSIST,
      [](evutil_socket_t, short, void* arg) { static_cast<Impl*>(arg)->CheckLiveness(); }, raw);
  if (impl->wake == nullptr || impl->tick == nullptr) {
    return absl::InternalError("mcp: cannot create the loop's events");
  }
  const timeval every = absl::ToTimeval(impl->liveness);
  event_add(impl->tick, &every);
  if (impl->ssl != nullptr) evhttp_set_bevcb(impl->http, TlsBufferevent, impl->ssl);
  evhttp_set_allowed_methods(impl->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_DELETE |
                                             EVHTTP_REQ_PUT | EVHTTP_REQ_PATCH |
                                             EVHTTP_REQ_OPTIONS | EVHTTP_REQ_HEAD);
  // McpServer answers a body over max_body_bytes with a JSON-RPC 413;
  // evhttp stops reading well past it.
  evhttp_set_max_body_size(impl->http, static_cast<ev_ssize_t>(mc.max_body_bytes) * 2 + 65536);
  evhttp_set_max_headers_size(impl->http, 64 << 10);
  // evhttp keeps reading while it streams an answer (to see the client
  // leave), so the idle timeout also applies to a quiet SSE stream: it must
  // outlast the keep-alive comments that the stream carries.
  const absl::Duration idle_timeout =
      std::max(options.idle_timeout, 2 * server->options().keepalive_interval + absl::Seconds(1));
  const timeval idle = absl::ToTimeval(idle_timeout);
  evhttp_set_timeout_tv(impl->http, &idle);
  evhttp_set_default_content_type(impl->http, nullptr);
  evhttp_set_gencb(
      impl->http, [](evhttp_request* req, void* arg) { static_cast<Impl*>(arg)->OnRequest(req); },
      raw);
  absl::StatusOr<evutil_socket_t> fd = Listen(host, port);
  if (!fd.ok())
    return absl::UnavailableError(absl::StrCat("mcp.listen: cannot listen on ", mc.listen));
  // Checked before evhttp owns the socket (it closes it when freed).
  const int bound = BoundPort(*fd);
  if (bound <= 0 || evhttp_accept_socket(impl->http, *fd) != 0) {
    close(*fd);
    return absl::UnavailableError(absl::StrCat("mcp.listen: cannot listen on ", mc.listen));
  }
  impl->workers = std::make_unique<WorkPool>("mcp-http", static_cast<int>(mc.max_threads));
  {
    absl::MutexLock l(&impl->mu);
    impl->running = true;
  }
  impl->loop = std::thread([raw] {
    pthread_setname_np(pthread_self(), "mcp-http-loop");
    event_base_loop(raw->base, EVLOOP_NO_EXIT_ON_EMPTY);
  });
  std::unique_ptr<McpHttpListener> l(new McpHttpListener());
  l->impl_ = std::move(impl);
  l->port_ = bound;
  Log(LogLevel::kInfo, "mcp.serving",
      {{"address", absl::StrCat(mc.listen.substr(0, colon), ":", bound)},
       {"path", mc.path},
       {"port", bound},
       {"tls", !config.tls_cert_file.empty()}});
  return l;
}

void McpHttpListener::Stop() {
  if (!impl_) return;
  {
    absl::MutexLock l(&impl_->mu);
    if (!impl_->running) return;
    impl_->running = false;
  }
  // loopexit, not loopbreak: a break asked for before the loop thread has
  // entered the loop would be reset when it does, and the loop would run on.
  event_base_loopexit(impl_->base, nullptr);
  if (impl_->loop.joinable()) impl_->loop.join();
  // Requests being parsed finish; what they post is dropped.
  impl_->workers.reset();
  // Tasks posted but never run hold the Impl (and their exchanges): a cycle.
  std::vector<std::function<void()>> unrun;
  {
    absl::MutexLock l(&impl_->mu);
    unrun.swap(impl_->tasks);
  }
  unrun.clear();
  // Each exchange still waiting is given up (its producer resumed to see
  // the client gone); returns its request, if any.
  auto abandon = [this](const std::shared_ptr<McpExchange>& x) {
    evhttp_request* req = x->req;
    x->gone = true;
    x->MaybeResume(true);
    if (req != nullptr) --impl_->waiting;
    x->req = nullptr;
    return req;
  };
  for (auto& [conn, x] : impl_->open) abandon(x);  // freed with its connection
  impl_->open.clear();
  // Requests whose client left before their answer: no answer will free them.
  for (const std::shared_ptr<McpExchange>& x : impl_->detached) {
    if (evhttp_request* req = abandon(x)) evhttp_request_free(req);
  }
  impl_->detached.clear();
  // Frees every connection; producers still holding a sink see it gone.
  impl_->Free();
}

McpHttpListener::~McpHttpListener() { Stop(); }

int64_t McpHttpListener::requests_waiting() const { return impl_ ? impl_->waiting.load() : 0; }

}  // namespace sandbox
