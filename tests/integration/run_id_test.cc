// run_id / call_id over the real gRPC server (local provider, SQLite store).

#include <gtest/gtest.h>

#include "tests/testing/broker_fixture.h"

namespace sandbox {
namespace {

class RunIdTest : public BrokerFixture {
 protected:
  void SetUp() override { StartBroker(); }
  grpc::Status Run(const std::string& code, const std::string& run_id, pb::RunResult* out) {
    pb::RunRequest r;
    r.set_session_id("rid");
    r.set_code(code);
    r.set_run_id(run_id);
    return stub_->Run(Ctx().get(), r, out);
  }
};

constexpr char kCount[] = "open('n.txt', 'a').write('x')\nprint(len(open('n.txt').read()))";

TEST_F(RunIdTest, ARunIdRunsOnceAndRetriesGetItsResult) {
  pb::RunResult a, b, c;
  ASSERT_TRUE(Run(kCount, "r-1", &a).ok());
  EXPECT_EQ(a.output(), "1\n");
  ASSERT_TRUE(Run(kCount, "r-1", &b).ok());
  EXPECT_EQ(b.output(), "1\n");  // the stored result, not a second run
  EXPECT_EQ(b.duration_ms(), a.duration_ms());
  ASSERT_TRUE(Run(kCount, "", &c).ok());  // no run_id: runs every time
  EXPECT_EQ(c.output(), "2\n");
  EXPECT_EQ(Run("print(1)", "r-1", &c).error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(Run(kCount, "bad id", &c).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Run(kCount, std::string(129, 'a'), &c).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // Closing the session forgets its run ids.
  pb::CloseSessionRequest close;
  close.set_session_id("rid");
  pb::CloseSessionResponse closed;
  ASSERT_TRUE(stub_->CloseSession(Ctx().get(), close, &closed).ok());
  ASSERT_TRUE(Run(kCount, "r-1", &c).ok());
  EXPECT_EQ(c.output(), "1\n");  // a new sandbox, run anew
}

// An idle reap forgets the session's run ids too: the next session under the
// same id is a new sandbox, and a run_id it reuses runs there.
TEST_F(RunIdTest, AReapedSessionsRunIdsAreForgotten) {
  pb::RunResult a, b;
  constexpr char kFresh[] = "import uuid; print(uuid.uuid4())";
  ASSERT_TRUE(Run(kFresh, "r-reap", &a).ok());
  ASSERT_EQ(a.output().size(), 37u) << a.output();
  EXPECT_EQ(server_->runs()->CountForTest("alpha", "rid"), 1);
  clock_.Advance(absl::Seconds(3));  // past idle_timeout_seconds (2)
  ASSERT_EQ(server_->sessions()->RunOnce(), 1);
  EXPECT_EQ(server_->runs()->CountForTest("alpha", "rid"), 0);
  ASSERT_TRUE(Run(kFresh, "r-reap", &b).ok());
  EXPECT_NE(b.output(), a.output());  // ran anew, not the reaped session's result
  EXPECT_EQ(server_->runs()->CountForTest("alpha", "rid"), 1);
}

TEST_F(RunIdTest, RunStreamRetryReplaysTheKeptOutput) {
  auto stream = [&](std::string* out) {
    pb::RunRequest r;
    r.set_session_id("rid");
    r.set_code(kCount);
    r.set_run_id("s-1");
    auto ctx = Ctx();
    auto reader = stub_->RunStream(ctx.get(), r);
    pb::RunEvent ev;
    while (reader->Read(&ev)) {
      if (ev.has_output()) *out += ev.output().data();
    }
    return reader->Finish();
  };
  std::string first, second;
  ASSERT_TRUE(stream(&first).ok());
  ASSERT_TRUE(stream(&second).ok());
  EXPECT_EQ(first, "1\n");
  EXPECT_EQ(second, "1\n");
}

TEST_F(RunIdTest, CallIdMakesAToolCallRetrySafe) {
  auto call = [&](const std::string& args, const std::string& call_id, pb::CallToolResponse* out) {
    pb::CallToolRequest r;
    r.set_session_id("rid");
    r.set_name("sandbox_local_shell");
    r.set_arguments_json(args);
    r.set_call_id(call_id);
    return stub_->CallTool(Ctx().get(), r, out);
  };
  const std::string args = R"({"command": "echo x >> c.txt; wc -c < c.txt"})";
  pb::CallToolResponse a, b;
  ASSERT_TRUE(call(args, "call_abc", &a).ok());
  ASSERT_TRUE(call(args, "call_abc", &b).ok());
  EXPECT_EQ(a.content(), b.content());
  EXPECT_NE(a.content().find("2"), std::string::npos) << a.content();
  EXPECT_EQ(call(R"({"command": "true"})", "call_abc", &b).error_code(),
            grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(call(args, "bad id", &b).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(RunIdTest, SessionInfoCarriesTheGeneration) {
  pb::RunResult r;
  ASSERT_TRUE(Run("print(1)", "", &r).ok());
  pb::GetSessionRequest g;
  g.set_session_id("rid");
  pb::SessionInfo info;
  ASSERT_TRUE(stub_->GetSession(Ctx().get(), g, &info).ok());
  EXPECT_EQ(info.generation(), 1);
}

}  // namespace
}  // namespace sandbox
