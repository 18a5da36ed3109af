#pragma once

#include <functional>
#include <iosfwd>
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

// A streamed transfer's options (RemoteSandbox::UploadFile, DownloadFile).
struct RemoteTransferOptions {
  uint32_t mode = 0;            // upload: permission bits (0 = 0644)
  std::optional<int64_t> size;  // upload: the bytes the stream holds, when known
  int64_t offset = 0;           // download: where to start
  int64_t length = 0;           // download: 0 = to the end
  // upload: bytes per message; each message must fit the broker's
  // max_message_bytes (default 32 MiB, at least 4 KiB): just under 1 MiB.
  size_t chunk_bytes = (1 << 20) - 1024;
  absl::Duration timeout = absl::Hours(24);
  // After each chunk: the bytes moved so far.
  std::function<void(int64_t)> progress;
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

  // The file API (docs/api.md#files). Paths as WriteFile's.
  // Every entry under directory `path` ("" = the workspace) down to `depth`,
  // sorted by path, all pages; nullopt when `path` does not exist.
  absl::StatusOr<std::optional<std::vector<pb::FileEntry>>> ListFiles(const std::string& path,
                                                                      int depth = 1);
  // nullopt when `path` does not exist.
  absl::StatusOr<std::optional<pb::FileEntry>> StatFile(const std::string& path);
  absl::Status MakeDir(const std::string& path, bool parents = false);
  // Returns whether `path` existed.
  absl::StatusOr<bool> RemoveFile(const std::string& path, bool recursive = false);
  absl::Status MoveFile(const std::string& source, const std::string& destination,
                        bool overwrite = false);

  // Code contexts (docs/api.md#code-contexts): live interpreters whose
  // variables persist between RunCode calls.
  absl::StatusOr<pb::Context> CreateContext(pb::Language language = pb::LANGUAGE_PYTHON,
                                            const std::string& cwd = "");
  absl::StatusOr<std::vector<pb::Context>> ListContexts();
  absl::StatusOr<pb::Context> RestartContext(const std::string& context_id);
  // Returns whether the context existed.
  absl::StatusOr<bool> DeleteContext(const std::string& context_id);
  // In `context_id` ("" = the session's default python context).
  absl::StatusOr<pb::Execution> RunCode(const std::string& code, const std::string& context_id = "",
                                        int timeout_seconds = 0);

  // Streamed transfers (docs/api.md#streamed-transfers): a chunk at a time,
  // whatever the size (RemoteTransferOptions).
  using TransferOptions = RemoteTransferOptions;
  // Everything `in` holds, into `path`; returns the bytes written.
  absl::StatusOr<int64_t> UploadFile(const std::string& path, std::istream& in,
                                     const TransferOptions& options = {});
  // `path`'s bytes into `out`; the file's entry, or nullopt when it does not
  // exist (nothing written to `out`).
  absl::StatusOr<std::optional<pb::FileEntry>> DownloadFile(const std::string& path,
                                                            std::ostream& out,
                                                            const TransferOptions& options = {});

  // The caller's sessions, all pages.
  absl::StatusOr<std::vector<pb::SessionInfo>> ListSessions();

 private:
  void Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const;
  // Deadline, credentials and the request shared by Run and RunStream.
  // A file call's request: the session and its spec set.
  template <typename Req>
  Req FileRequest() const {
    Req req;
    req.set_session_id(session_id_);
    *req.mutable_spec() = spec_;
    return req;
  }
  pb::RunRequest PrepareRun(grpc::ClientContext* ctx, const std::string& code,
                            const RemoteRunOptions& options) const;

  const std::shared_ptr<pb::SandboxBroker::StubInterface> stub_;
  const std::string session_id_;
  const std::string token_;
  const pb::SessionSpec spec_;
};

absl::Status FromGrpcStatus(const grpc::Status& s);

}  // namespace sandbox
