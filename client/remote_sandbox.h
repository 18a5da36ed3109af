#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sandboxbroker/v1/broker.grpc.pb.h"

namespace sandbox {

namespace pb = ::sandboxbroker::v1;

struct RemoteRunOptions {
  pb::Language language = pb::LANGUAGE_UNSPECIFIED;  // the session's, else python
  int timeout_seconds = 0;                           // 0 = the broker's default
  std::map<std::string, std::string> env;
};

// How to reach a broker over TLS.
struct RemoteTls {
  bool enabled = false;
  std::string root_certs_pem;   // empty = the system's roots
  std::string client_cert_pem;  // for brokers that verify clients
  std::string client_key_pem;
};

// A CloudSandbox backed by a sandbox broker: one session on one broker.
// The session's sandbox is created by the first call (or Start) and
// destroyed by Close. RPC failures come back as absl::Status with the
// broker's code and message.
//
// Written against StubInterface, so it runs against a real server or a mock.
// Thread-safe.
//
// Example:
//   auto sb = RemoteSandbox::Connect("127.0.0.1:50051", token, "my-session");
//   auto r = sb->Run("print(6 * 7)");
//   // r->output() == "42\n"
//   sb->Close();
class RemoteSandbox {
 public:
  RemoteSandbox(std::shared_ptr<pb::SandboxBroker::StubInterface> stub, std::string session_id,
                std::string token = "", pb::SessionSpec spec = {});

  using Tls = RemoteTls;
  // A channel to `address` (host:port): plaintext, or TLS when `tls` is set.
  static std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const Tls& tls);
  static std::unique_ptr<RemoteSandbox> Connect(const std::string& address,
                                                const std::string& token,
                                                const std::string& session_id,
                                                pb::SessionSpec spec = {}, const Tls& tls = {});

  // grpc.health.v1 Check of `service` ("" = the whole broker) on `channel`:
  // "SERVING", "NOT_SERVING", ... No token needed.
  static absl::StatusOr<std::string> Health(const std::shared_ptr<grpc::Channel>& channel,
                                            const std::string& service = "");

  const std::string& session_id() const { return session_id_; }

  absl::StatusOr<pb::SessionInfo> Start();
  absl::StatusOr<pb::RunResult> Run(const std::string& code, const RemoteRunOptions& options = {});
  absl::StatusOr<pb::RunResult> Shell(const std::string& command, int timeout_seconds = 0,
                                      const std::map<std::string, std::string>& env = {});
  absl::Status WriteFile(const std::string& path, const std::string& contents,
                         pb::Encoding encoding = pb::ENCODING_UTF8);
  // nullopt when the file does not exist.
  absl::StatusOr<std::optional<std::string>> ReadFile(const std::string& path,
                                                      pb::Encoding encoding = pb::ENCODING_UTF8);
  // Returns whether the session existed. Idempotent.
  absl::StatusOr<bool> Close();
  absl::StatusOr<pb::SessionInfo> Info();

  // Run, streamed: `on_chunk` sees each output chunk as it arrives; the
  // returned result's output is empty. Cancel by letting `timeout` pass.
  absl::StatusOr<pb::RunResult> RunStream(
      const std::string& code, const RemoteRunOptions& options,
      const std::function<void(pb::OutputStream, const std::string&)>& on_chunk);
  // Marks the session active; returns the new idle deadline (unix seconds).
  absl::StatusOr<int64_t> KeepAlive();
  absl::StatusOr<std::vector<pb::Tool>> ListTools(const std::string& provider = "",
                                                  const std::string& dialect = "");
  absl::StatusOr<pb::CallToolResponse> CallTool(const std::string& name,
                                                const std::string& arguments_json);

  // The caller's sessions, all pages.
  absl::StatusOr<std::vector<pb::SessionInfo>> ListSessions();

 private:
  void Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const;
  // Deadline, credentials and the request shared by Run and RunStream.
  pb::RunRequest PrepareRun(grpc::ClientContext* ctx, const std::string& code,
                            const RemoteRunOptions& options) const;

  const std::shared_ptr<pb::SandboxBroker::StubInterface> stub_;
  const std::string session_id_;
  const std::string token_;
  const pb::SessionSpec spec_;
};

absl::Status FromGrpcStatus(const grpc::Status& s);

}  // namespace sandbox
