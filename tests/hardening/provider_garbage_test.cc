// Providers answering garbage (docs/hardening.md): truncated JSON, wrong
// types, HTML, huge bodies, a stalled server and slowloris responses, from a
// real HTTP server standing in for E2B and Daytona. Every call fails with
// UNAVAILABLE or INTERNAL naming the provider, within the provider's request
// timeout, with a bounded message; the daemon stays up and keeps nothing
// (no session, no growing file descriptors).

#include <dirent.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "adapters/daytona/daytona_provider.h"
#include "tests/testing/broker_fixture.h"

namespace sandbox {
namespace {

using C = absl::StatusCode;

enum class Garbage { kTruncated, kWrongTypes, kHtml, kHuge200, kHuge500, kStall, kSlowloris };
const char* Name(Garbage g) {
  switch (g) {
    case Garbage::kTruncated:
      return "truncated";
    case Garbage::kWrongTypes:
      return "wrong-types";
    case Garbage::kHtml:
      return "html";
    case Garbage::kHuge200:
      return "huge-200";
    case Garbage::kHuge500:
      return "huge-500";
    case Garbage::kStall:
      return "stall";
    case Garbage::kSlowloris:
      return "slowloris";
  }
  return "?";
}
constexpr Garbage kAll[] = {Garbage::kTruncated, Garbage::kWrongTypes, Garbage::kHtml,
                            Garbage::kHuge200,   Garbage::kHuge500,    Garbage::kStall,
                            Garbage::kSlowloris};

int OpenFds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (struct dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

// Answers requests whose path starts with `good_prefix` with `good_body`
// (status 200), everything else with the current garbage.
class GarbageServer {
 public:
  GarbageServer() {
    auto handler = [this](const httplib::Request& req, httplib::Response& res) {
      std::string prefix, body;
      {
        // The broker probes this server as soon as it starts, while the
        // test body may still be calling Good().
        absl::MutexLock l(&good_mu_);
        prefix = good_prefix_;
        body = good_body_;
      }
      if (!prefix.empty() && absl::StartsWith(req.path, prefix)) {
        res.set_content(body, "application/json");
        return;
      }
      Answer(res);
    };
    server_.Get(".*", handler);
    server_.Post(".*", handler);
    server_.Delete(".*", handler);
    server_.Put(".*", handler);
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~GarbageServer() {
    stop_ = true;
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  void Set(Garbage g) { mode_ = g; }
  void Good(std::string prefix, std::string body) {
    absl::MutexLock l(&good_mu_);
    good_prefix_ = std::move(prefix);
    good_body_ = std::move(body);
  }

 private:
  void Answer(httplib::Response& res) {
    const Garbage g = mode_.load();
    switch (g) {
      case Garbage::kTruncated:
        res.status = 201;
        res.set_content(R"({"sandboxID":"sb-1","id":"sb-1","envdAcc)", "application/json");
        return;
      case Garbage::kWrongTypes:
        res.status = 200;
        res.set_content(R"({"sandboxID":42,"id":["sb"],"state":{},"exitCode":"x","result":7})",
                        "application/json");
        return;
      case Garbage::kHtml:
        res.status = 200;
        res.set_content("<html><body>\xff\xfe not json</body></html>", "text/html");
        return;
      case Garbage::kHuge200:
      case Garbage::kHuge500: {
        res.status = g == Garbage::kHuge200 ? 200 : 500;
        // 300 MiB, above the HTTP client's 256 MiB response limit.
        res.set_chunked_content_provider("application/json",
                                         [this](size_t offset, httplib::DataSink& sink) {
                                           static const std::string chunk(1 << 20, 'x');
                                           if (stop_ || offset >= (size_t{300} << 20)) {
                                             sink.done();
                                             return true;
                                           }
                                           return sink.write(chunk.data(), chunk.size());
                                         });
        return;
      }
      case Garbage::kStall:  // accepts, reads the request, never answers
        for (int i = 0; i < 200 && !stop_; ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        res.status = 500;
        return;
      case Garbage::kSlowloris:  // headers, then a byte every 100 ms forever
        res.status = 200;
        res.set_chunked_content_provider(
            "application/json", [this](size_t, httplib::DataSink& sink) {
              std::this_thread::sleep_for(std::chrono::milliseconds(100));
              if (stop_) return false;
              return sink.write("{", 1);
            });
        return;
    }
  }

  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<Garbage> mode_{Garbage::kTruncated};
  absl::Mutex good_mu_;
  std::string good_prefix_ ABSL_GUARDED_BY(good_mu_), good_body_ ABSL_GUARDED_BY(good_mu_);
};

constexpr int kRequestTimeoutSeconds = 2;

class ProviderGarbageTest : public BrokerFixture {
 protected:
  void SetUp() override {
    nlohmann::json extra = {{"providers",
                             {{"e2b",
                               {{"api_key", "e2b_test_key"},
                                {"api_url", garbage_.url()},
                                {"sandbox_url", garbage_.url()},
                                {"request_timeout_seconds", kRequestTimeoutSeconds},
                                {"retries", 0}}},
                              {"daytona",
                               {{"api_key", "dtn_test_key"},
                                {"api_url", garbage_.url() + "/api"},
                                {"request_timeout_seconds", kRequestTimeoutSeconds},
                                {"create_timeout_seconds", kRequestTimeoutSeconds}}}}}};
    StartBroker(extra.dump());
  }

  // One call through the broker; checks its code, the time it took and the
  // message.
  void Expect(const std::string& provider, const std::string& what,
              const std::function<grpc::Status(grpc::ClientContext*)>& call, absl::Duration limit) {
    auto ctx = Ctx();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    const absl::Time start = absl::Now();
    grpc::Status s = call(ctx.get());
    const absl::Duration took = absl::Now() - start;
    EXPECT_LE(took, limit) << what;
    EXPECT_TRUE(s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                s.error_code() == grpc::StatusCode::INTERNAL)
        << what << ": " << s.error_code() << " " << s.error_message().substr(0, 300);
    EXPECT_TRUE(absl::StrContains(s.error_message(), provider + ":"))
        << what << ": " << s.error_message().substr(0, 300);
    EXPECT_LE(s.error_message().size(), 1100u) << what;
  }

  void ExpectNoSessions() {
    pb::ListSessionsRequest req;
    pb::ListSessionsResponse resp;
    auto ctx = Ctx();
    ASSERT_TRUE(stub_->ListSessions(ctx.get(), req, &resp).ok());
    for (const auto& s : resp.sessions()) ADD_FAILURE() << "left behind: " << s.session_id();
  }

  GarbageServer garbage_;
};

TEST_F(ProviderGarbageTest, CreationFailsCleanlyOnEveryKindOfGarbage) {
  const absl::Duration limit = absl::Seconds(kRequestTimeoutSeconds + 3);
  // Two rounds: the second must not hold more descriptors than the first
  // (idle HTTP connections and the garbage server's own sockets are in this
  // process too, so the first round is the baseline).
  int fds_after_round[2] = {0, 0};
  for (int round = 0; round < 2; ++round) {
    for (const std::string provider : {"e2b", "daytona"}) {
      for (Garbage g : kAll) {
        garbage_.Set(g);
        const std::string what = provider + "/" + Name(g);
        Expect(
            provider, what,
            [&](grpc::ClientContext* ctx) {
              pb::StartSessionRequest req;
              req.set_session_id("g-" + provider);
              req.mutable_spec()->set_provider(provider);
              pb::SessionInfo info;
              return stub_->StartSession(ctx, req, &info);
            },
            limit);
        ExpectNoSessions();
      }
    }
    fds_after_round[round] = OpenFds();
  }
  EXPECT_LE(fds_after_round[1], fds_after_round[0] + 2);
}

TEST_F(ProviderGarbageTest, E2BRunsFailCleanlyWhenEnvdAnswersGarbage) {
  garbage_.Good("/v2/sandboxes",
                R"({"sandboxID":"isbgarbage","envdVersion":"0.6.4","envdAccessToken":"t"})");
  for (Garbage g : kAll) {
    garbage_.Set(g);
    const std::string what = std::string("e2b run/") + Name(g);
    if (g == Garbage::kStall || g == Garbage::kSlowloris) {
      // envd accepting the call and never answering (or trickling bytes)
      // looks like a process still running: the run's own timeout ends it
      // (timed_out), in time; or the garbage is seen first (UNAVAILABLE).
      pb::RunRequest req;
      req.set_session_id("g-run");
      req.set_code("print(1)");
      req.set_timeout_seconds(3);
      req.mutable_spec()->set_provider("e2b");
      pb::RunResult out;
      auto ctx = Ctx();
      const absl::Time start = absl::Now();
      grpc::Status s = stub_->Run(ctx.get(), req, &out);
      EXPECT_LE(absl::Now() - start, absl::Seconds(3 + kRequestTimeoutSeconds + 3));
      EXPECT_TRUE(s.ok() ? out.timed_out() : s.error_code() == grpc::StatusCode::UNAVAILABLE)
          << s.error_code() << " " << s.error_message();
      continue;
    }
    Expect(
        "e2b", what,
        [&](grpc::ClientContext* ctx) {
          pb::RunRequest req;
          req.set_session_id("g-run");
          req.set_code("print(1)");
          req.set_timeout_seconds(3);
          req.mutable_spec()->set_provider("e2b");
          pb::RunResult out;
          return stub_->Run(ctx, req, &out);
        },
        absl::Seconds(3 + kRequestTimeoutSeconds + 3));
    // File bodies are raw bytes: any 200 reply is a file's contents, so only
    // bad statuses, oversized bodies and slow replies must fail.
    if (g == Garbage::kWrongTypes || g == Garbage::kHtml) continue;
    Expect(
        "e2b", std::string("e2b write/") + Name(g),
        [&](grpc::ClientContext* ctx) {
          pb::WriteFileRequest req;
          req.set_session_id("g-run");
          req.set_path("a.txt");
          req.set_contents("x");
          pb::WriteFileResponse out;
          return stub_->WriteFile(ctx, req, &out);
        },
        absl::Seconds(kRequestTimeoutSeconds + 3));
    Expect(
        "e2b", std::string("e2b read/") + Name(g),
        [&](grpc::ClientContext* ctx) {
          pb::ReadFileRequest req;
          req.set_session_id("g-run");
          req.set_path("a.txt");
          pb::ReadFileResponse out;
          return stub_->ReadFile(ctx, req, &out);
        },
        absl::Seconds(kRequestTimeoutSeconds + 3));
  }
  pb::CloseSessionRequest close;
  close.set_session_id("g-run");
  pb::CloseSessionResponse closed;
  auto ctx = Ctx();
  const absl::Time start = absl::Now();
  EXPECT_TRUE(stub_->CloseSession(ctx.get(), close, &closed).ok());
  EXPECT_LE(absl::Now() - start, absl::Seconds(kRequestTimeoutSeconds + 3));
  ExpectNoSessions();
}

// The orphan sweep and crash recovery list sandboxes on the reaper thread:
// a listing with wrong types (here a null and a numeric state, a numeric
// createdAt) must be read, not thrown on (that crash-looped the daemon).
TEST(DaytonaListing, WrongTypesInAListedSandboxAreSkippedNotFatal) {
  GarbageServer server;
  server.Good("/api/sandbox", R"({"items": [
      {"id": "sb-null", "state": null, "createdAt": 5,
       "labels": {"sandbox-broker.deployment-id": "dep-1", "sandbox-broker.attempt-id": "a1"}},
      {"id": "sb-num", "state": 7, "labels": {"sandbox-broker.deployment-id": "dep-1"}},
      {"id": "sb-gone", "state": "destroyed",
       "labels": {"sandbox-broker.deployment-id": "dep-1"}},
      {"id": 42, "state": "started", "labels": {"sandbox-broker.deployment-id": "dep-1"}},
      {"id": "sb-other", "state": "started", "labels": {"sandbox-broker.deployment-id": "dep-2"}}
    ]})");
  auto c =
      ParseDaytonaConfig({{"api_key", "dtn_test_key"}, {"api_url", server.url() + "/api"}}, 60);
  ASSERT_TRUE(c.ok()) << c.status();
  auto provider = DaytonaProvider::Create(*c);
  ASSERT_TRUE(provider.ok()) << provider.status();
  auto owned = (*provider)->ListOwned("dep-1");
  ASSERT_TRUE(owned.ok()) << owned.status();
  ASSERT_EQ(owned->size(), 2u);
  EXPECT_EQ((*owned)[0].sandbox_id, "sb-null");
  EXPECT_EQ((*owned)[0].attempt_id, "a1");
  EXPECT_EQ((*owned)[1].sandbox_id, "sb-num");
}

}  // namespace
}  // namespace sandbox
