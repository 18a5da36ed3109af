#include "adapters/api/network_policy.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace sandbox {
namespace {

int AddressBits(const IpAddress& a) { return a.v6 ? 128 : 32; }

bool InNetwork(const IpAddress& a, const IpAddress& net, int prefix) {
  if (a.v6 != net.v6) return false;
  const int full = prefix / 8;
  if (memcmp(a.bytes.data(), net.bytes.data(), full) != 0) return false;
  const int rest = prefix % 8;
  if (rest == 0) return true;
  const uint8_t mask = static_cast<uint8_t>(0xff << (8 - rest));
  return (a.bytes[full] & mask) == (net.bytes[full] & mask);
}

struct Range {
  const char* text;
  IpAddress net;
  int prefix;
};

// Never reachable unless a rule names them (docs/network.md).
const std::vector<Range>& AlwaysDenied() {
  static const std::vector<Range>* ranges = [] {
    auto* r = new std::vector<Range>;
    for (const char* t :
         {"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
          "172.16.0.0/12", "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4",
          "240.0.0.0/4", "::/128", "::1/128", "fc00::/7", "fe80::/10", "ff00::/8"}) {
      auto rule = ParseNetRule(t, false, "");
      r->push_back({t, rule->network, rule->prefix});
    }
    return r;
  }();
  return *ranges;
}

std::string CanonicalName(absl::string_view name) {
  name = absl::StripSuffix(name, ".");
  return absl::AsciiStrToLower(name);
}

bool ValidDomain(absl::string_view d) {
  if (d.empty() || d.size() > 253) return false;
  for (absl::string_view label : absl::StrSplit(d, '.')) {
    if (label.empty() || label.size() > 63) return false;
    for (char c : label) {
      if (!absl::ascii_isalnum(c) && c != '-' && c != '_') return false;
    }
  }
  return true;
}

// "host:port", "[v6]:port", "v6" -> host and port (0 = none).
absl::Status SplitPort(absl::string_view text, absl::string_view* host, int* port,
                       const std::string& bad) {
  *port = 0;
  if (absl::StartsWith(text, "[")) {
    const size_t close = text.find(']');
    if (close == absl::string_view::npos) return absl::InvalidArgumentError(bad);
    *host = text.substr(1, close - 1);
    absl::string_view rest = text.substr(close + 1);
    if (rest.empty()) return absl::OkStatus();
    if (!absl::ConsumePrefix(&rest, ":")) return absl::InvalidArgumentError(bad);
    text = rest;
  } else {
    const size_t colon = text.rfind(':');
    // More than one colon without brackets: an IPv6 address, no port.
    if (colon == absl::string_view::npos || text.find(':') != colon) {
      *host = text;
      return absl::OkStatus();
    }
    *host = text.substr(0, colon);
    text = text.substr(colon + 1);
  }
  if (!absl::SimpleAtoi(text, port) || *port < 1 || *port > 65535) {
    return absl::InvalidArgumentError(bad);
  }
  return absl::OkStatus();
}

// Is `inner` (a rule) entirely inside `outer`'s reach?
bool Covers(const NetRule& outer, const NetRule& inner) {
  if (outer.port != 0 && outer.port != inner.port) return false;
  switch (inner.kind) {
    case NetRule::Kind::kDomain:
      return outer.kind != NetRule::Kind::kCidr && outer.MatchesName(inner.domain, inner.port);
    case NetRule::Kind::kWildcard:
      return outer.kind == NetRule::Kind::kWildcard &&
             (inner.domain == outer.domain || absl::EndsWith(inner.domain, "." + outer.domain));
    case NetRule::Kind::kCidr:
      return outer.kind == NetRule::Kind::kCidr && outer.prefix <= inner.prefix &&
             InNetwork(inner.network, outer.network, outer.prefix);
  }
  return false;
}

int64_t MinLimit(int64_t a, int64_t b) {
  if (a == 0) return b;
  if (b == 0) return a;
  return std::min(a, b);
}

}  // namespace

std::optional<IpAddress> IpAddress::Parse(absl::string_view text) {
  const std::string s(text);
  IpAddress a;
  if (inet_pton(AF_INET, s.c_str(), a.bytes.data()) == 1) return a;
  if (inet_pton(AF_INET6, s.c_str(), a.bytes.data()) != 1) return std::nullopt;
  static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (memcmp(a.bytes.data(), kMapped, 12) == 0) {
    memmove(a.bytes.data(), a.bytes.data() + 12, 4);
    memset(a.bytes.data() + 4, 0, 12);
    return a;
  }
  a.v6 = true;
  return a;
}

IpAddress IpAddress::V4(uint32_t host_order) {
  IpAddress a;
  const uint32_t n = htonl(host_order);
  memcpy(a.bytes.data(), &n, 4);
  return a;
}

std::string IpAddress::ToString() const {
  char buf[INET6_ADDRSTRLEN] = {};
  inet_ntop(v6 ? AF_INET6 : AF_INET, bytes.data(), buf, sizeof(buf));
  return buf;
}

bool NetRule::MatchesName(absl::string_view name, int p) const {
  if (port != 0 && p != 0 && port != p) return false;
  const std::string n = CanonicalName(name);
  if (kind == Kind::kDomain) return n == domain;
  if (kind == Kind::kWildcard) return absl::EndsWith(n, "." + domain);
  return false;
}

bool NetRule::MatchesAddress(const IpAddress& a, int p) const {
  if (kind != Kind::kCidr) return false;
  if (port != 0 && port != p) return false;
  return InNetwork(a, network, prefix);
}

absl::StatusOr<NetRule> ParseNetRule(absl::string_view text, bool domains_allowed,
                                     absl::string_view where) {
  const std::string bad = absl::StrCat(where, ": \"", text,
                                       "\" is not a domain, IP address or CIDR (with an optional "
                                       ":port)");
  NetRule r;
  absl::string_view body = absl::StripAsciiWhitespace(text);
  absl::string_view host;
  RETURN_IF_ERROR(SplitPort(body, &host, &r.port, bad));
  const std::string port_text = r.port != 0 ? absl::StrCat(":", r.port) : "";
  absl::string_view addr = host;
  int prefix = -1;
  if (const size_t slash = host.find('/'); slash != absl::string_view::npos) {
    addr = host.substr(0, slash);
    if (!absl::SimpleAtoi(host.substr(slash + 1), &prefix)) {
      return absl::InvalidArgumentError(bad);
    }
  }
  if (std::optional<IpAddress> ip = IpAddress::Parse(addr)) {
    r.kind = NetRule::Kind::kCidr;
    r.network = *ip;
    if (prefix < 0) prefix = AddressBits(*ip);
    if (prefix > AddressBits(*ip)) return absl::InvalidArgumentError(bad);
    r.prefix = prefix;
    // The network address itself, so equal rules compare equal.
    for (int bit = prefix; bit < AddressBits(*ip); ++bit) {
      r.network.bytes[bit / 8] &= static_cast<uint8_t>(~(0x80 >> (bit % 8)));
    }
    const std::string a = r.network.ToString();
    const bool host_rule = prefix == AddressBits(*ip);
    const std::string shown = host_rule ? a : absl::StrCat(a, "/", prefix);
    r.text = r.port != 0 && r.network.v6 ? absl::StrCat("[", shown, "]", port_text)
                                         : absl::StrCat(shown, port_text);
    return r;
  }
  if (prefix >= 0) return absl::InvalidArgumentError(bad);
  std::string name = absl::AsciiStrToLower(host);
  if (absl::StartsWith(name, "*.")) {
    r.kind = NetRule::Kind::kWildcard;
    r.domain = name.substr(2);
  } else {
    r.domain = name;
  }
  if (!ValidDomain(r.domain)) return absl::InvalidArgumentError(bad);
  if (!domains_allowed) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": \"", text, "\" is a domain; deny_out takes IP addresses and CIDRs only"));
  }
  r.text = absl::StrCat(name, port_text);
  return r;
}

absl::StatusOr<NetworkPolicy> ParseNetworkPolicy(const nlohmann::json& j, absl::string_view where) {
  NetworkPolicy p;
  if (j.is_null()) return p;
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": must be an object"));
  }
  static const char* const kKeys[] = {"allow_all",       "allow_out",       "deny_out",
                                      "hosts",           "max_connections", "max_bytes_per_second",
                                      "apply_to_running"};
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    bool known = false;
    for (const char* k : kKeys) known = known || key == k;
    if (!known) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".", key, ": unknown key (known: ", absl::StrJoin(kKeys, ", "), ")"));
    }
  }
  if (j.contains("apply_to_running")) {
    if (!j["apply_to_running"].is_boolean()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".apply_to_running: must be a boolean"));
    }
    p.apply_to_running = j["apply_to_running"].get<bool>();
  }
  if (j.contains("allow_all")) {
    if (!j["allow_all"].is_boolean()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".allow_all: must be a boolean"));
    }
    p.allow_all = j["allow_all"].get<bool>();
  }
  for (const char* list : {"allow_out", "deny_out"}) {
    if (!j.contains(list)) continue;
    const nlohmann::json& v = j[list];
    if (!v.is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".", list, ": must be a list of strings"));
    }
    const bool allow = std::string(list) == "allow_out";
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string at = absl::StrCat(where, ".", list, "[", i, "]");
      if (!v[i].is_string()) return absl::InvalidArgumentError(at + ": must be a string");
      ASSIGN_OR_RETURN(NetRule r, ParseNetRule(v[i].get<std::string>(), allow, at));
      (allow ? p.allow_out : p.deny_out).push_back(std::move(r));
    }
  }
  if (j.contains("hosts")) {
    const nlohmann::json& h = j["hosts"];
    if (!h.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".hosts: must be an object of name: address"));
    }
    for (auto it = h.begin(); it != h.end(); ++it) {
      const std::string at = absl::StrCat(where, ".hosts.", it.key());
      const std::string name = CanonicalName(it.key());
      if (!ValidDomain(name)) return absl::InvalidArgumentError(at + ": not a host name");
      std::optional<IpAddress> ip =
          it.value().is_string() ? IpAddress::Parse(it.value().get<std::string>()) : std::nullopt;
      if (!ip) return absl::InvalidArgumentError(at + ": must be an IP address");
      p.hosts[name] = ip->ToString();
    }
  }
  for (const char* key : {"max_connections", "max_bytes_per_second"}) {
    if (!j.contains(key)) continue;
    const nlohmann::json& v = j[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".", key, ": must be an integer >= 0 (0 = no cap)"));
    }
    (std::string(key) == "max_connections" ? p.max_connections : p.max_bytes_per_second) =
        v.get<int64_t>();
  }
  return p;
}

nlohmann::json NetworkPolicyJson(const NetworkPolicy& p) {
  nlohmann::json j = nlohmann::json::object();
  if (p.allow_all) j["allow_all"] = true;
  auto texts = [](const std::vector<NetRule>& rules) {
    nlohmann::json a = nlohmann::json::array();
    for (const NetRule& r : rules) a.push_back(r.text);
    return a;
  };
  if (!p.allow_out.empty()) j["allow_out"] = texts(p.allow_out);
  if (!p.deny_out.empty()) j["deny_out"] = texts(p.deny_out);
  if (!p.hosts.empty()) j["hosts"] = p.hosts;
  if (p.max_connections > 0) j["max_connections"] = p.max_connections;
  if (p.max_bytes_per_second > 0) j["max_bytes_per_second"] = p.max_bytes_per_second;
  if (p.apply_to_running) j["apply_to_running"] = true;
  return j;
}

absl::StatusOr<NetworkPolicy> NarrowNetworkPolicy(const NetworkPolicy& asked,
                                                  const NetworkPolicy& ceiling) {
  auto denied = [](const std::string& what) {
    return absl::PermissionDeniedError(
        absl::StrCat("spec.network: ", what, " is wider than the tenant's network policy allows"));
  };
  if (asked.allow_all && !ceiling.allow_all) return denied("allow_all");
  for (const NetRule& r : asked.allow_out) {
    const bool covered =
        ceiling.allow_all || std::any_of(ceiling.allow_out.begin(), ceiling.allow_out.end(),
                                         [&r](const NetRule& c) { return Covers(c, r); });
    if (!covered) return denied(absl::StrCat("allow_out \"", r.text, "\""));
  }
  for (const auto& entry : asked.hosts) {
    auto it = ceiling.hosts.find(entry.first);
    if (it == ceiling.hosts.end() || it->second != entry.second) {
      return denied(absl::StrCat("hosts.", entry.first));
    }
  }
  NetworkPolicy out = asked;
  out.apply_to_running = false;
  for (const NetRule& d : ceiling.deny_out) {
    const bool have = std::any_of(out.deny_out.begin(), out.deny_out.end(),
                                  [&d](const NetRule& x) { return x.text == d.text; });
    if (!have) out.deny_out.push_back(d);
  }
  out.max_connections = MinLimit(asked.max_connections, ceiling.max_connections);
  out.max_bytes_per_second = MinLimit(asked.max_bytes_per_second, ceiling.max_bytes_per_second);
  return out;
}

NetDecision DecideName(const NetworkPolicy& p, absl::string_view name, int port) {
  const std::string n = CanonicalName(name);
  if (n.empty() || IpAddress::Parse(n)) return {false, "an IP literal is not a name"};
  for (const NetRule& r : p.allow_out) {
    if (r.MatchesName(n, port)) return {true, r.text};
  }
  if (p.allow_all) return {true, "allow_all"};
  return {false, "no rule allows it"};
}

std::string AlwaysDeniedRange(const IpAddress& a) {
  for (const Range& r : AlwaysDenied()) {
    if (InNetwork(a, r.net, r.prefix)) return r.text;
  }
  return "";
}

NetDecision DecideAddress(const NetworkPolicy& p, const IpAddress& a, int port, AddressVia via,
                          const BrokerEndpoints& broker) {
  const bool ours = std::find(broker.ports.begin(), broker.ports.end(), port) != broker.ports.end();
  const bool local = InNetwork(a, IpAddress::V4(0x7f000000), 8) ||
                     (a.v6 && a == *IpAddress::Parse("::1")) ||
                     std::find(broker.local_addresses.begin(), broker.local_addresses.end(), a) !=
                         broker.local_addresses.end();
  if (ours && local) return {false, "the broker's own listener"};
  for (const NetRule& r : p.deny_out) {
    if (r.MatchesAddress(a, port)) return {false, absl::StrCat("deny_out ", r.text)};
  }
  const std::string reserved = AlwaysDeniedRange(a);
  if (via == AddressVia::kHostEntry) return {true, "hosts"};
  // A CIDR rule allows; in a reserved range only one that lies inside it.
  for (const NetRule& r : p.allow_out) {
    if (!r.MatchesAddress(a, port)) continue;
    if (reserved.empty()) return {true, r.text};
    for (const Range& range : AlwaysDenied()) {
      if (range.text == reserved && r.prefix >= range.prefix &&
          InNetwork(r.network, range.net, range.prefix)) {
        return {true, r.text};
      }
    }
  }
  if (!reserved.empty()) return {false, absl::StrCat("always denied: ", reserved)};
  if (via == AddressVia::kName) return {true, "resolved for an allowed name"};
  if (p.allow_all) return {true, "allow_all"};
  return {false, "no rule allows this address (an IP literal never matches a domain rule)"};
}

}  // namespace sandbox
