#pragma once

#include <httplib.h>

#include <atomic>
#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"

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
  // The fake creates the sandbox, then waits this long before answering the
  // create (widens the window between a provider's create and the caller's
  // next step, for crash tests).
  std::atomic<int> create_latency_ms{0};
  // While nonzero, creates wait (after the sandbox exists, before the reply)
  // until it is set to 0: a test sees how many creates are in flight at
  // once, then lets them go.
  std::atomic<int> hold_creates{0};
  // The same for attaches (E2B's connect): while nonzero they wait before
  // answering; connects_in_flight counts those waiting or being answered.
  std::atomic<int> hold_connects{0};
  std::atomic<int> connects_in_flight{0};
  // The same for file transfers (E2B's /files, Daytona's bulk upload and
  // download): while nonzero they wait before answering.
  std::atomic<int> hold_files{0};
  std::atomic<int> files_in_flight{0};
  // And for deletes (a sandbox's destroy).
  std::atomic<int> hold_deletes{0};
  std::atomic<int> deletes_in_flight{0};
  std::atomic<int64_t> requests{0};
  // Create requests received so far (counted on arrival, before any fault).
  std::atomic<int64_t> create_requests{0};
  // Sandboxes created and deleted (by a DELETE) so far.
  std::atomic<int64_t> creates{0};
  std::atomic<int64_t> deletes{0};
  // Create requests being handled now, and the most at once so far.
  std::atomic<int> creates_in_flight{0};
  std::atomic<int> max_creates_in_flight{0};

  // Counts one create request as in flight while it lives.
  class CreateScope {
   public:
    explicit CreateScope(Faults* f) : f_(f) {
      const int n = ++f_->creates_in_flight;
      int m = f_->max_creates_in_flight.load();
      while (n > m && !f_->max_creates_in_flight.compare_exchange_weak(m, n)) {
      }
    }
    ~CreateScope() { --f_->creates_in_flight; }
    CreateScope(const CreateScope&) = delete;
    CreateScope& operator=(const CreateScope&) = delete;

   private:
    Faults* const f_;
  };
  // Responses cut by drop_next so far.
  std::atomic<int64_t> dropped{0};

  // Sets the switches named in a JSON object (POST /_fake/faults). False,
  // with `error`, for anything else.
  bool Set(const std::string& body, std::string* error) {
    nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
    if (!j.is_object()) {
      *error = "body must be a JSON object";
      return false;
    }
    const std::pair<const char*, std::atomic<int>*> fields[] = {
        {"latency_ms", &latency_ms},
        {"create_latency_ms", &create_latency_ms},
        {"hold_creates", &hold_creates},
        {"hold_connects", &hold_connects},
        {"hold_files", &hold_files},
        {"hold_deletes", &hold_deletes},
        {"fail_next", &fail_next},
        {"error_every_n", &error_every_n},
        {"rate_limit_next", &rate_limit_next},
        {"retry_after_seconds", &retry_after_seconds},
        {"drop_next", &drop_next}};
    for (auto it = j.begin(); it != j.end(); ++it) {
      std::atomic<int>* target = nullptr;
      for (const auto& [name, field] : fields) {
        if (it.key() == name) target = field;
      }
      if (target == nullptr) {
        *error = absl::StrCat("unknown fault \"", it.key(), "\"");
        return false;
      }
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
          it.value().get<int64_t>() > 1000000) {
        *error = absl::StrCat(it.key(), ": must be an integer in [0, 1000000]");
        return false;
      }
    }
    for (auto it = j.begin(); it != j.end(); ++it) {
      for (const auto& [name, field] : fields) {
        if (it.key() == name) field->store(it.value().get<int>());
      }
    }
    return true;
  }

  // Sleeps create_latency_ms (after the sandbox exists, before the reply),
  // and waits while hold_creates is set.
  void CreateLatency() {
    if (int ms = create_latency_ms.load(); ms > 0) absl::SleepFor(absl::Milliseconds(ms));
    while (hold_creates.load() != 0) absl::SleepFor(absl::Milliseconds(2));
  }

  // Counts one request as in flight while it lives, and waits while its
  // hold switch is set.
  class HoldScope {
   public:
    HoldScope(std::atomic<int>* hold, std::atomic<int>* in_flight) : in_flight_(in_flight) {
      ++*in_flight_;
      while (hold->load() != 0) absl::SleepFor(absl::Milliseconds(2));
    }
    ~HoldScope() { --*in_flight_; }
    HoldScope(const HoldScope&) = delete;
    HoldScope& operator=(const HoldScope&) = delete;

   private:
    std::atomic<int>* const in_flight_;
  };
  // A connect (hold_connects) and a file transfer (hold_files).
  struct ConnectScope : HoldScope {
    explicit ConnectScope(Faults* f) : HoldScope(&f->hold_connects, &f->connects_in_flight) {}
  };
  struct FileScope : HoldScope {
    explicit FileScope(Faults* f) : HoldScope(&f->hold_files, &f->files_in_flight) {}
  };
  struct DeleteScope : HoldScope {
    explicit DeleteScope(Faults* f) : HoldScope(&f->hold_deletes, &f->deletes_in_flight) {}
  };

  // Applies the switches to one request. `error(res, status, message)`
  // writes the provider's own error body. True when a fault answered.
  bool Apply(httplib::Response& res, bool control_plane,
             const std::function<void(httplib::Response&, int, const std::string&)>& error) {
    const int64_t n = ++requests;
    if (int ms = latency_ms.load(); ms > 0) absl::SleepFor(absl::Milliseconds(ms));
    if (TakeOne(drop_next)) {
      ++dropped;
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

// The fakes' test-control endpoints (never part of a provider's API):
//   GET  /_fake/stats   {"creates": N, "deletes": N, "dropped": N, "live": N,
//                        "requests": N, "create_requests": N,
//                        "creates_in_flight": N,
//                        "max_creates_in_flight": N, "connects_in_flight": N,
//                        "files_in_flight": N, "deletes_in_flight": N}
//   POST /_fake/faults  a JSON object of any Faults switches
inline void AddFakeControlRoutes(httplib::Server& server, Faults& faults,
                                 std::function<int64_t()> live) {
  server.Get("/_fake/stats", [&faults, live](const httplib::Request&, httplib::Response& res) {
    nlohmann::json j = {{"creates", faults.creates.load()},
                        {"deletes", faults.deletes.load()},
                        {"dropped", faults.dropped.load()},
                        {"live", live()},
                        {"requests", faults.requests.load()},
                        {"create_requests", faults.create_requests.load()},
                        {"creates_in_flight", faults.creates_in_flight.load()},
                        {"max_creates_in_flight", faults.max_creates_in_flight.load()},
                        {"connects_in_flight", faults.connects_in_flight.load()},
                        {"files_in_flight", faults.files_in_flight.load()},
                        {"deletes_in_flight", faults.deletes_in_flight.load()}};
    res.set_content(j.dump(), "application/json");
  });
  server.Post("/_fake/faults", [&faults](const httplib::Request& req, httplib::Response& res) {
    std::string error;
    if (!faults.Set(req.body, &error)) {
      res.status = 400;
      res.set_content(nlohmann::json({{"error", error}}).dump(), "application/json");
      return;
    }
    res.set_content("{}", "application/json");
  });
}

}  // namespace sandbox
