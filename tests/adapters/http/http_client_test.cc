#include "adapters/http/http_client.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <thread>

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
  server.stop();
  t.join();
  HttpRequest refused;
  refused.url = base + "/hello";
  auto gone = client.Send(refused);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(IsConnectFailure(gone.status()));
}

}  // namespace
}  // namespace sandbox
