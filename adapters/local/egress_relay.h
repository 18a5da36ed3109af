#pragma once

// Inside the local egress (egress.h): one sandbox's state, and what serves
// its DNS queries and relays its connections.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "adapters/local/egress.h"

namespace sandbox {

// What every egress point of one provider shares: the broker's hooks, and
// the connection threads (the provider's end waits for them).
struct EgressHub {
  absl::Mutex mu;
  ProviderHooks hooks ABSL_GUARDED_BY(mu);
  BrokerEndpoints endpoints ABSL_GUARDED_BY(mu);
  std::set<int> sockets ABSL_GUARDED_BY(mu);  // of running relays
  int threads ABSL_GUARDED_BY(mu) = 0;
  bool stopping ABSL_GUARDED_BY(mu) = false;

  void Emit(const NetworkEvent& e);
  BrokerEndpoints Endpoints();
  // A relay thread's start and end; false once stopping.
  bool BeginThread();
  void EndThread();
  void Track(int fd);
  void Untrack(int fd);
  // Shuts every relay's sockets and waits for the threads.
  void StopAll();
};

// Bytes per second, shared by a sandbox's connections (one per direction).
class RateLimit {
 public:
  // How many of `want` bytes may move now (0 = wait `*wait`); rate 0 = all.
  size_t Take(int64_t rate, size_t want, absl::Duration* wait);

 private:
  absl::Mutex mu_;
  double tokens_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time refilled_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

struct EgressState {
  ~EgressState();

  // Constant after Open.
  Egress::Owner owner;
  std::shared_ptr<EgressHub> hub;
  int netns_fd = -1;
  int listen_fd = -1;  // TCP, 127.0.0.1:kEgressProxyPort in the namespace
  int dns_fd = -1;     // UDP, 127.0.0.1:53 in the namespace
  RateLimit up, down;

  NetworkPolicy Policy();
  void SetPolicy(NetworkPolicy p);
  // The address handed out for an allowed name (198.18.0.0/15, network
  // order), the same for the same name; nullopt when all are taken.
  std::optional<uint32_t> AddressFor(const std::string& name);
  // The name behind such an address; "" if none.
  std::string NameAt(uint32_t address);
  // A connection slot under max_connections.
  bool BeginConnection(int64_t max);
  void EndConnection();

 private:
  absl::Mutex mu_;
  NetworkPolicy policy_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint32_t> address_of_ ABSL_GUARDED_BY(mu_);
  std::map<uint32_t, std::string> name_at_ ABSL_GUARDED_BY(mu_);
  uint32_t next_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t connections_ ABSL_GUARDED_BY(mu_) = 0;
};

// Answers the queries waiting on `st.dns_fd` (non-blocking).
void ServeDns(EgressState& st);
// Decides and relays one accepted connection; runs on a thread of its own,
// owns `fd`.
void ServeConnection(std::shared_ptr<EgressState> st, int fd);

}  // namespace sandbox
