// Network policies (docs/network.md): the rules as values (NetworkRules),
// what the egress point reads off the wire (EgressWire), and the local
// provider's enforcement against real sandboxes, real nftables and real
// clients (curl, Python, node) talking to servers on the host's loopback
// (EgressTest).

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "adapters/api/network_policy.h"
#include "adapters/local/egress_wire.h"
#include "adapters/local/local_provider.h"
#include "tests/testing/temp_dir.h"

namespace sandbox {
namespace {

NetworkPolicy PolicyOf(const std::string& json) {
  auto p = ParseNetworkPolicy(nlohmann::json::parse(json), "network");
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : NetworkPolicy{};
}

// ---- NetworkRules: parsing, narrowing, deciding ------------------------------

TEST(NetworkRules, ParsesDomainsWildcardsAddressesAndPorts) {
  NetworkPolicy p = PolicyOf(R"({"allow_out": ["PyPI.org", "*.pythonhosted.org:443",
      "10.0.0.0/8", "1.2.3.4:80", "[2001:db8::1]:443", "2001:db8::/32"],
      "deny_out": ["10.1.0.0/16"], "hosts": {"files.test": "127.0.0.1"}, "max_connections": 4})");
  ASSERT_EQ(p.allow_out.size(), 6u);
  EXPECT_EQ(p.allow_out[0].text, "pypi.org");
  EXPECT_EQ(p.allow_out[1].text, "*.pythonhosted.org:443");
  EXPECT_EQ(p.allow_out[2].text, "10.0.0.0/8");
  EXPECT_EQ(p.allow_out[3].text, "1.2.3.4:80");
  EXPECT_EQ(p.allow_out[4].text, "[2001:db8::1]:443");
  EXPECT_EQ(p.allow_out[5].text, "2001:db8::/32");
  EXPECT_EQ(p.hosts.at("files.test"), "127.0.0.1");
  EXPECT_EQ(p.max_connections, 4);
  // Back and forth unchanged.
  auto again = ParseNetworkPolicy(NetworkPolicyJson(p), "network");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(NetworkPolicyJson(*again), NetworkPolicyJson(p));
}

TEST(NetworkRules, BadRulesAreRefusedNamingTheirPlace) {
  for (const char* bad : {R"({"allow_out": ["exa mple.com"]})", R"({"allow_out": ["1.2.3.4/33"]})",
                          R"({"allow_out": ["a.com:0"]})", R"({"allow_out": ["a.com:70000"]})",
                          R"({"deny_out": ["pypi.org"]})", R"({"hosts": {"x.test": "not-an-ip"}})",
                          R"({"allow_out": "pypi.org"})", R"({"max_connections": -1})",
                          R"({"allow": []})", R"({"allow_out": [7]})"}) {
    auto p = ParseNetworkPolicy(nlohmann::json::parse(bad), "tenants.a.network");
    ASSERT_FALSE(p.ok()) << bad;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(p.status().message(), "tenants.a.network")) << p.status();
  }
}

TEST(NetworkRules, WildcardsMatchAnyDepthBelowButNeverTheApex) {
  NetworkPolicy p = PolicyOf(R"({"allow_out": ["*.pythonhosted.org", "pypi.org:443"]})");
  EXPECT_TRUE(DecideName(p, "files.pythonhosted.org", 443).allowed);
  EXPECT_TRUE(DecideName(p, "a.b.pythonhosted.org.", 80).allowed);
  EXPECT_FALSE(DecideName(p, "pythonhosted.org", 443).allowed);
  EXPECT_FALSE(DecideName(p, "evilpythonhosted.org", 443).allowed);
  EXPECT_TRUE(DecideName(p, "PyPI.org", 443).allowed);
  EXPECT_FALSE(DecideName(p, "pypi.org", 80).allowed);
  EXPECT_TRUE(DecideName(p, "pypi.org", 0).allowed);  // DNS: any port
  EXPECT_EQ(DecideName(p, "pypi.org", 443).rule, "pypi.org:443");
  // An IP literal is never a name.
  EXPECT_FALSE(DecideName(PolicyOf(R"({"allow_all": true})"), "1.2.3.4", 80).allowed);
}

TEST(NetworkRules, AddressesFollowDenyThenReservedThenAllow) {
  BrokerEndpoints broker;
  broker.ports = {50051};
  auto ip = [](const char* s) { return *IpAddress::Parse(s); };
  NetworkPolicy all = PolicyOf(R"({"allow_all": true, "deny_out": ["203.0.113.0/24"]})");
  EXPECT_TRUE(DecideAddress(all, ip("93.184.216.34"), 443, AddressVia::kLiteral, broker).allowed);
  EXPECT_FALSE(DecideAddress(all, ip("203.0.113.9"), 443, AddressVia::kName, broker).allowed);
  // The always-denied ranges, also when a name resolves there.
  for (const char* reserved :
       {"169.254.169.254", "127.0.0.1", "10.1.2.3", "192.168.1.1", "172.16.0.1", "224.0.0.1", "::1",
        "fe80::1", "fd00::1", "::ffff:169.254.169.254"}) {
    NetDecision d = DecideAddress(all, ip(reserved), 80, AddressVia::kName, broker);
    EXPECT_FALSE(d.allowed) << reserved;
    EXPECT_TRUE(absl::StartsWith(d.rule, "always denied")) << reserved << ": " << d.rule;
  }
  EXPECT_EQ(DecideAddress(all, ip("169.254.169.254"), 80, AddressVia::kLiteral, broker).rule,
            "always denied: 169.254.0.0/16");
  // 0.0.0.0/0 does not name them; a CIDR inside one does.
  NetworkPolicy wide = PolicyOf(R"({"allow_out": ["0.0.0.0/0"]})");
  EXPECT_FALSE(DecideAddress(wide, ip("10.0.0.5"), 80, AddressVia::kLiteral, broker).allowed);
  NetworkPolicy lan = PolicyOf(R"({"allow_out": ["10.0.0.0/24:5432"]})");
  EXPECT_TRUE(DecideAddress(lan, ip("10.0.0.5"), 5432, AddressVia::kLiteral, broker).allowed);
  EXPECT_FALSE(DecideAddress(lan, ip("10.0.0.5"), 5433, AddressVia::kLiteral, broker).allowed);
  // A literal against domain rules only: refused; the same address
  // resolved for an allowed name: allowed.
  NetworkPolicy names = PolicyOf(R"({"allow_out": ["example.com"]})");
  EXPECT_FALSE(DecideAddress(names, ip("93.184.216.34"), 80, AddressVia::kLiteral, broker).allowed);
  EXPECT_TRUE(DecideAddress(names, ip("93.184.216.34"), 80, AddressVia::kName, broker).allowed);
  // Host entries may name loopback, never the broker's own ports.
  EXPECT_TRUE(DecideAddress(names, ip("127.0.0.1"), 8080, AddressVia::kHostEntry, broker).allowed);
  NetDecision ours = DecideAddress(all, ip("127.0.0.1"), 50051, AddressVia::kHostEntry, broker);
  EXPECT_FALSE(ours.allowed);
  EXPECT_EQ(ours.rule, "the broker's own listener");
}

TEST(NetworkRules, ARequestMayOnlyNarrowItsCeiling) {
  NetworkPolicy ceiling = PolicyOf(R"({"allow_out": ["*.example.com", "10.0.0.0/8:443",
      "pypi.org"], "deny_out": ["10.9.0.0/16"], "hosts": {"a.test": "127.0.0.1"},
      "max_connections": 8})");
  auto ok = NarrowNetworkPolicy(PolicyOf(R"({"allow_out": ["api.example.com", "*.x.example.com",
      "10.1.0.0/16:443"], "hosts": {"a.test": "127.0.0.1"}, "max_connections": 20})"),
                                ceiling);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->max_connections, 8);
  ASSERT_EQ(ok->deny_out.size(), 1u);  // the ceiling's deny rules stay
  EXPECT_EQ(ok->deny_out[0].text, "10.9.0.0/16");
  for (const char* wider : {R"({"allow_all": true})", R"({"allow_out": ["example.com"]})",
                            R"({"allow_out": ["10.0.0.0/8"]})", R"({"allow_out": ["*.org"]})",
                            R"({"hosts": {"a.test": "10.0.0.1"}})"}) {
    auto r = NarrowNetworkPolicy(PolicyOf(wider), ceiling);
    ASSERT_FALSE(r.ok()) << wider;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_TRUE(absl::StrContains(r.status().message(), "spec.network")) << r.status();
  }
  // Nothing asked of an empty ceiling is the default: allowed.
  EXPECT_TRUE(NarrowNetworkPolicy(NetworkPolicy{}, NetworkPolicy{}).ok());
}

// ---- EgressWire: the parsers of what sandboxed code sends -------------------

std::string Query(const std::string& name, uint16_t type) {
  std::string q = {'\x12', '\x34', '\x01', '\x00', '\x00', '\x01', 0, 0, 0, 0, 0, 0};
  for (absl::string_view label : absl::StrSplit(name, '.')) {
    q.push_back(static_cast<char>(label.size()));
    q.append(label.data(), label.size());
  }
  q.push_back(0);
  q.push_back(static_cast<char>(type >> 8));
  q.push_back(static_cast<char>(type & 0xff));
  q.append({0, 1});
  return q;
}

TEST(EgressWire, DnsQueriesAndAnswers) {
  const std::string q = Query("Files.Test", 1);
  auto parsed = egress::ParseDnsQuery(q);
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->name, "files.test");
  EXPECT_EQ(parsed->qtype, 1);
  EXPECT_EQ(parsed->id, 0x1234);
  const std::string a = egress::DnsAnswer(q, *parsed, htonl(0xc6120001), false);
  EXPECT_EQ(a.substr(0, 2), "\x12\x34");
  EXPECT_EQ(static_cast<uint8_t>(a[3]) & 0x0f, 0);  // NOERROR
  EXPECT_EQ(a[7], 1);                               // one answer
  EXPECT_EQ(a.substr(a.size() - 4), std::string("\xc6\x12\x00\x01", 4));
  const std::string nx = egress::DnsAnswer(q, *parsed, std::nullopt, true);
  EXPECT_EQ(static_cast<uint8_t>(nx[3]) & 0x0f, 3);  // NXDOMAIN
  EXPECT_EQ(nx.size(), q.size());
  // Garbage, answers, truncation and compression pointers are not queries.
  EXPECT_FALSE(egress::ParseDnsQuery("").has_value());
  EXPECT_FALSE(egress::ParseDnsQuery(q.substr(0, q.size() - 3)).has_value());
  std::string answer = q;
  answer[2] = '\x81';
  EXPECT_FALSE(egress::ParseDnsQuery(answer).has_value());
  std::string pointer = q.substr(0, 12) + "\xc0\x0c" + q.substr(q.size() - 4);
  EXPECT_FALSE(egress::ParseDnsQuery(pointer).has_value());
}

TEST(EgressWire, HttpHeadsNameTheirHost) {
  auto fb = egress::ParseFirstBytes(
      "GET /x HTTP/1.1\r\nUser-Agent: t\r\nhost: Files.Test:8080\r\n\r\nbody");
  EXPECT_EQ(fb.kind, egress::FirstBytes::Kind::kHttp);
  EXPECT_EQ(fb.name, "files.test");
  EXPECT_EQ(fb.method, "GET");
  EXPECT_EQ(fb.target, "/x");
  EXPECT_EQ(egress::ParseFirstBytes("GET /x HTTP/1.1\r\nHost: a").kind,
            egress::FirstBytes::Kind::kNeedMore);
  EXPECT_EQ(egress::ParseFirstBytes("GE").kind, egress::FirstBytes::Kind::kNeedMore);
  EXPECT_EQ(egress::ParseFirstBytes("SSH-2.0-OpenSSH\r\n").kind, egress::FirstBytes::Kind::kOther);
  auto c = egress::ParseFirstBytes("CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n");
  EXPECT_EQ(c.method, "CONNECT");
  auto hp = egress::SplitHostPort(c.target, 443);
  ASSERT_TRUE(hp.has_value());
  EXPECT_EQ(hp->first, "pypi.org");
  EXPECT_EQ(hp->second, 443);
  EXPECT_FALSE(egress::SplitHostPort("a:99999", 80).has_value());
  EXPECT_EQ(egress::SplitHostPort("[::1]:8080", 80)->first, "::1");
}

// A ClientHello as a TLS client sends it, with `sni`.
std::string ClientHello(const std::string& sni) {
  std::string ext;
  const uint16_t list_len = static_cast<uint16_t>(sni.size() + 3);
  ext += std::string{0, 0};  // server_name
  const uint16_t ext_len = static_cast<uint16_t>(list_len + 2);
  ext += std::string{static_cast<char>(ext_len >> 8), static_cast<char>(ext_len & 0xff)};
  ext += std::string{static_cast<char>(list_len >> 8), static_cast<char>(list_len & 0xff), 0};
  ext += std::string{static_cast<char>(sni.size() >> 8), static_cast<char>(sni.size() & 0xff)};
  ext += sni;
  std::string body = std::string{3, 3} + std::string(32, 'r') + std::string{0} +
                     std::string{0, 2, 0x13, 0x01} + std::string{1, 0};
  body += std::string{static_cast<char>(ext.size() >> 8), static_cast<char>(ext.size() & 0xff)};
  body += ext;
  std::string hs = std::string{1, 0, static_cast<char>(body.size() >> 8),
                               static_cast<char>(body.size() & 0xff)} +
                   body;
  return std::string{0x16, 3, 1, static_cast<char>(hs.size() >> 8),
                     static_cast<char>(hs.size() & 0xff)} +
         hs;
}

TEST(EgressWire, TlsClientHellosNameTheirServer) {
  const std::string hello = ClientHello("API.Example.com");
  auto fb = egress::ParseFirstBytes(hello);
  EXPECT_EQ(fb.kind, egress::FirstBytes::Kind::kTls);
  EXPECT_EQ(fb.name, "api.example.com");
  EXPECT_EQ(egress::ParseFirstBytes(hello.substr(0, 20)).kind, egress::FirstBytes::Kind::kNeedMore);
  // Every truncation and a corrupted length parse without harm.
  for (size_t n = 0; n <= hello.size(); ++n) (void)egress::ParseFirstBytes(hello.substr(0, n));
  std::string bad = hello;
  bad[60] = '\xff';
  (void)egress::ParseFirstBytes(bad);
}

// ---- EgressTest: real sandboxes, real nftables -------------------------------

// A loopback HTTP server: GET /hello says hello, /big sends `big_bytes`.
class LoopbackHttp {
 public:
  LoopbackHttp() {
    server_.Get("/hello", [](const httplib::Request& req, httplib::Response& res) {
      res.set_content(absl::StrCat("hello from ", req.get_header_value("Host")), "text/plain");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::yield();
  }
  ~LoopbackHttp() {
    server_.stop();
    thread_.join();
  }
  int port() const { return port_; }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

// A loopback TCP server that keeps the first bytes of each connection (a
// TLS ClientHello) and closes it.
class FirstBytesServer {
 public:
  FirstBytesServer() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    listen(fd_, 16);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      while (true) {
        const int c = accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        char buf[4096];
        const ssize_t n = read(c, buf, sizeof(buf));
        {
          absl::MutexLock l(&mu_);
          if (n > 0) got_.emplace_back(buf, static_cast<size_t>(n));
        }
        close(c);
      }
    });
  }
  ~FirstBytesServer() {
    shutdown(fd_, SHUT_RDWR);
    thread_.join();
    close(fd_);
  }
  int port() const { return port_; }
  std::vector<std::string> got() {
    absl::MutexLock l(&mu_);
    return got_;
  }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<std::string> got_ ABSL_GUARDED_BY(mu_);
};

class EgressTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LocalConfig c;
    c.workspace_root = dir_.path() + "/ws";
    c.uid_base = 640000;
    c.limits.pids = 64;
    c.limits.memory_bytes = int64_t{1} << 30;
    auto p = LocalProvider::Create(c);
    ASSERT_TRUE(p.ok()) << p.status();
    provider_ = std::move(*p);
    if (!provider_->egress_available()) GTEST_SKIP() << "egress needs root and nftables";
    ProviderHooks hooks;
    hooks.broker_ports = {broker_port_};
    hooks.on_network_event = [this](const NetworkEvent& e) {
      absl::MutexLock l(&mu_);
      events_.push_back(e);
    };
    provider_->SetHooks(std::move(hooks));
  }

  std::unique_ptr<Sandbox> Make(const std::string& policy_json) {
    SandboxSpec spec;
    spec.tenant = "t1";
    spec.session_id = "net";
    if (!policy_json.empty()) spec.network = PolicyOf(policy_json);
    auto sb = provider_->Create(spec);
    EXPECT_TRUE(sb.ok()) << sb.status();
    return sb.ok() ? std::move(*sb) : nullptr;
  }

  ExecResult Run(Sandbox* sb, Language lang, const std::string& code) {
    ExecRequest r;
    r.language = lang;
    r.code = code;
    r.timeout = absl::Seconds(30);
    auto res = sb->Exec(r);
    EXPECT_TRUE(res.ok()) << res.status();
    return res.ok() ? *res : ExecResult{};
  }

  std::vector<NetworkEvent> Events() {
    absl::MutexLock l(&mu_);
    return events_;
  }

  TempDir dir_;
  LoopbackHttp http_;
  LoopbackHttp broker_;  // stands for one of the broker's own listeners
  const int broker_port_ = broker_.port();
  std::unique_ptr<LocalProvider> provider_;
  absl::Mutex mu_;
  std::vector<NetworkEvent> events_ ABSL_GUARDED_BY(mu_);
};

TEST_F(EgressTest, WithoutRulesEveryKindOfAttemptFailsAtOnce) {
  auto sb = Make("");
  ASSERT_NE(sb, nullptr);
  ExecResult r = Run(sb.get(), Language::kShell,
                     "curl -sS -m 20 http://93.184.216.34/ >/dev/null 2>&1; echo tcp=$?\n"
                     "getent hosts pypi.org >/dev/null; echo dns=$?\n"
                     "python3 -c 'import socket; s=socket.socket(socket.AF_INET, "
                     "socket.SOCK_DGRAM); s.sendto(b\"x\", (\"8.8.8.8\", 53))' 2>/dev/null; "
                     "echo udp=$?\n");
  EXPECT_TRUE(absl::StrContains(r.output, "tcp=7")) << r.output;  // couldn't connect
  EXPECT_FALSE(absl::StrContains(r.output, "dns=0")) << r.output;
  EXPECT_FALSE(absl::StrContains(r.output, "udp=0")) << r.output;
  EXPECT_TRUE(Events().empty());
}

TEST_F(EgressTest, AnAllowListReachesItsNamesAndNothingElse) {
  const std::string port = absl::StrCat(http_.port());
  auto sb = Make(absl::StrCat(R"({"allow_out": ["files.test"], "hosts": {"files.test":
      "127.0.0.1", "other.test": "127.0.0.1", "broker.test": "127.0.0.1"}})"));
  ASSERT_NE(sb, nullptr);
  // curl through HTTP_PROXY, and transparently without it.
  EXPECT_EQ(Run(sb.get(), Language::kShell, "curl -sS http://files.test:" + port + "/hello").output,
            "hello from files.test:" + port);
  EXPECT_EQ(
      Run(sb.get(), Language::kShell, "curl -sS --noproxy '*' http://files.test:" + port + "/hello")
          .output,
      "hello from files.test:" + port);
  // Python: a raw socket (no proxy involved), and urllib.
  ExecResult raw = Run(sb.get(), Language::kPython,
                       "import socket\n"
                       "s = socket.create_connection(('files.test', " +
                           port +
                           "), timeout=10)\n"
                           "s.sendall(b'GET /hello HTTP/1.0\\r\\nHost: files.test\\r\\n\\r\\n')\n"
                           "print(s.makefile('rb').read().decode().split('\\r\\n\\r\\n')[1])\n");
  EXPECT_EQ(raw.output, "hello from files.test\n");
  ExecResult url = Run(sb.get(), Language::kPython,
                       "import urllib.request\n"
                       "print(urllib.request.urlopen('http://files.test:" +
                           port + "/hello', timeout=10).read().decode())\n");
  EXPECT_EQ(url.output, "hello from files.test:" + port + "\n");
  // node's fetch ignores proxy variables: transparent.
  ExecResult node = Run(sb.get(), Language::kNode,
                        "fetch('http://files.test:" + port +
                            "/hello').then(r => r.text()).then(t => console.log(t))"
                            ".catch(e => console.log('error', e.cause ? e.cause.code : e))");
  EXPECT_EQ(node.output, "hello from files.test:" + port + "\n");

  // Denied: a name not allowed (NXDOMAIN), an IP literal, the metadata
  // address, a Host that is not the name resolved, a CONNECT elsewhere.
  ExecResult denied =
      Run(sb.get(), Language::kShell,
          "getent hosts other.test; echo nx=$?\n"
          "curl -sS --noproxy '*' -m 10 http://93.184.216.34/; echo\n"
          "curl -sS --noproxy '*' -m 10 http://169.254.169.254/latest/meta-data/; echo\n"
          "curl -sS --noproxy '*' -H 'Host: other.test' http://files.test:" +
              port +
              "/hello; echo\n"
              "curl -sS -m 10 -p http://other.test:" +
              port + "/hello 2>&1 | head -c 200; echo\n");
  EXPECT_TRUE(absl::StrContains(denied.output, "nx=2")) << denied.output;
  EXPECT_TRUE(absl::StrContains(denied.output, "93.184.216.34:80 is not allowed")) << denied.output;
  EXPECT_TRUE(absl::StrContains(denied.output, "always denied: 169.254.0.0/16")) << denied.output;
  EXPECT_TRUE(absl::StrContains(denied.output, "the connection names other.test, not files.test"))
      << denied.output;
  EXPECT_TRUE(absl::StrContains(denied.output, "403")) << denied.output;
  EXPECT_FALSE(absl::StrContains(denied.output, "hello from")) << denied.output;

  // The broker's own port, even through a host entry allowed by name.
  auto to_broker = Make(R"({"allow_out": ["broker.test"], "hosts": {"broker.test": "127.0.0.1"}})");
  ASSERT_NE(to_broker, nullptr);
  EXPECT_TRUE(
      absl::StrContains(Run(to_broker.get(), Language::kShell,
                            absl::StrCat("curl -sS http://broker.test:", broker_port_, "/hello"))
                            .output,
                        "the broker's own listener"));

  // Metered and reported: allowed connections with their bytes, denials
  // with their rule, DNS denials.
  bool allowed = false, nx = false, metadata = false, bytes = false;
  for (const NetworkEvent& e : Events()) {
    EXPECT_EQ(e.tenant, "t1");
    if (e.kind == NetworkEvent::Kind::kConnection && e.allowed) allowed = true;
    if (e.kind == NetworkEvent::Kind::kDns && e.destination == "other.test") nx = true;
    if (!e.allowed && e.destination == "169.254.169.254") metadata = true;
    if (e.kind == NetworkEvent::Kind::kClosed && e.bytes_in > 0 && e.bytes_out > 0) bytes = true;
  }
  EXPECT_TRUE(allowed && nx && metadata && bytes);
}

TEST_F(EgressTest, RawPacketsOwnResolversUdpAndSniAreContained) {
  FirstBytesServer tls;
  const std::string port = absl::StrCat(tls.port());
  auto sb = Make(R"({"allow_out": ["files.test"], "hosts": {"files.test": "127.0.0.1"}})");
  ASSERT_NE(sb, nullptr);
  ExecResult r = Run(sb.get(), Language::kPython,
                     "import socket, ssl, subprocess\n"
                     "def attempt(name, f):\n"
                     "    try:\n"
                     "        f(); print(name, 'ok')\n"
                     "    except Exception as e:\n"
                     "        print(name, type(e).__name__)\n"
                     "attempt('raw', lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, "
                     "socket.IPPROTO_ICMP))\n"
                     "def udp():\n"
                     "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5)\n"
                     "    s.connect(('93.184.216.34', 443)); s.send(b'quic'); s.recv(10)\n"
                     "attempt('udp', udp)\n"
                     "def own_resolver():\n"
                     "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5)\n"
                     "    q = b'\\x12\\x34\\x01\\x00\\x00\\x01' + bytes(6) + "
                     "b'\\x04pypi\\x03org\\x00\\x00\\x01\\x00\\x01'\n"
                     "    s.sendto(q, ('8.8.8.8', 53)); a = s.recv(512)\n"
                     "    print('own-dns rcode', a[3] & 15)\n"
                     "attempt('dns', own_resolver)\n"
                     "def server_first():\n"
                     "    s = socket.create_connection(('10.1.2.3', 22), timeout=5); s.recv(10)\n"
                     "    if not s.recv(10): raise ConnectionError('closed')\n"
                     "attempt('literal', server_first)\n"
                     "def sni(name):\n"
                     "    c = ssl.create_default_context(); c.check_hostname = False; "
                     "c.verify_mode = ssl.CERT_NONE\n"
                     "    s = socket.create_connection(('files.test', " +
                         port +
                         "), timeout=5)\n"
                         "    c.wrap_socket(s, server_hostname=name)\n"
                         "attempt('sni-other', lambda: sni('other.test'))\n"
                         "attempt('sni-same', lambda: sni('files.test'))\n");
  EXPECT_TRUE(absl::StrContains(r.output, "raw PermissionError")) << r.output;
  // UDP (QUIC too) is rejected as it leaves: the send fails at once.
  EXPECT_TRUE(absl::StrContains(r.output, "udp PermissionError") ||
              absl::StrContains(r.output, "udp ConnectionRefusedError"))
      << r.output;
  // A query to a resolver of its own choosing is answered by the broker.
  EXPECT_TRUE(absl::StrContains(r.output, "own-dns rcode 3")) << r.output;
  EXPECT_FALSE(absl::StrContains(r.output, "literal ok")) << r.output;
  EXPECT_FALSE(absl::StrContains(r.output, "sni-other ok")) << r.output;
  // Only the ClientHello naming the allowed name reached the server.
  std::vector<std::string> got = tls.got();
  ASSERT_EQ(got.size(), 1u) << r.output;
  EXPECT_EQ(egress::ParseFirstBytes(got[0]).name, "files.test");
}

TEST_F(EgressTest, LiveUpdatesAndConnectionCapsApplyToNewConnections) {
  const std::string port = absl::StrCat(http_.port());
  auto sb = Make(R"({"allow_out": ["files.test"], "hosts": {"files.test": "127.0.0.1"},
      "max_connections": 1})");
  ASSERT_NE(sb, nullptr);
  const std::string get = "curl -sS --noproxy '*' http://files.test:" + port + "/hello";
  EXPECT_EQ(Run(sb.get(), Language::kShell, get).output, "hello from files.test:" + port);
  // One connection held open: the second is refused naming the cap.
  ExecResult capped = Run(
      sb.get(), Language::kPython,
      "import socket, subprocess\n"
      "held = socket.create_connection(('files.test', " +
          port +
          "))\n"
          "held.sendall(b'GET /hello HTTP/1.1\\r\\nHost: files.test\\r\\n\\r\\n')\n"
          "held.recv(10)\n"
          "print(subprocess.run(" +
          nlohmann::json(get).dump() + ", shell=True, capture_output=True, text=True).stdout)\n");
  EXPECT_TRUE(absl::StrContains(capped.output, "max_connections 1")) << capped.output;
  // Rules replaced while it runs.
  ASSERT_TRUE(sb->UpdateNetwork(PolicyOf(R"({"hosts": {"files.test": "127.0.0.1"}})")).ok());
  ExecResult after = Run(sb.get(), Language::kShell, get + "; echo rc=$?");
  EXPECT_TRUE(absl::StrContains(after.output, "rc=6")) << after.output;  // no such name now
  // A session made without rules has nothing to update.
  auto plain = Make("");
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(plain->UpdateNetwork(PolicyOf(R"({"allow_all": true})")).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace sandbox
