#include "adapters/http/http_client.h"

#include <curl/curl.h>

#include <atomic>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
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
};

size_t OnData(char* ptr, size_t size, size_t nmemb, void* userdata) {
  auto* t = static_cast<Transfer*>(userdata);
  const size_t n = size * nmemb;
  if (t->request->on_body) {
    if (!t->request->on_body(absl::string_view(ptr, n))) {
      t->aborted_by_body = true;
      return 0;  // aborts with CURLE_WRITE_ERROR
    }
  } else {
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

std::string HttpResponse::Header(const std::string& name) const {
  auto it = headers.find(name);
  return it == headers.end() ? std::string() : it->second;
}

HttpClient::HttpClient(std::string user_agent)
    : user_agent_(std::move(user_agent)), connections_(std::make_shared<std::atomic<int64_t>>(0)) {
  static GlobalInit init;
}

HttpClient::~HttpClient() {
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

absl::StatusOr<HttpResponse> HttpClient::Send(const HttpRequest& request) {
  CURL* curl = static_cast<CURL*>(TakeHandle());
  if (curl == nullptr) return absl::InternalError("http: cannot create a curl handle");
  curl_easy_reset(curl);  // keeps the connection cache
  HttpResponse response;
  Transfer t{&request, &response};

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
  curl_easy_setopt(curl, CURLOPT_USERAGENT, user_agent_.c_str());
  curl_easy_setopt(curl, CURLOPT_ACCEPT_ENCODING, "");  // gzip/deflate, decoded
  curl_easy_setopt(curl, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_2TLS);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
  if (request.timeout > absl::ZeroDuration()) {
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS,
                     static_cast<long>(absl::ToInt64Milliseconds(request.timeout)));
  }
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, OnData);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, OnProgress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &t);
  curl_easy_setopt(curl, CURLOPT_OPENSOCKETFUNCTION, OnOpenSocket);
  curl_easy_setopt(curl, CURLOPT_OPENSOCKETDATA, connections_.get());

  CURLcode rc = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  response.status = static_cast<int>(status);
  ReturnHandle(curl);

  if (rc == CURLE_OK) return response;
  if (rc == CURLE_ABORTED_BY_CALLBACK || (rc == CURLE_WRITE_ERROR && t.aborted_by_body)) {
    return absl::CancelledError("http: transfer stopped");
  }
  if (rc == CURLE_OPERATION_TIMEDOUT) {
    return absl::DeadlineExceededError(
        absl::StrCat("http: timed out (", curl_easy_strerror(rc), ")"));
  }
  return absl::UnavailableError(absl::StrCat("http: ", curl_easy_strerror(rc)));
}

MultipartBody BuildMultipart(const std::vector<std::pair<std::string, std::string>>& files,
                             const std::string& field) {
  const std::string boundary = absl::StrCat("----sandbox-broker-", RandomHex(12));
  MultipartBody m;
  m.content_type = absl::StrCat("multipart/form-data; boundary=", boundary);
  for (const auto& [name, data] : files) {
    std::string escaped;
    for (char c : name) {
      if (c == '"') {
        escaped += "%22";
      } else if (c == '\r' || c == '\n') {
        escaped += c == '\r' ? "%0D" : "%0A";
      } else {
        escaped.push_back(c);
      }
    }
    absl::StrAppend(&m.body, "--", boundary, "\r\nContent-Disposition: form-data; name=\"", field,
                    "\"; filename=\"", escaped,
                    "\"\r\nContent-Type: application/octet-stream\r\n\r\n");
    m.body.append(data);
    m.body.append("\r\n");
  }
  absl::StrAppend(&m.body, "--", boundary, "--\r\n");
  return m;
}

}  // namespace sandbox
