#include "adapters/e2b/e2b_wire.h"

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/text.h"
#include "nlohmann/json.hpp"

namespace sandbox {
namespace e2b {

using nlohmann::json;

std::string EncodeEnvelope(uint8_t flags, absl::string_view payload) {
  std::string out;
  out.reserve(5 + payload.size());
  out.push_back(static_cast<char>(flags));
  const uint32_t n = static_cast<uint32_t>(payload.size());
  out.push_back(static_cast<char>((n >> 24) & 0xff));
  out.push_back(static_cast<char>((n >> 16) & 0xff));
  out.push_back(static_cast<char>((n >> 8) & 0xff));
  out.push_back(static_cast<char>(n & 0xff));
  out.append(payload.data(), payload.size());
  return out;
}

absl::StatusOr<std::optional<Envelope>> EnvelopeReader::Next(size_t max_frame) {
  if (buffer_.size() < 5) return std::optional<Envelope>();
  const auto b = [&](size_t i) { return static_cast<uint8_t>(buffer_[i]); };
  const uint32_t n =
      (uint32_t{b(1)} << 24) | (uint32_t{b(2)} << 16) | (uint32_t{b(3)} << 8) | uint32_t{b(4)};
  if (n > max_frame) {
    return absl::InvalidArgumentError(absl::StrCat("connect frame of ", n, " bytes is too large"));
  }
  if (buffer_.size() < 5 + size_t{n}) return std::optional<Envelope>();
  Envelope e;
  e.flags = b(0);
  e.payload = buffer_.substr(5, n);
  buffer_.erase(0, 5 + size_t{n});
  return std::optional<Envelope>(std::move(e));
}

absl::StatusOr<Network> MapNetwork(const NetworkPolicy& p) {
  auto cannot = [](const std::string& what, absl::string_view why) {
    return absl::FailedPreconditionError(
        absl::StrCat("e2b: spec.network ", what, " cannot be enforced on E2B (", why, ")"));
  };
  if (!p.hosts.empty())
    return cannot(absl::StrCat("hosts.", p.hosts.begin()->first), "no host entries");
  if (p.max_connections > 0) return cannot("max_connections", "no connection cap");
  if (p.max_bytes_per_second > 0) return cannot("max_bytes_per_second", "no bandwidth cap");
  Network n;
  for (const auto* rules : {&p.allow_out, &p.deny_out}) {
    for (const NetRule& r : *rules) {
      if (r.port != 0) return cannot(absl::StrCat("\"", r.text, "\""), "its rules take no port");
      (rules == &p.allow_out ? n.allow_out : n.deny_out).push_back(r.text);
    }
  }
  if (p.allow_all) {
    n.allow_out.clear();
    n.allow_internet_access = true;
    return n;
  }
  if (!n.allow_out.empty() && !n.deny_out.empty()) {
    return cannot(absl::StrCat("deny_out \"", n.deny_out[0], "\" beside allow_out"),
                  "its allow rules win over its deny rules");
  }
  // Everything not allowed is denied.
  n.deny_out = {"0.0.0.0/0"};
  return n;
}

std::string NetworkUpdateBody(const Network& n) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!n.allow_out.empty()) j["allowOut"] = n.allow_out;
  if (!n.deny_out.empty()) j["denyOut"] = n.deny_out;
  if (n.allow_internet_access) j["allow_internet_access"] = *n.allow_internet_access;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string CreateSandboxBody(const std::string& template_id, int64_t timeout_seconds,
                              const std::map<std::string, std::string>& metadata,
                              const std::map<std::string, std::string>& env_vars,
                              const std::optional<Network>& network) {
  nlohmann::ordered_json j;
  j["templateID"] = template_id;
  if (!metadata.empty()) j["metadata"] = metadata;
  if (!env_vars.empty()) j["envVars"] = env_vars;
  if (timeout_seconds > 0) j["timeout"] = timeout_seconds;
  if (network) {
    if (network->allow_internet_access) {
      j["allow_internet_access"] = *network->allow_internet_access;
    }
    nlohmann::ordered_json rules = nlohmann::ordered_json::object();
    if (!network->allow_out.empty()) rules["allowOut"] = network->allow_out;
    if (!network->deny_out.empty()) rules["denyOut"] = network->deny_out;
    if (!rules.empty()) j["network"] = std::move(rules);
  }
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

absl::StatusOr<SandboxInfo> ParseSandbox(absl::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::UnavailableError("e2b: sandbox response is not a JSON object");
  }
  SandboxInfo s;
  auto str = [&](const char* k, std::string* out) {
    auto it = j.find(k);
    if (it != j.end() && it->is_string()) *out = it->get<std::string>();
  };
  str("sandboxID", &s.sandbox_id);
  str("envdVersion", &s.envd_version);
  str("envdAccessToken", &s.envd_access_token);
  str("domain", &s.domain);
  if (s.sandbox_id.empty()) return absl::UnavailableError("e2b: sandbox response has no sandboxID");
  return s;
}

absl::StatusOr<SandboxSize> ParseSandboxSize(absl::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::UnavailableError("e2b: sandbox detail is not a JSON object");
  }
  // Megabytes past this would overflow bytes: no size anyone reports.
  constexpr double kMaxMB = static_cast<double>(int64_t{1} << 42);
  auto number = [&](const char* k) -> double {
    auto it = j.find(k);
    if (it == j.end() || !it->is_number()) return -1;
    const double v = it->get<double>();
    return v >= 0 && v <= kMaxMB ? v : -1;
  };
  SandboxSize s;
  s.cpus = number("cpuCount");
  const double memory_mb = number("memoryMB");
  const double disk_mb = number("diskSizeMB");
  if (memory_mb >= 0) s.memory_bytes = static_cast<int64_t>(memory_mb) << 20;
  if (disk_mb >= 0) s.disk_bytes = static_cast<int64_t>(disk_mb) << 20;
  return s;
}

std::string StartRequestJson(const std::string& cmd, const std::vector<std::string>& args,
                             const std::map<std::string, std::string>& envs,
                             const std::string& cwd) {
  nlohmann::ordered_json p;
  p["cmd"] = cmd;
  p["args"] = args;
  if (!envs.empty()) p["envs"] = envs;
  if (!cwd.empty()) p["cwd"] = cwd;
  nlohmann::ordered_json j;
  j["process"] = p;
  j["stdin"] = false;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

absl::StatusOr<ProcessEvent> ParseProcessEvent(absl::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::UnavailableError("e2b: process event is not JSON");
  }
  ProcessEvent e;
  auto ev = j.find("event");
  if (ev == j.end() || !ev->is_object()) return e;  // unknown: ignored
  auto num = [](const json& o, const char* k) -> int64_t {
    auto it = o.find(k);
    if (it == o.end()) return 0;
    if (it->is_number_integer()) return it->get<int64_t>();
    if (it->is_string()) return std::strtoll(it->get<std::string>().c_str(), nullptr, 10);
    return 0;
  };
  auto text_of = [](const json& o, const char* k) {
    auto it = o.find(k);
    return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (auto s = ev->find("start"); s != ev->end() && s->is_object()) {
    e.kind = ProcessEvent::kStart;
    e.pid = static_cast<uint32_t>(num(*s, "pid"));
  } else if (auto d = ev->find("data"); d != ev->end() && d->is_object()) {
    for (const auto& [key, kind] :
         {std::pair<const char*, ProcessEvent::Kind>{"stdout", ProcessEvent::kStdout},
          {"stderr", ProcessEvent::kStderr},
          {"pty", ProcessEvent::kPty}}) {
      auto it = d->find(key);
      if (it != d->end() && it->is_string()) {
        e.kind = kind;
        if (!absl::Base64Unescape(it->get<std::string>(), &e.data)) {
          return absl::UnavailableError("e2b: process output is not base64");
        }
        break;
      }
    }
  } else if (auto en = ev->find("end"); en != ev->end() && en->is_object()) {
    e.kind = ProcessEvent::kEnd;
    e.exit_code = static_cast<int32_t>(num(*en, "exitCode"));
    auto ex = en->find("exited");
    e.exited = ex != en->end() && ex->is_boolean() && ex->get<bool>();
    e.status = text_of(*en, "status");
    e.error = text_of(*en, "error");
  } else if (ev->contains("keepalive")) {
    e.kind = ProcessEvent::kKeepalive;
  }
  return e;
}

absl::StatusCode ConnectCodeToStatus(absl::string_view code) {
  static const std::pair<const char*, absl::StatusCode> kCodes[] = {
      {"canceled", absl::StatusCode::kCancelled},
      {"unknown", absl::StatusCode::kUnknown},
      {"invalid_argument", absl::StatusCode::kInvalidArgument},
      {"deadline_exceeded", absl::StatusCode::kDeadlineExceeded},
      {"not_found", absl::StatusCode::kNotFound},
      {"already_exists", absl::StatusCode::kAlreadyExists},
      {"permission_denied", absl::StatusCode::kPermissionDenied},
      {"resource_exhausted", absl::StatusCode::kResourceExhausted},
      {"failed_precondition", absl::StatusCode::kFailedPrecondition},
      {"aborted", absl::StatusCode::kAborted},
      {"out_of_range", absl::StatusCode::kOutOfRange},
      {"unimplemented", absl::StatusCode::kUnimplemented},
      {"internal", absl::StatusCode::kInternal},
      {"unavailable", absl::StatusCode::kUnavailable},
      {"data_loss", absl::StatusCode::kDataLoss},
      {"unauthenticated", absl::StatusCode::kUnauthenticated},
  };
  for (const auto& [name, c] : kCodes) {
    if (code == name) return c;
  }
  return absl::StatusCode::kUnknown;
}

absl::Status ParseEndStream(absl::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::UnavailableError("e2b: malformed end of stream");
  }
  auto err = j.find("error");
  if (err == j.end() || !err->is_object()) return absl::OkStatus();
  // A provider's reply is untrusted: read fields only with the right types.
  auto field = [&](const char* k, const char* def) {
    auto it = err->find(k);
    return it != err->end() && it->is_string() ? it->get<std::string>() : std::string(def);
  };
  std::string code = field("code", "unknown");
  std::string message = QuoteForError(field("message", ""));
  return absl::Status(ConnectCodeToStatus(code),
                      absl::StrCat("[", QuoteForError(code, 64), "] ", message));
}

namespace {
std::string BodyMessage(absl::string_view body) {
  json j = json::parse(body.begin(), body.end(), nullptr, false);
  if (!j.is_discarded() && j.is_object()) {
    auto it = j.find("message");
    if (it != j.end() && it->is_string()) return QuoteForError(it->get<std::string>());
  }
  return QuoteForError(body);
}
}  // namespace

bool IsSandboxGone(int http_status, absl::string_view body) {
  return http_status == 502 && absl::StrContains(body, "sandbox was not found");
}

absl::Status HttpError(absl::string_view op, int http_status, absl::string_view body) {
  const std::string msg = absl::StrCat("e2b: ", op, ": ", http_status, " ", BodyMessage(body));
  switch (http_status) {
    case 400:
      return absl::InvalidArgumentError(msg);
    case 401:
      return absl::FailedPreconditionError(
          absl::StrCat(msg, " (unauthorized: check providers.e2b.api_key)"));
    case 403:
      return absl::PermissionDeniedError(msg);
    case 404:
      return absl::NotFoundError(msg);
    case 409:
      return absl::FailedPreconditionError(msg);
    case 429:
      return absl::ResourceExhaustedError(absl::StrCat(msg, " (rate limited)"));
    case 507:
      return absl::ResourceExhaustedError(msg);
    default:
      // 5xx, and replies no E2B operation gives (1xx-3xx where an error was
      // expected): the provider is not answering properly.
      if (http_status >= 500 || http_status < 400) return absl::UnavailableError(msg);
      return absl::UnknownError(msg);
  }
}

}  // namespace e2b
}  // namespace sandbox
