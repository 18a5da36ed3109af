#include "adapters/http/http_client.h"

#include <curl/curl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <unordered_set>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/text.h"

namespace sandbox {
namespace {

struct GlobalInit {
  GlobalInit() { curl_global_init(CURL_GLOBAL_DEFAULT); }
};

struct Transfer {
  const HttpRequest* request;
  HttpResponse* response;
  bool aborted_by_body = false;
  bool too_large = false;
  int status = 0;               // from the last status line seen
  bool error_body_cut = false;  // an error status's body reached kErrorBodyBytes
};

// How much of a non-2xx body a streamed request keeps for the error.
constexpr size_t kErrorBodyBytes = 64 << 10;

bool Success(int status) { return status >= 200 && status < 300; }

size_t OnData(char* ptr, size_t size, size_t nmemb, void* userdata) {
  auto* t = static_cast<Transfer*>(userdata);
  const size_t n = size * nmemb;
  if (t->request->on_body && !Success(t->status)) {
    // An error answer is no stream: collected (bounded) for the caller to
    // read the status and the provider's message, never fed to on_body.
    const size_t room = kErrorBodyBytes - std::min(kErrorBodyBytes, t->response->body.size());
    t->response->body.append(ptr, std::min(n, room));
    if (n > room) {
      t->error_body_cut = true;
      return 0;  // aborts with CURLE_WRITE_ERROR: enough to word the error
    }
  } else if (t->request->on_body) {
    if (!t->request->on_body(absl::string_view(ptr, n))) {
      t->aborted_by_body = true;
      return 0;  // aborts with CURLE_WRITE_ERROR
    }
  } else {
    if (t->response->body.size() + n > t->request->max_response_bytes) {
      t->too_large = true;
      return 0;  // aborts with CURLE_WRITE_ERROR
    }
    t->response->body.append(ptr, n);
  }
  return n;
}

size_t OnHeader(char* ptr, size_t size, size_t nmemb, void* userdata) {
  auto* t = static_cast<Transfer*>(userdata);
  const size_t n = size * nmemb;
  absl::string_view line(ptr, n);
  if (absl::StartsWith(line, "HTTP/")) {
    t->response->headers.clear();  // a new response (after 100-continue, redirects)
    // "HTTP/1.1 502 Bad Gateway", "HTTP/2 200"
    std::vector<absl::string_view> parts =
        absl::StrSplit(absl::StripAsciiWhitespace(line), ' ', absl::SkipEmpty());
    int code = 0;
    t->status = parts.size() >= 2 && absl::SimpleAtoi(parts[1], &code) ? code : 0;
    return n;
  }
  size_t colon = line.find(':');
  if (colon != absl::string_view::npos) {
    std::string name = absl::AsciiStrToLower(absl::StripAsciiWhitespace(line.substr(0, colon)));
    std::string value(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    t->response->headers.emplace(std::move(name), std::move(value));
  }
  return n;
}

int OnProgress(void* userdata, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(userdata);
  return (t->request->cancelled && t->request->cancelled()) ? 1 : 0;
}

curl_socket_t OnOpenSocket(void* clientp, curlsocktype, struct curl_sockaddr* addr) {
  ++*static_cast<std::atomic<int64_t>*>(clientp);
  return socket(addr->family, addr->socktype, addr->protocol);
}

}  // namespace

// One SendAsync transfer, owned by the multi loop from SendAsync to done.
struct HttpClient::Async {
  HttpRequest request;
  HttpResponse response;
  Transfer t{nullptr, nullptr};
  CURL* curl = nullptr;
  struct curl_slist* headers = nullptr;
  Done done;
};

std::string HttpResponse::Header(const std::string& name) const {
  auto it = headers.find(name);
  return it == headers.end() ? std::string() : it->second;
}

HttpClient::HttpClient(std::string user_agent)
    : user_agent_(std::move(user_agent)), connections_(std::make_shared<std::atomic<int64_t>>(0)) {
  static GlobalInit init;
}

HttpClient::~HttpClient() {
  CURLM* multi = nullptr;
  {
    absl::MutexLock l(&multi_mu_);
    stop_ = true;
    multi = static_cast<CURLM*>(multi_);
    if (multi) Wake(wake_fd_);
  }
  if (multi_thread_) multi_thread_->join();
  if (wake_fd_ >= 0) close(wake_fd_);
  {
    absl::MutexLock l(&multi_mu_);
    for (Async* a : adding_) {
      curl_slist_free_all(a->headers);
      curl_easy_cleanup(a->curl);
      Done done = std::move(a->done);
      delete a;
      done(absl::CancelledError("http: the client was shut down"));
    }
    adding_.clear();
  }
  if (multi) curl_multi_cleanup(multi);
  absl::MutexLock l(&mu_);
  for (void* h : idle_) curl_easy_cleanup(static_cast<CURL*>(h));
}

int64_t HttpClient::connections_opened() const { return connections_->load(); }

void* HttpClient::TakeHandle() {
  {
    absl::MutexLock l(&mu_);
    if (!idle_.empty()) {
      void* h = idle_.back();
      idle_.pop_back();
      return h;
    }
  }
  return curl_easy_init();
}

void HttpClient::ReturnHandle(void* handle) {
  absl::MutexLock l(&mu_);
  if (idle_.size() < 64) {
    idle_.push_back(handle);
    return;
  }
  curl_easy_cleanup(static_cast<CURL*>(handle));
}

std::string HttpClient::UrlEncode(absl::string_view s) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

namespace {

// The options of one transfer on a reset handle. Returns the header list
// (freed by the caller after the transfer).
struct curl_slist* Setup(CURL* curl, const HttpRequest& request, Transfer* t,
                         const std::string& user_agent, std::atomic<int64_t>* connections) {
  curl_easy_setopt(curl, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, request.method.c_str());
  if (request.method == "HEAD") curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  if (!request.body.empty() || request.method == "POST" || request.method == "PUT") {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request.body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE,
                     static_cast<curl_off_t>(request.body.size()));
  }
  struct curl_slist* headers = nullptr;
  for (const auto& [k, v] : request.headers) {
    headers = curl_slist_append(headers, absl::StrCat(k, ": ", v).c_str());
  }
  headers = curl_slist_append(headers, "Expect:");  // no 100-continue round trip
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_USERAGENT, user_agent.c_str());
  curl_easy_setopt(curl, CURLOPT_ACCEPT_ENCODING, "");  // gzip/deflate, decoded
  curl_easy_setopt(curl, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_2TLS);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
  if (request.timeout > absl::ZeroDuration()) {
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS,
                     static_cast<long>(absl::ToInt64Milliseconds(request.timeout)));
  }
  if (!request.ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, request.ca_file.c_str());
  if (!request.cert_file.empty()) {
    curl_easy_setopt(curl, CURLOPT_SSLCERT, request.cert_file.c_str());
  }
  if (!request.key_file.empty()) curl_easy_setopt(curl, CURLOPT_SSLKEY, request.key_file.c_str());
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnData);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, t);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, t);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, OnProgress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, t);
  curl_easy_setopt(curl, CURLOPT_OPENSOCKETFUNCTION, OnOpenSocket);
  curl_easy_setopt(curl, CURLOPT_OPENSOCKETDATA, connections);
  return headers;
}

// A request header that carries a credential.
bool SecretHeader(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  return n == "authorization" || n == "proxy-authorization" || n == "cookie" ||
         absl::StrContains(n, "key") || absl::StrContains(n, "token") ||
         absl::StrContains(n, "secret");
}

// `secret` as a JSON string's contents, with "/" escaped as "\/" or not
// (both are valid JSON; PHP and some proxies escape it).
std::string JsonEscaped(absl::string_view secret, bool escape_slash) {
  std::string out;
  for (unsigned char c : secret) {
    if (c == '"' || c == '\\' || (escape_slash && c == '/')) {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c < 0x20) {
      absl::StrAppend(&out, "\\u00", absl::Hex(c, absl::kZeroPad2));
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

// `secret` percent-encoded (RFC 3986 unreserved characters kept), with
// upper- or lower-case hex digits, and with a space as "+" or "%20".
std::string UrlEncoded(absl::string_view secret, bool lower_hex, bool space_plus) {
  std::string out;
  for (unsigned char c : secret) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else if (c == ' ' && space_plus) {
      out.push_back('+');
    } else {
      std::string hex = absl::StrCat(absl::Hex(c, absl::kZeroPad2));
      out += "%" + (lower_hex ? hex : absl::AsciiStrToUpper(hex));
    }
  }
  return out;
}

// Every form in which a server may echo `secret`: as sent, JSON-escaped,
// URL-encoded. Each distinct form once.
std::vector<std::string> EchoedForms(absl::string_view secret) {
  std::vector<std::string> forms = {std::string(secret)};
  for (bool slash : {false, true}) forms.push_back(JsonEscaped(secret, slash));
  for (bool lower : {false, true}) {
    for (bool plus : {false, true}) forms.push_back(UrlEncoded(secret, lower, plus));
  }
  std::sort(forms.begin(), forms.end());
  forms.erase(std::unique(forms.begin(), forms.end()), forms.end());
  return forms;
}

// An error body goes into errors and logs: a server (or a proxy before it)
// that echoes the request, verbatim, JSON-escaped or URL-encoded, must not
// make them carry its credentials.
void RedactSecrets(const HttpRequest& request, std::string* body) {
  for (const auto& [name, value] : request.headers) {
    if (!SecretHeader(name)) continue;
    std::vector<absl::string_view> secrets = {value};
    // "Bearer <token>": the token alone may be echoed too.
    if (size_t sp = value.find(' '); sp != std::string::npos) {
      secrets.push_back(absl::string_view(value).substr(sp + 1));
    }
    for (absl::string_view secret : secrets) {
      if (secret.size() < 4) continue;  // too short to tell from other text
      for (const std::string& form : EchoedForms(secret)) {
        size_t at = 0;
        while ((at = body->find(form, at)) != std::string::npos) {
          body->replace(at, form.size(), "[redacted]");
          at += 10;
        }
      }
    }
  }
}

absl::StatusOr<HttpResponse> Result(CURLcode rc, const Transfer& t, const HttpRequest& request,
                                    HttpResponse response) {
  if (!Success(response.status)) RedactSecrets(request, &response.body);
  if (rc == CURLE_OK) return response;
  if (rc == CURLE_WRITE_ERROR && t.error_body_cut) return response;  // its first kErrorBodyBytes
  if (rc == CURLE_ABORTED_BY_CALLBACK || (rc == CURLE_WRITE_ERROR && t.aborted_by_body)) {
    return absl::CancelledError("http: transfer stopped");
  }
  if (rc == CURLE_WRITE_ERROR && t.too_large) {
    return absl::UnavailableError(
        absl::StrCat("http: response body larger than ", request.max_response_bytes, " bytes"));
  }
  if (rc == CURLE_OPERATION_TIMEDOUT) {
    return absl::DeadlineExceededError(
        absl::StrCat("http: timed out (", curl_easy_strerror(rc), ")"));
  }
  absl::Status err = absl::UnavailableError(absl::StrCat("http: ", curl_easy_strerror(rc)));
  if (rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ||
      rc == CURLE_COULDNT_RESOLVE_PROXY) {
    err.SetPayload(kConnectFailedPayload, absl::Cord("1"));
  }
  return err;
}

}  // namespace

absl::StatusOr<HttpResponse> HttpClient::Send(const HttpRequest& request) {
  CURL* curl = static_cast<CURL*>(TakeHandle());
  if (curl == nullptr) return absl::InternalError("http: cannot create a curl handle");
  curl_easy_reset(curl);  // keeps the connection cache
  HttpResponse response;
  Transfer t{&request, &response};
  struct curl_slist* headers = Setup(curl, request, &t, user_agent_, connections_.get());
  CURLcode rc = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  response.status = static_cast<int>(status);
  ReturnHandle(curl);
  return Result(rc, t, request, std::move(response));
}

void HttpClient::SendAsync(HttpRequest request, Done done) {
  CURL* curl = static_cast<CURL*>(TakeHandle());
  if (curl == nullptr) {
    done(absl::InternalError("http: cannot create a curl handle"));
    return;
  }
  curl_easy_reset(curl);
  auto* a = new Async;
  a->request = std::move(request);
  a->t.request = &a->request;
  a->t.response = &a->response;
  a->curl = curl;
  a->done = std::move(done);
  a->headers = Setup(curl, a->request, &a->t, user_agent_, connections_.get());
  curl_easy_setopt(curl, CURLOPT_PRIVATE, a);
  absl::MutexLock l(&multi_mu_);
  if (multi_ == nullptr) {
    multi_ = curl_multi_init();
    wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    multi_thread_ = std::make_unique<std::thread>([this] { MultiLoop(); });
  }
  adding_.push_back(a);
  Wake(wake_fd_);
}

namespace {

using SteadyTime = std::chrono::steady_clock::time_point;

// The multi loop's sockets and curl's timer: libcurl tells it which sockets
// to watch (CURLMOPT_SOCKETFUNCTION) and when to call it back
// (CURLMOPT_TIMERFUNCTION); the loop waits on epoll and acts on exactly the
// sockets that are ready, so a wakeup costs O(ready), not O(transfers).
struct MultiSockets {
  int epoll_fd = -1;
  SteadyTime timer = SteadyTime::max();
};

int OnMultiSocket(CURL*, curl_socket_t fd, int what, void* userp, void*) {
  auto* ms = static_cast<MultiSockets*>(userp);
  if (what == CURL_POLL_REMOVE) {
    epoll_ctl(ms->epoll_fd, EPOLL_CTL_DEL, fd, nullptr);  // may be closed already
    return 0;
  }
  epoll_event ev{};
  ev.events = ((what & CURL_POLL_IN) ? EPOLLIN : 0u) | ((what & CURL_POLL_OUT) ? EPOLLOUT : 0u);
  ev.data.fd = fd;
  // A socket curl closed without a REMOVE left epoll by itself: then MOD
  // finds nothing and it is added anew.
  if (epoll_ctl(ms->epoll_fd, EPOLL_CTL_MOD, fd, &ev) != 0 && errno == ENOENT) {
    epoll_ctl(ms->epoll_fd, EPOLL_CTL_ADD, fd, &ev);
  }
  return 0;
}

int OnMultiTimer(CURLM*, long timeout_ms, void* userp) {
  auto* ms = static_cast<MultiSockets*>(userp);
  ms->timer = timeout_ms < 0
                  ? SteadyTime::max()
                  : std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  return 0;
}

}  // namespace

void HttpClient::Wake(int fd) {
  const uint64_t one = 1;
  if (fd >= 0) (void)!write(fd, &one, sizeof(one));
}

void HttpClient::MultiLoop() {
  CURLM* multi;
  int wake_fd;
  {
    absl::MutexLock l(&multi_mu_);
    multi = static_cast<CURLM*>(multi_);
    wake_fd = wake_fd_;
  }
  MultiSockets ms;
  ms.epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  epoll_event wake_ev{};
  wake_ev.events = EPOLLIN;
  wake_ev.data.fd = wake_fd;
  epoll_ctl(ms.epoll_fd, EPOLL_CTL_ADD, wake_fd, &wake_ev);
  curl_multi_setopt(multi, CURLMOPT_SOCKETFUNCTION, OnMultiSocket);
  curl_multi_setopt(multi, CURLMOPT_SOCKETDATA, &ms);
  curl_multi_setopt(multi, CURLMOPT_TIMERFUNCTION, OnMultiTimer);
  curl_multi_setopt(multi, CURLMOPT_TIMERDATA, &ms);

  std::unordered_set<Async*> running;
  // Removes a finished (or stopped) transfer and calls its `done`.
  auto finish = [&](Async* a, absl::StatusOr<HttpResponse> r) {
    curl_multi_remove_handle(multi, a->curl);
    running.erase(a);
    curl_slist_free_all(a->headers);
    ReturnHandle(a->curl);
    Done done = std::move(a->done);
    delete a;
    done(std::move(r));
  };
  constexpr auto kCancelSweep = std::chrono::milliseconds(100);
  SteadyTime next_sweep = std::chrono::steady_clock::now() + kCancelSweep;
  int still = 0;
  for (;;) {
    {
      SteadyTime now = std::chrono::steady_clock::now();
      SteadyTime until = std::min(ms.timer, next_sweep);
      int wait_ms = 0;
      if (until > now) {
        wait_ms = static_cast<int>(
            std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count() + 1);
      }
      epoll_event events[64];
      const int n = epoll_wait(ms.epoll_fd, events, 64, wait_ms);
      for (int i = 0; i < n; ++i) {
        const int fd = events[i].data.fd;
        if (fd == wake_fd) {
          uint64_t count;
          (void)!read(wake_fd, &count, sizeof(count));
          continue;
        }
        int flags = 0;
        if (events[i].events & EPOLLIN) flags |= CURL_CSELECT_IN;
        if (events[i].events & EPOLLOUT) flags |= CURL_CSELECT_OUT;
        if (events[i].events & (EPOLLERR | EPOLLHUP)) flags |= CURL_CSELECT_ERR;
        curl_multi_socket_action(multi, fd, flags, &still);
      }
    }
    std::vector<Async*> add;
    {
      absl::MutexLock l(&multi_mu_);
      if (stop_) break;
      add.swap(adding_);
    }
    for (Async* a : add) {
      running.insert(a);
      curl_multi_add_handle(multi, a->curl);  // sets curl's timer to "now"
    }
    const SteadyTime now = std::chrono::steady_clock::now();
    if (ms.timer <= now) {
      ms.timer = SteadyTime::max();  // curl sets the next one while it acts
      curl_multi_socket_action(multi, CURL_SOCKET_TIMEOUT, 0, &still);
    }
    int queued = 0;
    while (CURLMsg* m = curl_multi_info_read(multi, &queued)) {
      if (m->msg != CURLMSG_DONE) continue;
      Async* a = nullptr;
      curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, reinterpret_cast<char**>(&a));
      const CURLcode rc = m->data.result;
      long status = 0;
      curl_easy_getinfo(a->curl, CURLINFO_RESPONSE_CODE, &status);
      a->response.status = static_cast<int>(status);
      absl::StatusOr<HttpResponse> r = Result(rc, a->t, a->request, std::move(a->response));
      finish(a, std::move(r));
    }
    // `cancelled` is polled every 100 ms for every transfer, also one whose
    // sockets are quiet (curl calls the progress callback only for transfers
    // it acts on).
    if (now >= next_sweep) {
      next_sweep = now + kCancelSweep;
      std::vector<Async*> stopped;
      for (Async* a : running) {
        if (a->request.cancelled && a->request.cancelled()) stopped.push_back(a);
      }
      for (Async* a : stopped) finish(a, absl::CancelledError("http: transfer stopped"));
    }
  }
  for (Async* a : std::vector<Async*>(running.begin(), running.end())) {
    curl_multi_remove_handle(multi, a->curl);
    curl_slist_free_all(a->headers);
    curl_easy_cleanup(a->curl);
    Done done = std::move(a->done);
    delete a;
    done(absl::CancelledError("http: the client was shut down"));
  }
  curl_multi_setopt(multi, CURLMOPT_SOCKETFUNCTION, nullptr);
  curl_multi_setopt(multi, CURLMOPT_TIMERFUNCTION, nullptr);
  close(ms.epoll_fd);
}

namespace {
// Quotes a Content-Disposition parameter value.
std::string DispositionValue(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '"') {
      out += "%22";
    } else if (c == '\r') {
      out += "%0D";
    } else if (c == '\n') {
      out += "%0A";
    } else {
      out.push_back(c);
    }
  }
  return out;
}
}  // namespace

MultipartBody BuildMultipart(const std::vector<MultipartPart>& parts) {
  const std::string boundary = absl::StrCat("----sandbox-broker-", RandomHex(12));
  MultipartBody m;
  m.content_type = absl::StrCat("multipart/form-data; boundary=", boundary);
  for (const MultipartPart& p : parts) {
    absl::StrAppend(&m.body, "--", boundary, "\r\nContent-Disposition: form-data; name=\"",
                    DispositionValue(p.name), "\"");
    if (!p.filename.empty()) {
      absl::StrAppend(&m.body, "; filename=\"", DispositionValue(p.filename),
                      "\"\r\nContent-Type: ",
                      p.content_type.empty() ? "application/octet-stream" : p.content_type);
    } else if (!p.content_type.empty()) {
      absl::StrAppend(&m.body, "\r\nContent-Type: ", p.content_type);
    }
    m.body.append("\r\n\r\n");
    m.body.append(p.data);
    m.body.append("\r\n");
  }
  absl::StrAppend(&m.body, "--", boundary, "--\r\n");
  return m;
}

MultipartBody BuildMultipart(const std::vector<std::pair<std::string, std::string>>& files,
                             const std::string& field) {
  std::vector<MultipartPart> parts;
  for (const auto& [name, data] : files) parts.push_back({field, name, "", data});
  return BuildMultipart(parts);
}

namespace {
// The value of `param` in a header like `form-data; name="x"; filename="y"`.
std::string HeaderParam(absl::string_view header, absl::string_view param) {
  const std::string key = absl::StrCat(param, "=");
  size_t pos = 0;
  while ((pos = header.find(key, pos)) != absl::string_view::npos) {
    // Must start a parameter (not the tail of "filename*=" or similar).
    if (pos > 0 && header[pos - 1] != ' ' && header[pos - 1] != ';') {
      pos += key.size();
      continue;
    }
    absl::string_view v = header.substr(pos + key.size());
    if (!v.empty() && v.front() == '"') {
      size_t end = v.find('"', 1);
      return std::string(v.substr(1, end == absl::string_view::npos ? v.size() : end - 1));
    }
    size_t end = v.find(';');
    return std::string(absl::StripAsciiWhitespace(v.substr(0, end)));
  }
  return "";
}
}  // namespace

absl::StatusOr<std::vector<MultipartPart>> ParseMultipart(absl::string_view content_type,
                                                          absl::string_view body) {
  std::string boundary = HeaderParam(content_type, "boundary");
  if (boundary.empty()) return absl::InvalidArgumentError("multipart: no boundary");
  const std::string delim = absl::StrCat("--", boundary);
  std::vector<MultipartPart> parts;
  size_t pos = body.find(delim);
  if (pos == absl::string_view::npos) return absl::InvalidArgumentError("multipart: no parts");
  while (true) {
    pos += delim.size();
    if (body.substr(pos, 2) == "--") return parts;  // the closing delimiter
    if (body.substr(pos, 2) != "\r\n") return absl::InvalidArgumentError("multipart: malformed");
    pos += 2;
    size_t headers_end = body.find("\r\n\r\n", pos);
    if (headers_end == absl::string_view::npos) {
      return absl::InvalidArgumentError("multipart: unterminated headers");
    }
    MultipartPart part;
    int64_t content_length = -1;
    for (absl::string_view line : absl::StrSplit(body.substr(pos, headers_end - pos), "\r\n")) {
      size_t colon = line.find(':');
      if (colon == absl::string_view::npos) continue;
      std::string name = absl::AsciiStrToLower(absl::StripAsciiWhitespace(line.substr(0, colon)));
      absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
      if (name == "content-disposition") {
        part.name = HeaderParam(value, "name");
        part.filename = HeaderParam(value, "filename");
      } else if (name == "content-type") {
        part.content_type = std::string(value);
      } else if (name == "content-length") {
        if (!absl::SimpleAtoi(value, &content_length)) content_length = -1;
      }
    }
    const size_t data_start = headers_end + 4;
    // A part's own Content-Length wins over searching for the boundary: a
    // fixed boundary (Daytona's) may occur inside file data.
    size_t next = absl::string_view::npos;
    if (content_length >= 0 && data_start + static_cast<size_t>(content_length) <= body.size() &&
        body.substr(data_start + static_cast<size_t>(content_length), 2 + delim.size()) ==
            absl::StrCat("\r\n", delim)) {
      next = data_start + static_cast<size_t>(content_length);
    } else {
      next = body.find(absl::StrCat("\r\n", delim), data_start);
    }
    if (next == absl::string_view::npos)
      return absl::InvalidArgumentError("multipart: unterminated part");
    part.data = std::string(body.substr(data_start, next - data_start));
    parts.push_back(std::move(part));
    pos = next + 2;
  }
}

}  // namespace sandbox
