// CallTool's inputs from the model: the tool name and the JSON arguments
// (protocol/tools.cc), including deeply nested and oversized JSON.
//
// Input: op byte, then the tool name and the arguments separated by 0xFF.
// Invariants: accepted arguments are complete and in range (non-empty code,
// timeout 0 = default or 1..max, a known language and encoding, a path for
// file tools); rejections are INVALID_ARGUMENT in valid UTF-8 (the model
// reads them); a parsed tool name round-trips to the same name.

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/text.h"
#include "fuzz/fuzz_check.h"
#include "protocol/tools.h"

using sandbox::ToolOp;
namespace pb = ::sandboxbroker::v1;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const ToolOp op = static_cast<ToolOp>(data[0] % 4);
  absl::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  const absl::string_view name = sandbox::fuzz::NextField(&in);
  const absl::string_view args = in;

  auto tn = sandbox::ParseToolName(name);
  if (tn.ok()) {
    static const char* kSuffix[] = {"run", "shell", "write_file", "read_file"};
    FUZZ_CHECK(!tn->provider.empty());
    FUZZ_CHECK(absl::StrCat("sandbox_", tn->provider, "_", kSuffix[static_cast<int>(tn->op)]) ==
               name);
  } else {
    FUZZ_CHECK(tn.status().code() == absl::StatusCode::kInvalidArgument);
  }

  sandbox::ToolLimits limits;
  auto a = sandbox::ParseToolArgs(op, args, limits);
  if (!a.ok()) {
    FUZZ_CHECK(a.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(sandbox::IsValidUtf8(a.status().message()));
    return 0;
  }
  FUZZ_CHECK(a->timeout_seconds == 0 ||
             (a->timeout_seconds >= 1 && a->timeout_seconds <= limits.max_timeout_seconds));
  FUZZ_CHECK(a->encoding == pb::ENCODING_UTF8 || a->encoding == pb::ENCODING_BASE64);
  switch (op) {
    case ToolOp::kRun:
      FUZZ_CHECK(!a->code.empty());
      FUZZ_CHECK(a->language == pb::LANGUAGE_PYTHON || a->language == pb::LANGUAGE_NODE ||
                 a->language == pb::LANGUAGE_SHELL);
      break;
    case ToolOp::kShell:
      FUZZ_CHECK(!a->code.empty());
      break;
    case ToolOp::kWriteFile:
    case ToolOp::kReadFile:
      FUZZ_CHECK(a->code.empty());
      break;
  }
  return 0;
}
