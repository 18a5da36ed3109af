#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace sandbox {

struct HttpRequest {
  std::string method = "GET";
  std::string url;
  // Name/value pairs sent as is. Values may hold secrets: they never appear
  // in errors or logs.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // The whole exchange, including a streamed body. Zero = no limit.
  absl::Duration timeout = absl::Seconds(60);
  // Streamed response: called with each piece of a 2xx response's body as
  // it arrives instead of collecting it; return false to abort the transfer.
  // Any other status's body is collected in HttpResponse::body instead (its
  // first 64 KiB), for the caller to word the error.
  std::function<bool(absl::string_view)> on_body;
  // Polled during the transfer; true aborts it (CANCELLED).
  std::function<bool()> cancelled;
  // A collected body larger than this fails the request (UNAVAILABLE): a
  // provider answering garbage cannot make the daemon buffer without bound.
  size_t max_response_bytes = size_t{256} << 20;
  // TLS (https URLs): a PEM CA bundle to verify the server with instead of
  // the system's, and a PEM client certificate and key. Empty = unset.
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
};

struct HttpResponse {
  int status = 0;
  // Lower-case names.
  std::multimap<std::string, std::string> headers;
  // Empty when on_body was given and the status is 2xx. Not 2xx: the values
  // of the request's credential headers (Authorization, *key*, *token*,
  // *secret*, Cookie) are replaced by "[redacted]", verbatim, JSON-escaped
  // or URL-encoded, since error bodies end up in errors and logs.
  std::string body;

  // The first value of a header (name in lower case), or "".
  std::string Header(const std::string& name) const;
};

// A small HTTP/1.1 (and HTTP/2 over TLS, where the server offers it) client
// over libcurl, shared by all sandboxes of a provider. Connections are kept
// alive and reused: handles return to a pool, each with its connection cache.
//
// Errors: UNAVAILABLE for transport failures (connect, reset, TLS),
// DEADLINE_EXCEEDED when `timeout` passes, CANCELLED when `cancelled` or
// on_body stopped it. An HTTP error status is a response, not an error.
//
// Thread-safe.
class HttpClient {
 public:
  explicit HttpClient(std::string user_agent);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  absl::StatusOr<HttpResponse> Send(const HttpRequest& request);

  // Send without holding the caller's thread: the transfer runs on the
  // client's libcurl multi handle, driven by one thread of its own (started
  // on first use). `done` is called exactly once, on that thread, with what
  // Send would return; it and the request's callbacks must not block.
  // `cancelled` is polled at least every 100 ms.
  using Done = std::function<void(absl::StatusOr<HttpResponse>)>;
  void SendAsync(HttpRequest request, Done done);

  // TCP connections opened so far (to see that connections are reused).
  int64_t connections_opened() const;

  // "%2F"-style encoding of a query value.
  static std::string UrlEncode(absl::string_view s);

 private:
  struct Async;
  void* TakeHandle();
  void ReturnHandle(void* handle);
  void MultiLoop();
  static void Wake(int eventfd);

  const std::string user_agent_;
  absl::Mutex mu_;
  std::vector<void*> idle_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<std::atomic<int64_t>> connections_;
  // SendAsync's multi handle and thread; transfers waiting to be added.
  absl::Mutex multi_mu_;
  void* multi_ ABSL_GUARDED_BY(multi_mu_) = nullptr;
  bool stop_ ABSL_GUARDED_BY(multi_mu_) = false;
  std::vector<Async*> adding_ ABSL_GUARDED_BY(multi_mu_);
  int wake_fd_ = -1;  // an eventfd the multi loop waits on; set with multi_
  std::unique_ptr<std::thread> multi_thread_;
};

// A transport failure before any byte reached the server (refused, no
// route, DNS): safe to retry for any method.
inline constexpr char kConnectFailedPayload[] = "type.sandbox-broker.dev/http-connect-failed";
inline bool IsConnectFailure(const absl::Status& s) {
  return s.GetPayload(kConnectFailedPayload).has_value();
}

// One part of a multipart/form-data body.
struct MultipartPart {
  std::string name;      // the form field
  std::string filename;  // empty for a plain field
  std::string content_type;
  std::string data;
};

struct MultipartBody {
  std::string content_type;  // with the boundary
  std::string body;
};

// A multipart/form-data body, as browsers and the official SDKs send them
// (file parts get application/octet-stream unless they say otherwise).
MultipartBody BuildMultipart(const std::vector<MultipartPart>& parts);
// One file part per (filename, bytes), all under the field `field`.
MultipartBody BuildMultipart(const std::vector<std::pair<std::string, std::string>>& files,
                             const std::string& field);

// Splits a multipart body. INVALID_ARGUMENT when `content_type` has no
// boundary or the body is malformed.
absl::StatusOr<std::vector<MultipartPart>> ParseMultipart(absl::string_view content_type,
                                                          absl::string_view body);

}  // namespace sandbox
