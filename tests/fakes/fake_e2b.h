#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "tests/fakes/fault_injection.h"

namespace sandbox {

// A protocol-faithful fake of E2B: the control plane (REST, X-API-KEY) and
// envd (Connect process API, /files) on one HTTP port, routed by path and
// the E2b-Sandbox-Id / E2b-Sandbox-Port headers, as the official SDK uses it
// with apiUrl = sandboxUrl = http://127.0.0.1:PORT. Its sandboxes are real:
// each is a local bubblewrap sandbox that looks like E2B's base template
// from inside (user "user", home and cwd /home/user, a persistent /tmp).
//
// Thread-safe.
class FakeE2B {
 public:
  struct Options {
    std::string api_key = "e2b_test_key";
    int port = 0;                // 0 = any free port
    std::string workspace_root;  // empty = a fresh temporary directory
    int64_t uid_base = 650000;
    // The CPU weight of all its sandboxes together (their cgroup group is
    // named after the fake), as providers.local.cpu_weight. A cloud's
    // sandboxes do not share our CPU; a benchmark may give them more.
    int64_t cpu_weight = 100;
    // Time for sandbox TTLs. With a fake clock, call ExpireNow() to reap.
    Clock* clock = Clock::Real();
    bool ttl_thread = true;  // reap expired sandboxes every second
  };

  static absl::StatusOr<std::unique_ptr<FakeE2B>> Start(Options options);
  ~FakeE2B();

  int port() const;
  std::string url() const;  // http://127.0.0.1:PORT
  // Fault injection switches.
  Faults& faults();

  // Kills sandboxes whose TTL has passed; returns how many.
  int ExpireNow();
  // Makes a sandbox disappear as if E2B lost it (envd answers 502).
  bool Vanish(const std::string& sandbox_id);
  int live_sandboxes() const;
  // A live sandbox's metadata and seconds left before its TTL kills it.
  std::map<std::string, std::string> metadata(const std::string& sandbox_id) const;
  int64_t ttl_left_seconds(const std::string& sandbox_id) const;
  // A live sandbox's egress rules as recorded: {"network": {allowOut,
  // denyOut}, "allow_internet_access": bool}, each only if given.
  std::string network(const std::string& sandbox_id) const;
  // Requests seen, and distinct client connections they came on, so far.
  int64_t requests() const;
  int64_t connections() const;

  class Impl;

 private:
  explicit FakeE2B(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sandbox
