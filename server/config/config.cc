#include "server/config/config.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/config_reader.h"
#include "common/status_macros.h"

namespace sandbox {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(what, ": cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::Status AddTokens(const std::map<std::string, std::string>& in, absl::string_view key,
                       std::map<std::string, std::string>* out) {
  for (const auto& [token, tenant] : in) {
    if (token.size() < 8) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, ": tokens must be at least 8 characters"));
    }
    if (!IsValidTenant(tenant)) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, ": tenant \"", tenant, "\" must be 1-64 characters of [A-Za-z0-9._-]"));
    }
    (*out)[token] = tenant;
  }
  return absl::OkStatus();
}

}  // namespace

bool IsValidTenant(absl::string_view t) {
  if (t.empty() || t.size() > 64) return false;
  for (char c : t) {
    if (!(isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) return false;
  }
  return true;
}

absl::StatusOr<BrokerConfig> ParseConfig(absl::string_view json_text) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("config: not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("config: must be a JSON object");
  BrokerConfig c;
  ConfigReader r(j, "");
  constexpr int64_t kDay = 86400;
  c.listen = r.String("listen", c.listen, false);
  c.default_provider = r.String("default_provider", c.default_provider, false);
  c.idle_timeout_seconds = r.Int("idle_timeout_seconds", c.idle_timeout_seconds, 1, 30 * kDay);
  c.reap_interval_seconds = r.Int("reap_interval_seconds", c.reap_interval_seconds, 1, kDay);
  c.health_probe_interval_seconds =
      r.Int("health_probe_interval_seconds", c.health_probe_interval_seconds, 1, kDay);
  c.max_lifetime_seconds = r.Int("max_lifetime_seconds", c.max_lifetime_seconds, 0, 365 * kDay);
  c.max_sessions_per_tenant =
      r.Int("max_sessions_per_tenant", c.max_sessions_per_tenant, 1, 100000000);
  c.default_timeout_seconds = r.Int("default_timeout_seconds", c.default_timeout_seconds, 1, kDay);
  c.max_timeout_seconds = r.Int("max_timeout_seconds", c.max_timeout_seconds, 1, 7 * kDay);
  c.max_output_bytes = r.Int("max_output_bytes", c.max_output_bytes, 1, int64_t{1} << 30);
  c.max_message_bytes = r.Int("max_message_bytes", c.max_message_bytes, 4096, int64_t{1} << 30);
  c.max_transfer_bytes = r.Int("max_transfer_bytes", c.max_transfer_bytes, 0, int64_t{1} << 50);
  c.max_contexts_per_session = r.Int("max_contexts_per_session", c.max_contexts_per_session, 1, 64);
  c.close_wait_seconds = r.Int("close_wait_seconds", c.close_wait_seconds, 0, kDay);
  c.max_threads = r.Int("max_threads", c.max_threads, 4, 100000);
  c.reflection = r.Bool("reflection", c.reflection);
  c.admin_listen = r.String("admin_listen", c.admin_listen);
  c.drain_grace_seconds = r.Int("drain_grace_seconds", c.drain_grace_seconds, 0, kDay);
  c.drain_close_sandboxes_set = r.Has("drain_close_sandboxes");
  c.drain_close_sandboxes = r.Bool("drain_close_sandboxes", c.drain_close_sandboxes);
  {
    ConfigReader state(r.Object("state"), "state");
    c.state_backend = state.Enum("backend", c.state_backend, {"sqlite", "memory", "etcd"});
    c.state_path = state.String("path", "");
    const bool has_etcd = state.Has("etcd");
    {
      BrokerConfig::StateEtcd& e = c.state_etcd;
      ConfigReader etcd(state.Object("etcd"), "state.etcd");
      e.endpoints = etcd.StringList("endpoints");
      e.prefix = etcd.String("prefix", e.prefix, /*allow_empty=*/false);
      e.member_ttl_seconds = etcd.Int("member_ttl_seconds", e.member_ttl_seconds, 2, 3600);
      e.ca_file = etcd.String("ca_file", "");
      e.cert_file = etcd.String("cert_file", "");
      e.key_file = etcd.String("key_file", "");
      e.username = etcd.String("username", "");
      e.password_file = etcd.String("password_file", "");
      RETURN_IF_ERROR(etcd.Finish());
    }
    RETURN_IF_ERROR(state.Finish());
    if (c.state_backend != "sqlite" && !c.state_path.empty()) {
      return absl::InvalidArgumentError("state.path: only for backend \"sqlite\"");
    }
    if (c.state_backend != "etcd" && has_etcd) {
      return absl::InvalidArgumentError("state.etcd: only for backend \"etcd\"");
    }
    if (c.state_backend == "etcd") {
      const BrokerConfig::StateEtcd& e = c.state_etcd;
      if (e.endpoints.empty()) {
        return absl::InvalidArgumentError(
            "state.etcd.endpoints: state.backend \"etcd\" needs at least one endpoint");
      }
      for (const std::string& ep : e.endpoints) {
        if (!absl::StartsWith(ep, "http://") && !absl::StartsWith(ep, "https://")) {
          return absl::InvalidArgumentError(
              absl::StrCat("state.etcd.endpoints: \"", ep, "\" is not an http:// or https:// URL"));
        }
      }
      if (e.prefix.front() != '/' || e.prefix.back() != '/') {
        return absl::InvalidArgumentError("state.etcd.prefix: must start and end with '/'");
      }
      if (e.cert_file.empty() != e.key_file.empty()) {
        return absl::InvalidArgumentError(
            "state.etcd.cert_file, state.etcd.key_file: give both or neither");
      }
      if (e.username.empty() != e.password_file.empty()) {
        return absl::InvalidArgumentError(
            "state.etcd.username, state.etcd.password_file: give both or neither");
      }
    }
    if (!c.state_path.empty() && c.state_path.front() != '/') {
      return absl::InvalidArgumentError("state.path: must be an absolute path");
    }
  }
  {
    ConfigReader cl(r.Object("cluster"), "cluster");
    BrokerConfig::Cluster& k = c.cluster;
    k.member_id = cl.String("member_id", "");
    k.advertise_address = cl.String("advertise_address", "");
    k.token = cl.String("token", "");
    k.token_file = cl.String("token_file", "");
    k.peer_ca_file = cl.String("peer_ca_file", "");
    k.lease_safety_margin_ms =
        cl.Int("lease_safety_margin_ms", k.lease_safety_margin_ms, 0, 3600 * 1000);
    RETURN_IF_ERROR(cl.Finish());
    if (k.lease_safety_margin_ms < 0)
      k.lease_safety_margin_ms = c.state_etcd.member_ttl_seconds * 100;
    if (k.lease_safety_margin_ms * 3 >= c.state_etcd.member_ttl_seconds * 1000 * 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cluster.lease_safety_margin_ms: ", k.lease_safety_margin_ms,
          " must be below 2/3 of state.etcd.member_ttl_seconds (",
          c.state_etcd.member_ttl_seconds * 1000 * 2 / 3,
          " ms): renewals go every third of the TTL, and a replica must stay fresh between them"));
    }
    k.enabled = !k.token.empty() || !k.token_file.empty();
    if (!k.token.empty() && !k.token_file.empty()) {
      return absl::InvalidArgumentError("cluster.token, cluster.token_file: give one, not both");
    }
    if (r.Has("cluster") && !k.enabled) {
      return absl::InvalidArgumentError(
          "cluster: needs token or token_file (the secret replicas authenticate each other with)");
    }
    if (k.enabled && c.state_backend != "etcd") {
      return absl::InvalidArgumentError(
          "cluster: replicas share sessions through etcd: set state.backend \"etcd\"");
    }
    if (!k.token.empty() && k.token.size() < 16) {
      return absl::InvalidArgumentError("cluster.token: must be at least 16 characters");
    }
    for (char ch : k.member_id) {
      if (!isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_' && ch != '.') {
        return absl::InvalidArgumentError(
            "cluster.member_id: letters, digits, '-', '_' and '.' only");
      }
    }
  }
  if (!c.drain_close_sandboxes_set) c.drain_close_sandboxes = c.state_backend == "memory";
  c.deployment_id = r.String("deployment_id", "");
  for (char ch : c.deployment_id) {
    if (!(isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.') ||
        c.deployment_id.size() > 64) {
      return absl::InvalidArgumentError("deployment_id: must be 1-64 characters of [A-Za-z0-9._-]");
    }
  }
  c.orphan_sweep_interval_seconds =
      r.Int("orphan_sweep_interval_seconds", c.orphan_sweep_interval_seconds, 1, kDay);
  c.orphan_grace_seconds = r.Int("orphan_grace_seconds", c.orphan_grace_seconds, 1, 30 * kDay);
  c.run_result_ttl_seconds =
      r.Int("run_result_ttl_seconds", c.run_result_ttl_seconds, 1, 30 * kDay);
  c.run_results_per_session =
      r.Int("run_results_per_session", c.run_results_per_session, 1, 100000);
  {
    ConfigReader tls(r.Object("tls"), "tls");
    c.tls_cert_file = tls.String("cert_file", "");
    c.tls_key_file = tls.String("key_file", "");
    c.tls_client_ca_file = tls.String("client_ca_file", "");
    RETURN_IF_ERROR(tls.Finish());
    if (c.tls_cert_file.empty() != c.tls_key_file.empty()) {
      return absl::InvalidArgumentError("tls: cert_file and key_file go together");
    }
    if (!c.tls_client_ca_file.empty() && c.tls_cert_file.empty()) {
      return absl::InvalidArgumentError("tls.client_ca_file: needs cert_file and key_file");
    }
  }
  c.log_format = r.Enum("log_format", c.log_format, {"text", "json"});
  c.log_level = r.Enum("log_level", c.log_level, {"debug", "info", "warning", "error"});
  {
    ConfigReader auth(r.Object("auth"), "auth");
    auto tokens = auth.StringMap("tokens", /*secret_keys=*/true);
    std::string tokens_file = auth.String("tokens_file", "");
    auto admin_tokens = auth.StringMap("admin_tokens", /*secret_keys=*/true);
    RETURN_IF_ERROR(auth.Finish());
    RETURN_IF_ERROR(AddTokens(tokens, "auth.tokens", &c.tokens));
    c.tokens_file = tokens_file;
    for (const auto& [token, name] : admin_tokens) {
      if (token.size() < 8) {
        return absl::InvalidArgumentError(
            "auth.admin_tokens: tokens must be at least 8 characters");
      }
      if (!IsValidTenant(name)) {
        return absl::InvalidArgumentError(
            absl::StrCat("auth.admin_tokens: admin name \"", name,
                         "\" must be 1-64 characters of [A-Za-z0-9._-]"));
      }
      c.admin_tokens[token] = name;
    }
    if (!tokens_file.empty()) {
      ASSIGN_OR_RETURN(std::string text, ReadFile(tokens_file, "auth.tokens_file"));
      nlohmann::json tj = nlohmann::json::parse(text, nullptr, false);
      if (tj.is_discarded() || !tj.is_object()) {
        return absl::InvalidArgumentError(
            "auth.tokens_file: must hold a JSON object of token -> tenant");
      }
      std::map<std::string, std::string> file_tokens;
      for (auto it = tj.begin(); it != tj.end(); ++it) {
        if (!it.value().is_string()) {
          return absl::InvalidArgumentError(
              "auth.tokens_file: must hold a JSON object of token -> tenant");
        }
        file_tokens[it.key()] = it.value().get<std::string>();
      }
      RETURN_IF_ERROR(AddTokens(file_tokens, "auth.tokens_file", &c.tokens));
    }
  }
  {
    ConfigReader m(r.Object("mcp"), "mcp");
    c.mcp.listen = m.String("listen", "");
    c.mcp.path = m.String("path", c.mcp.path, false);
    c.mcp.allowed_origins = m.StringList("allowed_origins");
    c.mcp.allowed_hosts = m.StringList("allowed_hosts");
    c.mcp.max_body_bytes = m.Int("max_body_bytes", c.mcp.max_body_bytes, 1024, int64_t{1} << 30);
    c.mcp.max_sessions = m.Int("max_sessions", c.mcp.max_sessions, 1, 10000000);
    c.mcp.keepalive_seconds = m.Int("keepalive_seconds", c.mcp.keepalive_seconds, 1, 3600);
    c.mcp.max_threads = m.Int("max_threads", c.mcp.max_threads, 2, 10000);
    RETURN_IF_ERROR(m.Finish());
    if (c.mcp.path.empty() || c.mcp.path[0] != '/') {
      return absl::InvalidArgumentError("mcp.path: must start with /");
    }
  }
  {
    ConfigReader l(r.Object("limits"), "limits");
    c.limits.max_calls_in_flight =
        l.Int("max_calls_in_flight", c.limits.max_calls_in_flight, 0, 10000000);
    c.limits.max_concurrent_runs_per_tenant = l.Int(
        "max_concurrent_runs_per_tenant", c.limits.max_concurrent_runs_per_tenant, 0, 10000000);
    c.limits.max_queued_calls = l.Int("max_queued_calls", c.limits.max_queued_calls, 0, 10000000);
    c.limits.queue_timeout_ms = l.Int("queue_timeout_ms", c.limits.queue_timeout_ms, 0, 3600000);
    RETURN_IF_ERROR(l.Finish());
  }
  const nlohmann::json& providers = r.Object("providers");
  const nlohmann::json& tenant_defaults = r.Object("tenant_defaults");
  const nlohmann::json& tenants = r.Object("tenants");
  {
    ConfigReader audit(r.Object("audit_log"), "audit_log");
    c.audit_log_path = audit.String("path", "", false);
    RETURN_IF_ERROR(audit.Finish());
  }
  RETURN_IF_ERROR(r.Finish());
  if (!providers.is_null()) c.providers = providers;
  for (auto it = c.providers.begin(); it != c.providers.end(); ++it) {
    if (!it.value().is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("providers.", it.key(), ": must be a JSON object"));
    }
    // The broker's key, not the provider's: taken out before the provider
    // reads its object.
    ConfigReader pr(it.value(), absl::StrCat("providers.", it.key()));
    if (pr.Has("max_concurrent_creates")) {
      c.max_concurrent_creates[it.key()] =
          pr.Int("max_concurrent_creates", kDefaultMaxConcurrentCreates, 1, 100000);
      RETURN_IF_ERROR(pr.status());
      it.value().erase("max_concurrent_creates");
    }
    if (pr.Has("network")) {
      ASSIGN_OR_RETURN(c.provider_network[it.key()],
                       ParseNetworkPolicy(pr.Object("network"),
                                          absl::StrCat("providers.", it.key(), ".network")));
      RETURN_IF_ERROR(pr.status());
      it.value().erase("network");
    }
  }
  for (const auto& [token, name] : c.admin_tokens) {
    if (c.tokens.count(token) != 0) {
      return absl::InvalidArgumentError(
          "auth.admin_tokens: a token is also a tenant token; use separate tokens");
    }
  }
  {
    std::vector<std::string> configured;
    for (auto it = c.providers.begin(); it != c.providers.end(); ++it)
      configured.push_back(it.key());
    if (!c.providers.contains(c.default_provider)) configured.push_back(c.default_provider);
    ASSIGN_OR_RETURN(c.policy,
                     ParsePolicyConfig(tenant_defaults, tenants, configured, c.default_provider));
  }
  c.raw = j;
  if (c.default_timeout_seconds > c.max_timeout_seconds) {
    return absl::InvalidArgumentError(
        "default_timeout_seconds: must not exceed max_timeout_seconds");
  }
  return c;
}

absl::StatusOr<BrokerConfig> LoadConfigFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path, "config"));
  return ParseConfig(text);
}

}  // namespace sandbox
