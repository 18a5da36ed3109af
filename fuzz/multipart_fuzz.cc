// The multipart/form-data parser (adapters/http) behind Daytona's
// bulk-download reply, and the Content-Type parameter parsing it uses.
//
// Input: mode byte, then fields separated by 0xFF.
// Mode even: arbitrary reply: content type, body, requested paths. Every
//   parsed part's data is a substring of the body; ParseBulkDownload returns
//   one entry per requested path or UNAVAILABLE naming the provider.
// Mode odd: round trip: parts built from the fields (names from a safe
//   alphabet, data arbitrary) come back from ParseMultipart(BuildMultipart())
//   exactly, in order.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "adapters/daytona/daytona_wire.h"
#include "adapters/http/http_client.h"
#include "fuzz/fuzz_check.h"

using sandbox::fuzz::NextField;

namespace {

std::string SafeName(absl::string_view f) {
  static const char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789._-/ ";
  std::string out;
  for (char c : f.substr(0, 64)) out.push_back(kAlphabet[static_cast<uint8_t>(c) % 41]);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool round_trip = data[0] & 1;
  absl::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);

  if (!round_trip) {
    const absl::string_view content_type = NextField(&in);
    const absl::string_view body = NextField(&in);
    std::vector<std::string> paths;
    while (!in.empty() && paths.size() < 8) paths.emplace_back(NextField(&in));

    auto parts = sandbox::ParseMultipart(content_type, body);
    if (parts.ok()) {
      for (const auto& p : *parts) FUZZ_CHECK(absl::StrContains(body, p.data));
    } else {
      FUZZ_CHECK(parts.status().code() == absl::StatusCode::kInvalidArgument);
    }
    auto dl = sandbox::daytona::ParseBulkDownload(content_type, body, paths);
    if (dl.ok()) {
      FUZZ_CHECK(dl->size() == paths.size());
      for (const auto& d : *dl) {
        if (d.found) FUZZ_CHECK(absl::StrContains(body, d.data));
      }
    } else {
      FUZZ_CHECK(dl.status().code() == absl::StatusCode::kUnavailable);
      FUZZ_CHECK(absl::StartsWith(dl.status().message(), "daytona: bulk-download: "));
    }
    return 0;
  }

  std::vector<sandbox::MultipartPart> parts;
  while (!in.empty() && parts.size() < 16) {
    sandbox::MultipartPart p;
    p.name = SafeName(NextField(&in));
    if (p.name.empty()) p.name = "file";
    p.filename = SafeName(NextField(&in));
    p.data = std::string(NextField(&in));
    parts.push_back(std::move(p));
  }
  const sandbox::MultipartBody m = sandbox::BuildMultipart(parts);
  auto back = sandbox::ParseMultipart(m.content_type, m.body);
  FUZZ_CHECK(back.ok());
  FUZZ_CHECK(back->size() == parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    FUZZ_CHECK((*back)[i].name == parts[i].name);
    FUZZ_CHECK((*back)[i].filename == parts[i].filename);
    FUZZ_CHECK((*back)[i].data == parts[i].data);
  }
  return 0;
}
