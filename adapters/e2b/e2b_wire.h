#pragma once

// E2B's wire formats, as the official JS SDK (e2b@2.51.0) speaks them: the
// control-plane JSON, Connect-protocol envelopes for envd's process stream,
// and E2B's error bodies. Pure functions over bytes; unit-tested with
// recorded payloads.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "adapters/api/network_policy.h"

namespace sandbox {
namespace e2b {

constexpr int kEnvdPort = 49983;
constexpr uint8_t kFlagEndStream = 0x02;
constexpr uint8_t kFlagCompressed = 0x01;

// One Connect envelope: flags, 4-byte big-endian length, payload.
std::string EncodeEnvelope(uint8_t flags, absl::string_view payload);

struct Envelope {
  uint8_t flags = 0;
  std::string payload;
};

// Splits a byte stream into envelopes as bytes arrive.
class EnvelopeReader {
 public:
  void Feed(absl::string_view bytes) { buffer_.append(bytes.data(), bytes.size()); }
  // The next complete envelope, if one has arrived. INVALID_ARGUMENT for a
  // frame longer than `max_frame` bytes.
  absl::StatusOr<std::optional<Envelope>> Next(size_t max_frame = 16 << 20);
  bool empty() const { return buffer_.empty(); }

 private:
  std::string buffer_;
};

// POST /v2/sandboxes body (NewSandboxV2).
// A network policy as E2B takes it (docs/network.md#e2b-and-daytona):
// `allowOut` (domains, IPs, CIDRs) and `denyOut` (IPs, CIDRs), where an
// allow entry wins over a deny entry, and `allow_internet_access`.
struct Network {
  std::optional<bool> allow_internet_access;
  std::vector<std::string> allow_out;
  std::vector<std::string> deny_out;
};
// FAILED_PRECONDITION naming the first rule E2B cannot express: a port,
// a host entry, a connection or bandwidth cap, deny_out beside allow_out
// (E2B would let the allow rules win). The default policy is everything
// denied here: a caller that wants the provider's default sends nothing.
absl::StatusOr<Network> MapNetwork(const NetworkPolicy& p);
// The body of PUT /sandboxes/{id}/network (omitted fields are cleared).
std::string NetworkUpdateBody(const Network& n);

// `network` unset: the fields are left out (E2B's default).
std::string CreateSandboxBody(const std::string& template_id, int64_t timeout_seconds,
                              const std::map<std::string, std::string>& metadata,
                              const std::map<std::string, std::string>& env_vars,
                              const std::optional<Network>& network = std::nullopt);

// The fields of a Sandbox object the broker uses.
struct SandboxInfo {
  std::string sandbox_id;
  std::string envd_version;
  std::string envd_access_token;
  std::string domain;  // empty when null
};
absl::StatusOr<SandboxInfo> ParseSandbox(absl::string_view json);

// A sandbox's size, as GET /sandboxes/{id} reports it (SandboxDetail's
// cpuCount, memoryMB, diskSizeMB). A field E2B left out (or sent as
// something other than a non-negative number) is -1: not known.
struct SandboxSize {
  double cpus = -1;
  int64_t memory_bytes = -1;
  int64_t disk_bytes = -1;
};
absl::StatusOr<SandboxSize> ParseSandboxSize(absl::string_view json);

// A StartRequest for `cmd args...` with envs and cwd, as JSON.
std::string StartRequestJson(const std::string& cmd, const std::vector<std::string>& args,
                             const std::map<std::string, std::string>& envs,
                             const std::string& cwd);

// One event of a process stream (StartResponse / ConnectResponse).
struct ProcessEvent {
  enum Kind { kStart, kStdout, kStderr, kPty, kEnd, kKeepalive, kUnknown } kind = kUnknown;
  uint32_t pid = 0;
  std::string data;  // decoded bytes for stdout/stderr/pty
  int32_t exit_code = 0;
  bool exited = false;
  std::string status;
  std::string error;
};
absl::StatusOr<ProcessEvent> ParseProcessEvent(absl::string_view json);

// An end-stream payload: OK for `{}`, else the error it carries.
absl::Status ParseEndStream(absl::string_view json);

// Connect error code names ("not_found", ...) to status codes.
absl::StatusCode ConnectCodeToStatus(absl::string_view code);

// Maps an E2B HTTP error (status + `{"code","message"}` body) to a status
// whose message names the operation: "e2b: create sandbox: 401 ...".
absl::Status HttpError(absl::string_view op, int http_status, absl::string_view body);

// True for the edge proxy's answer about a sandbox that no longer exists.
bool IsSandboxGone(int http_status, absl::string_view body);

}  // namespace e2b
}  // namespace sandbox
