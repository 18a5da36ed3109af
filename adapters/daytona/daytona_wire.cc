#include "adapters/daytona/daytona_wire.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "adapters/http/http_client.h"
#include "common/text.h"
#include "nlohmann/json.hpp"

namespace sandbox {
namespace daytona {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

std::string CreateSandboxBody(const CreateParams& p) {
  ojson j;
  if (!p.name.empty()) j["name"] = p.name;
  if (!p.snapshot.empty()) j["snapshot"] = p.snapshot;
  j["env"] = p.env.empty() ? ojson::object() : ojson(p.env);
  j["labels"] = p.labels;
  if (!p.target.empty()) j["target"] = p.target;
  if (p.auto_stop_minutes >= 0) j["autoStopInterval"] = p.auto_stop_minutes;
  if (p.auto_delete_minutes >= -1) j["autoDeleteInterval"] = p.auto_delete_minutes;
  if (p.cpu > 0) j["cpu"] = p.cpu;
  if (p.memory_gib > 0) j["memory"] = p.memory_gib;
  if (p.disk_gib > 0) j["disk"] = p.disk_gib;
  if (p.network_block_all) j["networkBlockAll"] = *p.network_block_all;
  if (!p.network_allow_list.empty()) j["networkAllowList"] = p.network_allow_list;
  if (!p.domain_allow_list.empty()) j["domainAllowList"] = p.domain_allow_list;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

absl::Status MapNetwork(const NetworkPolicy& policy, CreateParams* p) {
  if (policy.IsDefault()) return absl::OkStatus();
  auto cannot = [](const std::string& what, absl::string_view why) {
    return absl::FailedPreconditionError(
        absl::StrCat("daytona: spec.network ", what, " cannot be enforced on Daytona (", why, ")"));
  };
  if (!policy.hosts.empty()) {
    return cannot(absl::StrCat("hosts.", policy.hosts.begin()->first), "no host entries");
  }
  if (policy.max_connections > 0) return cannot("max_connections", "no connection cap");
  if (policy.max_bytes_per_second > 0) return cannot("max_bytes_per_second", "no bandwidth cap");
  if (!policy.deny_out.empty()) {
    return cannot(absl::StrCat("deny_out \"", policy.deny_out[0].text, "\""), "no deny rules");
  }
  if (policy.allow_all) {
    p->network_block_all = false;
    return absl::OkStatus();
  }
  std::vector<std::string> cidrs, domains;
  for (const NetRule& r : policy.allow_out) {
    if (r.port != 0) return cannot(absl::StrCat("\"", r.text, "\""), "its rules take no port");
    if (r.kind == NetRule::Kind::kCidr) {
      cidrs.push_back(absl::StrCat(r.network.ToString(), "/", r.prefix));
    } else {
      domains.push_back(r.text);
    }
  }
  p->network_block_all = cidrs.empty() && domains.empty();
  p->network_allow_list = absl::StrJoin(cidrs, ",");
  p->domain_allow_list = absl::StrJoin(domains, ",");
  return absl::OkStatus();
}

absl::StatusOr<SandboxDto> ParseSandbox(absl::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::UnavailableError("daytona: sandbox response is not a JSON object");
  }
  SandboxDto d;
  auto str = [&](const char* k) {
    auto it = j.find(k);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  d.id = str("id");
  d.state = str("state");
  d.error_reason = str("errorReason");
  d.toolbox_proxy_url = str("toolboxProxyUrl");
  if (auto it = j.find("labels"); it != j.end() && it->is_object()) {
    for (auto l = it->begin(); l != it->end(); ++l) {
      if (l.value().is_string()) d.labels[l.key()] = l.value().get<std::string>();
    }
  }
  if (d.id.empty()) return absl::UnavailableError("daytona: sandbox response has no id");
  return d;
}

std::string ExecuteBody(const std::string& command, const std::string& cwd,
                        const std::map<std::string, std::string>& envs, int64_t timeout_seconds) {
  ojson j;
  j["command"] = command;
  if (!cwd.empty()) j["cwd"] = cwd;
  if (!envs.empty()) j["envs"] = envs;
  if (timeout_seconds > 0) j["timeout"] = timeout_seconds;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string CodeRunBody(const std::string& code, const std::string& language,
                        const std::map<std::string, std::string>& envs, int64_t timeout_seconds) {
  ojson j;
  j["code"] = code;
  j["language"] = language;
  if (!envs.empty()) j["envs"] = envs;
  if (timeout_seconds > 0) j["timeout"] = timeout_seconds;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

absl::StatusOr<ExecuteResult> ParseExecuteResult(absl::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::UnavailableError("daytona: execute response is not a JSON object");
  }
  ExecuteResult r;
  auto code = j.find("exitCode");
  if (code == j.end() || !code->is_number_integer()) code = j.find("code");
  // No exit code is no result: reporting 0 would call a failure a success.
  if (code == j.end() || !code->is_number_integer()) {
    return absl::UnavailableError("daytona: execute response has no integer exitCode");
  }
  // Unsigned first: get<int64_t> of 2^64-1 would read as -1.
  if (code->is_number_unsigned() && code->get<uint64_t>() > INT32_MAX) {
    return absl::UnavailableError("daytona: execute response's exitCode is out of range");
  }
  const int64_t exit_code = code->get<int64_t>();
  if (exit_code < INT32_MIN || exit_code > INT32_MAX) {
    return absl::UnavailableError("daytona: execute response's exitCode is out of range");
  }
  r.exit_code = static_cast<int>(exit_code);
  auto res = j.find("result");
  if (res != j.end() && res->is_string()) r.result = res->get<std::string>();
  return r;
}

absl::StatusOr<std::vector<Download>> ParseBulkDownload(absl::string_view content_type,
                                                        absl::string_view body,
                                                        const std::vector<std::string>& paths) {
  auto parts = ParseMultipart(content_type, body);
  if (!parts.ok()) {
    return absl::UnavailableError(
        absl::StrCat("daytona: bulk-download: ", parts.status().message()));
  }
  std::vector<Download> out(paths.size());
  std::vector<bool> seen(paths.size(), false);
  for (const MultipartPart& part : *parts) {
    for (size_t i = 0; i < paths.size(); ++i) {
      if (seen[i] || part.filename != paths[i]) continue;
      seen[i] = true;
      if (part.name == "file") {
        out[i].found = true;
        out[i].data = part.data;
      } else {
        json e = json::parse(part.data, nullptr, false);
        out[i].status = 500;
        if (!e.is_discarded() && e.is_object()) {
          if (e.contains("statusCode") && e["statusCode"].is_number_integer()) {
            out[i].status = e["statusCode"].get<int>();
          }
          if (e.contains("code") && e["code"].is_string())
            out[i].code = e["code"].get<std::string>();
          if (e.contains("message") && e["message"].is_string()) {
            out[i].message = e["message"].get<std::string>();
          }
        }
      }
      break;
    }
  }
  for (size_t i = 0; i < paths.size(); ++i) {
    if (!seen[i]) {
      return absl::UnavailableError(
          absl::StrCat("daytona: bulk-download: no data received for ", paths[i]));
    }
  }
  return out;
}

absl::Status HttpError(absl::string_view op, int http_status, absl::string_view body) {
  std::string message;
  json j = json::parse(body.begin(), body.end(), nullptr, false);
  if (!j.is_discarded() && j.is_object()) {
    if (j.contains("message") && j["message"].is_string()) {
      message = QuoteForError(j["message"].get<std::string>());
    } else if (j.contains("error") && j["error"].is_string()) {
      message = QuoteForError(j["error"].get<std::string>());
    } else {
      // The body itself, not j.dump(): dumping recurses once per nesting
      // level (a deeply nested reply overflowed the stack) and is unbounded.
      message = QuoteForError(body);
    }
  } else {
    message = QuoteForError(body);
  }
  const std::string msg = absl::StrCat("daytona: ", op, ": ", http_status, " ", message);
  switch (http_status) {
    case 400:
    case 422:
      return absl::InvalidArgumentError(msg);
    case 401:
      return absl::FailedPreconditionError(
          absl::StrCat(msg, " (unauthorized: check providers.daytona.api_key)"));
    case 403:
      return absl::PermissionDeniedError(msg);
    case 404:
      return absl::NotFoundError(msg);
    case 408:
    case 504:
      return absl::DeadlineExceededError(msg);
    case 409:
      return absl::AbortedError(msg);
    case 410:
      return absl::NotFoundError(msg);
    case 429:
      return absl::ResourceExhaustedError(absl::StrCat(msg, " (rate limited)"));
    default:
      // 5xx, and replies no Daytona operation gives (1xx-3xx where an error
      // was expected): the provider is not answering properly.
      if (http_status >= 500 || http_status < 400) return absl::UnavailableError(msg);
      return absl::UnknownError(msg);
  }
}

}  // namespace daytona
}  // namespace sandbox
