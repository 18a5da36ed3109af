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
// --floor bash|bash-login then measures, in the same run right after, the
// machine's own floor: N `bash -c CODE` (or `bash -l -c CODE`, what E2B's
// SDK sends) started at once straight on the host, no broker, no sandbox,
// no provider; p50 is reported beside the broker's and as a ratio to it.

#include <spawn.h>
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
    std::vector<std::thread> ts;
    for (int t = 0; t < 32; ++t) {
      ts.emplace_back([&] {
        for (int i; (i = next++) < sessions;) {
          grpc::ClientContext ctx;
          if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
          pb::StartSessionRequest req;
          req.set_session_id(session(i));
          pb::SessionInfo info;
          if (!stubs[0]->StartSession(&ctx, req, &info).ok()) ++failed;
        }
      });
    }
    for (auto& t : ts) t.join();
    if (failed > 0) std::fprintf(stderr, "%d session starts failed\n", failed.load());
    std::fprintf(stderr, "sessions started; firing\n");  // a mark for profilers
  }
  const Proc before = pid > 0 ? ReadProc(pid) : Proc{};

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
  auto pct = [&](double q) {
    return ms.empty() ? 0.0 : ms[std::min(ms.size() - 1, size_t(q * ms.size()))];
  };
  std::printf("calls %d sessions %d: errors %d%s%s\n", calls, sessions, errors,
              errors ? " first: " : "", first_error.c_str());
  std::printf("  fired in %.0f ms; p50 %.0f ms  p99 %.0f ms  max %.0f ms\n", fired_ms, pct(0.5),
              pct(0.99), ms.empty() ? 0.0 : ms.back());
  if (baseline_ms > 0)
    std::printf("  p50 / %.0f ms = %.3fx\n", baseline_ms, pct(0.5) / baseline_ms);
  if (pid > 0) {
    std::printf(
        "  broker threads %d -> peak %d; RSS %lld KiB -> peak %lld KiB (%.1f KiB per call)\n",
        before.threads, peak.threads, static_cast<long long>(before.rss_kib),
        static_cast<long long>(peak.rss_kib), double(peak.rss_kib - before.rss_kib) / calls);
  }
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
  }
  return errors == 0 ? 0 : 1;
}
