#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "tests/fakes/fault_injection.h"

namespace sandbox {

// A protocol-faithful fake of Daytona: the control plane under /api and the
// toolbox under /toolbox/{id}/..., with Daytona's DTOs, error bodies and
// status codes, as the official SDK (@daytonaio/sdk 0.218.0) uses them with
// apiUrl = http://127.0.0.1:PORT/api. Its sandboxes are real local
// bubblewrap sandboxes that look like Daytona's default image from inside
// (user "daytona", home and cwd /home/daytona, a persistent /tmp).
//
// Thread-safe.
class FakeDaytona {
 public:
  struct Options {
    std::string api_key = "dtn_test_key";
    int port = 0;
    std::string workspace_root;  // empty = a fresh temporary directory
    int64_t uid_base = 660000;
    // The CPU weight of all its sandboxes together (their cgroup group is
    // named after the fake), as providers.local.cpu_weight. A cloud's
    // sandboxes do not share our CPU; a benchmark may give them more.
    int64_t cpu_weight = 100;
    Clock* clock = Clock::Real();  // auto-stop / auto-delete timers
    bool timer_thread = true;      // apply them every second
  };

  static absl::StatusOr<std::unique_ptr<FakeDaytona>> Start(Options options);
  ~FakeDaytona();

  int port() const;
  std::string api_url() const;  // http://127.0.0.1:PORT/api
  Faults& faults();
  // New sandboxes stay in "starting" (never reach "started") while set.
  void set_stuck_starting(bool stuck);

  // Applies auto-stop and auto-delete now; returns sandboxes stopped + deleted.
  int ApplyTimersNow();
  bool Vanish(const std::string& id);
  int live_sandboxes() const;  // not yet deleted
  std::map<std::string, std::string> labels(const std::string& id) const;
  // A sandbox's egress fields as created: {networkBlockAll,
  // networkAllowList, domainAllowList}.
  std::string network(const std::string& id) const;
  // "started", "stopped", ... or "" when deleted.
  std::string state(const std::string& id) const;
  int64_t auto_stop_minutes(const std::string& id) const;
  // {"cpu", "memory", "disk"} as created (CPUs, GiB, GiB); empty when gone.
  std::map<std::string, int64_t> resources(const std::string& id) const;

  class Impl;

 private:
  explicit FakeDaytona(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sandbox
