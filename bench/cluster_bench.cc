// More than one broker, measured (docs/cluster.md):
// three sandbox-brokerd replicas (processes, echo provider) on a real etcd
// started here on loopback.
//
//   1. Latency, one caller, sequential Run calls: to the session's owner
//      (direct) vs through another replica (forwarded: two gRPC hops). The
//      floor of a forward is one more hop, so the ratio says what the
//      forward costs beyond that.
//   2. Throughput, closed loop, `--concurrency` callers: spread over the
//      three replicas (each caller's session owned where it calls), vs all
//      on one replica, vs every call forwarded. On a machine with fewer
//      cores than replicas, three replicas share the same cores: the ratio
//      shows the cluster's overhead, not its scale-out.
//   3. Takeover: the owner is killed with SIGKILL; how long until a call for
//      its session succeeds through another replica (member_ttl_seconds is
//      the floor).
//
//   cluster_bench [--brokerd PATH] [--calls N] [--seconds S] [--concurrency C]
//                 [--ttl SECONDS]
// Reports; asserts nothing (exit 1 only when something fails to start).

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/create_channel.h"
#include "nlohmann/json.hpp"
#include "sandboxbroker/v1/broker.grpc.pb.h"
#include "tests/server/etcd_fixture.h"
#include "tests/testing/child_process.h"

namespace sandbox {
namespace {

namespace pb = ::sandboxbroker::v1;
using nlohmann::json;

struct Options {
  std::string brokerd;
  int calls = 2000;
  double seconds = 5;
  int concurrency = 32;
  int ttl = 2;
};

std::string ExeDir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  std::string p(buf, n > 0 ? static_cast<size_t>(n) : 0);
  return p.substr(0, p.rfind('/'));
}

struct Replica {
  std::unique_ptr<Proc> proc;
  std::unique_ptr<pb::SandboxBroker::Stub> stub;
};

bool StartReplica(const Options& o, const std::string& dir, const std::string& etcd, int i,
                  Replica* r) {
  json c = {
      {"listen", "127.0.0.1:0"},
      {"default_provider", "echo"},
      {"log_level", "info"},
      {"max_sessions_per_tenant", 100000},
      {"state",
       {{"backend", "etcd"},
        {"etcd", {{"endpoints", {etcd}}, {"prefix", "/bench/"}, {"member_ttl_seconds", o.ttl}}}}},
      {"cluster", {{"member_id", absl::StrCat("r", i)}, {"token", "bench-cluster-token-0123"}}},
      {"providers", {{"echo", json::object()}}}};
  const std::string cfg = absl::StrCat(dir, "/r", i, ".json");
  std::ofstream(cfg) << c.dump();
  const std::string err = absl::StrCat(dir, "/r", i, ".err");
  r->proc = std::make_unique<Proc>(std::vector<std::string>{o.brokerd, "--config", cfg},
                                   dir + "/out", err);
  const std::string addr = WaitForServingAddress(err, absl::Seconds(30));
  if (addr.empty()) {
    fprintf(stderr, "replica r%d did not start:\n%s\n", i, ReadAll(err).c_str());
    return false;
  }
  grpc::ChannelArguments args;
  args.SetInt("grpc.use_local_subchannel_pool", 1);
  r->stub = pb::SandboxBroker::NewStub(
      grpc::CreateCustomChannel(addr, grpc::InsecureChannelCredentials(), args));
  return true;
}

grpc::Status Run(pb::SandboxBroker::Stub* stub, const std::string& session) {
  pb::RunRequest r;
  r.set_session_id(session);
  r.set_code("x");
  pb::RunResult out;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  return stub->Run(&ctx, r, &out);
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// Sequential calls; latencies in microseconds.
std::vector<double> Sequential(pb::SandboxBroker::Stub* stub, const std::string& session, int n,
                               int* errors) {
  std::vector<double> us;
  us.reserve(n);
  for (int i = 0; i < n; ++i) {
    const absl::Time t = absl::Now();
    if (!Run(stub, session).ok()) ++*errors;
    us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t));
  }
  return us;
}

// Closed loop: caller k calls stubs[pick(k)] for session sessions[k].
double Throughput(const Options& o, const std::vector<pb::SandboxBroker::Stub*>& stubs,
                  const std::vector<std::string>& sessions, int* errors) {
  std::atomic<int64_t> done{0};
  std::atomic<int> errs{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int k = 0; k < o.concurrency; ++k) {
    threads.emplace_back([&, k] {
      while (!stop.load(std::memory_order_relaxed)) {
        if (Run(stubs[k], sessions[k]).ok()) {
          ++done;
        } else {
          ++errs;
        }
      }
    });
  }
  const absl::Time start = absl::Now();
  absl::SleepFor(absl::Seconds(o.seconds));
  stop = true;
  for (auto& t : threads) t.join();
  *errors += errs.load();
  return done.load() / absl::ToDoubleSeconds(absl::Now() - start);
}

int Main(const Options& o) {
  if (!EtcdInstalled()) {
    fprintf(stderr, "%s is not installed\n", kEtcdPath);
    return 1;
  }
  TempDir dir;
  EtcdServer etcd;
  if (!etcd.Start()) {
    fprintf(stderr, "etcd did not start\n");
    return 1;
  }
  Replica r[3];
  for (int i = 0; i < 3; ++i) {
    if (!StartReplica(o, dir.path(), etcd.endpoint(), i, &r[i])) return 1;
  }
  printf(
      "cluster_bench: 3 replicas (echo provider), 1 etcd member, member_ttl_seconds %d, %u cores\n",
      o.ttl, std::thread::hardware_concurrency());
  int errors = 0;

  // Each caller's session is first touched (so owned) where it is meant to be.
  const int c = o.concurrency;
  std::vector<std::string> spread(c), on_r0(c);
  std::vector<pb::SandboxBroker::Stub*> spread_stubs(c), r0_stubs(c), forward_stubs(c);
  for (int k = 0; k < c; ++k) {
    spread[k] = absl::StrCat("spread-", k);
    spread_stubs[k] = r[k % 3].stub.get();
    if (!Run(spread_stubs[k], spread[k]).ok()) ++errors;
    on_r0[k] = absl::StrCat("r0-", k);
    r0_stubs[k] = r[0].stub.get();
    forward_stubs[k] = r[1 + k % 2].stub.get();
    if (!Run(r0_stubs[k], on_r0[k]).ok()) ++errors;
  }

  printf("\n[1] latency, one caller, %d sequential Run calls each\n", o.calls);
  (void)Sequential(r[0].stub.get(), on_r0[0], 200, &errors);  // warm up both paths
  (void)Sequential(r[1].stub.get(), on_r0[0], 200, &errors);
  std::vector<double> direct = Sequential(r[0].stub.get(), on_r0[0], o.calls, &errors);
  std::vector<double> fwd = Sequential(r[1].stub.get(), on_r0[0], o.calls, &errors);
  printf("  %-28s %10s %10s\n", "", "p50 us", "p99 us");
  printf("  %-28s %10.0f %10.0f\n", "direct (to the owner)", Percentile(direct, 0.5),
         Percentile(direct, 0.99));
  printf("  %-28s %10.0f %10.0f\n", "forwarded (via r1)", Percentile(fwd, 0.5),
         Percentile(fwd, 0.99));
  printf("  forwarded / direct p50: %.2fx (floor: 2 hops = about 2x)\n",
         Percentile(fwd, 0.5) / Percentile(direct, 0.5));

  printf("\n[2] throughput, closed loop, %d callers, %.0f s each\n", c, o.seconds);
  const double t_spread = Throughput(o, spread_stubs, spread, &errors);
  const double t_one = Throughput(o, r0_stubs, on_r0, &errors);
  const double t_fwd = Throughput(o, forward_stubs, on_r0, &errors);
  printf("  %-40s %10.0f calls/s\n", "spread over 3 replicas (all direct)", t_spread);
  printf("  %-40s %10.0f calls/s\n", "all on one replica", t_one);
  printf("  %-40s %10.0f calls/s\n", "all forwarded (r1, r2 -> r0)", t_fwd);
  printf("  three replicas / one: %.2fx; forwarded / one: %.2fx\n", t_spread / t_one,
         t_fwd / t_one);

  printf("\n[3] takeover: the owner (r0) killed with SIGKILL\n");
  r[0].proc->Kill9();
  const absl::Time killed = absl::Now();
  absl::Duration took = absl::InfiniteDuration();
  while (absl::Now() - killed < absl::Seconds(o.ttl + 30)) {
    if (Run(r[1].stub.get(), on_r0[0]).ok()) {
      took = absl::Now() - killed;
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  printf("  first successful call after the kill: %.0f ms (member_ttl_seconds %d = %d ms)\n",
         absl::ToDoubleMilliseconds(took), o.ttl, o.ttl * 1000);
  printf("\nerrors outside the takeover window: %d\n", errors);
  return 0;
}

}  // namespace
}  // namespace sandbox

int main(int argc, char** argv) {
  sandbox::Options o;
  o.brokerd = sandbox::ExeDir() + "/sandbox-brokerd";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string v = argv[i + 1];
    bool ok = true;
    if (flag == "--brokerd") {
      o.brokerd = v;
    } else if (flag == "--calls") {
      ok = absl::SimpleAtoi(v, &o.calls);
    } else if (flag == "--seconds") {
      ok = absl::SimpleAtod(v, &o.seconds);
    } else if (flag == "--concurrency") {
      ok = absl::SimpleAtoi(v, &o.concurrency);
    } else if (flag == "--ttl") {
      ok = absl::SimpleAtoi(v, &o.ttl);
    } else {
      ok = false;
    }
    if (!ok) {
      fprintf(stderr, "bad flag %s %s\n", flag.c_str(), v.c_str());
      return 2;
    }
  }
  return sandbox::Main(o);
}
