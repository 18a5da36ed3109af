#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "adapters/api/pool_config.h"
#include "adapters/api/provider.h"
#include "adapters/http/http_client.h"
#include "nlohmann/json.hpp"

namespace sandbox {

// Settings of the Daytona provider (config key providers.daytona).
struct DaytonaConfig {
  std::string api_key;                                 // default: $DAYTONA_API_KEY
  std::string api_url = "https://app.daytona.io/api";  // self-hosted: yours (the seeds' baseURL)
  std::string target;                                  // region; empty = the server's default
  std::string snapshot;                                // empty = the server's default
  std::string organization_id;  // JWT mode: sent as X-Daytona-Organization-ID
  // The seeds' `workspace`: a sandbox name prefix; names become
  // <workspace>-<session id>-<random>. Empty = Daytona names it by id.
  std::string workspace;
  int64_t request_timeout_seconds = 60;
  int64_t create_timeout_seconds = 60;  // create + wait for "started"
  // Dead-man's switch: Daytona stops a sandbox idle this long (minutes) and
  // deletes it when stopped. Default: the broker's idle timeout + 1 minute,
  // rounded up; delete at once on stop.
  int64_t auto_stop_minutes = 0;
  int64_t auto_delete_minutes = 0;
  // A warm pool (server/sessions/warm_pool.h); size 0 = none.
  PoolConfig pool;
};

// Reads providers.daytona. INVALID_ARGUMENT naming the key for bad values;
// FAILED_PRECONDITION "daytona: missing API key" when there is none.
absl::StatusOr<DaytonaConfig> ParseDaytonaConfig(const nlohmann::json& json,
                                                 int64_t broker_idle_timeout_seconds);

// Sandboxes on Daytona (hosted or self-hosted), over its REST API and the
// toolbox proxy exactly as the official SDK drives them. A sandbox's code
// language is fixed at creation (from the session's language). One shared
// HttpClient; each sandbox is owned by one session.
//
// Thread-safe.
class DaytonaProvider final : public Provider {
 public:
  static absl::StatusOr<std::unique_ptr<DaytonaProvider>> Create(DaytonaConfig config);

  absl::string_view name() const override { return "daytona"; }
  absl::StatusOr<std::unique_ptr<Sandbox>> Create(const SandboxSpec& spec) override;
  // Create and Attach as a chain of asynchronous requests and timers (the
  // wait for "started" included): no thread waits. Create and Attach wait
  // for them.
  void CreateAsync(SandboxSpec spec, SandboxDone done) override;
  void AttachAsync(std::string sandbox_id, SandboxSpec spec, SandboxDone done) override;
  // The control plane answers an authenticated list (429 counts as up).
  absl::Status CheckHealth() override;
  // Durable sessions: get by id (starting it when its auto-stop stopped it;
  // 404 or destroyed = gone), and list by the deployment label (all pages).
  absl::StatusOr<std::unique_ptr<Sandbox>> Attach(const std::string& sandbox_id,
                                                  const SandboxSpec& spec) override;
  absl::StatusOr<std::vector<OwnedSandbox>> ListOwned(const std::string& deployment_id) override;
  // Warm pools: a member serves a session that asks for its snapshot, its
  // language (python; fixed at creation) and no resources (env is applied
  // to each run). A claim replaces its labels with the session's (so the
  // attempt tag resolves it after a crash) and sets the session's auto-stop.
  bool CanClaim(const SandboxSpec& member, const SandboxSpec& session) const override;
  absl::StatusOr<std::unique_ptr<Sandbox>> Claim(Sandbox* member,
                                                 const SandboxSpec& session) override;

  const DaytonaConfig& config() const { return config_; }
  HttpClient* http() { return http_.get(); }

  // A request with Daytona's headers; connection-phase failures are
  // retried (at most twice, with backoff) like the SDK.
  absl::StatusOr<HttpResponse> Send(HttpRequest request);
  // Send without holding a thread (HttpClient::SendAsync), with the same
  // headers and connect-failure retries (250 ms x attempt apart, on a timer).
  void SendAsync(HttpRequest request, HttpClient::Done done, int attempt = 0);
  // An API request as Api() sends it.
  HttpRequest ApiRequest(const std::string& method, const std::string& path,
                         const std::string& body) const;
  // An API request: `path` is relative to api_url.
  absl::StatusOr<HttpResponse> Api(const std::string& method, const std::string& path,
                                   const std::string& body);
  // Api without holding a thread; `done` runs on the HTTP thread.
  void ApiAsync(const std::string& method, const std::string& path, const std::string& body,
                HttpClient::Done done);

 private:
  explicit DaytonaProvider(DaytonaConfig config);
  absl::Status DeleteSandbox(const std::string& id);
  // Deletes without waiting for the answer (a half-made sandbox).
  void DeleteAsync(const std::string& id);
  // Create's request body; FAILED_PRECONDITION for what Daytona cannot do.
  absl::StatusOr<std::string> CreateBody(const SandboxSpec& spec) const;
  struct StartOp;
  // The labels a sandbox for `spec` carries.
  std::map<std::string, std::string> LabelsOf(const SandboxSpec& spec) const;

  const DaytonaConfig config_;
  std::shared_ptr<HttpClient> http_;
};

}  // namespace sandbox
