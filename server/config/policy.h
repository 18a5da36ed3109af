#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "adapters/api/network_policy.h"
#include "common/clock.h"
#include "nlohmann/json.hpp"

namespace sandbox {

// Per-tenant policy (docs/operators.md): what each tenant may use,
// tightening the broker's and the providers' own maxima, never loosening.

// The most a session may ask for in SessionSpec.resources (0 = no tenant
// maximum for that field).
struct ResourceLimits {
  int64_t memory_bytes = 0;
  double cpus = 0;
  int64_t pids = 0;
  int64_t disk_bytes = 0;
};

// One policy object as written (`tenant_defaults` or `tenants.<name>`):
// every rule optional; a tenant's value overrides the default's.
struct TenantPolicyConfig {
  std::optional<std::vector<std::string>> providers;
  std::optional<std::string> default_provider;
  // provider -> allowed templates; a provider not named allows any.
  std::optional<std::map<std::string, std::vector<std::string>>> templates;
  std::optional<int64_t> max_sessions;
  std::optional<int64_t> max_concurrent_runs;
  std::optional<int64_t> max_timeout_seconds;
  std::optional<int64_t> idle_timeout_seconds;
  std::optional<int64_t> max_lifetime_seconds;
  std::optional<int64_t> max_output_bytes;
  std::optional<int64_t> run_rate;  // runs per minute
  std::optional<int64_t> res_memory_bytes;
  std::optional<double> res_cpus;
  std::optional<int64_t> res_pids;
  std::optional<int64_t> res_disk_bytes;
  std::optional<bool> disabled;
  // What sessions may reach (docs/network.md); unset = the provider's
  // default network.
  std::optional<NetworkPolicy> network;
};

struct PolicyConfig {
  TenantPolicyConfig defaults;
  std::map<std::string, TenantPolicyConfig> tenants;
  bool empty() const;
};

// Parses `tenant_defaults` and `tenants` (either may be null). Errors name
// the key (`tenants.acme.providers: unknown provider "gpu" (configured:
// local)`). `configured_providers` are the providers the broker has.
absl::StatusOr<PolicyConfig> ParsePolicyConfig(const nlohmann::json& tenant_defaults,
                                               const nlohmann::json& tenants,
                                               const std::vector<std::string>& configured_providers,
                                               const std::string& broker_default_provider);

// The broker's own maxima, which a policy can only tighten.
struct BrokerMaxima {
  std::vector<std::string> providers;  // configured, sorted
  std::string default_provider;
  int64_t max_sessions = 100;
  int64_t max_timeout_seconds = 900;
  int64_t idle_timeout_seconds = 300;
  int64_t max_lifetime_seconds = 0;  // 0 = none
  int64_t max_output_bytes = 65536;
};

// One tenant's effective rules: defaults and its own values merged, clamped
// to the broker's maxima.
struct TenantRules {
  std::vector<std::string> providers;  // allowed, sorted
  std::string default_provider;
  std::map<std::string, std::vector<std::string>> templates;
  int64_t max_sessions = 0;
  int64_t max_concurrent_runs = 0;  // 0 = unlimited
  int64_t max_timeout_seconds = 0;
  int64_t idle_timeout_seconds = 0;
  int64_t max_lifetime_seconds = 0;  // 0 = none
  int64_t max_output_bytes = 0;
  int64_t run_rate = 0;  // 0 = unlimited
  ResourceLimits resources;
  bool disabled = false;
  std::optional<NetworkPolicy> network;  // unset = the provider's default

  bool AllowsProvider(absl::string_view provider) const;
};

TenantRules ResolveTenantRules(const PolicyConfig& policy, const BrokerMaxima& maxima,
                               const std::string& tenant);

// The part of the config that reloads without a restart: tokens, admin
// tokens and tenant policy. Immutable; a reload swaps in a new one whole, and
// each call reads one at its start.
struct OperatorSnapshot {
  int64_t generation = 1;
  // Bearer token -> tenant; empty = open (one tenant, "default").
  std::map<std::string, std::string, std::less<>> tokens;
  // Bearer token -> admin name (for the audit log).
  std::map<std::string, std::string, std::less<>> admin_tokens;
  PolicyConfig policy;
  BrokerMaxima maxima;
  std::string tokens_file;
  // Resolved rules: of every tenant named in tokens or `tenants`, and of
  // everyone else.
  std::map<std::string, TenantRules, std::less<>> rules;
  TenantRules other_rules;

  const TenantRules& For(absl::string_view tenant) const;
  // Tenants the config names (token tenants and policy tenants; "default"
  // when open): the bounded set of `tenant` label values.
  std::set<std::string> KnownTenants() const;
};

std::shared_ptr<const OperatorSnapshot> MakeOperatorSnapshot(
    std::map<std::string, std::string> tokens, std::map<std::string, std::string> admin_tokens,
    PolicyConfig policy, BrokerMaxima maxima, std::string tokens_file, int64_t generation);

// Applies tenant rules at run time: holds the current snapshot, the admin's
// enable/disable switches, each tenant's running-run count and run-rate
// token bucket. Refusal messages name the tenant, the rule and its value.
//
// Thread-safe.
class PolicyEngine {
 public:
  PolicyEngine(Clock* clock, std::shared_ptr<const OperatorSnapshot> initial);

  std::shared_ptr<const OperatorSnapshot> Current() const;
  void Swap(std::shared_ptr<const OperatorSnapshot> next);

  // The admin's switch; overrides the config's `disabled` until set again.
  void SetDisabled(const std::string& tenant, bool disabled);

  // PERMISSION_DENIED for a disabled tenant.
  absl::Status CheckEnabled(const TenantRules& rules, const std::string& tenant) const;
  // PERMISSION_DENIED for a provider or template not allowed,
  // INVALID_ARGUMENT for resources above the tenant's maximum. A provider
  // the broker does not have (`known` false) is left to the registry
  // (FAILED_PRECONDITION, unknown provider).
  static absl::Status CheckSpec(const TenantRules& rules, const std::string& tenant,
                                const std::string& provider, const std::string& template_name,
                                const ResourceLimits& asked, bool known = true);
  // INVALID_ARGUMENT above the tenant's max_timeout_seconds.
  static absl::Status CheckTimeout(const TenantRules& rules, const std::string& tenant,
                                   int64_t timeout_seconds);

  // A run's admission: holds one of the tenant's max_concurrent_runs while
  // alive. Movable.
  class RunSlot {
   public:
    RunSlot() = default;
    RunSlot(RunSlot&& o) noexcept { *this = std::move(o); }
    RunSlot& operator=(RunSlot&& o) noexcept;
    ~RunSlot();

   private:
    friend class PolicyEngine;
    PolicyEngine* engine_ = nullptr;
    std::string tenant_;
  };
  // RESOURCE_EXHAUSTED when the tenant has max_concurrent_runs running or
  // its run_rate bucket is empty (nothing is consumed then).
  absl::StatusOr<RunSlot> BeginRun(const TenantRules& rules, const std::string& tenant);
  int running(const std::string& tenant) const;

 private:
  struct Bucket {
    double tokens = 0;
    absl::Time refilled;
    bool started = false;
  };
  void EndRun(const std::string& tenant);

  Clock* const clock_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const OperatorSnapshot> current_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, bool> admin_disabled_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> running_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sandbox
