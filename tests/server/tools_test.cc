#include "protocol/tools.h"

#include <gtest/gtest.h>

#include "nlohmann/json.hpp"

namespace sandbox {
namespace {

using nlohmann::json;

TEST(ToolNames, ParseEveryOpAndRefuseOthers) {
  EXPECT_EQ(ParseToolName("sandbox_local_run")->provider, "local");
  EXPECT_EQ(ParseToolName("sandbox_e2b_shell")->op, ToolOp::kShell);
  EXPECT_EQ(ParseToolName("sandbox_daytona_write_file")->op, ToolOp::kWriteFile);
  auto r = ParseToolName("sandbox_my_provider_read_file");
  EXPECT_EQ(r->provider, "my_provider");
  EXPECT_EQ(r->op, ToolOp::kReadFile);
  for (const char* bad : {"", "sandbox_run", "local_run", "sandbox_local_exec", "sandbox__run"}) {
    EXPECT_EQ(ParseToolName(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(BuildTools, FourToolsPerProviderWithSchemasAModelCanFollow) {
  ToolLimits l;
  l.max_timeout_seconds = 120;
  auto tools = BuildTools({"e2b", "local"}, "", l);
  ASSERT_TRUE(tools.ok());
  ASSERT_EQ(tools->size(), 8u);
  EXPECT_EQ((*tools)[0].name(), "sandbox_e2b_run");
  EXPECT_EQ((*tools)[7].name(), "sandbox_local_read_file");
  json run = json::parse((*tools)[0].parameters_json_schema());
  EXPECT_EQ(run["type"], "object");
  EXPECT_EQ(run["required"], json::array({"code"}));
  EXPECT_EQ(run["properties"]["language"]["enum"], json::array({"python", "node", "shell"}));
  EXPECT_EQ(run["properties"]["timeoutSeconds"]["type"], "integer");
  EXPECT_EQ(run["properties"]["timeoutSeconds"]["maximum"], 120);
  EXPECT_EQ(run["additionalProperties"], false);
  json write = json::parse((*tools)[2].parameters_json_schema());
  EXPECT_EQ(write["required"], json::array({"path", "contents"}));
  EXPECT_EQ(write["properties"]["encoding"]["enum"], json::array({"utf8", "base64"}));
  json read = json::parse((*tools)[3].parameters_json_schema());
  EXPECT_EQ(read["required"], json::array({"path"}));
  EXPECT_NE((*tools)[3].description().find("[file not found]"), std::string::npos);
  EXPECT_NE((*tools)[0].description().find("timedOut"), std::string::npos);
}

TEST(BuildTools, EachDialectHasItsApisShape) {
  ToolLimits l;
  json plain = json::parse((*BuildTools({"local"}, "", l))[0].definition_json());
  EXPECT_EQ(plain["name"], "sandbox_local_run");
  EXPECT_TRUE(plain["parameters"].is_object());
  json openai = json::parse((*BuildTools({"local"}, "openai", l))[0].definition_json());
  EXPECT_EQ(openai["type"], "function");
  EXPECT_EQ(openai["function"]["name"], "sandbox_local_run");
  EXPECT_TRUE(openai["function"]["description"].is_string());
  EXPECT_EQ(openai["function"]["parameters"]["type"], "object");
  json anthropic = json::parse((*BuildTools({"local"}, "anthropic", l))[0].definition_json());
  EXPECT_EQ(anthropic["name"], "sandbox_local_run");
  EXPECT_EQ(anthropic["input_schema"]["type"], "object");
  EXPECT_FALSE(anthropic.contains("parameters"));
  EXPECT_EQ(BuildTools({"local"}, "gemini", l).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ToolArgs, GoodArgumentsParse) {
  ToolLimits l;
  auto run = ParseToolArgs(ToolOp::kRun,
                           R"j({"code": "print(1)", "language": "node", "timeoutSeconds": 5})j", l);
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->code, "print(1)");
  EXPECT_EQ(run->language, pb::LANGUAGE_NODE);
  EXPECT_EQ(run->timeout_seconds, 5);
  EXPECT_EQ(ParseToolArgs(ToolOp::kRun, R"j({"code": "x"})j", l)->language, pb::LANGUAGE_PYTHON);
  EXPECT_EQ(ParseToolArgs(ToolOp::kShell, R"j({"command": "ls", "timeoutSeconds": 3.0})j", l)
                ->timeout_seconds,
            3);
  auto w = ParseToolArgs(ToolOp::kWriteFile,
                         R"j({"path": "a", "contents": "AA==", "encoding": "base64"})j", l);
  EXPECT_EQ(w->encoding, pb::ENCODING_BASE64);
  EXPECT_EQ(ParseToolArgs(ToolOp::kReadFile, R"j({"path": "a"})j", l)->path, "a");
}

TEST(ToolArgs, MalformedArgumentsSayWhatIsWrong) {
  ToolLimits l;
  l.max_timeout_seconds = 60;
  struct Case {
    ToolOp op;
    const char* args;
    const char* message;
  } cases[] = {
      {ToolOp::kRun, "{not json", "arguments are not valid JSON; send a JSON object"},
      {ToolOp::kRun, "[1]", "arguments must be a JSON object"},
      {ToolOp::kRun, "{}", "missing required argument \"code\" (a string)"},
      {ToolOp::kRun, R"j({"code": 5})j", "argument \"code\" must be a string, not number"},
      {ToolOp::kRun, R"j({"code": ""})j", "argument \"code\" must not be empty"},
      {ToolOp::kRun, R"j({"code": "x", "language": "ruby"})j",
       "argument \"language\" must be one of \"python\", \"node\", \"shell\", not \"ruby\""},
      {ToolOp::kRun, R"j({"code": "x", "timeoutSeconds": 61})j",
       "argument \"timeoutSeconds\" must be a whole number from 1 to 60"},
      {ToolOp::kRun, R"j({"code": "x", "timeoutSeconds": "10"})j",
       "argument \"timeoutSeconds\" must be a whole number from 1 to 60"},
      {ToolOp::kRun, R"j({"code": "x", "timeoutSeconds": 1.5})j",
       "argument \"timeoutSeconds\" must be a whole number from 1 to 60"},
      {ToolOp::kRun, R"j({"code": "x", "cmd": "y"})j", "unknown argument \"cmd\""},
      {ToolOp::kShell, R"j({"code": "ls"})j", "missing required argument \"command\" (a string)"},
      {ToolOp::kWriteFile, R"j({"path": "a"})j",
       "missing required argument \"contents\" (a string)"},
      {ToolOp::kWriteFile, R"j({"path": "a", "contents": "x", "encoding": "hex"})j",
       "argument \"encoding\" must be \"utf8\" or \"base64\", not \"hex\""},
      {ToolOp::kReadFile, R"j({"path": null})j", "missing required argument \"path\" (a string)"},
  };
  for (const auto& c : cases) {
    auto r = ParseToolArgs(c.op, c.args, l);
    ASSERT_FALSE(r.ok()) << c.args;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(), c.message) << c.args;
  }
}

TEST(FormatRunResult, ExactlyTheDocumentedKeys) {
  pb::RunResult r;
  r.set_output("hi\n");
  r.set_exit_code(0);
  EXPECT_EQ(FormatRunResult(r), R"j({"output":"hi\n","exitCode":0})j");
  r.set_timed_out(true);
  r.set_exit_code(124);
  r.set_truncated(true);
  EXPECT_EQ(FormatRunResult(r),
            R"j({"output":"hi\n","exitCode":124,"timedOut":true,"truncated":true})j");
}

TEST(FormatRunResult, AnOomKillIsExplainedInWords) {
  pb::RunResult r;
  r.set_output("start\n");
  r.set_exit_code(137);
  r.set_oom_killed(true);
  const std::string text = FormatRunResult(r);
  EXPECT_NE(text.find(R"j("oomKilled":true)j"), std::string::npos) << text;
  EXPECT_NE(text.find("ran out of memory"), std::string::npos) << text;
}

TEST(ParseRunResult, ReadsWhatFormatRunResultWritesAndNothingElse) {
  pb::RunResult r;
  r.set_output("out\n");
  r.set_exit_code(137);
  r.set_truncated(true);
  r.set_oom_killed(true);
  pb::RunResult back;
  ASSERT_TRUE(ParseRunResult(FormatRunResult(r), &back));
  EXPECT_EQ(back.output(), "out\n");
  EXPECT_EQ(back.exit_code(), 137);
  EXPECT_FALSE(back.timed_out());
  EXPECT_TRUE(back.truncated());
  EXPECT_TRUE(back.oom_killed());
  // Anything else (a file's contents, another server's garbage) is refused
  // and leaves the result untouched.
  for (const char* text :
       {R"j({"output": 1, "exitCode": 0})j", R"j({"output": "x", "exitCode": "0"})j",
        R"j({"output": "x"})j", R"j({"output": "x", "exitCode": 4294967296})j",
        R"j({"output": "x", "exitCode": 18446744073709551615})j", "[1]", "not json", ""}) {
    EXPECT_FALSE(ParseRunResult(text, &back)) << text;
    EXPECT_EQ(back.output(), "out\n") << text;
  }
  // Flags of another type read as false.
  ASSERT_TRUE(ParseRunResult(R"j({"output": "", "exitCode": -1, "timedOut": "yes"})j", &back));
  EXPECT_EQ(back.exit_code(), -1);
  EXPECT_FALSE(back.timed_out());
}

}  // namespace
}  // namespace sandbox
