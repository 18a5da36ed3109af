#pragma once

// LLM tool definitions and tool-call plumbing, as the CloudSandbox toolkits
// expose them: four tools per provider, sandbox_<provider>_{run, shell,
// write_file, read_file}. Pure functions: no sessions, no I/O.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sandboxbroker/v1/broker.pb.h"

namespace sandbox {

namespace pb = ::sandboxbroker::v1;

enum class ToolOp { kRun, kShell, kWriteFile, kReadFile };

struct ToolName {
  std::string provider;
  ToolOp op = ToolOp::kRun;
};

// Limits the tool descriptions and schemas state.
struct ToolLimits {
  int64_t default_timeout_seconds = 30;
  int64_t max_timeout_seconds = 900;
  int64_t max_output_bytes = 65536;
};

// "sandbox_local_run" -> {local, kRun}. INVALID_ARGUMENT otherwise.
absl::StatusOr<ToolName> ParseToolName(absl::string_view name);

// The tools of each provider in `providers`, rendered in `dialect` ("",
// "openai", "anthropic"; anything else is INVALID_ARGUMENT).
absl::StatusOr<std::vector<pb::Tool>> BuildTools(const std::vector<std::string>& providers,
                                                 absl::string_view dialect,
                                                 const ToolLimits& limits);

// A tool call's arguments, validated. INVALID_ARGUMENT messages are written
// for the model: they say which argument is wrong and what is expected.
struct ToolArgs {
  std::string code;  // run: code; shell: command
  pb::Language language = pb::LANGUAGE_UNSPECIFIED;
  int32_t timeout_seconds = 0;
  std::string path;
  std::string contents;
  pb::Encoding encoding = pb::ENCODING_UTF8;
};
absl::StatusOr<ToolArgs> ParseToolArgs(ToolOp op, absl::string_view arguments_json,
                                       const ToolLimits& limits);

// run/shell tool result: {"output", "exitCode"} plus "timedOut": true and
// "truncated": true only when so.
std::string FormatRunResult(const pb::RunResult& r);

// The reverse, for a result another broker formatted: false (and *out
// untouched) unless `content` is such an object with a string "output" and
// an int32 "exitCode"; flags of any other type read as false.
bool ParseRunResult(absl::string_view content, pb::RunResult* out);

// A failed tool call as the model sees it: "error: <message>" for bad
// arguments, else "error: <CODE>: <message>".
std::string ToolErrorText(const absl::Status& s);

// What read_file returns for a missing file.
inline constexpr char kFileNotFound[] = "[file not found]";

}  // namespace sandbox
