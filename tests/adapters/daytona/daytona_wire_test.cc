#include "adapters/daytona/daytona_wire.h"

#include <gtest/gtest.h>

namespace sandbox {
namespace daytona {
namespace {

TEST(DaytonaWire, CreateBodyCarriesResourcesInCpusAndGib) {
  CreateParams p;
  p.labels = {{"code-toolbox-language", "python"}};
  p.cpu = 2;
  p.memory_gib = 4;
  p.disk_gib = 10;
  EXPECT_EQ(
      CreateSandboxBody(p),
      R"j({"env":{},"labels":{"code-toolbox-language":"python"},"cpu":2,"memory":4,"disk":10})j");
}

TEST(DaytonaWire, CreateBodyMatchesTheSdkCapture) {
  CreateParams p;
  p.labels = {{"code-toolbox-language", "python"}};
  EXPECT_EQ(CreateSandboxBody(p), R"j({"env":{},"labels":{"code-toolbox-language":"python"}})j");
  p.name = "my-box";
  p.snapshot = "my-snap";
  p.env = {{"A", "1"}};
  p.target = "eu";
  p.auto_stop_minutes = 6;
  p.auto_delete_minutes = 0;
  EXPECT_EQ(
      CreateSandboxBody(p),
      R"j({"name":"my-box","snapshot":"my-snap","env":{"A":"1"},"labels":{"code-toolbox-language":"python"},"target":"eu","autoStopInterval":6,"autoDeleteInterval":0})j");
}

TEST(DaytonaWire, ToolboxBodiesMatchTheSdkCaptures) {
  EXPECT_EQ(ExecuteBody("echo hi", "", {}, 0), R"j({"command":"echo hi"})j");
  EXPECT_EQ(ExecuteBody("exit 3", "/tmp", {{"FOO", "bar"}}, 5),
            R"j({"command":"exit 3","cwd":"/tmp","envs":{"FOO":"bar"},"timeout":5})j");
  EXPECT_EQ(CodeRunBody("print(6*7)", "python", {}, 0),
            R"j({"code":"print(6*7)","language":"python"})j");
  auto r = ParseExecuteResult(R"j({"exitCode":3,"result":"out\n"})j");
  EXPECT_EQ(r->exit_code, 3);
  EXPECT_EQ(r->result, "out\n");
  EXPECT_EQ(ParseExecuteResult(R"j({"code":-1,"result":""})j")->exit_code, -1);
  EXPECT_FALSE(ParseExecuteResult("oops").ok());
  // A reply without an integer exit code is not a success with no output.
  EXPECT_EQ(ParseExecuteResult("{}").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(ParseExecuteResult(R"j({"exitCode":"0","result":""})j").ok());
  EXPECT_FALSE(ParseExecuteResult(R"j({"exitCode":4294967296,"result":""})j").ok());
  EXPECT_FALSE(ParseExecuteResult(R"j({"exitCode":18446744073709551615,"result":""})j").ok());
}

TEST(DaytonaWire, SandboxDto) {
  auto d = ParseSandbox(
      R"j({"id":"sbx-1","state":"started","labels":{"code-toolbox-language":"python"},"toolboxProxyUrl":"http://127.0.0.1:1/toolbox"})j");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->id, "sbx-1");
  EXPECT_EQ(d->state, "started");
  EXPECT_EQ(d->labels.at("code-toolbox-language"), "python");
  EXPECT_EQ(d->toolbox_proxy_url, "http://127.0.0.1:1/toolbox");
  EXPECT_EQ(ParseSandbox(R"j({"state":"started"})j").status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(DaytonaWire, BulkDownloadPartsAreMatchedByFilename) {
  const std::string body =
      "--DAYTONA-FILE-BOUNDARY\r\n"
      "Content-Disposition: form-data; name=\"error\"; filename=\"/home/daytona/missing.txt\"\r\n"
      "Content-Type: application/json; charset=utf-8\r\n\r\n"
      R"j({"statusCode":404,"message":"file not found: /home/daytona/missing.txt","code":"FILE_NOT_FOUND"})j"
      "\r\n--DAYTONA-FILE-BOUNDARY\r\n"
      "Content-Disposition: form-data; name=\"file\"; filename=\"/home/daytona/hello.txt\"; "
      "filename*=utf-8''%2Fhome%2Fdaytona%2Fhello.txt\r\n"
      "Content-Type: text/plain\r\n\r\n"
      "hello world\n\r\n"
      "--DAYTONA-FILE-BOUNDARY--\r\n";
  auto d = ParseBulkDownload("multipart/form-data; boundary=DAYTONA-FILE-BOUNDARY", body,
                             {"/home/daytona/hello.txt", "/home/daytona/missing.txt"});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE((*d)[0].found);
  EXPECT_EQ((*d)[0].data, "hello world\n");
  EXPECT_FALSE((*d)[1].found);
  EXPECT_EQ((*d)[1].status, 404);
  EXPECT_EQ((*d)[1].code, "FILE_NOT_FOUND");
  auto none =
      ParseBulkDownload("multipart/form-data; boundary=DAYTONA-FILE-BOUNDARY", body, {"/other"});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(ParseBulkDownload("application/json", "{}", {"/x"}).ok());
}

TEST(DaytonaWire, ErrorsMapWithTheProvidersMessage) {
  absl::Status s = HttpError(
      "get sandbox", 404,
      R"j({"path":"/api/sandbox/xyz","statusCode":404,"error":"Not Found","message":"Sandbox with ID or name xyz not found"})j");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "daytona: get sandbox: 404 Sandbox with ID or name xyz not found");
  EXPECT_EQ(HttpError("x", 401, "{}").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(HttpError("x", 400, R"j({"errors":[],"files":[]})j").message(),
            R"j(daytona: x: 400 {"errors":[],"files":[]})j");
  EXPECT_EQ(HttpError("x", 408, "{}").code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(HttpError("x", 409, "{}").code(), absl::StatusCode::kAborted);
  EXPECT_EQ(HttpError("x", 429, "{}").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(HttpError("x", 502, "{}").code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace daytona
}  // namespace sandbox
