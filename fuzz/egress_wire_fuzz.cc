// What a sandbox sends its egress point (adapters/local/egress_wire.cc): DNS
// queries, TLS ClientHellos, HTTP request heads and CONNECT targets, all
// written by untrusted code.
//
// Invariants: nothing crashes or reads out of bounds; a parsed query names
// at most 253 characters and its answer echoes its id and question; a name
// read from the first bytes is lower case; an HTTP head ends inside the
// input; a split host:port has a port in 1-65535.

#include <arpa/inet.h>

#include <cstdint>
#include <string>

#include "adapters/local/egress_wire.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view in(reinterpret_cast<const char*>(data), size);
  namespace eg = sandbox::egress;

  if (auto q = eg::ParseDnsQuery(in)) {
    FUZZ_CHECK(q->name.size() <= 253);
    FUZZ_CHECK(q->question_end <= in.size());
    for (bool nx : {false, true}) {
      const std::string a = eg::DnsAnswer(in, *q, htonl(0xc6120001), nx);
      FUZZ_CHECK(a.size() >= q->question_end);
      const absl::string_view answer(a);
      FUZZ_CHECK(answer.substr(0, 2) == in.substr(0, 2));
      FUZZ_CHECK(answer.substr(12, q->question_end - 12) == in.substr(12, q->question_end - 12));
      FUZZ_CHECK(!eg::ParseDnsQuery(a).has_value());  // an answer is not a query
    }
  }

  const eg::FirstBytes fb = eg::ParseFirstBytes(in);
  for (char c : fb.name) FUZZ_CHECK(!(c >= 'A' && c <= 'Z'));
  if (fb.kind == eg::FirstBytes::Kind::kHttp) FUZZ_CHECK(fb.head_end <= in.size());

  if (auto hp = eg::SplitHostPort(in, 443)) {
    FUZZ_CHECK(hp->second >= 1 && hp->second <= 65535);
    FUZZ_CHECK(!hp->first.empty());
  }
  return 0;
}
