#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "adapters/api/provider.h"
#include "nlohmann/json.hpp"

namespace sandbox {

// A diagnostics provider for measuring the broker's own overhead: Exec
// returns the code (or command) as its output at once, files live in
// memory. Enabled only by `providers: {echo: {}}`; never the default and
// never isolation of anything.
//
// Thread-safe.
class EchoProvider final : public Provider {
 public:
  // providers.echo: {hold_ms: N}: each Exec completes N ms later (ExecAsync
  // on a timer, holding no thread), to measure calls held in flight.
  static absl::StatusOr<std::unique_ptr<EchoProvider>> Create(const nlohmann::json& config);
  explicit EchoProvider(int64_t hold_ms = 0) : hold_ms_(hold_ms) {}
  absl::string_view name() const override { return "echo"; }
  absl::StatusOr<std::unique_ptr<Sandbox>> Create(const SandboxSpec& spec) override;

 private:
  const int64_t hold_ms_;
};

}  // namespace sandbox
