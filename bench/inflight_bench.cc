// Calls held in flight at once against a running broker (issue: thousands
// of calls in flight). Fires N calls together with the callback client API
// (no client thread per call), then reports errors, latency percentiles and
// the broker process's threads and RSS sampled while the calls are held.
//
//   inflight_bench --addr 127.0.0.1:50051 --pid PID --calls 5000 --sessions 50
//                  --code 'x' [--shell] [--start] [--token T] [--baseline-ms 3000]
//                  [--floor bash|bash-login]
//
// --start starts every session first (its create is not timed), --shell
// sends Shell instead of Run, --baseline-ms prints p50 as a ratio against
// that duration (e.g. the `sleep 3` the calls run).
//
// --mcp PORT sends the calls as MCP tools/call requests (2026-07-28, JSON
// answers) over HTTP/1.1 to the broker's MCP listener instead, one
// connection per call, all read by this one thread (epoll); --tool names
// the tool (default sandbox_echo_run).
//
// --floor bash|bash-login then measures, in the same run right after, the
// machine's own floor: N `bash -c CODE` (or `bash -l -c CODE`, what E2B's
// SDK sends) started at once straight on the host, no broker, no sandbox,
// no provider; p50 is reported beside the broker's and as a ratio to it.
// It also reports what one process start costs on this machine (200
// `/bin/true` in a row) and, on x86-64, one `cpuid` instruction: in a
// nested VM each one exits to the hypervisor, and glibc's start-up in every
// exec runs about a hundred of them (its cache and feature probes).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/create_channel.h"
#include "sandboxbroker/v1/broker.grpc.pb.h"

namespace pb = ::sandboxbroker::v1;

namespace {

struct Proc {
  int threads = 0;
  int64_t rss_kib = 0;
};

Proc ReadProc(int pid) {
  Proc p;
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Threads:", 0) == 0) p.threads = std::atoi(line.c_str() + 8);
    if (line.rfind("VmRSS:", 0) == 0) p.rss_kib = std::atoll(line.c_str() + 6);
  }
  return p;
}

// N copies of `argv` started at once; each one's time from the first start
// to its exit, in ms, sorted. Empty if any could not start.
std::vector<double> SpawnAll(int n, const std::vector<std::string>& args, const std::string& home) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // A clean environment: the host user's profile is not the sandbox's.
  std::string path = "PATH=/usr/local/bin:/usr/bin:/bin", h = "HOME=" + home, lang = "LANG=C.UTF-8";
  char* envp[] = {path.data(), h.data(), lang.data(), nullptr};
  const auto t0 = std::chrono::steady_clock::now();
  int started = 0;
  for (int i = 0; i < n; ++i) {
    pid_t pid;
    if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), envp) == 0) ++started;
  }
  std::vector<double> ms;
  int status;
  while (static_cast<int>(ms.size()) < started && waitpid(-1, &status, 0) > 0) {
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  if (started < n) ms.clear();
  std::sort(ms.begin(), ms.end());
  return ms;
}

// One process start on this machine: median ms of 200 `/bin/true` started
// and waited for one after another.
double ExecCostMs() {
  char* argv[] = {const_cast<char*>("/bin/true"), nullptr};
  char* envp[] = {nullptr};
  std::vector<double> ms;
  for (int i = 0; i < 200; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    pid_t pid;
    int status;
    if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv, envp) != 0) return 0;
    if (waitpid(pid, &status, 0) != pid) return 0;
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// One `cpuid` instruction in microseconds (0 where there is none).
double CpuidCostUs() {
#if defined(__x86_64__)
  constexpr int kN = 2000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kN; ++i) {
    unsigned a = 4, b, c = i & 3, d;
    // volatile: <cpuid.h>'s macro is not, and clang drops it when unused.
    asm volatile("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d));
  }
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
         kN;
#else
  return 0;
#endif
}

std::string Flag(int argc, char** argv, const std::string& name, const std::string& def) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (argv[i] == "--" + name) return argv[i + 1];
  }
  return def;
}
bool Has(int argc, char** argv, const std::string& name) {
  for (int i = 1; i < argc; ++i) {
    if (argv[i] == "--" + name) return true;
  }
  return false;
}

// The q-quantile of sorted `ms` (0 when empty).
double Pct(const std::vector<double>& ms, double q) {
  return ms.empty() ? 0.0 : ms[std::min(ms.size() - 1, size_t(q * ms.size()))];
}

// The broker's threads and RSS before the burst and at its peak.
void PrintGrowth(const Proc& before, const Proc& peak, int calls) {
  std::printf("  broker threads %d -> peak %d; RSS %lld KiB -> peak %lld KiB (%.1f KiB per call)\n",
              before.threads, peak.threads, static_cast<long long>(before.rss_kib),
              static_cast<long long>(peak.rss_kib), double(peak.rss_kib - before.rss_kib) / calls);
}

// `s` as the inside of a JSON string.
std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrCat("\\u00", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
    } else {
      out += c;
    }
  }
  return out;
}

// One MCP tools/call per connection to 127.0.0.1:port, all written first,
// then every answer read to EOF on this thread. Each call's time from t0 to
// its answer's end, in ms (negative: failed), in call order.
std::vector<double> McpCalls(int port, int calls, int sessions, const std::string& prefix,
                             const std::string& tool, const std::string& code,
                             const std::string& token, std::chrono::steady_clock::time_point t0,
                             std::string* first_error) {
  std::vector<double> ms(calls, -1);
  std::vector<std::string> got(calls);
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  int open = 0;
  for (int i = 0; i < calls; ++i) {
    const std::string id = std::to_string(i);
    std::string body = absl::StrCat(
        R"({"jsonrpc":"2.0","id":)", id, R"(,"method":"tools/call","params":{"name":")", tool,
        R"(","arguments":{"code":")", JsonEscape(code), R"(","session":")", prefix, "-",
        i % sessions, R"("},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",)",
        R"("io.modelcontextprotocol/clientCapabilities":{}}}})");
    std::string req =
        absl::StrCat("POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n",
                     "Accept: application/json\r\nMCP-Protocol-Version: 2026-07-28\r\n",
                     "Mcp-Method: tools/call\r\nMcp-Name: ", tool, "\r\nConnection: close\r\n",
                     token.empty() ? "" : absl::StrCat("Authorization: Bearer ", token, "\r\n"),
                     "Content-Length: ", body.size(), "\r\n\r\n", body);
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
      if (first_error->empty()) *first_error = absl::StrCat("connect/write: errno ", errno);
      if (fd >= 0) close(fd);
      continue;
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = (static_cast<uint64_t>(i) << 32) | static_cast<uint32_t>(fd);
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    ++open;
  }
  std::vector<epoll_event> evs(256);
  char buf[8192];
  while (open > 0) {
    const int n = epoll_wait(ep, evs.data(), static_cast<int>(evs.size()), 130000);
    if (n <= 0) break;
    for (int k = 0; k < n; ++k) {
      const int i = static_cast<int>(evs[k].data.u64 >> 32);
      const int fd = static_cast<int>(evs[k].data.u64 & 0xffffffffu);
      const ssize_t r = read(fd, buf, sizeof(buf));
      if (r > 0) {
        got[i].append(buf, static_cast<size_t>(r));
        continue;
      }
      close(fd);
      --open;
      const bool ok = got[i].rfind("HTTP/1.1 200", 0) == 0 &&
                      got[i].find(R"("isError":false)") != std::string::npos;
      if (ok) {
        ms[i] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count();
      } else if (first_error->empty()) {
        *first_error = got[i].substr(0, 300);
      }
    }
  }
  close(ep);
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string addr = Flag(argc, argv, "addr", "127.0.0.1:50051");
  const int pid = std::atoi(Flag(argc, argv, "pid", "0").c_str());
  const int calls = std::atoi(Flag(argc, argv, "calls", "1000").c_str());
  const int sessions = std::max(1, std::atoi(Flag(argc, argv, "sessions", "10").c_str()));
  const std::string code = Flag(argc, argv, "code", "x");
  const std::string token = Flag(argc, argv, "token", "");
  const std::string prefix = Flag(argc, argv, "prefix", "inflight");
  const double baseline_ms = std::atof(Flag(argc, argv, "baseline-ms", "0").c_str());
  const bool shell = Has(argc, argv, "shell");
  // One channel per 100 calls (servers may cap concurrent streams per
  // connection); each its own connection.
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<pb::SandboxBroker::Stub>> stubs;
  for (int i = 0; i < (calls + 99) / 100; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("bench.channel", i);
    channels.push_back(grpc::CreateCustomChannel(addr, grpc::InsecureChannelCredentials(), args));
    stubs.push_back(pb::SandboxBroker::NewStub(channels.back()));
  }
  auto session = [&](int i) { return absl::StrCat(prefix, "-", i % sessions); };
  if (Has(argc, argv, "start")) {
    // Started in parallel, 32 at a time.
    std::atomic<int> next{0}, failed{0};
    std::vector<double> start_ms(sessions);  // each start's own time, by start order
    const auto s0 = std::chrono::steady_clock::now();
    std::vector<std::thread> ts;
    for (int t = 0; t < 32; ++t) {
      ts.emplace_back([&] {
        for (int i; (i = next++) < sessions;) {
          grpc::ClientContext ctx;
          if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
          pb::StartSessionRequest req;
          req.set_session_id(session(i));
          pb::SessionInfo info;
          const auto c0 = std::chrono::steady_clock::now();
          if (!stubs[0]->StartSession(&ctx, req, &info).ok()) ++failed;
          start_ms[i] =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c0)
                  .count();
        }
      });
    }
    for (auto& t : ts) t.join();
    if (failed > 0) std::fprintf(stderr, "%d session starts failed\n", failed.load());
    // How a start's cost moves as sessions accumulate: the first and the
    // last tenth of them.
    const int tenth = std::max(1, sessions / 10);
    auto mean = [&](int from) {
      double sum = 0;
      for (int i = from; i < from + tenth; ++i) sum += start_ms[i];
      return sum / tenth;
    };
    std::printf(
        "  %d sessions started in %.1f s, 32 at a time; mean start: first %d %.0f ms, last %d %.0f "
        "ms\n",
        sessions, std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count(),
        tenth, mean(0), tenth, mean(sessions - tenth));
    std::fprintf(stderr, "sessions started; firing\n");  // a mark for profilers
  }
  const Proc before = pid > 0 ? ReadProc(pid) : Proc{};
  if (Has(argc, argv, "mcp")) {
    const int port = std::atoi(Flag(argc, argv, "mcp", "0").c_str());
    const std::string tool = Flag(argc, argv, "tool", "sandbox_echo_run");
    std::atomic<bool> done{false};
    Proc peak = before;
    std::thread sampler([&] {
      while (!done && pid > 0) {
        Proc p = ReadProc(pid);
        peak.threads = std::max(peak.threads, p.threads);
        peak.rss_kib = std::max(peak.rss_kib, p.rss_kib);
        usleep(20000);
      }
    });
    std::string first_error;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<double> all =
        McpCalls(port, calls, sessions, prefix, tool, code, token, t0, &first_error);
    done = true;
    sampler.join();
    std::vector<double> ms;
    for (double m : all) {
      if (m >= 0) ms.push_back(m);
    }
    std::sort(ms.begin(), ms.end());
    const int errors = calls - static_cast<int>(ms.size());
    std::printf("mcp calls %d sessions %d: errors %d%s%s\n", calls, sessions, errors,
                errors ? " first: " : "", first_error.c_str());
    std::printf("  p50 %.0f ms  p99 %.0f ms  max %.0f ms\n", Pct(ms, 0.5), Pct(ms, 0.99),
                ms.empty() ? 0.0 : ms.back());
    if (baseline_ms > 0)
      std::printf("  p50 / %.0f ms = %.3fx\n", baseline_ms, Pct(ms, 0.5) / baseline_ms);
    if (pid > 0) PrintGrowth(before, peak, calls);
    return errors == 0 ? 0 : 1;
  }

  struct Call {
    grpc::ClientContext ctx;
    pb::RunRequest run;
    pb::ShellRequest sh;
    pb::RunResult resp;
    grpc::Status status;
    double ms = 0;
  };
  std::vector<std::unique_ptr<Call>> all(calls);
  absl::Mutex mu;
  int pending = calls;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) {
    all[i] = std::make_unique<Call>();
    Call* c = all[i].get();
    if (!token.empty()) c->ctx.AddMetadata("authorization", "Bearer " + token);
    c->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    auto done = [c, t0, &mu, &pending](grpc::Status s) {
      c->status = s;
      c->ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      absl::MutexLock l(&mu);
      --pending;
    };
    pb::SandboxBroker::Stub* stub = stubs[i / 100].get();
    if (shell) {
      c->sh.set_session_id(session(i));
      c->sh.set_command(code);
      stub->async()->Shell(&c->ctx, &c->sh, &c->resp, done);
    } else {
      c->run.set_session_id(session(i));
      c->run.set_code(code);
      stub->async()->Run(&c->ctx, &c->run, &c->resp, done);
    }
  }
  const double fired_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  // Sample the broker while the calls are held.
  Proc peak = before;
  for (;;) {
    {
      absl::MutexLock l(&mu);
      if (pending == 0) break;
    }
    if (pid > 0) {
      Proc p = ReadProc(pid);
      peak.threads = std::max(peak.threads, p.threads);
      peak.rss_kib = std::max(peak.rss_kib, p.rss_kib);
    }
    usleep(20000);
  }
  std::vector<double> ms;
  int errors = 0;
  std::string first_error;
  for (auto& c : all) {
    if (!c->status.ok()) {
      if (errors++ == 0) first_error = c->status.error_message();
      continue;
    }
    ms.push_back(c->ms);
  }
  std::sort(ms.begin(), ms.end());
  auto pct = [&](double q) { return Pct(ms, q); };
  std::printf("calls %d sessions %d: errors %d%s%s\n", calls, sessions, errors,
              errors ? " first: " : "", first_error.c_str());
  std::printf("  fired in %.0f ms; p50 %.0f ms  p99 %.0f ms  max %.0f ms\n", fired_ms, pct(0.5),
              pct(0.99), ms.empty() ? 0.0 : ms.back());
  if (baseline_ms > 0)
    std::printf("  p50 / %.0f ms = %.3fx\n", baseline_ms, pct(0.5) / baseline_ms);
  if (pid > 0) PrintGrowth(before, peak, calls);
  const std::string floor = Flag(argc, argv, "floor", "");
  if (!floor.empty()) {
    std::vector<std::string> args = {"/bin/bash"};
    if (floor == "bash-login") args.push_back("-l");
    args.insert(args.end(), {"-c", code});
    char home_tmpl[] = "/tmp/inflight-floor-XXXXXX";
    const char* home = mkdtemp(home_tmpl);
    std::vector<double> f = SpawnAll(calls, args, home ? home : "/nonexistent");
    if (home) rmdir(home);
    if (f.empty()) {
      std::printf("  floor: could not start %d processes\n", calls);
      return 1;
    }
    const double f50 = f[f.size() / 2];
    std::printf("  floor (%d x %s -c, no broker, no sandbox): p50 %.0f ms  p99 %.0f ms", calls,
                floor == "bash-login" ? "bash -l" : "bash", f50,
                f[std::min(f.size() - 1, size_t(0.99 * f.size()))]);
    if (baseline_ms > 0) std::printf(" (%.3fx)", f50 / baseline_ms);
    std::printf("; broker p50 / floor p50 = %.3fx\n", pct(0.5) / f50);
    const double exec_ms = ExecCostMs();
    if (exec_ms > 0) {
      std::printf("  this machine: a process start (/bin/true, 200 in a row) %.2f ms", exec_ms);
    } else {
      std::printf("  this machine: /bin/true could not be started");
    }
    const double cpuid_us = CpuidCostUs();
    if (cpuid_us > 0) std::printf("; one cpuid %.2f us", cpuid_us);
    std::printf("\n");
  }
  return errors == 0 ? 0 : 1;
}
