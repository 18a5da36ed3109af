// The broker's side of the context supervisor's protocol
// (adapters/local/contexts.h): what sandboxed code may send back is parsed,
// never trusted.

#include <gtest/gtest.h>

#include "adapters/local/contexts.h"
#include "nlohmann/json.hpp"

namespace sandbox {
namespace {

CodeOp RunOp(size_t max_output = 0) {
  CodeOp op;
  op.kind = CodeOp::Kind::kRun;
  op.code = "1";
  op.max_output_bytes = max_output;
  return op;
}

TEST(ContextWire, AnExecutionIsFoldedFromItsEvents) {
  const std::string answer =
      R"({"event":"stdout","text":"a"})"
      "\n"
      R"({"event":"stderr","text":"w"})"
      "\n"
      R"({"event":"result","main":false,"data":{"image/png":"iVBO\nRw0K\nGgo=","text/plain":"<Figure>"}})"
      "\n"
      R"({"event":"stdout","text":"b"})"
      "\n"
      R"({"event":"done","ok":true,"execution_count":4,"timed_out":true,"duration_ms":12,)"
      R"("error":{"name":"E","value":"v","traceback":["l1",2,"l2"]},)"
      R"("context":{"id":"c1","language":"python","cwd":"/w","created_at_ms":1000}})"
      "\n";
  auto r = ParseContextAnswer(RunOp(), answer);
  ASSERT_TRUE(r.ok()) << r.status();
  const Execution& x = r->execution;
  EXPECT_EQ(x.stdout_text, "ab");
  EXPECT_EQ(x.stderr_text, "w");
  ASSERT_EQ(x.results.size(), 1u);
  EXPECT_EQ(x.results[0].data.at("image/png"), "\x89PNG\r\n\x1a\n");  // base64, newline and all
  EXPECT_EQ(x.results[0].data.at("text/plain"), "<Figure>");
  EXPECT_EQ(x.execution_count, 4);
  EXPECT_TRUE(x.timed_out);
  ASSERT_TRUE(x.error.has_value());
  EXPECT_EQ(x.error->traceback, (std::vector<std::string>{"l1", "l2"}));  // the number dropped
  EXPECT_EQ(x.context.id, "c1");
  EXPECT_EQ(x.context.created_at, absl::FromUnixMillis(1000));
}

TEST(ContextWire, OutputIsCutAtTheLimit) {
  std::string answer;
  for (int i = 0; i < 10; ++i)
    answer += R"({"event":"stdout","text":"0123456789"})"
              "\n";
  answer += R"({"event":"done","ok":true})"
            "\n";
  auto r = ParseContextAnswer(RunOp(25), answer);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->execution.stdout_text, "0123456789012345678901234");
}

TEST(ContextWire, RefusalsKeepTheirCodes) {
  auto r = ParseContextAnswer(
      RunOp(), R"({"event":"done","ok":false,"code":"RESOURCE_EXHAUSTED","message":"max"})");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  r = ParseContextAnswer(RunOp(), R"({"event":"done","ok":false,"code":"NOT_FOUND"})");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  // A code the broker does not know is the supervisor's own failure.
  r = ParseContextAnswer(RunOp(), R"({"event":"done","ok":false,"code":"OK"})");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
}

TEST(ContextWire, GarbageIsUnavailableNeverACrash) {
  for (const char* answer :
       {"", "{not json", "[1,2]", "null", R"({"event":"stdout"})",
        R"({"event":"result","data":[1]})", R"({"event":"done","ok":"yes"})",
        R"({"event":"done","ok":true,"context":7,"contexts":{"a":1},"error":"x",)"
        R"("execution_count":"many","duration_ms":1e999})",
        "\xff\xfe\n{\"event\":\"done\"}"}) {
    auto r = ParseContextAnswer(RunOp(), answer);
    if (r.ok()) continue;  // a well-formed answer with wrong types: defaults
    EXPECT_TRUE(r.status().code() == absl::StatusCode::kUnavailable ||
                r.status().code() == absl::StatusCode::kInternal)
        << answer << ": " << r.status();
  }
}

TEST(ContextWire, RequestsAreOneJsonLine) {
  CodeOp op = RunOp();
  op.code = "print('a\nb')\x01";
  op.env = {{"K", "v"}};
  const std::string line = ContextRequest(op);
  ASSERT_EQ(line.back(), '\n');
  EXPECT_EQ(line.find('\n'), line.size() - 1);
  auto j = nlohmann::json::parse(line);
  EXPECT_EQ(j["op"], "run");
  EXPECT_EQ(j["code"], op.code);
  EXPECT_EQ(j["env"]["K"], "v");
}

}  // namespace
}  // namespace sandbox
