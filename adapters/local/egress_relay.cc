// One sandbox's DNS answers and relayed connections (egress.h).

#include "adapters/local/egress_relay.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/netfilter_ipv4.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "adapters/local/egress_wire.h"

namespace sandbox {
namespace {

constexpr uint32_t kNameBase = 0xc6120000;  // 198.18.0.0/15: handed out for names
constexpr uint32_t kNameCount = 1u << 17;
constexpr absl::Duration kSniffTime = absl::Milliseconds(300);  // server-speaks-first protocols
constexpr absl::Duration kHeadTime = absl::Seconds(10);         // an explicit proxy request
constexpr int kConnectTimeoutMs = 10000;
constexpr size_t kMaxHead = 16 * 1024;

int64_t Remaining(absl::Time deadline) {
  return std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
}

// Reads what the connection says first, until it is enough to know where it
// goes, or the deadline.
egress::FirstBytes ReadFirst(int fd, absl::Time deadline, std::string* buf) {
  egress::FirstBytes fb;
  while (buf->size() < kMaxHead) {
    fb = egress::ParseFirstBytes(*buf);
    if (fb.kind != egress::FirstBytes::Kind::kNeedMore) return fb;
    struct pollfd p = {fd, POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(Remaining(deadline)));
    if (r <= 0) return fb;
    char tmp[4096];
    const ssize_t n = read(fd, tmp, sizeof(tmp));
    if (n <= 0) return fb;
    buf->append(tmp, static_cast<size_t>(n));
  }
  return egress::ParseFirstBytes(*buf);
}

bool WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      struct pollfd p = {fd, POLLOUT, 0};
      if (poll(&p, 1, kConnectTimeoutMs) <= 0) return false;
      continue;
    }
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// A TCP reset: the sandbox's connect or first read fails at once.
void Reset(int fd) {
  struct linger l = {1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
}

int ConnectTo(const IpAddress& a, int port) {
  struct sockaddr_storage ss = {};
  socklen_t len;
  if (a.v6) {
    auto* s6 = reinterpret_cast<sockaddr_in6*>(&ss);
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(static_cast<uint16_t>(port));
    memcpy(&s6->sin6_addr, a.bytes.data(), 16);
    len = sizeof(*s6);
  } else {
    auto* s4 = reinterpret_cast<sockaddr_in*>(&ss);
    s4->sin_family = AF_INET;
    s4->sin_port = htons(static_cast<uint16_t>(port));
    memcpy(&s4->sin_addr, a.bytes.data(), 4);
    len = sizeof(*s4);
  }
  const int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (connect(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  struct pollfd p = {fd, POLLOUT, 0};
  int err = 0;
  socklen_t elen = sizeof(err);
  if (poll(&p, 1, kConnectTimeoutMs) != 1 ||
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0 || err != 0) {
    close(fd);
    return -1;
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

// Where a connection goes, once decided.
struct Target {
  std::string name;  // "" = an IP literal
  IpAddress address;
  int port = 0;
  bool allowed = false;
  std::string rule;
};

// The name's addresses as the broker resolves them (a host entry, else the
// host's resolver), the first the policy allows.
void Resolve(const NetworkPolicy& policy, const BrokerEndpoints& broker, Target* t) {
  auto entry = policy.hosts.find(t->name);
  std::vector<std::pair<IpAddress, AddressVia>> candidates;
  if (entry != policy.hosts.end()) {
    candidates.emplace_back(*IpAddress::Parse(entry->second), AddressVia::kHostEntry);
  } else {
    struct addrinfo hints = {};
    hints.ai_socktype = SOCK_STREAM;
    struct addrinfo* res = nullptr;
    if (getaddrinfo(t->name.c_str(), nullptr, &hints, &res) != 0) {
      t->allowed = false;
      t->rule = "the name does not resolve";
      return;
    }
    for (struct addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
      char host[INET6_ADDRSTRLEN] = {};
      if (getnameinfo(ai->ai_addr, ai->ai_addrlen, host, sizeof(host), nullptr, 0,
                      NI_NUMERICHOST) == 0) {
        if (auto ip = IpAddress::Parse(host)) candidates.emplace_back(*ip, AddressVia::kName);
      }
    }
    freeaddrinfo(res);
  }
  t->allowed = false;
  t->rule = "the name does not resolve";
  for (const auto& c : candidates) {
    NetDecision d = DecideAddress(policy, c.first, t->port, c.second, broker);
    if (d.allowed) {
      t->address = c.first;
      t->allowed = true;
      return;
    }
    t->rule = absl::StrCat(d.rule, " (", c.first.ToString(), ")");
  }
}

// Decides where the connection `fd` goes. `first` gets the bytes read
// before the decision (to be sent upstream); `explicit_proxy` tells a
// request to the proxy port (HTTP_PROXY) from a redirected connection.
Target Decide(EgressState& st, int fd, bool* explicit_proxy, bool* connect_method,
              std::string* first) {
  Target t;
  struct sockaddr_in dst = {};
  socklen_t len = sizeof(dst);
  if (getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, &dst, &len) != 0) {
    t.rule = "no original destination";
    return t;
  }
  const uint32_t ip = ntohl(dst.sin_addr.s_addr);
  t.port = ntohs(dst.sin_port);
  t.address = IpAddress::V4(ip);
  *explicit_proxy = ip == 0x7f000001 && t.port == kEgressProxyPort;
  const NetworkPolicy policy = st.Policy();
  const BrokerEndpoints broker = st.hub->Endpoints();
  if (*explicit_proxy) {
    egress::FirstBytes fb = ReadFirst(fd, absl::Now() + kHeadTime, first);
    if (fb.kind != egress::FirstBytes::Kind::kHttp) {
      t.rule = "not an HTTP proxy request";
      return t;
    }
    std::optional<std::pair<std::string, int>> hp;
    if (fb.method == "CONNECT") {
      *connect_method = true;
      hp = egress::SplitHostPort(fb.target, 443);
      first->erase(0, fb.head_end);
    } else if (absl::StartsWith(fb.target, "http://")) {
      // The absolute form, rewritten to the origin form a server expects.
      absl::string_view rest = absl::string_view(fb.target).substr(7);
      const size_t slash = rest.find('/');
      hp = egress::SplitHostPort(rest.substr(0, slash), 80);
      const std::string path =
          slash == absl::string_view::npos ? "/" : std::string(rest.substr(slash));
      const size_t line_end = first->find("\r\n");
      const std::string line = first->substr(0, line_end);
      const std::string version = line.substr(line.rfind(' ') + 1);
      first->replace(0, line_end, absl::StrCat(fb.method, " ", path, " ", version));
    }
    if (!hp) {
      t.rule = "a proxy request names no host";
      return t;
    }
    t.name = hp->first;
    t.port = hp->second;
    if (auto literal = IpAddress::Parse(t.name)) {
      t.name.clear();
      t.address = *literal;
    }
  } else {
    if ((ip & ~(kNameCount - 1)) == kNameBase) {
      t.name = st.NameAt(ip);
      if (t.name.empty()) {
        t.rule = "an address the broker did not hand out";
        return t;
      }
    }
    egress::FirstBytes fb = ReadFirst(fd, absl::Now() + kSniffTime, first);
    // The connection's own words decide when it has them (SNI, Host):
    // a name other than the one it resolved is refused.
    if (!t.name.empty() && !fb.name.empty() && fb.name != t.name) {
      t.rule = absl::StrCat("the connection names ", fb.name, ", not ", t.name);
      return t;
    }
  }
  if (t.name.empty()) {
    NetDecision d = DecideAddress(policy, t.address, t.port, AddressVia::kLiteral, broker);
    t.allowed = d.allowed;
    t.rule = d.rule;
    return t;
  }
  NetDecision d = DecideName(policy, t.name, t.port);
  t.rule = d.rule;
  if (!d.allowed) return t;
  const std::string rule = d.rule;
  Resolve(policy, broker, &t);
  if (t.allowed) t.rule = rule;
  return t;
}

// Moves bytes both ways until both sides are done: splice through a pipe
// per direction (no copy through user space), each paced by its RateLimit.
void Pump(EgressState& st, int client, int upstream, int64_t rate, int64_t* out, int64_t* in) {
  struct Dir {
    int from, to;
    RateLimit* limit;
    int64_t* bytes;
    int pipe[2] = {-1, -1};
    size_t buffered = 0;
    bool eof = false;
    bool shut = false;
  };
  Dir dirs[2] = {{client, upstream, &st.up, out}, {upstream, client, &st.down, in}};
  for (Dir& d : dirs) {
    if (pipe2(d.pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
      for (Dir& c : dirs) {
        if (c.pipe[0] >= 0) close(c.pipe[0]), close(c.pipe[1]);
      }
      return;
    }
    fcntl(d.pipe[1], F_SETPIPE_SZ, 256 << 10);
  }
  absl::Cleanup close_pipes = [&dirs] {
    for (Dir& d : dirs) close(d.pipe[0]), close(d.pipe[1]);
  };
  fcntl(client, F_SETFL, fcntl(client, F_GETFL) | O_NONBLOCK);
  constexpr size_t kChunk = 256 << 10;
  while (!(dirs[0].shut && dirs[1].shut)) {
    struct pollfd p[4];
    int n = 0;
    int timeout = -1;
    size_t allowance[2] = {0, 0};
    for (int i = 0; i < 2; ++i) {
      Dir& d = dirs[i];
      if (!d.eof && d.buffered < kChunk) {
        absl::Duration wait;
        allowance[i] = d.limit->Take(rate, kChunk - d.buffered, &wait);
        if (allowance[i] > 0) {
          p[n++] = {d.from, POLLIN, 0};
        } else {
          const int ms = std::max<int>(1, static_cast<int>(absl::ToInt64Milliseconds(wait)));
          timeout = timeout < 0 ? ms : std::min(timeout, ms);
        }
      }
      if (d.buffered > 0) p[n++] = {d.to, POLLOUT, 0};
    }
    if (n > 0 || timeout >= 0) {
      if (poll(p, static_cast<nfds_t>(n), timeout) < 0 && errno != EINTR) return;
    }
    for (int i = 0; i < 2; ++i) {
      Dir& d = dirs[i];
      if (allowance[i] > 0) {
        const ssize_t r = splice(d.from, nullptr, d.pipe[1], nullptr, allowance[i],
                                 SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (r == 0) {
          d.eof = true;
        } else if (r > 0) {
          d.buffered += static_cast<size_t>(r);
          *d.bytes += r;
        } else if (errno != EAGAIN && errno != EINTR) {
          return;
        }
        // What was granted and not read goes back to no one: the bucket
        // refills by time alone.
      }
      if (d.buffered > 0) {
        const ssize_t w = splice(d.pipe[0], nullptr, d.to, nullptr, d.buffered,
                                 SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (w > 0) {
          d.buffered -= static_cast<size_t>(w);
        } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
          return;
        }
      }
      if (d.eof && d.buffered == 0 && !d.shut) {
        shutdown(d.to, SHUT_WR);
        d.shut = true;
      }
    }
  }
}

}  // namespace

// ---- EgressHub -------------------------------------------------------------

void EgressHub::Emit(const NetworkEvent& e) {
  std::function<void(const NetworkEvent&)> sink;
  {
    absl::MutexLock l(&mu);
    sink = hooks.on_network_event;
  }
  if (sink) sink(e);
}

BrokerEndpoints EgressHub::Endpoints() {
  absl::MutexLock l(&mu);
  return endpoints;
}

bool EgressHub::BeginThread() {
  absl::MutexLock l(&mu);
  if (stopping) return false;
  ++threads;
  return true;
}

void EgressHub::EndThread() {
  absl::MutexLock l(&mu);
  --threads;
}

void EgressHub::Track(int fd) {
  absl::MutexLock l(&mu);
  sockets.insert(fd);
  if (stopping) shutdown(fd, SHUT_RDWR);
}

void EgressHub::Untrack(int fd) {
  absl::MutexLock l(&mu);
  sockets.erase(fd);
}

void EgressHub::StopAll() {
  absl::MutexLock l(&mu);
  stopping = true;
  for (int fd : sockets) shutdown(fd, SHUT_RDWR);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return threads == 0; };
  mu.Await(absl::Condition(&done));
}

// ---- RateLimit -------------------------------------------------------------

size_t RateLimit::Take(int64_t rate, size_t want, absl::Duration* wait) {
  if (rate <= 0) return want;
  absl::MutexLock l(&mu_);
  const absl::Time now = absl::Now();
  // A burst of at most a tenth of a second's worth (and 16 KiB).
  const double burst = std::max(16384.0, static_cast<double>(rate) / 10);
  if (refilled_ == absl::InfinitePast()) {
    tokens_ = burst;
  } else {
    tokens_ = std::min(burst, tokens_ + absl::ToDoubleSeconds(now - refilled_) * rate);
  }
  refilled_ = now;
  if (tokens_ < 1) {
    *wait = absl::Seconds((1 - tokens_) / static_cast<double>(rate)) + absl::Milliseconds(1);
    return 0;
  }
  const size_t n = std::min(want, static_cast<size_t>(tokens_));
  tokens_ -= static_cast<double>(n);
  return n;
}

// ---- EgressState -----------------------------------------------------------

EgressState::~EgressState() {
  for (int fd : {netns_fd, listen_fd, dns_fd}) {
    if (fd >= 0) close(fd);
  }
}

NetworkPolicy EgressState::Policy() {
  absl::MutexLock l(&mu_);
  return policy_;
}

void EgressState::SetPolicy(NetworkPolicy p) {
  absl::MutexLock l(&mu_);
  policy_ = std::move(p);
}

std::optional<uint32_t> EgressState::AddressFor(const std::string& name) {
  absl::MutexLock l(&mu_);
  auto it = address_of_.find(name);
  if (it != address_of_.end()) return it->second;
  if (next_ >= kNameCount - 1) return std::nullopt;
  const uint32_t a = kNameBase + next_++;
  address_of_[name] = a;
  name_at_[a] = name;
  return a;
}

std::string EgressState::NameAt(uint32_t address) {
  absl::MutexLock l(&mu_);
  auto it = name_at_.find(address);
  return it == name_at_.end() ? "" : it->second;
}

bool EgressState::BeginConnection(int64_t max) {
  absl::MutexLock l(&mu_);
  if (max > 0 && connections_ >= max) return false;
  ++connections_;
  return true;
}

void EgressState::EndConnection() {
  absl::MutexLock l(&mu_);
  --connections_;
}

// ---- serving ---------------------------------------------------------------

void ServeDns(EgressState& st) {
  for (int i = 0; i < 64; ++i) {
    char buf[4096];
    struct sockaddr_storage from = {};
    socklen_t from_len = sizeof(from);
    const ssize_t n =
        recvfrom(st.dns_fd, buf, sizeof(buf), 0, reinterpret_cast<sockaddr*>(&from), &from_len);
    if (n < 0) return;
    const absl::string_view packet(buf, static_cast<size_t>(n));
    std::optional<egress::DnsQuery> q = egress::ParseDnsQuery(packet);
    if (!q) continue;
    const NetDecision d = DecideName(st.Policy(), q->name, 0);
    std::optional<uint32_t> address;
    if (d.allowed && q->qtype == egress::kTypeA) {
      if (std::optional<uint32_t> a = st.AddressFor(q->name)) address = htonl(*a);
    }
    if (!d.allowed) {
      NetworkEvent e;
      e.tenant = st.owner.tenant;
      e.session_id = st.owner.session_id;
      e.sandbox_id = st.owner.sandbox_id;
      e.kind = NetworkEvent::Kind::kDns;
      e.destination = q->name;
      e.rule = d.rule;
      st.hub->Emit(e);
    }
    const std::string answer = egress::DnsAnswer(packet, *q, address, !d.allowed);
    sendto(st.dns_fd, answer.data(), answer.size(), MSG_DONTWAIT,
           reinterpret_cast<sockaddr*>(&from), from_len);
  }
}

void ServeConnection(std::shared_ptr<EgressState> st, int fd) {
  st->hub->Track(fd);
  absl::Cleanup done = [&st, fd] {
    st->hub->Untrack(fd);
    close(fd);
    st->hub->EndThread();
  };
  bool explicit_proxy = false;
  bool connect_method = false;
  std::string first;
  Target t = Decide(*st, fd, &explicit_proxy, &connect_method, &first);
  const NetworkPolicy policy = st->Policy();
  if (t.allowed && !st->BeginConnection(policy.max_connections)) {
    t.allowed = false;
    t.rule = absl::StrCat("max_connections ", policy.max_connections);
  }
  NetworkEvent e;
  e.tenant = st->owner.tenant;
  e.session_id = st->owner.session_id;
  e.sandbox_id = st->owner.sandbox_id;
  e.destination = t.name.empty() ? t.address.ToString() : t.name;
  e.port = t.port;
  e.rule = t.rule;
  e.allowed = t.allowed;
  st->hub->Emit(e);
  const std::string denied = absl::StrCat("sandbox-broker: ", e.destination, ":", t.port,
                                          " is not allowed (", t.rule, ")\n");
  const bool http =
      explicit_proxy || egress::ParseFirstBytes(first).kind == egress::FirstBytes::Kind::kHttp;
  auto refuse = [&](int status, absl::string_view reason) {
    if (http && !connect_method) {
      // A plain HTTP client gets an answer naming the rule.
      (void)WriteAll(fd, absl::StrCat("HTTP/1.1 ", status, " ", reason,
                                      "\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                                      "Content-Length: ",
                                      denied.size(), "\r\n\r\n", denied));
    } else if (connect_method) {
      (void)WriteAll(fd, absl::StrCat("HTTP/1.1 ", status, " ", reason,
                                      "\r\nContent-Length: ", denied.size(), "\r\n\r\n", denied));
    } else {
      Reset(fd);
    }
  };
  if (!t.allowed) return refuse(403, "Forbidden");
  absl::Cleanup end_connection = [&st] { st->EndConnection(); };
  const int up = ConnectTo(t.address, t.port);
  if (up < 0) return refuse(502, "Bad Gateway");
  st->hub->Track(up);
  absl::Cleanup close_up = [&st, up] {
    st->hub->Untrack(up);
    close(up);
  };
  if (connect_method && !WriteAll(fd, "HTTP/1.1 200 Connection established\r\n\r\n")) {
    return;
  }
  if (!first.empty() && !WriteAll(up, first)) return;
  NetworkEvent closed = e;
  closed.kind = NetworkEvent::Kind::kClosed;
  closed.bytes_out = static_cast<int64_t>(first.size());
  Pump(*st, fd, up, policy.max_bytes_per_second, &closed.bytes_out, &closed.bytes_in);
  st->hub->Emit(closed);
}

}  // namespace sandbox
