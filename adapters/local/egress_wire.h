#pragma once

// What the local egress point reads off the wire (docs/network.md): DNS
// queries, a TLS ClientHello's SNI, an HTTP request head. Pure parsers of
// untrusted bytes from sandboxed code: no I/O, never throw, bounded.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace sandbox::egress {

struct DnsQuery {
  uint16_t id = 0;
  std::string name;  // lower case, no trailing dot
  uint16_t qtype = 0;
  bool recursion_desired = false;
  size_t question_end = 0;  // offset just past the question
};
inline constexpr uint16_t kTypeA = 1;

// One query with exactly one question; nullopt for anything else.
std::optional<DnsQuery> ParseDnsQuery(absl::string_view packet);

// The answer to `q` (echoing its question): an A record with `ipv4` (network
// order) when given, else an empty NOERROR, or NXDOMAIN when `nxdomain`.
std::string DnsAnswer(absl::string_view packet, const DnsQuery& q, std::optional<uint32_t> ipv4,
                      bool nxdomain);

// What the first bytes of a connection say about where it goes.
struct FirstBytes {
  enum class Kind { kNeedMore, kTls, kHttp, kOther };
  Kind kind = Kind::kNeedMore;
  std::string name;  // SNI or Host without port; "" if none
  // HTTP only: the method and request target, and where the head ends.
  std::string method;
  std::string target;
  size_t head_end = 0;
};
// kNeedMore while `data` may still grow into a ClientHello or a request
// head (at most 16 KiB is read).
FirstBytes ParseFirstBytes(absl::string_view data);

// "host:port" or "[v6]:port" (CONNECT) -> host, port; nullopt if malformed.
std::optional<std::pair<std::string, int>> SplitHostPort(absl::string_view s, int default_port);

}  // namespace sandbox::egress
