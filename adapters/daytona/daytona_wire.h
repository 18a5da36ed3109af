#pragma once

// Daytona's wire formats, as the official TypeScript SDK (@daytonaio/sdk
// 0.218.0) speaks them: control-plane DTOs, toolbox requests and replies,
// the bulk-download multipart reply and error bodies. Pure functions.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "adapters/api/network_policy.h"

namespace sandbox {
namespace daytona {

inline constexpr char kLanguageLabel[] = "code-toolbox-language";

struct CreateParams {
  std::string name;      // empty = server default (the id)
  std::string snapshot;  // empty = server default
  std::string target;    // empty = server default
  std::map<std::string, std::string> env;
  std::map<std::string, std::string> labels;  // the language label included
  int64_t auto_stop_minutes = -1;             // <0 = not sent
  int64_t auto_delete_minutes = -2;           // <-1 = not sent
  // Resources (0 = not sent): whole CPUs, memory and disk in GiB.
  int64_t cpu = 0;
  int64_t memory_gib = 0;
  int64_t disk_gib = 0;
  // Egress (MapNetwork); unset = not sent (Daytona's default).
  std::optional<bool> network_block_all;
  std::string network_allow_list;  // comma-separated CIDRs
  std::string domain_allow_list;   // comma-separated domains
};
std::string CreateSandboxBody(const CreateParams& p);

// A network policy as Daytona takes it (docs/network.md#e2b-and-daytona):
// networkBlockAll, networkAllowList (CIDRs) and domainAllowList. The
// default policy sets nothing. FAILED_PRECONDITION naming the first rule it
// cannot express: a port, a host entry, a cap, a deny_out rule.
absl::Status MapNetwork(const NetworkPolicy& policy, CreateParams* p);

// The fields of a Sandbox DTO the broker uses.
struct SandboxDto {
  std::string id;
  std::string state;
  std::string error_reason;
  std::string toolbox_proxy_url;
  std::map<std::string, std::string> labels;
};
absl::StatusOr<SandboxDto> ParseSandbox(absl::string_view json);

std::string ExecuteBody(const std::string& command, const std::string& cwd,
                        const std::map<std::string, std::string>& envs, int64_t timeout_seconds);
std::string CodeRunBody(const std::string& code, const std::string& language,
                        const std::map<std::string, std::string>& envs, int64_t timeout_seconds);

// {"exitCode", "result"} of execute and code-run.
struct ExecuteResult {
  int exit_code = 0;
  std::string result;
};
absl::StatusOr<ExecuteResult> ParseExecuteResult(absl::string_view json);

// One requested path's outcome in a bulk-download reply.
struct Download {
  bool found = false;
  std::string data;
  int status = 0;  // for an error part
  std::string code;
  std::string message;
};
// Parts matched to `paths` by filename. UNAVAILABLE for a malformed reply.
absl::StatusOr<std::vector<Download>> ParseBulkDownload(absl::string_view content_type,
                                                        absl::string_view body,
                                                        const std::vector<std::string>& paths);

// Maps an HTTP error with Daytona's body ({statusCode, message, code,
// source} or {error}) to a status naming the operation.
absl::Status HttpError(absl::string_view op, int http_status, absl::string_view body);

}  // namespace daytona
}  // namespace sandbox
