#pragma once

// The local provider's egress (docs/network.md): every sandbox with a
// network policy gets a network namespace of its own whose only route leads
// to the broker. nftables in that namespace redirect every TCP connection
// to a listener the broker holds there and every DNS query to the broker's
// resolver; everything else is rejected. The broker decides each
// connection against the session's rules (on the name the connection
// itself carries: TLS SNI, HTTP Host, a CONNECT target, or the name it
// resolved) and relays the allowed ones from the host. Nothing inside the
// sandbox can widen it: the namespace belongs to the host's user namespace,
// where sandboxed code has no capability.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "adapters/api/network_policy.h"
#include "adapters/api/provider.h"

namespace sandbox {

struct EgressState;  // egress_relay.h
struct EgressLoop;   // egress.cc

// Where a sandbox's proxy listens, inside its namespace (HTTP_PROXY).
inline constexpr int kEgressProxyPort = 15001;

// One sandbox's egress point. Closing it (the destructor) closes its
// listeners; the namespace goes when the container does. Must not outlive
// the Egress that opened it.
class EgressPoint {
 public:
  EgressPoint(EgressLoop* loop, std::shared_ptr<EgressState> state, std::vector<uint64_t> keys);
  ~EgressPoint();
  EgressPoint(const EgressPoint&) = delete;
  EgressPoint& operator=(const EgressPoint&) = delete;

  // The namespace, for the container to join (setns) before it starts.
  int netns_fd() const;
  // New rules for new connections and queries (UpdateSessionNetwork).
  void SetPolicy(NetworkPolicy policy);

 private:
  EgressLoop* const loop_;
  std::shared_ptr<EgressState> state_;
  const std::vector<uint64_t> keys_;
};

class Egress {
 public:
  // UNAVAILABLE with the reason when this host cannot (not root, no
  // nftables in the kernel): sessions with rules are then refused.
  static absl::StatusOr<std::unique_ptr<Egress>> Start();
  ~Egress();

  void SetHooks(ProviderHooks hooks);

  struct Owner {
    std::string tenant;
    std::string session_id;
    std::string sandbox_id;
  };
  absl::StatusOr<std::unique_ptr<EgressPoint>> Open(Owner owner, NetworkPolicy policy);

  // The variables every run in such a sandbox gets (HTTP_PROXY and kin),
  // for tools that look for them.
  static std::map<std::string, std::string> ProxyEnv();

 private:
  explicit Egress(std::unique_ptr<EgressLoop> impl);
  std::unique_ptr<EgressLoop> impl_;
};

}  // namespace sandbox
