// The local egress (egress.h): each sandbox's namespace and listeners, and
// one thread that waits on all of them.

#include "adapters/local/egress.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nftables/libnftables.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "adapters/local/egress_relay.h"
#include "common/status_macros.h"

namespace sandbox {
namespace {

// In the sandbox's namespace: its own loopback stays its own; DNS to any
// server is answered by the broker; every other TCP connection goes to the
// broker's listener; anything else is rejected at once (never a silent
// drop). The sandbox cannot change this: the namespace is not its own.
constexpr char kRules[] = R"(table inet sandbox_egress {
  chain nat_out {
    type nat hook output priority -100; policy accept;
    udp dport 53 redirect to :53
    tcp dport 53 redirect to :53
    ip daddr 127.0.0.0/8 return
    ip6 daddr ::1 return
    meta l4proto tcp redirect to :15001
  }
  chain filter_out {
    type filter hook output priority 0; policy accept;
    ip daddr 127.0.0.0/8 accept
    ip6 daddr ::1 accept
    meta l4proto tcp reject with tcp reset
    reject
  }
}
)";
static_assert(kEgressProxyPort == 15001, "kRules names the port");

std::string Errno(absl::string_view what) { return absl::StrCat(what, ": ", strerror(errno)); }

// lo up (its addresses come with it).
bool LoopbackUp(std::string* why) {
  const int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct ifreq ifr = {};
  strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  ifr.ifr_flags = IFF_UP | IFF_LOOPBACK | IFF_RUNNING;
  const bool ok = s >= 0 && ioctl(s, SIOCSIFFLAGS, &ifr) == 0;
  if (!ok) *why = Errno("lo up");
  if (s >= 0) close(s);
  return ok;
}

// "default dev lo src 127.0.0.1": without a route, a connect to any address
// outside fails before the redirect could see it.
bool DefaultRoute(std::string* why) {
  const int s = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (s < 0) {
    *why = Errno("netlink");
    return false;
  }
  struct {
    struct nlmsghdr nh;
    struct rtmsg rt;
    char attrs[64];
  } req = {};
  req.nh.nlmsg_len = NLMSG_LENGTH(sizeof(struct rtmsg));
  req.nh.nlmsg_type = RTM_NEWROUTE;
  req.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK;
  req.rt.rtm_family = AF_INET;
  req.rt.rtm_table = RT_TABLE_MAIN;
  req.rt.rtm_protocol = RTPROT_BOOT;
  req.rt.rtm_scope = RT_SCOPE_LINK;
  req.rt.rtm_type = RTN_UNICAST;
  auto add = [&req](uint16_t type, const void* data, size_t len) {
    auto* a = reinterpret_cast<struct rtattr*>(reinterpret_cast<char*>(&req) +
                                               NLMSG_ALIGN(req.nh.nlmsg_len));
    a->rta_type = type;
    a->rta_len = static_cast<uint16_t>(RTA_LENGTH(len));
    memcpy(RTA_DATA(a), data, len);
    req.nh.nlmsg_len = NLMSG_ALIGN(req.nh.nlmsg_len) + RTA_ALIGN(a->rta_len);
  };
  const uint32_t lo = if_nametoindex("lo");
  const uint32_t src = htonl(INADDR_LOOPBACK);
  add(RTA_OIF, &lo, sizeof(lo));
  add(RTA_PREFSRC, &src, sizeof(src));
  bool ok = send(s, &req, req.nh.nlmsg_len, 0) == static_cast<ssize_t>(req.nh.nlmsg_len);
  char buf[512];
  const ssize_t n = ok ? recv(s, buf, sizeof(buf), 0) : -1;
  const auto* ack = reinterpret_cast<const struct nlmsghdr*>(buf);
  ok = n >= static_cast<ssize_t>(NLMSG_LENGTH(sizeof(struct nlmsgerr))) &&
       ack->nlmsg_type == NLMSG_ERROR &&
       reinterpret_cast<const struct nlmsgerr*>(NLMSG_DATA(ack))->error == 0;
  if (!ok) *why = "default route: the kernel refused it";
  close(s);
  return ok;
}

bool ApplyRules(std::string* why) {
  struct nft_ctx* ctx = nft_ctx_new(NFT_CTX_DEFAULT);
  if (ctx == nullptr) {
    *why = "nftables: no context";
    return false;
  }
  nft_ctx_buffer_error(ctx);
  const bool ok = nft_run_cmd_from_buffer(ctx, kRules) == 0;
  if (!ok) *why = absl::StrCat("nftables: ", nft_ctx_get_error_buffer(ctx));
  nft_ctx_free(ctx);
  return ok;
}

int Listen(int type, int port, std::string* why) {
  const int fd = socket(AF_INET, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      (type == SOCK_STREAM && listen(fd, 256) != 0)) {
    *why = Errno(absl::StrCat("listen on 127.0.0.1:", port));
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

// A new namespace with the rules and the two listeners, made on a thread of
// its own (unshare changes only the calling thread's namespace).
absl::Status MakeNamespace(EgressState* st) {
  std::string why;
  std::thread t([st, &why] {
    if (unshare(CLONE_NEWNET) != 0) {
      why = Errno("unshare(CLONE_NEWNET)");
      return;
    }
    if (!LoopbackUp(&why) || !DefaultRoute(&why) || !ApplyRules(&why)) return;
    st->listen_fd = Listen(SOCK_STREAM, kEgressProxyPort, &why);
    if (st->listen_fd < 0) return;
    st->dns_fd = Listen(SOCK_DGRAM, 53, &why);
    if (st->dns_fd < 0) return;
    st->netns_fd = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (st->netns_fd < 0) why = Errno("open the namespace");
  });
  t.join();
  if (st->netns_fd < 0) {
    return absl::UnavailableError(absl::StrCat("local: egress: ", why));
  }
  return absl::OkStatus();
}

std::vector<IpAddress> LocalAddresses() {
  std::vector<IpAddress> out;
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (struct ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    char host[INET6_ADDRSTRLEN] = {};
    if (i->ifa_addr->sa_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, host,
                sizeof(host));
    } else if (i->ifa_addr->sa_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr, host,
                sizeof(host));
    } else {
      continue;
    }
    if (auto ip = IpAddress::Parse(host)) out.push_back(*ip);
  }
  freeifaddrs(list);
  return out;
}

}  // namespace

// ---- EgressLoop: the thread that waits on every sandbox's listeners --------

struct EgressLoop {
  std::shared_ptr<EgressHub> hub = std::make_shared<EgressHub>();
  int epoll_fd = -1;
  int wake_fd = -1;
  std::thread loop;
  absl::Mutex mu;
  uint64_t next_key ABSL_GUARDED_BY(mu) = 1;
  // epoll key -> (point, is its DNS socket); a closed point is gone from here.
  std::map<uint64_t, std::pair<std::weak_ptr<EgressState>, bool>> keys ABSL_GUARDED_BY(mu);

  void Run() {
    struct epoll_event events[64];
    while (true) {
      const int n = epoll_wait(epoll_fd, events, 64, -1);
      for (int i = 0; i < n; ++i) {
        const uint64_t key = events[i].data.u64;
        if (key == 0) return;  // wake_fd: stopping
        std::shared_ptr<EgressState> st;
        bool dns = false;
        {
          absl::MutexLock l(&mu);
          auto it = keys.find(key);
          if (it == keys.end()) continue;
          st = it->second.first.lock();
          dns = it->second.second;
        }
        if (st == nullptr) continue;
        dns ? ServeDns(*st) : Accept(st);
      }
    }
  }

  void Accept(const std::shared_ptr<EgressState>& st) {
    while (true) {
      const int fd = accept4(st->listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      if (!hub->BeginThread()) {
        close(fd);
        continue;
      }
      std::thread(ServeConnection, st, fd).detach();
    }
  }

  void Watch(const std::shared_ptr<EgressState>& st, std::vector<uint64_t>* out) {
    absl::MutexLock l(&mu);
    for (bool dns : {false, true}) {
      const uint64_t key = next_key++;
      keys[key] = {st, dns};
      struct epoll_event ev = {};
      ev.events = EPOLLIN;
      ev.data.u64 = key;
      epoll_ctl(epoll_fd, EPOLL_CTL_ADD, dns ? st->dns_fd : st->listen_fd, &ev);
      out->push_back(key);
    }
  }

  void Unwatch(EgressState* st, const std::vector<uint64_t>& watched) {
    absl::MutexLock l(&mu);
    for (uint64_t key : watched) keys.erase(key);
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, st->listen_fd, nullptr);
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, st->dns_fd, nullptr);
  }
};

// ---- EgressPoint -------------------------------------------------------------

EgressPoint::EgressPoint(EgressLoop* loop, std::shared_ptr<EgressState> state,
                         std::vector<uint64_t> keys)
    : loop_(loop), state_(std::move(state)), keys_(std::move(keys)) {}

EgressPoint::~EgressPoint() {
  loop_->Unwatch(state_.get(), keys_);
  // No new connection: the listeners stop; the relays running keep their
  // state (and its descriptors) until they end.
  shutdown(state_->listen_fd, SHUT_RDWR);
}

int EgressPoint::netns_fd() const { return state_->netns_fd; }

void EgressPoint::SetPolicy(NetworkPolicy policy) { state_->SetPolicy(std::move(policy)); }

// ---- Egress ------------------------------------------------------------------

Egress::Egress(std::unique_ptr<EgressLoop> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<Egress>> Egress::Start() {
  if (geteuid() != 0) return absl::UnavailableError("local: egress needs root");
  auto impl = std::make_unique<EgressLoop>();
  // One namespace made and dropped: proves unshare, netlink and nftables.
  {
    EgressState probe;
    RETURN_IF_ERROR(MakeNamespace(&probe));
  }
  impl->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  impl->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl->epoll_fd < 0 || impl->wake_fd < 0) {
    return absl::InternalError(Errno("local: egress: epoll"));
  }
  struct epoll_event ev = {};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;
  epoll_ctl(impl->epoll_fd, EPOLL_CTL_ADD, impl->wake_fd, &ev);
  {
    absl::MutexLock l(&impl->hub->mu);
    impl->hub->endpoints.local_addresses = LocalAddresses();
  }
  EgressLoop* raw = impl.get();
  impl->loop = std::thread([raw] { raw->Run(); });
  return std::unique_ptr<Egress>(new Egress(std::move(impl)));
}

Egress::~Egress() {
  const uint64_t one = 1;
  (void)!write(impl_->wake_fd, &one, sizeof(one));
  impl_->loop.join();
  impl_->hub->StopAll();
  close(impl_->epoll_fd);
  close(impl_->wake_fd);
}

void Egress::SetHooks(ProviderHooks hooks) {
  absl::MutexLock l(&impl_->hub->mu);
  impl_->hub->endpoints.ports = hooks.broker_ports;
  impl_->hub->hooks = std::move(hooks);
}

absl::StatusOr<std::unique_ptr<EgressPoint>> Egress::Open(Owner owner, NetworkPolicy policy) {
  auto st = std::make_shared<EgressState>();
  st->owner = std::move(owner);
  st->hub = impl_->hub;
  st->SetPolicy(std::move(policy));
  RETURN_IF_ERROR(MakeNamespace(st.get()));
  std::vector<uint64_t> keys;
  impl_->Watch(st, &keys);
  return std::make_unique<EgressPoint>(impl_.get(), std::move(st), std::move(keys));
}

std::map<std::string, std::string> Egress::ProxyEnv() {
  const std::string proxy = absl::StrCat("http://127.0.0.1:", kEgressProxyPort);
  const std::string none = "localhost,127.0.0.1,::1";
  return {{"HTTP_PROXY", proxy},  {"HTTPS_PROXY", proxy}, {"http_proxy", proxy},
          {"https_proxy", proxy}, {"NO_PROXY", none},     {"no_proxy", none}};
}

}  // namespace sandbox
