// Tools, streaming, cancellation and keep-alive over a real gRPC server.

#include <dirent.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/escaping.h"
#include "nlohmann/json.hpp"
#include "tests/testing/broker_fixture.h"
#include "tests/testing/processes.h"

namespace sandbox {
namespace {

using nlohmann::json;

class AgentApiTest : public BrokerFixture {
 protected:
  void SetUp() override { StartBroker(); }
};

TEST_F(AgentApiTest, ListToolsForEveryConfiguredProviderAndDialect) {
  auto sb = Client("tools");
  auto all = sb->ListTools();
  ASSERT_TRUE(all.ok()) << all.status();
  std::vector<std::string> names;
  for (const auto& t : *all) names.push_back(t.name());
  EXPECT_EQ(names,
            (std::vector<std::string>{"sandbox_local_run", "sandbox_local_shell",
                                      "sandbox_local_write_file", "sandbox_local_read_file"}));
  auto openai = sb->ListTools("local", "openai");
  EXPECT_EQ(json::parse((*openai)[1].definition_json())["function"]["name"], "sandbox_local_shell");
  EXPECT_EQ(sb->ListTools("e2b").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(sb->ListTools("", "bard").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(AgentApiTest, EveryToolWorksWithGoodArguments) {
  auto sb = Client("agent");
  auto w = sb->CallTool("sandbox_local_write_file", R"j({"path": "in.txt", "contents": "21"})j");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->content(), "ok");
  EXPECT_FALSE(w->is_error());
  auto run =
      sb->CallTool("sandbox_local_run", R"j({"code": "print(int(open('in.txt').read()) * 2)"})j");
  EXPECT_EQ(run->content(), R"j({"output":"42\n","exitCode":0})j");
  auto node =
      sb->CallTool("sandbox_local_run", R"j({"code": "process.exit(4)", "language": "node"})j");
  EXPECT_EQ(node->content(), R"j({"output":"","exitCode":4})j");
  EXPECT_FALSE(node->is_error());  // a nonzero exit is a result
  auto sh = sb->CallTool("sandbox_local_shell", R"j({"command": "sleep 5", "timeoutSeconds": 1})j");
  EXPECT_EQ(sh->content(), R"j({"output":"","exitCode":124,"timedOut":true})j");
  auto big = sb->CallTool("sandbox_local_shell", R"j({"command": "yes | head -c 10000"})j");
  json bj = json::parse(big->content());
  EXPECT_EQ(bj["truncated"], true);
  EXPECT_EQ(bj["output"].get<std::string>().size(), 4096u);
  auto rd = sb->CallTool("sandbox_local_read_file", R"j({"path": "in.txt"})j");
  EXPECT_EQ(rd->content(), "21");
  auto b64 =
      sb->CallTool("sandbox_local_read_file", R"j({"path": "in.txt", "encoding": "base64"})j");
  EXPECT_EQ(b64->content(), absl::Base64Escape("21"));
  auto missing = sb->CallTool("sandbox_local_read_file", R"j({"path": "nope.txt"})j");
  EXPECT_EQ(missing->content(), "[file not found]");
  EXPECT_FALSE(missing->is_error());
}

TEST_F(AgentApiTest, MalformedToolCallsAreErrorsForTheModelNotCrashes) {
  auto sb = Client("agent-bad");
  struct Case {
    const char* name;
    const char* args;
    const char* content;
  } cases[] = {
      {"sandbox_local_run", "{oops", "error: arguments are not valid JSON; send a JSON object"},
      {"sandbox_local_run", R"j({"code": 1})j",
       "error: argument \"code\" must be a string, not number"},
      {"sandbox_local_shell", "{}", "error: missing required argument \"command\" (a string)"},
      {"sandbox_local_explode", "{}",
       "error: unknown tool \"sandbox_local_explode\"; tools are named "
       "sandbox_<provider>_{run,shell,write_file,read_file}"},
      {"sandbox_e2b_run", R"j({"code": "1"})j",
       "error: FAILED_PRECONDITION: unknown provider \"e2b\" (configured: local)"},
      {"sandbox_local_write_file", R"j({"path": "../x", "contents": "x"})j",
       "error: PERMISSION_DENIED: path \"../x\" escapes the workspace"},
      {"sandbox_local_write_file", R"j({"path": "x", "contents": "!!", "encoding": "base64"})j",
       "error: contents: invalid base64: length is not a multiple of 4"},
  };
  for (const auto& c : cases) {
    auto r = sb->CallTool(c.name, c.args);
    ASSERT_TRUE(r.ok()) << c.args << ": " << r.status();
    EXPECT_TRUE(r->is_error()) << c.args;
    EXPECT_EQ(r->content(), c.content) << c.args;
  }
  // The platform's own mistakes stay RPC errors.
  EXPECT_EQ(Client("bad id")->CallTool("sandbox_local_run", "{}").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Client("agent-bad", "wrong-token")->CallTool("sandbox_local_run", "{}").status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST_F(AgentApiTest, StreamDeliversChunksInOrderAndEqualsTheUnaryOutput) {
  auto sb = Client("stream");
  const std::string code =
      "import sys, time\n"
      "for i in range(5):\n"
      "    print('out', i, flush=True)\n"
      "    print('err', i, file=sys.stderr, flush=True)\n"
      "    time.sleep(0.02)\n"
      "sys.exit(2)\n";
  std::string streamed;
  // Consecutive chunks of one stream, merged: a line may arrive in pieces.
  std::vector<std::pair<pb::OutputStream, std::string>> runs;
  auto r = sb->RunStream(code, {}, [&](pb::OutputStream s, const std::string& data) {
    streamed += data;
    if (runs.empty() || runs.back().first != s) runs.emplace_back(s, "");
    runs.back().second += data;
  });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code(), 2);
  EXPECT_EQ(r->output(), "");  // it was streamed
  ASSERT_EQ(runs.size(), 10u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(runs[2 * i].first, pb::OUTPUT_STREAM_STDOUT);
    EXPECT_EQ(runs[2 * i].second, absl::StrCat("out ", i, "\n"));
    EXPECT_EQ(runs[2 * i + 1].first, pb::OUTPUT_STREAM_STDERR);
    EXPECT_EQ(runs[2 * i + 1].second, absl::StrCat("err ", i, "\n"));
  }
  auto unary = sb->Run(code);
  EXPECT_EQ(streamed, unary->output());
  EXPECT_EQ(streamed, "out 0\nerr 0\nout 1\nerr 1\nout 2\nerr 2\nout 3\nerr 3\nout 4\nerr 4\n");
}

TEST_F(AgentApiTest, StreamHonoursTheOutputCapAndTimeout) {
  auto sb = Client("stream-cap");
  std::string streamed;
  RemoteRunOptions o;
  o.timeout_seconds = 1;
  auto r = sb->RunStream("print('x' * 10000, flush=True)\nimport time\ntime.sleep(30)", o,
                         [&](pb::OutputStream, const std::string& d) { streamed += d; });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(streamed, std::string(4096, 'x'));
  EXPECT_TRUE(r->truncated());
  EXPECT_TRUE(r->timed_out());
  EXPECT_EQ(r->exit_code(), 124);
}

TEST_F(AgentApiTest, CancellingARunKillsItsProcessTreeAndTheSessionSurvives) {
  auto sb = Client("cancel");
  const std::string marker = absl::StrCat("cancel-marker-", getpid());
  for (bool streaming : {false, true}) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer token-alpha-123");
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(800));
    pb::RunRequest req;
    req.set_session_id("cancel");
    req.set_language(pb::LANGUAGE_SHELL);
    req.set_code(absl::StrCat("setsid bash -c 'sleep 1000; : ", marker, "' & sleep 1000"));
    req.set_timeout_seconds(60);
    grpc::Status s;
    if (streaming) {
      auto reader = stub_->RunStream(&ctx, req);
      pb::RunEvent ev;
      while (reader->Read(&ev)) {
      }
      s = reader->Finish();
    } else {
      pb::RunResult out;
      s = stub_->Run(&ctx, req, &out);
    }
    EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    EXPECT_TRUE(GoneWithin(marker, absl::Seconds(5))) << (streaming ? "RunStream" : "Run");
  }
  EXPECT_EQ(sb->Run("print('alive')")->output(), "alive\n");
}

TEST_F(AgentApiTest, KeepAliveHoldsOffTheReaperAndNeverCreates) {
  auto sb = Client("thinking");
  EXPECT_EQ(sb->KeepAlive().status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(sb->Info().status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(sb->Start().ok());
  for (int i = 0; i < 5; ++i) {  // an agent thinking for 5 x 1.5 s with idle 2 s
    clock_.Advance(absl::Milliseconds(1500));
    auto deadline = sb->KeepAlive();
    ASSERT_TRUE(deadline.ok());
    EXPECT_EQ(*deadline, absl::ToUnixSeconds(clock_.Now() + absl::Seconds(2)));
    EXPECT_EQ(server_->sessions()->RunOnce(), 0);
  }
  clock_.Advance(absl::Seconds(2));
  EXPECT_EQ(server_->sessions()->RunOnce(), 1);
}

}  // namespace
}  // namespace sandbox
