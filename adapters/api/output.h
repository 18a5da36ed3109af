#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"
#include "adapters/api/provider.h"

namespace sandbox {

// Collects a run's combined output in arrival order up to a byte cap,
// forwarding each kept chunk to an optional callback. Bytes past the cap are
// dropped and mark the output truncated. Not thread-safe.
class OutputCollector {
 public:
  OutputCollector(size_t max_bytes, std::function<void(OutputStream, absl::string_view)> on_output)
      : max_bytes_(max_bytes), on_output_(std::move(on_output)) {}

  void Append(OutputStream stream, absl::string_view data) {
    if (data.empty()) return;
    const size_t room = max_bytes_ - output_.size();
    if (data.size() > room) {
      truncated_ = true;
      data = data.substr(0, room);
    }
    if (data.empty()) return;
    output_.append(data.data(), data.size());
    if (on_output_) on_output_(stream, data);
  }

  bool truncated() const { return truncated_; }
  std::string Take() { return std::move(output_); }

 private:
  const size_t max_bytes_;
  std::function<void(OutputStream, absl::string_view)> on_output_;
  std::string output_;
  bool truncated_ = false;
};

}  // namespace sandbox
