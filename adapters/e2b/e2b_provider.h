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

// Settings of the E2B provider (config key providers.e2b).
struct E2BConfig {
  std::string api_key;  // default: $E2B_API_KEY
  std::string template_id = "base";
  std::string domain = "e2b.app";
  std::string api_url;      // default https://api.<domain> (as E2B_API_URL)
  std::string sandbox_url;  // default: as the SDK computes it (as E2B_SANDBOX_URL)
  int64_t request_timeout_seconds = 60;
  // E2B's own timeout for our sandboxes: a dead-man's switch, so a sandbox
  // the broker forgets dies by itself. Default: the broker's idle timeout
  // plus 60 s; extended while the session is active.
  int64_t sandbox_timeout_seconds = 0;
  int retries = 3;  // 429 + Retry-After retries of control-plane calls
  // A warm pool (server/sessions/warm_pool.h); size 0 = none.
  PoolConfig pool;
};

// Reads providers.e2b. INVALID_ARGUMENT naming the key for bad values;
// FAILED_PRECONDITION "e2b: missing API key" when there is none.
absl::StatusOr<E2BConfig> ParseE2BConfig(const nlohmann::json& json,
                                         int64_t broker_idle_timeout_seconds);

// Sandboxes on E2B, driven over its REST control plane and envd's Connect
// API exactly as the official SDK drives them. One HttpClient (connection
// reuse) is shared by all sandboxes; each sandbox is owned by one session.
//
// Thread-safe.
class E2BProvider final : public Provider {
 public:
  static absl::StatusOr<std::unique_ptr<E2BProvider>> Create(E2BConfig config);

  absl::string_view name() const override { return "e2b"; }
  absl::StatusOr<std::unique_ptr<Sandbox>> Create(const SandboxSpec& spec) override;
  // Create and Attach on the HTTP client's multi handle: no thread waits.
  void CreateAsync(SandboxSpec spec, SandboxDone done) override;
  void AttachAsync(std::string sandbox_id, SandboxSpec spec, SandboxDone done) override;
  // The control plane answers an authenticated list (429 counts as up).
  absl::Status CheckHealth() override;
  // Durable sessions: connect by id (resumes a paused sandbox, extends its
  // timeout to sandbox_timeout_seconds; 404 = gone), and list by the
  // deployment metadata tag (running and paused, all pages).
  absl::StatusOr<std::unique_ptr<Sandbox>> Attach(const std::string& sandbox_id,
                                                  const SandboxSpec& spec) override;
  absl::StatusOr<std::vector<OwnedSandbox>> ListOwned(const std::string& deployment_id) override;
  // Warm pools: a member serves a session that asks for its template and no
  // resources (env is applied to each run). A claim sets the session's
  // timeout; E2B's metadata is fixed at create, so a claimed member keeps
  // its pool tags and the claim is known only from the session store.
  bool CanClaim(const SandboxSpec& member, const SandboxSpec& session) const override;
  absl::StatusOr<std::unique_ptr<Sandbox>> Claim(Sandbox* member,
                                                 const SandboxSpec& session) override;

  HttpClient* http() { return http_.get(); }
  const E2BConfig& config() const { return config_; }
  // The envd base URL for a sandbox (see the SDK's getSandboxUrl).
  std::string EnvdUrl(const std::string& sandbox_id, const std::string& domain) const;

  // A control-plane request with the API key, retrying 429 + Retry-After.
  absl::StatusOr<HttpResponse> ControlRequest(const std::string& method, const std::string& path,
                                              const std::string& body);
  // The same without a thread: `done` runs on the HTTP thread; a 429 is
  // retried from a timer.
  void ControlRequestAsync(const std::string& method, const std::string& path,
                           const std::string& body, HttpClient::Done done);

 private:
  explicit E2BProvider(E2BConfig config);
  // Create's request body (and the sandbox's E2B timeout), and the sandbox
  // its response makes.
  absl::StatusOr<std::string> CreateBody(const SandboxSpec& spec, int64_t* timeout) const;
  // The template decides an E2B sandbox's size, so a tenant's ceiling is
  // checked after the create (GET /sandboxes/{id}): `sandbox` is handed on
  // when it is within, else killed and the create is FAILED_PRECONDITION
  // naming the key.
  void CheckSizeAsync(std::unique_ptr<Sandbox> sandbox, const SandboxSpec& spec, SandboxDone done);
  absl::StatusOr<std::unique_ptr<Sandbox>> Created(const SandboxSpec& spec, int64_t timeout,
                                                   absl::StatusOr<HttpResponse> resp);
  // Attach's id check, connect body, and the sandbox its response makes.
  static absl::Status CheckSandboxId(const std::string& sandbox_id);
  std::string ConnectBody() const;
  absl::StatusOr<std::unique_ptr<Sandbox>> Attached(const std::string& sandbox_id,
                                                    const SandboxSpec& spec,
                                                    absl::StatusOr<HttpResponse> resp);

  const E2BConfig config_;
  std::shared_ptr<HttpClient> http_;
};

}  // namespace sandbox
