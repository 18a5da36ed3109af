#pragma once

// A session's network policy (docs/network.md): which destinations its
// sandbox may reach. Plain values and pure decisions, no I/O: the local
// provider's egress point enforces them, the remote providers map them.

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace sandbox {

// An IPv4 or IPv6 address; IPv4 is kept as IPv4 (an IPv4-mapped IPv6
// address is unmapped when parsed).
struct IpAddress {
  bool v6 = false;
  std::array<uint8_t, 16> bytes{};  // v4: the first 4
  static std::optional<IpAddress> Parse(absl::string_view text);
  static IpAddress V4(uint32_t host_order);
  std::string ToString() const;
  bool operator==(const IpAddress& o) const { return v6 == o.v6 && bytes == o.bytes; }
};

// One rule as written: `pypi.org`, `*.pythonhosted.org` (any depth below,
// never the apex), `10.0.0.0/8`, `1.2.3.4`, `[::1]`, each with an optional
// `:port` (0 = any port).
struct NetRule {
  enum class Kind { kDomain, kWildcard, kCidr };
  Kind kind = Kind::kDomain;
  std::string domain;  // lower case; kWildcard: the suffix after "*."
  IpAddress network;   // kCidr
  int prefix = 0;      // kCidr
  int port = 0;
  std::string text;  // canonical, for messages and SessionInfo

  bool MatchesName(absl::string_view name, int port) const;
  bool MatchesAddress(const IpAddress& a, int port) const;
};

struct NetworkPolicy {
  bool allow_all = false;
  std::vector<NetRule> allow_out;
  std::vector<NetRule> deny_out;  // IPs and CIDRs only; win over any allow
  // Static host entries (name -> address literal), like docker --add-host:
  // they say where a name goes, not that it may be reached.
  std::map<std::string, std::string> hosts;
  int64_t max_connections = 0;       // at once, per sandbox; 0 = no cap
  int64_t max_bytes_per_second = 0;  // each direction, per sandbox; 0 = no cap
  // Config only (tenant policy): a reload that changes these rules applies
  // them to the tenant's running sessions too, not only to new ones.
  bool apply_to_running = false;

  // No destination at all (the default).
  bool AllowsNothing() const { return !allow_all && allow_out.empty(); }
  // Anything beyond the default: a provider that cannot enforce policies
  // refuses these.
  bool IsDefault() const {
    return AllowsNothing() && deny_out.empty() && hosts.empty() && max_connections == 0 &&
           max_bytes_per_second == 0;
  }
};

// `text` as one rule. Domains only where `domains_allowed` (allow_out).
// INVALID_ARGUMENT naming `where` and the rule.
absl::StatusOr<NetRule> ParseNetRule(absl::string_view text, bool domains_allowed,
                                     absl::string_view where);

// The `network` object of a config or a request, as JSON: {"allow_all",
// "allow_out", "deny_out", "hosts", "max_connections",
// "max_bytes_per_second"}. Unknown keys and bad values are INVALID_ARGUMENT
// naming `where`.key.
absl::StatusOr<NetworkPolicy> ParseNetworkPolicy(const nlohmann::json& j, absl::string_view where);
nlohmann::json NetworkPolicyJson(const NetworkPolicy& p);

// What a session gets: `asked` (its own SessionSpec.network), which may only
// narrow `ceiling` (the tenant's policy, else the provider's default). A
// wider request is PERMISSION_DENIED naming the rule. The ceiling's deny
// rules and limits stay in force.
absl::StatusOr<NetworkPolicy> NarrowNetworkPolicy(const NetworkPolicy& asked,
                                                  const NetworkPolicy& ceiling);

struct NetDecision {
  bool allowed = false;
  // The rule that decided, as written, or why nothing did ("no rule allows
  // it", "always denied: 169.254.0.0/16", "deny_out 10.0.0.0/8").
  std::string rule;
};

// A name (DNS query, TLS SNI, HTTP Host, CONNECT target) on `port` (0 =
// any, for DNS). Names are case-insensitive; a trailing dot is ignored.
NetDecision DecideName(const NetworkPolicy& p, absl::string_view name, int port);

// How a connection's address came about.
enum class AddressVia {
  kLiteral,    // the sandbox connected to an IP it chose
  kName,       // resolved by the broker for an allowed name
  kHostEntry,  // a static host entry (operator intent: may name loopback)
};

// Where the broker itself listens: never reachable from a sandbox.
struct BrokerEndpoints {
  std::vector<int> ports;
  std::vector<IpAddress> local_addresses;  // the host's own interfaces
};

// An address the connection would go to. deny_out always wins; the
// always-denied ranges (loopback, private, link-local, multicast, ...) are
// allowed only by an allow_out CIDR inside them, or by a host entry; the
// broker's own listeners never. kLiteral needs an allow_out CIDR (or
// allow_all): an IP literal never matches a domain rule.
NetDecision DecideAddress(const NetworkPolicy& p, const IpAddress& a, int port, AddressVia via,
                          const BrokerEndpoints& broker);

// The range of the always-denied set holding `a`, or "" if none.
std::string AlwaysDeniedRange(const IpAddress& a);

}  // namespace sandbox
