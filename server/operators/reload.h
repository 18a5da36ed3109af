#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "server/config/config.h"
#include "server/config/policy.h"
#include "server/operators/usage.h"
#include "server/telemetry/audit.h"

namespace sandbox {

struct ReloadResult {
  int64_t generation = 0;
  // Changed keys that need a restart (ignored).
  std::vector<std::string> needs_restart;
};

// Reload without restart: re-reads the config file and swaps in a new
// operator snapshot (tokens, admin tokens, tenant policy) whole, or rejects
// the file whole and keeps the old one. Triggered by SIGHUP, the Admin API's
// ReloadConfig, and a change of auth.tokens_file's contents (CheckTokensFile,
// polled by a watcher thread; tests call it directly).
//
// Thread-safe; reloads are serialized.
class Reloader {
 public:
  // `running` is the config the broker started with (restart-only keys stay
  // as it has them); `providers` the configured provider names.
  Reloader(std::string config_path, std::string listen_override, BrokerConfig running,
           std::vector<std::string> providers, PolicyEngine* policy, UsageMeter* usage,
           AuditLog* audit);
  ~Reloader();

  // `source`: "sighup", "admin:<name>", "tokens_file". INVALID_ARGUMENT with
  // the reason when the new config does not validate (the old stays);
  // FAILED_PRECONDITION without a config file.
  absl::StatusOr<ReloadResult> Reload(const std::string& source);

  // Called after each applied reload with the snapshots before and after,
  // on the reloading thread with no lock held. Set before serving.
  using SwapHook =
      std::function<void(const OperatorSnapshot& before, const OperatorSnapshot& after)>;
  void SetSwapHook(SwapHook hook) { swap_hook_ = std::move(hook); }

  // Reloads when auth.tokens_file's contents differ from the last seen ones
  // (a broken file is tried once per change). Returns whether it reloaded
  // (successfully or not).
  bool CheckTokensFile();
  // Calls CheckTokensFile every `every` on a thread until Stop.
  void StartWatching(absl::Duration every);
  void Stop();

  // The snapshot of `config`, with maxima from `running` and the provider
  // names; errors when the policy names a provider that is not running.
  static absl::StatusOr<std::shared_ptr<const OperatorSnapshot>> SnapshotOf(
      const BrokerConfig& config, const BrokerConfig& running,
      const std::vector<std::string>& providers, int64_t generation);
  // Keys whose values differ and cannot change at runtime.
  static std::vector<std::string> RestartKeys(const nlohmann::json& before,
                                              const nlohmann::json& after);

 private:
  std::string ReadTokensFile(const std::string& path) const;

  const std::string config_path_;
  const std::string listen_override_;
  const BrokerConfig running_;
  const std::vector<std::string> providers_;
  PolicyEngine* const policy_;
  UsageMeter* const usage_;
  AuditLog* const audit_;
  SwapHook swap_hook_;

  absl::StatusOr<ReloadResult> ReloadLocked(const std::string& source,
                                            std::shared_ptr<const OperatorSnapshot>* before);

  absl::Mutex mu_;  // serializes reloads
  std::string tokens_seen_ ABSL_GUARDED_BY(mu_);
  absl::Mutex watch_mu_;
  absl::Notification stop_;
  std::thread watcher_;
};

}  // namespace sandbox
