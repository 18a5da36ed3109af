// egress_bench: what a network policy costs a local sandbox (docs/network.md),
// as ratios against the true limit measured side by side in the same run:
// the same client on the host, talking to the same loopback server without
// the egress point. The issue's bars: an allowed 100 MiB download at least
// 0.5x the host's throughput, and connection setup at most +2 ms p50.
//
//   egress_bench [--mib N] [--connections C] [--rounds R]
//                defaults 100 MiB, 200 connections, 3 rounds
//   egress_bench --smoke        8 MiB, 20 connections, 1 round (ctest)
//
// Download: curl -o /dev/null, its own time_total. Setup: a Python loop of
// connect, a one-line HTTP/1.0 request, read to the end (a 1-byte body):
// p50 per connection. Rounds alternate host and sandbox so that drift on a
// shared machine falls on both. Needs root (the egress point's namespace).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "adapters/local/local_provider.h"
#include "common/log.h"

namespace sandbox {
namespace {

// GET /<n> answers n bytes; one thread per connection.
class ByteServer {
 public:
  ByteServer() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    listen(fd_, 512);
    socklen_t len = sizeof(a);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      while (true) {
        const int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) return;
        std::thread([c] { Serve(c); }).detach();
      }
    });
  }
  ~ByteServer() {
    shutdown(fd_, SHUT_RDWR);
    thread_.join();
    close(fd_);
  }
  int port() const { return port_; }

 private:
  static void Serve(int c) {
    std::string head;
    char buf[4096];
    while (head.find("\r\n\r\n") == std::string::npos) {
      const ssize_t n = read(c, buf, sizeof(buf));
      if (n <= 0) return (void)close(c);
      head.append(buf, static_cast<size_t>(n));
    }
    int64_t size = 0;
    const size_t slash = head.find('/');
    (void)absl::SimpleAtoi(head.substr(slash + 1, head.find(' ', slash) - slash - 1), &size);
    const std::string h =
        absl::StrCat("HTTP/1.0 200 OK\r\nContent-Length: ", size, "\r\nConnection: close\r\n\r\n");
    bool ok = send(c, h.data(), h.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(h.size());
    static const std::string chunk(1 << 20, 'x');
    while (ok && size > 0) {
      const ssize_t n = send(c, chunk.data(), std::min<int64_t>(size, chunk.size()), MSG_NOSIGNAL);
      ok = n > 0;
      size -= n;
    }
    close(c);
  }
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

std::string HostRun(const std::string& command) {
  std::string out;
  FILE* f = popen(command.c_str(), "r");
  if (f == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  pclose(f);
  return out;
}

std::string SandboxRun(Sandbox* sb, const std::string& command) {
  ExecRequest r;
  r.language = Language::kShell;
  r.code = command;
  r.timeout = absl::Minutes(5);
  r.max_output_bytes = 1 << 20;
  auto res = sb->Exec(r);
  return res.ok() ? res->output : "";
}

std::string SetupScript(const std::string& host, int port, int n) {
  return absl::StrCat(
      "python3 - <<'EOF'\n", "import socket, time\n", "t = []\n", "for i in range(", n, "):\n",
      "    a = time.perf_counter()\n", "    s = socket.create_connection(('", host, "', ", port,
      "))\n", "    s.sendall(b'GET /1 HTTP/1.0\\r\\n\\r\\n')\n", "    while s.recv(4096): pass\n",
      "    s.close()\n", "    t.append(time.perf_counter() - a)\n", "t.sort()\n",
      "print('%.4f' % (t[len(t) // 2] * 1000))\n", "EOF\n");
}

double Number(const std::string& s) {
  double v = 0;
  return absl::SimpleAtod(absl::StripAsciiWhitespace(s), &v) ? v : -1;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Main(int argc, char** argv) {
  int64_t mib = 100;
  int connections = 200;
  int rounds = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--smoke") {
      mib = 8;
      connections = 20;
      rounds = 1;
    } else if (a == "--mib" && i + 1 < argc) {
      mib = std::atoll(argv[++i]);
    } else if (a == "--connections" && i + 1 < argc) {
      connections = std::atoi(argv[++i]);
    } else if (a == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    }
  }
  SetLogLevel(LogLevel::kWarning);
  char dir[] = "/tmp/egress-bench-XXXXXX";
  if (mkdtemp(dir) == nullptr) return 1;
  chmod(dir, 0755);
  LocalConfig c;
  c.workspace_root = std::string(dir) + "/ws";
  c.uid_base = 660000;
  auto provider = LocalProvider::Create(c);
  if (!provider.ok() || !(*provider)->egress_available()) {
    fprintf(stderr, "egress_bench: needs root and nftables (%s)\n",
            provider.ok() ? "no egress" : std::string(provider.status().message()).c_str());
    return 1;
  }
  ByteServer server;
  SandboxSpec spec;
  spec.session_id = "bench";
  auto policy = ParseNetworkPolicy(
      nlohmann::json::parse(
          R"({"allow_out": ["files.test"], "hosts": {"files.test": "127.0.0.1"}})"),
      "network");
  spec.network = *policy;
  auto sb = (*provider)->Create(spec);
  if (!sb.ok()) {
    fprintf(stderr, "egress_bench: %s\n", std::string(sb.status().message()).c_str());
    return 1;
  }
  const int64_t bytes = mib << 20;
  auto curl = [&](const std::string& host) {
    return absl::StrCat(
        "curl -sS --noproxy '*' -o /dev/null -w '%{size_download} %{time_total}' "
        "http://",
        host, ":", server.port(), "/", bytes);
  };
  std::vector<double> ratios, extras;
  printf(
      "round  download: host MiB/s  sandbox MiB/s  ratio   setup p50: host ms  sandbox ms  "
      "extra\n");
  for (int r = 0; r < rounds; ++r) {
    std::vector<std::string> host = absl::StrSplit(HostRun(curl("127.0.0.1")), ' ');
    std::vector<std::string> box = absl::StrSplit(SandboxRun(sb->get(), curl("files.test")), ' ');
    if (host.size() != 2 || box.size() != 2 || Number(host[0]) != bytes ||
        Number(box[0]) != bytes) {
      fprintf(stderr, "egress_bench: a download did not complete\n");
      return 1;
    }
    const double host_rate = mib / Number(host[1]);
    const double box_rate = mib / Number(box[1]);
    const double host_ms = Number(HostRun(SetupScript("127.0.0.1", server.port(), connections)));
    const double box_ms =
        Number(SandboxRun(sb->get(), SetupScript("files.test", server.port(), connections)));
    if (host_ms <= 0 || box_ms <= 0) {
      fprintf(stderr, "egress_bench: the setup loop failed\n");
      return 1;
    }
    ratios.push_back(box_rate / host_rate);
    extras.push_back(box_ms - host_ms);
    printf("%5d  %20.0f  %13.0f  %5.2fx  %18.2f  %10.2f  %+5.2f ms\n", r + 1, host_rate, box_rate,
           box_rate / host_rate, host_ms, box_ms, box_ms - host_ms);
  }
  printf(
      "median: download %.2fx the host's throughput (bar >= 0.5x), setup %+.2f ms p50 "
      "(bar <= +2 ms)\n",
      Median(ratios), Median(extras));
  (void)(*sb)->Destroy();
  sb->reset();
  provider->reset();
  HostRun(absl::StrCat("rm -rf ", dir));
  return 0;
}

}  // namespace
}  // namespace sandbox

int main(int argc, char** argv) { return sandbox::Main(argc, argv); }
