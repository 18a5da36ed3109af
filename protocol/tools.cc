#include "protocol/tools.h"

#include <cmath>
#include <cstdint>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"

namespace sandbox {
namespace {

using ojson = nlohmann::ordered_json;

struct OpInfo {
  ToolOp op;
  const char* suffix;
};
constexpr OpInfo kOps[] = {{ToolOp::kRun, "run"},
                           {ToolOp::kShell, "shell"},
                           {ToolOp::kWriteFile, "write_file"},
                           {ToolOp::kReadFile, "read_file"}};

ojson TimeoutSchema(const ToolLimits& l) {
  return {{"type", "integer"},
          {"minimum", 1},
          {"maximum", l.max_timeout_seconds},
          {"description",
           absl::StrCat("Seconds before the process is killed (default ", l.default_timeout_seconds,
                        ", at most ", l.max_timeout_seconds, ").")}};
}

ojson EncodingSchema(const char* what) {
  return {{"type", "string"},
          {"enum", {"utf8", "base64"}},
          {"default", "utf8"},
          {"description", absl::StrCat("How `", what,
                                       "` is encoded: utf8 text (default) or base64 for "
                                       "binary data.")}};
}

ojson Schema(ToolOp op, const ToolLimits& l) {
  ojson props;
  ojson required = ojson::array();
  switch (op) {
    case ToolOp::kRun:
      props["code"] = {{"type", "string"}, {"description", "The program to run."}};
      props["language"] = {{"type", "string"},
                           {"enum", {"python", "node", "shell"}},
                           {"default", "python"},
                           {"description", "python (python3), node (Node.js) or shell (bash)."}};
      props["timeoutSeconds"] = TimeoutSchema(l);
      required.push_back("code");
      break;
    case ToolOp::kShell:
      props["command"] = {{"type", "string"}, {"description", "A bash command line."}};
      props["timeoutSeconds"] = TimeoutSchema(l);
      required.push_back("command");
      break;
    case ToolOp::kWriteFile:
      props["path"] = {
          {"type", "string"},
          {"description", "File path; relative paths are in the sandbox's working directory."}};
      props["contents"] = {{"type", "string"}, {"description", "The file's contents."}};
      props["encoding"] = EncodingSchema("contents");
      required = {"path", "contents"};
      break;
    case ToolOp::kReadFile:
      props["path"] = {
          {"type", "string"},
          {"description", "File path; relative paths are in the sandbox's working directory."}};
      props["encoding"] = EncodingSchema("the returned content");
      required.push_back("path");
      break;
  }
  return {{"type", "object"},
          {"properties", props},
          {"required", required},
          {"additionalProperties", false}};
}

std::string Description(ToolOp op, const std::string& provider, const ToolLimits& l) {
  const std::string where = absl::StrCat("an isolated ", provider,
                                         " sandbox that persists for this session (files and "
                                         "installed packages stay between calls)");
  const std::string result =
      absl::StrCat(" Returns JSON {\"output\", \"exitCode\"}: stdout and stderr combined (at most ",
                   l.max_output_bytes,
                   " bytes; \"truncated\": true when cut) and the exit code; on timeout "
                   "the process is killed and \"timedOut\": true with exitCode 124.");
  switch (op) {
    case ToolOp::kRun:
      return absl::StrCat("Run python, node or shell code in ", where,
                          ". Print what you need to see.", result);
    case ToolOp::kShell:
      return absl::StrCat("Run a bash command in ", where, ". No network access.", result);
    case ToolOp::kWriteFile:
      return absl::StrCat("Write a file in ", where,
                          ", creating parent directories. Returns \"ok\".");
    case ToolOp::kReadFile:
      return absl::StrCat("Read a file from ", where, ". Returns the content, or \"", kFileNotFound,
                          "\" when there is no such file.");
  }
  return "";
}

// Reads an optional string argument.
absl::Status GetString(const nlohmann::json& args, const char* key, bool required,
                       std::string* out) {
  auto it = args.find(key);
  if (it == args.end() || it->is_null()) {
    if (required) {
      return absl::InvalidArgumentError(
          absl::StrCat("missing required argument \"", key, "\" (a string)"));
    }
    return absl::OkStatus();
  }
  if (!it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat("argument \"", key, "\" must be a string, not ", it->type_name()));
  }
  *out = it->get<std::string>();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ToolName> ParseToolName(absl::string_view name) {
  absl::string_view rest = name;
  if (absl::ConsumePrefix(&rest, "sandbox_")) {
    for (const OpInfo& o : kOps) {
      absl::string_view provider = rest;
      if (absl::ConsumeSuffix(&provider, absl::StrCat("_", o.suffix)) && !provider.empty()) {
        return ToolName{std::string(provider), o.op};
      }
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown tool \"", name,
                   "\"; tools are named sandbox_<provider>_{run,shell,write_file,read_file}"));
}

absl::StatusOr<std::vector<pb::Tool>> BuildTools(const std::vector<std::string>& providers,
                                                 absl::string_view dialect,
                                                 const ToolLimits& limits) {
  if (dialect != "" && dialect != "openai" && dialect != "anthropic") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown dialect \"", dialect, "\" (use \"\", \"openai\" or \"anthropic\")"));
  }
  std::vector<pb::Tool> out;
  for (const std::string& p : providers) {
    for (const OpInfo& o : kOps) {
      pb::Tool t;
      t.set_name(absl::StrCat("sandbox_", p, "_", o.suffix));
      t.set_description(Description(o.op, p, limits));
      ojson schema = Schema(o.op, limits);
      t.set_parameters_json_schema(schema.dump());
      ojson def;
      if (dialect == "openai") {
        def = {{"type", "function"},
               {"function",
                {{"name", t.name()}, {"description", t.description()}, {"parameters", schema}}}};
      } else if (dialect == "anthropic") {
        def = {{"name", t.name()}, {"description", t.description()}, {"input_schema", schema}};
      } else {
        def = {{"name", t.name()}, {"description", t.description()}, {"parameters", schema}};
      }
      t.set_definition_json(def.dump());
      out.push_back(std::move(t));
    }
  }
  return out;
}

absl::StatusOr<ToolArgs> ParseToolArgs(ToolOp op, absl::string_view arguments_json,
                                       const ToolLimits& limits) {
  // An empty argument string is an empty object (some models send "").
  nlohmann::json args = arguments_json.empty()
                            ? nlohmann::json::object()
                            : nlohmann::json::parse(arguments_json.begin(), arguments_json.end(),
                                                    nullptr, /*allow_exceptions=*/false);
  if (args.is_discarded()) {
    return absl::InvalidArgumentError("arguments are not valid JSON; send a JSON object");
  }
  if (!args.is_object()) {
    return absl::InvalidArgumentError("arguments must be a JSON object");
  }
  std::vector<const char*> allowed;
  ToolArgs a;
  std::string enc, lang;
  switch (op) {
    case ToolOp::kRun:
      allowed = {"code", "language", "timeoutSeconds"};
      if (auto s = GetString(args, "code", true, &a.code); !s.ok()) return s;
      if (auto s = GetString(args, "language", false, &lang); !s.ok()) return s;
      if (lang.empty() || lang == "python") {
        a.language = pb::LANGUAGE_PYTHON;
      } else if (lang == "node" || lang == "javascript") {
        a.language = pb::LANGUAGE_NODE;
      } else if (lang == "shell" || lang == "bash") {
        a.language = pb::LANGUAGE_SHELL;
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            "argument \"language\" must be one of \"python\", \"node\", \"shell\", not \"", lang,
            "\""));
      }
      break;
    case ToolOp::kShell:
      allowed = {"command", "timeoutSeconds"};
      if (auto s = GetString(args, "command", true, &a.code); !s.ok()) return s;
      break;
    case ToolOp::kWriteFile:
      allowed = {"path", "contents", "encoding"};
      if (auto s = GetString(args, "path", true, &a.path); !s.ok()) return s;
      if (auto s = GetString(args, "contents", true, &a.contents); !s.ok()) return s;
      if (auto s = GetString(args, "encoding", false, &enc); !s.ok()) return s;
      break;
    case ToolOp::kReadFile:
      allowed = {"path", "encoding"};
      if (auto s = GetString(args, "path", true, &a.path); !s.ok()) return s;
      if (auto s = GetString(args, "encoding", false, &enc); !s.ok()) return s;
      break;
  }
  for (auto it = args.begin(); it != args.end(); ++it) {
    bool ok = false;
    for (const char* k : allowed) ok = ok || it.key() == k;
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("unknown argument \"", it.key(), "\""));
    }
  }
  if (op == ToolOp::kRun || op == ToolOp::kShell) {
    if (a.code.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "argument \"", op == ToolOp::kRun ? "code" : "command", "\" must not be empty"));
    }
    auto it = args.find("timeoutSeconds");
    if (it != args.end() && !it->is_null()) {
      const bool integral =
          it->is_number_integer() ||
          (it->is_number_float() && std::floor(it->get<double>()) == it->get<double>());
      const double v = it->is_number() ? it->get<double>() : 0;
      if (!integral || v < 1 || v > static_cast<double>(limits.max_timeout_seconds)) {
        return absl::InvalidArgumentError(
            absl::StrCat("argument \"timeoutSeconds\" must be a whole number from 1 to ",
                         limits.max_timeout_seconds));
      }
      a.timeout_seconds = static_cast<int32_t>(v);
    }
  }
  if (enc.empty() || enc == "utf8" || enc == "utf-8") {
    a.encoding = pb::ENCODING_UTF8;
  } else if (enc == "base64") {
    a.encoding = pb::ENCODING_BASE64;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("argument \"encoding\" must be \"utf8\" or \"base64\", not \"", enc, "\""));
  }
  return a;
}

std::string FormatRunResult(const pb::RunResult& r) {
  ojson j;
  j["output"] = r.output();
  j["exitCode"] = r.exit_code();
  if (r.timed_out()) j["timedOut"] = true;
  if (r.truncated()) j["truncated"] = true;
  if (r.oom_killed()) {
    j["oomKilled"] = true;
    j["note"] =
        "A process was killed because the sandbox ran out of memory (its memory limit). "
        "Use less memory (smaller data, streaming, fewer processes) and try again; "
        "files and the session are still there.";
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

bool ParseRunResult(absl::string_view content, pb::RunResult* out) {
  const nlohmann::json j = nlohmann::json::parse(content, nullptr, false);
  if (!j.is_object()) return false;
  const auto output = j.find("output");
  const auto exit_code = j.find("exitCode");
  if (output == j.end() || !output->is_string() || exit_code == j.end() ||
      !exit_code->is_number_integer()) {
    return false;
  }
  if (exit_code->is_number_unsigned() && exit_code->get<uint64_t>() > INT32_MAX) return false;
  const int64_t code = exit_code->get<int64_t>();
  if (code < INT32_MIN || code > INT32_MAX) return false;
  pb::RunResult r;
  r.set_output(output->get<std::string>());
  r.set_exit_code(static_cast<int32_t>(code));
  const auto flag = [&j](const char* key) {
    const auto it = j.find(key);
    return it != j.end() && it->is_boolean() && it->get<bool>();
  };
  r.set_timed_out(flag("timedOut"));
  r.set_truncated(flag("truncated"));
  r.set_oom_killed(flag("oomKilled"));
  *out = std::move(r);
  return true;
}

std::string ToolErrorText(const absl::Status& s) {
  return s.code() == absl::StatusCode::kInvalidArgument
             ? absl::StrCat("error: ", s.message())
             : absl::StrCat("error: ", absl::StatusCodeToString(s.code()), ": ", s.message());
}

}  // namespace sandbox
