#include "adapters/e2b/e2b_wire.h"

#include <gtest/gtest.h>

namespace sandbox {
namespace e2b {
namespace {

TEST(Envelope, EncodesAndSplitsFramesArrivingInPieces) {
  const std::string a = EncodeEnvelope(0, R"j({"event":{"start":{"pid":4242}}})j");
  const std::string b = EncodeEnvelope(kFlagEndStream, "{}");
  EXPECT_EQ(a.substr(0, 5), std::string("\x00\x00\x00\x00\x20", 5));
  const std::string wire = a + b;
  EnvelopeReader r;
  std::vector<Envelope> got;
  for (char c : wire) {  // one byte at a time
    r.Feed(absl::string_view(&c, 1));
    while (true) {
      auto e = r.Next();
      ASSERT_TRUE(e.ok());
      if (!e->has_value()) break;
      got.push_back(**e);
    }
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].flags, 0);
  EXPECT_EQ(got[0].payload, R"j({"event":{"start":{"pid":4242}}})j");
  EXPECT_EQ(got[1].flags, kFlagEndStream);
  EXPECT_TRUE(r.empty());
  EnvelopeReader huge;
  huge.Feed(std::string("\x00\x7f\xff\xff\xff", 5));
  EXPECT_EQ(huge.Next().status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ProcessEvents, ParseTheCapturedStream) {
  // The frames envd sent for run('echo hi') (reference 8.2).
  auto start = ParseProcessEvent(R"j({"event":{"start":{"pid":4242}}})j");
  EXPECT_EQ(start->kind, ProcessEvent::kStart);
  EXPECT_EQ(start->pid, 4242u);
  auto data = ParseProcessEvent(R"j({"event":{"data":{"stdout":"aGkK"}}})j");
  EXPECT_EQ(data->kind, ProcessEvent::kStdout);
  EXPECT_EQ(data->data, "hi\n");
  auto err = ParseProcessEvent(R"j({"event":{"data":{"stderr":"Ym9vbQo="}}})j");
  EXPECT_EQ(err->kind, ProcessEvent::kStderr);
  auto end = ParseProcessEvent(R"j({"event":{"end":{"exited":true,"status":"exit status 0"}}})j");
  EXPECT_EQ(end->kind, ProcessEvent::kEnd);
  EXPECT_EQ(end->exit_code, 0);
  EXPECT_TRUE(end->exited);
  auto fail = ParseProcessEvent(
      R"j({"event":{"end":{"exitCode":3,"exited":true,"error":"exit status 3"}}})j");
  EXPECT_EQ(fail->exit_code, 3);
  auto killed = ParseProcessEvent(
      R"j({"event":{"end":{"exitCode":-1,"exited":false,"status":"signal: killed"}}})j");
  EXPECT_EQ(killed->exit_code, -1);
  EXPECT_FALSE(killed->exited);
  EXPECT_EQ(ParseProcessEvent(R"j({"event":{"keepalive":{}}})j")->kind, ProcessEvent::kKeepalive);
  EXPECT_EQ(ParseProcessEvent(R"j({"event":{"somethingNew":{}}})j")->kind, ProcessEvent::kUnknown);
  EXPECT_FALSE(ParseProcessEvent("not json").ok());
  EXPECT_FALSE(ParseProcessEvent(R"j({"event":{"data":{"stdout":"!!"}}})j").ok());
}

TEST(EndStream, OkOrTheCarriedError) {
  EXPECT_TRUE(ParseEndStream("{}").ok());
  absl::Status s = ParseEndStream(
      R"j({"error":{"code":"invalid_argument","message":"cwd '/nope' does not exist"}})j");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "[invalid_argument] cwd '/nope' does not exist");
  EXPECT_EQ(ParseEndStream(R"j({"error":{"code":"deadline_exceeded"}})j").code(),
            absl::StatusCode::kDeadlineExceeded);
  // Wrong types from a provider are an error, never a crash.
  EXPECT_EQ(ParseEndStream(R"j({"error":{"code":5,"message":[]}})j").code(),
            absl::StatusCode::kUnknown);
}

TEST(Requests, BodiesMatchTheSdkCaptures) {
  EXPECT_EQ(StartRequestJson("/bin/bash", {"-l", "-c", "echo hi"}, {}, ""),
            R"j({"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"]},"stdin":false})j");
  EXPECT_EQ(
      StartRequestJson("/bin/bash", {"-l", "-c", "echo x"}, {{"A", "1"}}, "/tmp"),
      R"j({"process":{"cmd":"/bin/bash","args":["-l","-c","echo x"],"envs":{"A":"1"},"cwd":"/tmp"},"stdin":false})j");
  EXPECT_EQ(
      CreateSandboxBody("base", 120, {{"owner", "cpp-team"}}, {{"FOO", "bar"}}),
      R"j({"templateID":"base","metadata":{"owner":"cpp-team"},"envVars":{"FOO":"bar"},"timeout":120})j");
  EXPECT_EQ(CreateSandboxBody("base", 0, {}, {}), R"j({"templateID":"base"})j");
}

TEST(Requests, NetworkPoliciesMapOntoAllowOutAndDenyOut) {
  auto policy = [](const char* j) {
    return *ParseNetworkPolicy(nlohmann::json::parse(j), "network");
  };
  auto some =
      MapNetwork(policy(R"({"allow_out": ["pypi.org", "*.pythonhosted.org", "10.0.0.0/8"]})"));
  ASSERT_TRUE(some.ok()) << some.status();
  EXPECT_EQ(
      CreateSandboxBody("base", 0, {}, {}, *some),
      R"j({"templateID":"base","network":{"allowOut":["pypi.org","*.pythonhosted.org","10.0.0.0/8"],"denyOut":["0.0.0.0/0"]}})j");
  auto all = MapNetwork(policy(R"({"allow_all": true, "deny_out": ["203.0.113.0/24"]})"));
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(
      CreateSandboxBody("base", 0, {}, {}, *all),
      R"j({"templateID":"base","allow_internet_access":true,"network":{"denyOut":["203.0.113.0/24"]}})j");
  auto none = MapNetwork(NetworkPolicy{});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(NetworkUpdateBody(*none), R"j({"denyOut":["0.0.0.0/0"]})j");
  for (const char* cannot :
       {R"({"allow_out": ["pypi.org:443"]})", R"({"hosts": {"a.test": "127.0.0.1"}})",
        R"({"allow_out": ["pypi.org"], "deny_out": ["10.0.0.0/8"]})", R"({"max_connections": 3})",
        R"({"allow_all": true, "max_bytes_per_second": 10})"}) {
    auto r = MapNetwork(policy(cannot));
    ASSERT_FALSE(r.ok()) << cannot;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(r.status().message().find("spec.network"), std::string::npos) << r.status();
  }
}

TEST(Sandbox, ParsesTheCreateResponse) {
  auto s = ParseSandbox(
      R"j({"sandboxID":"isbfake0001","clientID":"6532622b","templateID":"rki5dems9wqfm4r03t7g","alias":"base","envdVersion":"0.6.4","envdAccessToken":"envd-token-abc","domain":null,"trafficAccessToken":null})j");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->sandbox_id, "isbfake0001");
  EXPECT_EQ(s->envd_access_token, "envd-token-abc");
  EXPECT_EQ(s->domain, "");
  EXPECT_EQ(ParseSandbox("{}").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ParseSandbox("<html>").status().code(), absl::StatusCode::kUnavailable);
}

TEST(Errors, HttpStatusesMapToCodesNamingE2b) {
  absl::Status s =
      HttpError("create sandbox", 401, R"j({"code":401,"message":"Invalid API key"})j");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "e2b: create sandbox: 401 Invalid API key (unauthorized: check providers.e2b.api_key)");
  EXPECT_EQ(HttpError("x", 400, "{}").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HttpError("x", 404, "{}").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(HttpError("x", 429, "{}").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(HttpError("x", 500, "oops").message(), "e2b: x: 500 oops");
  EXPECT_EQ(HttpError("x", 503, "{}").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(HttpError("x", 507, "{}").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(IsSandboxGone(
      502, R"j({"sandboxId":"x","message":"The sandbox was not found","code":502})j"));
  EXPECT_FALSE(IsSandboxGone(502, "bad gateway"));
}

}  // namespace
}  // namespace e2b
}  // namespace sandbox
