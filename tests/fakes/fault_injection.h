#pragma once

#include <httplib.h>

#include <atomic>
#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace sandbox {

// Failure switches shared by the fake provider servers; each is read per
// request, so a test can flip one between calls.
struct Faults {
  std::atomic<int> latency_ms{0};
  std::atomic<int> fail_next{0};        // next N requests: 500
  std::atomic<int> error_every_n{0};    // every Nth request: 503 (a share of 5xx)
  std::atomic<int> rate_limit_next{0};  // next N control-plane requests: 429
  std::atomic<int> retry_after_seconds{1};
  std::atomic<int> drop_next{0};  // next N requests: connection cut mid-response
  std::atomic<int64_t> requests{0};

  // Applies the switches to one request. `error(res, status, message)`
  // writes the provider's own error body. True when a fault answered.
  bool Apply(httplib::Response& res, bool control_plane,
             const std::function<void(httplib::Response&, int, const std::string&)>& error) {
    const int64_t n = ++requests;
    if (int ms = latency_ms.load(); ms > 0) absl::SleepFor(absl::Milliseconds(ms));
    if (TakeOne(drop_next)) {
      // Headers, then the connection is cut before the promised body.
      res.set_content_provider(1024, "application/json",
                               [](size_t, size_t, httplib::DataSink&) { return false; });
      return true;
    }
    if (TakeOne(fail_next)) {
      error(res, 500, "internal server error (injected)");
      return true;
    }
    if (int every = error_every_n.load(); every > 0 && n % every == 0) {
      error(res, 503, "service temporarily unavailable (injected)");
      return true;
    }
    if (control_plane && TakeOne(rate_limit_next)) {
      res.set_header("Retry-After", absl::StrCat(retry_after_seconds.load()));
      error(res, 429, "rate limit exceeded (injected)");
      return true;
    }
    return false;
  }

 private:
  static bool TakeOne(std::atomic<int>& counter) {
    int v = counter.load();
    while (v > 0) {
      if (counter.compare_exchange_weak(v, v - 1)) return true;
    }
    return false;
  }
};

}  // namespace sandbox
