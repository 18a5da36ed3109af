#include "server/mcp_http.h"

#include <httplib.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/log.h"

namespace sandbox {
namespace {

// An SSE response's bytes between the producer (any thread, never
// blocked) and the connection's thread, which alone writes to the socket.
class QueueSink final : public McpEventSink {
 public:
  bool Write(absl::string_view bytes) override {
    absl::MutexLock l(&mu_);
    if (gone_) return false;
    buf_.append(bytes.data(), bytes.size());
    return true;
  }
  bool Alive() override {
    absl::MutexLock l(&mu_);
    return !gone_;
  }
  void Close() override {
    absl::MutexLock l(&mu_);
    closed_ = true;
  }
  // On the connection's thread: sends what is written until the producer
  // closes, checking every `check` that the client is still there. False
  // once it is gone.
  bool Pump(httplib::DataSink& sink, absl::Duration check) {
    for (;;) {
      std::string out;
      bool closed = false;
      {
        absl::MutexLock l(&mu_);
        mu_.AwaitWithTimeout(absl::Condition(this, &QueueSink::Ready), check);
        out.swap(buf_);
        closed = closed_;
      }
      bool alive = out.empty() || sink.write(out.data(), out.size());
      if (alive && closed) return true;
      alive = alive && (!sink.is_writable || sink.is_writable());
      if (!alive) {
        absl::MutexLock l(&mu_);
        gone_ = true;
        return false;
      }
    }
  }

 private:
  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !buf_.empty() || closed_; }
  absl::Mutex mu_;
  std::string buf_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool gone_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

bool IsLoopbackListen(const std::string& listen) {
  std::string host = listen.substr(0, listen.rfind(':'));
  return host == "127.0.0.1" || host == "localhost" || host == "[::1]" || host == "::1";
}

absl::StatusOr<std::unique_ptr<McpHttpListener>> McpHttpListener::Start(
    McpServer* server, const BrokerConfig& config) {
  std::unique_ptr<McpHttpListener> l(new McpHttpListener());
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
  if (!config.tls_cert_file.empty()) {
    auto ssl = std::make_unique<httplib::SSLServer>(
        config.tls_cert_file.c_str(), config.tls_key_file.c_str(),
        config.tls_client_ca_file.empty() ? nullptr : config.tls_client_ca_file.c_str());
    if (!ssl->is_valid()) {
      return absl::InvalidArgumentError("mcp: cannot load tls.cert_file / key_file / client_ca_file");
    }
    l->http_ = std::move(ssl);
  } else {
    l->http_ = std::make_unique<httplib::Server>();
  }
  httplib::Server& http = *l->http_;
  const size_t threads = static_cast<size_t>(mc.max_threads);
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(static_cast<size_t>(mc.max_body_bytes));
  // Long runs stream their response; the write timeout is per write.
  http.set_read_timeout(30, 0);
  const absl::Duration check = server->options().liveness_interval;
  auto handler = [server, check](const httplib::Request& hreq, httplib::Response& hres) {
    McpHttpRequest req;
    req.method = hreq.method;
    for (const auto& [k, v] : hreq.headers) {
      req.headers.emplace(absl::AsciiStrToLower(k), v);
    }
    req.body = hreq.body;
    McpHttpResponse resp = server->HandleRequest(req);
    if (resp.later) {
      // httplib answers on this thread; the core holds none meanwhile.
      absl::Notification answered;
      McpHttpResponse out;
      auto later = std::move(resp.later);
      later([&](McpHttpResponse r) {
        out = std::move(r);
        answered.Notify();
      });
      answered.WaitForNotification();
      resp = std::move(out);
    }
    hres.status = resp.status;
    for (const auto& [k, v] : resp.headers) hres.set_header(k, v);
    if (resp.stream) {
      auto stream = std::make_shared<std::function<void(std::shared_ptr<McpEventSink>)>>(
          std::move(resp.stream));
      hres.set_chunked_content_provider(resp.content_type,
                                        [stream, check](size_t, httplib::DataSink& sink) {
                                          auto queue = std::make_shared<QueueSink>();
                                          (*stream)(queue);
                                          if (!queue->Pump(sink, check)) return false;
                                          sink.done();
                                          return true;
                                        });
    } else if (!resp.body.empty()) {
      hres.set_content(resp.body, resp.content_type);
    }
  };
  http.Post(mc.path, handler);
  http.Get(mc.path, handler);
  http.Delete(mc.path, handler);
  http.Put(mc.path, handler);
  http.Patch(mc.path, handler);
  http.Options(mc.path, handler);
  if (port == 0) {
    l->port_ = http.bind_to_any_port(host);
  } else if (http.bind_to_port(host, port)) {
    l->port_ = port;
  }
  if (l->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("mcp.listen: cannot listen on ", mc.listen));
  }
  httplib::Server* raw = l->http_.get();
  l->thread_ = std::thread([raw] { raw->listen_after_bind(); });
  Log(LogLevel::kInfo, "mcp.serving",
      {{"address", absl::StrCat(mc.listen.substr(0, colon), ":", l->port_)},
       {"path", mc.path},
       {"port", l->port_},
       {"tls", !config.tls_cert_file.empty()}});
  return l;
}

void McpHttpListener::Stop() {
  if (http_) http_->stop();
  if (thread_.joinable()) thread_.join();
}

McpHttpListener::~McpHttpListener() { Stop(); }

}  // namespace sandbox
