#include "adapters/local/egress_wire.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace sandbox::egress {
namespace {

constexpr size_t kMaxFirstBytes = 16 * 1024;

uint16_t U16(absl::string_view s, size_t at) {
  return static_cast<uint16_t>((static_cast<uint8_t>(s[at]) << 8) |
                               static_cast<uint8_t>(s[at + 1]));
}

void PutU16(std::string* out, uint16_t v) {
  out->push_back(static_cast<char>(v >> 8));
  out->push_back(static_cast<char>(v & 0xff));
}

// The SNI of a TLS record holding a ClientHello; kNeedMore until the record
// is whole.
FirstBytes ParseClientHello(absl::string_view d) {
  FirstBytes out;
  if (d.size() < 5) return out;
  const size_t record_len = U16(d, 3);
  if (d.size() < 5 + record_len) {
    if (5 + record_len > kMaxFirstBytes) out.kind = FirstBytes::Kind::kTls;
    return out;
  }
  out.kind = FirstBytes::Kind::kTls;
  absl::string_view h = d.substr(5, record_len);
  // Handshake: type 1 (ClientHello), 3-byte length.
  if (h.size() < 4 || h[0] != 1) return out;
  size_t p = 4 + 2 + 32;  // client_version, random
  auto skip = [&](size_t len_bytes) -> bool {
    if (p + len_bytes > h.size()) return false;
    size_t len = len_bytes == 1 ? static_cast<uint8_t>(h[p]) : U16(h, p);
    p += len_bytes + len;
    return p <= h.size();
  };
  if (!skip(1) || !skip(2) || !skip(1)) return out;  // session id, ciphers, compression
  if (p + 2 > h.size()) return out;
  const size_t ext_end = std::min(h.size(), p + 2 + U16(h, p));
  p += 2;
  while (p + 4 <= ext_end) {
    const uint16_t type = U16(h, p);
    const size_t len = U16(h, p + 2);
    p += 4;
    if (p + len > ext_end) return out;
    if (type == 0 && len >= 5) {
      absl::string_view e = h.substr(p, len);
      // server_name_list: 2-byte length, then (type 0, 2-byte length, name).
      if (static_cast<uint8_t>(e[2]) == 0) {
        const size_t name_len = U16(e, 3);
        if (5 + name_len <= e.size()) {
          out.name = absl::AsciiStrToLower(e.substr(5, name_len));
        }
      }
      return out;
    }
    p += len;
  }
  return out;
}

bool IsMethodChar(char c) { return c >= 'A' && c <= 'Z'; }

FirstBytes ParseHttpHead(absl::string_view d) {
  FirstBytes out;
  size_t i = 0;
  while (i < d.size() && i < 16 && IsMethodChar(d[i])) ++i;
  if (i == d.size()) {
    if (i >= 16) out.kind = FirstBytes::Kind::kOther;
    return out;  // kNeedMore: still a method
  }
  if (i == 0 || d[i] != ' ') {
    out.kind = FirstBytes::Kind::kOther;
    return out;
  }
  const size_t end = d.find("\r\n\r\n");
  if (end == absl::string_view::npos) {
    if (d.size() >= kMaxFirstBytes) out.kind = FirstBytes::Kind::kOther;
    return out;
  }
  out.kind = FirstBytes::Kind::kHttp;
  out.head_end = end + 4;
  std::vector<absl::string_view> lines = absl::StrSplit(d.substr(0, end), "\r\n");
  std::vector<absl::string_view> request = absl::StrSplit(lines[0], ' ');
  if (request.size() != 3 || !absl::StartsWith(request[2], "HTTP/")) {
    out.kind = FirstBytes::Kind::kOther;
    return out;
  }
  out.method = std::string(request[0]);
  out.target = std::string(request[1]);
  for (size_t l = 1; l < lines.size(); ++l) {
    absl::string_view line = lines[l];
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    if (!absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(line.substr(0, colon)), "host")) {
      continue;
    }
    auto hp = SplitHostPort(absl::StripAsciiWhitespace(line.substr(colon + 1)), 80);
    if (hp) out.name = absl::AsciiStrToLower(hp->first);
    break;
  }
  return out;
}

}  // namespace

std::optional<DnsQuery> ParseDnsQuery(absl::string_view packet) {
  if (packet.size() < 12 || packet.size() > 4096) return std::nullopt;
  const uint16_t flags = U16(packet, 2);
  // A standard query (QR 0, opcode 0) with one question.
  if ((flags & 0xf800) != 0 || U16(packet, 4) != 1) return std::nullopt;
  DnsQuery q;
  q.id = U16(packet, 0);
  q.recursion_desired = (flags & 0x0100) != 0;
  size_t p = 12;
  std::string name;
  while (true) {
    if (p >= packet.size()) return std::nullopt;
    const uint8_t len = static_cast<uint8_t>(packet[p++]);
    if (len == 0) break;
    if (len > 63 || p + len > packet.size()) return std::nullopt;  // no compression here
    if (!name.empty()) name.push_back('.');
    name.append(packet.data() + p, len);
    if (name.size() > 253) return std::nullopt;
    p += len;
  }
  if (p + 4 > packet.size()) return std::nullopt;
  q.qtype = U16(packet, p);
  q.question_end = p + 4;
  q.name = absl::AsciiStrToLower(name);
  return q;
}

std::string DnsAnswer(absl::string_view packet, const DnsQuery& q, std::optional<uint32_t> ipv4,
                      bool nxdomain) {
  std::string out;
  PutU16(&out, q.id);
  uint16_t flags = 0x8000 | 0x0080;  // QR, RA
  if (q.recursion_desired) flags |= 0x0100;
  if (nxdomain) flags |= 3;
  PutU16(&out, flags);
  PutU16(&out, 1);                                      // questions
  PutU16(&out, ipv4 && !nxdomain ? 1 : 0);              // answers
  PutU16(&out, 0);                                      // authority
  PutU16(&out, 0);                                      // additional
  out.append(packet.data() + 12, q.question_end - 12);  // the question, echoed
  if (ipv4 && !nxdomain) {
    PutU16(&out, 0xc00c);  // the name: a pointer to the question's
    PutU16(&out, kTypeA);
    PutU16(&out, 1);  // IN
    PutU16(&out, 0);
    PutU16(&out, 30);  // TTL 30 s
    PutU16(&out, 4);
    out.append(reinterpret_cast<const char*>(&*ipv4), 4);
  }
  return out;
}

FirstBytes ParseFirstBytes(absl::string_view data) {
  if (data.empty()) return FirstBytes{};
  // A TLS handshake record.
  if (static_cast<uint8_t>(data[0]) == 0x16) {
    if (data.size() >= 2 && data[1] != 3) {
      FirstBytes other;
      other.kind = FirstBytes::Kind::kOther;
      return other;
    }
    return ParseClientHello(data);
  }
  return ParseHttpHead(data);
}

std::optional<std::pair<std::string, int>> SplitHostPort(absl::string_view s, int default_port) {
  std::string host;
  absl::string_view port;
  if (absl::StartsWith(s, "[")) {
    const size_t close = s.find(']');
    if (close == absl::string_view::npos) return std::nullopt;
    host = std::string(s.substr(1, close - 1));
    absl::string_view rest = s.substr(close + 1);
    if (!rest.empty() && !absl::ConsumePrefix(&rest, ":")) return std::nullopt;
    port = rest;
  } else {
    const size_t colon = s.rfind(':');
    if (colon != absl::string_view::npos && s.find(':') == colon) {
      host = std::string(s.substr(0, colon));
      port = s.substr(colon + 1);
    } else {
      host = std::string(s);
    }
  }
  int p = default_port;
  if (!port.empty() && (!absl::SimpleAtoi(port, &p) || p < 1 || p > 65535)) return std::nullopt;
  if (host.empty()) return std::nullopt;
  return std::make_pair(host, p);
}

}  // namespace sandbox::egress
