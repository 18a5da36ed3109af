#include "adapters/http/http_client.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <cctype>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "tests/fakes/fake_common.h"

namespace sandbox {
namespace {

TEST(Multipart, BuildAndParseRoundTripBinaryParts) {
  const std::string binary("\x00\r\n--x\r\n\xff", 9);
  MultipartBody m = BuildMultipart(std::vector<MultipartPart>{
      {"files[0].path", "", "", "/home/a b/\"q\".txt"}, {"files[0].file", "q.txt", "", binary}});
  auto parts = ParseMultipart(m.content_type, m.body);
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].name, "files[0].path");
  EXPECT_EQ((*parts)[0].filename, "");
  EXPECT_EQ((*parts)[0].data, "/home/a b/\"q\".txt");
  EXPECT_EQ((*parts)[1].filename, "q.txt");
  EXPECT_EQ((*parts)[1].content_type, "application/octet-stream");
  EXPECT_EQ((*parts)[1].data, binary);
  EXPECT_FALSE(ParseMultipart("multipart/form-data", m.body).ok());
  EXPECT_FALSE(ParseMultipart(m.content_type, "garbage").ok());
}

TEST(HttpClient, ReusesOneConnectionAndStreamsBodies) {
  httplib::Server server;
  server.Get("/hello", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("hello", "text/plain");
  });
  server.Post("/echo", [](const httplib::Request& req, httplib::Response& res) {
    res.set_header("X-Seen", req.get_header_value("X-Test"));
    res.set_content(req.body, "application/octet-stream");
  });
  server.Post("/gone", [](const httplib::Request& req, httplib::Response& res) {
    res.status = 502;
    // A big error body: its first 64 KiB are kept, the rest is not read.
    res.set_content(R"({"message":"The sandbox was not found"})" +
                        std::string(req.has_param("big") ? 1 << 20 : 0, ' '),
                    "application/json");
  });
  server.Get("/echo-error", [](const httplib::Request& req, httplib::Response& res) {
    res.status = 500;  // a proxy that echoes what it got
    res.set_content("key=" + req.get_header_value("X-API-KEY") +
                        " auth=" + req.get_header_value("Authorization") +
                        " ua=" + req.get_header_value("User-Agent"),
                    "text/plain");
  });
  server.Get("/echo-encoded", [](const httplib::Request& req, httplib::Response& res) {
    res.status = 400;  // a server quoting the key in JSON and in a URL
    const std::string key = req.get_header_value("X-API-KEY");
    std::string json_slashes, url;
    for (char c : key) json_slashes += c == '/' ? std::string("\\/") : std::string(1, c);
    for (char c : key) {
      url += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'
                 ? std::string(1, c)
                 : absl::StrFormat("%%%02x", c);
    }
    res.set_content(absl::StrCat(R"({"error":"bad key \")", json_slashes, R"(\"","retry":"/v?key=)",
                                 url, R"("})"),
                    "application/json");
  });
  server.set_keep_alive_max_count(1000);  // httplib closes after 5 by default
  int port = server.bind_to_any_port("127.0.0.1");
  std::thread t([&] { server.listen_after_bind(); });
  HttpClient client("test-agent");
  const std::string base = "http://127.0.0.1:" + std::to_string(port);
  for (int i = 0; i < 20; ++i) {
    HttpRequest req;
    req.url = base + "/hello";
    auto r = client.Send(req);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "hello");
  }
  EXPECT_EQ(client.connections_opened(), 1);
  HttpRequest post;
  post.method = "POST";
  post.url = base + "/echo";
  post.headers = {{"X-Test", "v"}};
  post.body = std::string("a\0b", 3);
  std::string streamed;
  post.on_body = [&](absl::string_view d) {
    streamed.append(d.data(), d.size());
    return true;
  };
  auto r = client.Send(post);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->Header("x-seen"), "v");
  EXPECT_EQ(streamed, std::string("a\0b", 3));
  EXPECT_TRUE(r->body.empty());
  // An error status is no stream: on_body never sees its body, the
  // response carries it (bounded), and the status is the answer.
  for (const std::string path : {"/gone", "/gone?big=1"}) {
    HttpRequest failed = post;
    failed.url = base + path;
    streamed.clear();
    auto e = client.Send(failed);
    ASSERT_TRUE(e.ok()) << path << ": " << e.status();
    EXPECT_EQ(e->status, 502);
    EXPECT_TRUE(streamed.empty()) << path;
    EXPECT_EQ(e->body.rfind(R"({"message":"The sandbox was not found"})", 0), 0u) << path;
    EXPECT_LE(e->body.size(), size_t{64} << 10) << path;
  }
  // Credentials never come back in an error body (errors and logs quote it).
  HttpRequest echo;
  echo.url = base + "/echo-error";
  echo.headers = {{"X-API-KEY", "e2b_SECRET-CANARY-123"},
                  {"Authorization", "Bearer dtn-CANARY-321"}};
  auto echoed = client.Send(echo);
  ASSERT_TRUE(echoed.ok()) << echoed.status();
  EXPECT_EQ(echoed->status, 500);
  EXPECT_EQ(echoed->body, "key=[redacted] auth=[redacted] ua=test-agent");
  // JSON-escaped ("\/") and URL-encoded (lower-case hex) echoes too.
  echo.url = base + "/echo-encoded";
  echo.headers = {{"X-API-KEY", "dtn/CANARY+9=z"}};
  echoed = client.Send(echo);
  ASSERT_TRUE(echoed.ok()) << echoed.status();
  EXPECT_EQ(echoed->status, 400);
  EXPECT_EQ(echoed->body, R"({"error":"bad key \"[redacted]\"","retry":"/v?key=[redacted]"})");
  server.stop();
  t.join();
  HttpRequest refused;
  refused.url = base + "/hello";
  auto gone = client.Send(refused);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(IsConnectFailure(gone.status()));
}

// SendAsync: many transfers at once on the multi loop, each answered; a
// quiet transfer (its server holds the response) is stopped by `cancelled`
// without any socket activity; a transfer in flight when the client goes
// away is answered CANCELLED.
TEST(HttpClient, AsyncTransfersRunTogetherStopWhenCancelledAndEndWithTheClient) {
  httplib::Server server;
  absl::Notification release;
  server.Get("/n", [](const httplib::Request& req, httplib::Response& res) {
    res.set_content("n=" + req.get_param_value("i"), "text/plain");
  });
  server.Get("/hold", [&](const httplib::Request&, httplib::Response& res) {
    release.WaitForNotificationWithTimeout(absl::Seconds(60));
    res.set_content("late", "text/plain");
  });
  server.new_task_queue = [] { return new httplib::ThreadPool(80); };
  server.set_keep_alive_timeout(1);  // stop() waits out idle connections
  // A deep backlog: the 64 connects below come at once, and the packaged
  // httplib listens with 5 (dropped SYNs are retried after 1, 3, 7, 15,
  // 31 s: this test once waited past 30 s for them under ASan).
  int port = BindFakeServer(server, 0);
  ASSERT_GT(port, 0);
  std::thread t([&] { server.listen_after_bind(); });
  const std::string base = "http://127.0.0.1:" + std::to_string(port);

  constexpr int kCalls = 64;
  absl::Mutex mu;
  int answered = 0;
  std::vector<std::string> bodies(kCalls);
  // After what its callbacks touch: destroyed first, even on a failed
  // assertion (its transfers are answered CANCELLED as it goes).
  auto client = std::make_unique<HttpClient>("test-agent");
  for (int i = 0; i < kCalls; ++i) {
    HttpRequest req;
    req.url = base + "/n?i=" + std::to_string(i);
    client->SendAsync(std::move(req), [&, i](absl::StatusOr<HttpResponse> r) {
      absl::MutexLock l(&mu);
      bodies[i] = r.ok() ? r->body : std::string(r.status().message());
      ++answered;
    });
  }
  {
    absl::MutexLock l(&mu);
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(
                                        +[](int* n) { return *n == kCalls; }, &answered),
                                    absl::Seconds(30)));
  }
  for (int i = 0; i < kCalls; ++i) EXPECT_EQ(bodies[i], "n=" + std::to_string(i));

  std::atomic<bool> stop{false};
  absl::Notification cancelled_done;
  absl::Status cancelled_status;
  HttpRequest quiet;
  quiet.url = base + "/hold";
  quiet.cancelled = [&] { return stop.load(); };
  client->SendAsync(std::move(quiet), [&](absl::StatusOr<HttpResponse> r) {
    cancelled_status = r.status();
    cancelled_done.Notify();
  });
  absl::Notification shutdown_done;
  absl::Status shutdown_status;
  HttpRequest held;
  held.url = base + "/hold";
  client->SendAsync(std::move(held), [&](absl::StatusOr<HttpResponse> r) {
    shutdown_status = r.status();
    shutdown_done.Notify();
  });
  stop = true;
  ASSERT_TRUE(cancelled_done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(cancelled_status.code(), absl::StatusCode::kCancelled) << cancelled_status;
  EXPECT_FALSE(shutdown_done.HasBeenNotified());
  client.reset();
  ASSERT_TRUE(shutdown_done.HasBeenNotified());
  EXPECT_EQ(shutdown_status.code(), absl::StatusCode::kCancelled) << shutdown_status;
  release.Notify();
  server.stop();
  t.join();
}

}  // namespace
}  // namespace sandbox
