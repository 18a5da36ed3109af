// broker_bench: every figure is a ratio against a baseline measured side by
// side in the same run (these machines are shared and noisy).
//
//   broker_bench            the whole harness (a few minutes)
//   broker_bench --smoke    a tiny version, run in CI so the harness cannot rot
//
// Sections:
//   1. gRPC: the broker with the echo provider vs bare gRPC echo servers
//      (baseline 1: the callback API, answering inline with no thread cap,
//      the fastest server gRPC C++ offers; and a sync server under the
//      broker's 256-thread cap), same async closed-loop load generator, same
//      messages, interleaved rounds.
//   2. Sandbox floor: the local provider's Run of print(42) vs the same
//      bubblewrap invocation without the broker, and plain python3 -c
//      (baseline 2).
//   3. E2B: our adapter vs the official e2b SDK against the same fake E2B
//      server, same call sequence; TCP connections each opened (baseline 3).
//   4. Session scale: 100k idle sessions (echo provider): RSS per session,
//      and the reaper's cost against how many sessions expire.
//   6. Warm pool: the first Run of a new session against fake E2B with a
//      500 ms create latency, with providers.e2b.pool vs without (baseline).

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "adapters/e2b/e2b_provider.h"
#include "adapters/echo/echo_provider.h"
#include "adapters/local/local_provider.h"
#include "adapters/local/workspace_fs.h"
#include "common/clock.h"
#include "common/log.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/server_callback.h"
#include "sandboxbroker/v1/broker.grpc.pb.h"
#include "server/app/broker_server.h"
#include "server/app/provider_setup.h"
#include "tests/fakes/fake_e2b.h"

namespace sandbox {
namespace {

namespace pb = ::sandboxbroker::v1;

struct Options {
  bool smoke = false;
  absl::Duration load_time = absl::Seconds(3);
  int floor_runs = 30;
  int e2b_calls = 30;
  int sessions = 100000;
};

// ---- load generator ------------------------------------------------------

struct Latencies {
  std::vector<double> us;
  int64_t errors = 0;
  double seconds = 0;
  double Pct(double p) {
    if (us.empty()) return 0;
    std::sort(us.begin(), us.end());
    size_t i = std::min(us.size() - 1, static_cast<size_t>(p * static_cast<double>(us.size())));
    return us[i];
  }
  double Throughput() const { return seconds > 0 ? static_cast<double>(us.size()) / seconds : 0; }
};

// Closed loop: `concurrency` sessions, each with one call outstanding, for
// `duration`. The call mix cycles Run, Shell, WriteFile, ReadFile when
// `mixed`, else Run only. Async gRPC on one completion queue.
Latencies Load(const std::string& address, int concurrency, absl::Duration duration, size_t payload,
               bool mixed) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = pb::SandboxBroker::NewStub(channel);
  grpc::CompletionQueue cq;
  const std::string code = absl::StrCat("#", std::string(payload > 1 ? payload - 1 : 0, 'x'));
  struct Call {
    int slot;
    int op;
    grpc::ClientContext ctx;
    grpc::Status status;
    pb::RunResult run;
    pb::WriteFileResponse write;
    pb::ReadFileResponse read;
    std::unique_ptr<grpc::ClientAsyncResponseReader<pb::RunResult>> run_reader;
    std::unique_ptr<grpc::ClientAsyncResponseReader<pb::WriteFileResponse>> write_reader;
    std::unique_ptr<grpc::ClientAsyncResponseReader<pb::ReadFileResponse>> read_reader;
    absl::Time start;
  };
  Clock* clock = Clock::Real();
  std::vector<int> next_op(static_cast<size_t>(concurrency), 0);
  auto issue = [&](int slot) {
    auto* c = new Call();
    c->slot = slot;
    c->op = mixed ? next_op[static_cast<size_t>(slot)]++ % 4 : 0;
    c->start = clock->Monotonic();
    const std::string session = absl::StrCat("bench-", slot);
    switch (c->op) {
      case 0: {
        pb::RunRequest r;
        r.set_session_id(session);
        r.set_code(code);
        c->run_reader = stub->AsyncRun(&c->ctx, r, &cq);
        c->run_reader->Finish(&c->run, &c->status, c);
        break;
      }
      case 1: {
        pb::ShellRequest r;
        r.set_session_id(session);
        r.set_command(code);
        c->run_reader = stub->AsyncShell(&c->ctx, r, &cq);
        c->run_reader->Finish(&c->run, &c->status, c);
        break;
      }
      case 2: {
        pb::WriteFileRequest r;
        r.set_session_id(session);
        r.set_path("bench.txt");
        r.set_contents(code);
        c->write_reader = stub->AsyncWriteFile(&c->ctx, r, &cq);
        c->write_reader->Finish(&c->write, &c->status, c);
        break;
      }
      default: {
        pb::ReadFileRequest r;
        r.set_session_id(session);
        r.set_path("bench.txt");
        c->read_reader = stub->AsyncReadFile(&c->ctx, r, &cq);
        c->read_reader->Finish(&c->read, &c->status, c);
        break;
      }
    }
  };
  // Warm-up: every session's first call creates its sandbox; not measured.
  for (int i = 0; i < concurrency; ++i) {
    grpc::ClientContext ctx;
    pb::RunRequest r;
    r.set_session_id(absl::StrCat("bench-", i));
    r.set_code(code);
    pb::RunResult out;
    (void)stub->Run(&ctx, r, &out);
  }
  Latencies lat;
  const absl::Time start = clock->Monotonic();
  const absl::Time end = start + duration;
  for (int i = 0; i < concurrency; ++i) issue(i);
  int outstanding = concurrency;
  void* tag;
  bool ok;
  while (outstanding > 0 && cq.Next(&tag, &ok)) {
    auto* c = static_cast<Call*>(tag);
    const absl::Time now = clock->Monotonic();
    if (ok && c->status.ok()) {
      lat.us.push_back(absl::ToDoubleMicroseconds(now - c->start));
    } else {
      ++lat.errors;
    }
    const int slot = c->slot;
    delete c;
    if (now < end) {
      issue(slot);
    } else {
      --outstanding;
    }
  }
  lat.seconds = absl::ToDoubleSeconds(clock->Monotonic() - start);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return lat;
}

// Baseline 1a: the same service answered by a bare sync gRPC server with
// the broker's thread cap (config max_threads, 256), and no work at all.
class EchoService final : public pb::SandboxBroker::Service {
 public:
  grpc::Status Run(grpc::ServerContext*, const pb::RunRequest* r, pb::RunResult* out) override {
    out->set_output(r->code());
    return grpc::Status::OK;
  }
  grpc::Status Shell(grpc::ServerContext*, const pb::ShellRequest* r, pb::RunResult* out) override {
    out->set_output(r->command());
    return grpc::Status::OK;
  }
  grpc::Status WriteFile(grpc::ServerContext*, const pb::WriteFileRequest* r,
                         pb::WriteFileResponse* out) override {
    out->set_bytes_written(static_cast<int64_t>(r->contents().size()));
    return grpc::Status::OK;
  }
  grpc::Status ReadFile(grpc::ServerContext*, const pb::ReadFileRequest*,
                        pb::ReadFileResponse* out) override {
    out->set_found(true);
    out->set_contents("x");
    return grpc::Status::OK;
  }
};

// Baseline 1b, the headline one: the callback API, each call answered and
// finished inline on gRPC's own threads (the default reactor), no thread
// cap: as fast as a bare gRPC C++ server gets.
class CallbackEchoService final : public pb::SandboxBroker::CallbackService {
 public:
  grpc::ServerUnaryReactor* Run(grpc::CallbackServerContext* ctx, const pb::RunRequest* r,
                                pb::RunResult* out) override {
    out->set_output(r->code());
    return Done(ctx);
  }
  grpc::ServerUnaryReactor* Shell(grpc::CallbackServerContext* ctx, const pb::ShellRequest* r,
                                  pb::RunResult* out) override {
    out->set_output(r->command());
    return Done(ctx);
  }
  grpc::ServerUnaryReactor* WriteFile(grpc::CallbackServerContext* ctx,
                                      const pb::WriteFileRequest* r,
                                      pb::WriteFileResponse* out) override {
    out->set_bytes_written(static_cast<int64_t>(r->contents().size()));
    return Done(ctx);
  }
  grpc::ServerUnaryReactor* ReadFile(grpc::CallbackServerContext* ctx, const pb::ReadFileRequest*,
                                     pb::ReadFileResponse* out) override {
    out->set_found(true);
    out->set_contents("x");
    return Done(ctx);
  }

 private:
  static grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

// `max_threads` > 0 caps the server's threads (a resource quota).
std::unique_ptr<grpc::Server> StartEchoServer(grpc::Service* service, int max_threads, int* port) {
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  b.RegisterService(service);
  if (max_threads > 0) {
    grpc::ResourceQuota quota("bench-echo");
    quota.SetMaxThreads(max_threads);
    b.SetResourceQuota(quota);
  }
  return b.BuildAndStart();
}

absl::StatusOr<std::unique_ptr<BrokerServer>> StartBroker(const std::string& extra) {
  nlohmann::json cfg = nlohmann::json::parse(
      R"({"listen": "127.0.0.1:0", "default_provider": "echo", "providers": {"echo": {}},
          "max_sessions_per_tenant": 100000, "max_output_bytes": 1048576,
          "state": {"backend": "memory"}})");
  cfg.merge_patch(nlohmann::json::parse(extra));
  auto config = ParseConfig(cfg.dump());
  if (!config.ok()) return config.status();
  auto providers = BuildProviders(*config);
  if (!providers.ok()) return providers.status();
  BrokerServer::Options o;
  o.reaper_thread = false;
  return BrokerServer::Start(*config, std::move(*providers), o);
}

void Row(const char* what, double value, double base, const char* unit, bool higher_is_better) {
  const double ratio = base > 0 ? value / base : 0;
  printf("  %-44s %12.1f %-6s  baseline %12.1f  ratio %5.2fx%s\n", what, value, unit, base, ratio,
         higher_is_better ? " (higher is better)" : "");
}

// ---- durable store ----------------------------------------------------------

// Echo Run throughput with the SQLite store vs the memory store, side by
// side: the hot path must not touch the store (target >= 0.95x).
void StoreSection(const Options& o) {
  printf("\n[5] Session store: echo Run, broker with sqlite store vs memory store\n");
  char tmpl[] = "/tmp/bench-store-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  auto mem = StartBroker("{}");
  auto sql = StartBroker(
      absl::StrCat(R"({"state": {"backend": "sqlite", "path": ")", dir, R"(/state.db"}})"));
  if (!mem.ok() || !sql.ok()) {
    printf("  broker failed to start: %s\n",
           std::string((mem.ok() ? sql.status() : mem.status()).message()).c_str());
    return;
  }
  const std::string mem_addr = absl::StrCat("127.0.0.1:", (*mem)->port());
  const std::string sql_addr = absl::StrCat("127.0.0.1:", (*sql)->port());
  for (int concurrency : o.smoke ? std::vector<int>{4} : std::vector<int>{1, 16, 64}) {
    // Many short alternating rounds spread the noise of a shared machine.
    const int rounds = o.smoke ? 2 : 8;
    Latencies m1, q1;
    for (int i = 0; i < rounds; ++i) {
      for (auto [addr, into] : {std::pair{&mem_addr, &m1}, std::pair{&sql_addr, &q1}}) {
        Latencies l = Load(*addr, concurrency, o.load_time / rounds, 64, false);
        into->us.insert(into->us.end(), l.us.begin(), l.us.end());
        into->seconds += l.seconds;
        into->errors += l.errors;
      }
    }
    printf(" concurrency %d, Run only, %d alternating rounds (errors: sqlite %lld, memory %lld)\n",
           concurrency, rounds, static_cast<long long>(q1.errors),
           static_cast<long long>(m1.errors));
    Row("throughput sqlite vs memory", q1.Throughput(), m1.Throughput(), "req/s", true);
    Row("p50 latency sqlite vs memory", q1.Pct(0.50), m1.Pct(0.50), "us", false);
  }
  sql->reset();
  mem->reset();
  std::string cmd = absl::StrCat("rm -rf '", dir, "'");
  (void)!system(cmd.c_str());
}

void Merge(Latencies* into, const Latencies& l) {
  into->us.insert(into->us.end(), l.us.begin(), l.us.end());
  into->seconds += l.seconds;
  into->errors += l.errors;
}

// One figure for the broker and both baselines, with the broker's ratios.
void Row3(const char* what, double broker, double callback, double sync, const char* unit) {
  printf("  %-16s %12.1f %12.1f %12.1f  %-6s %7.2fx %7.2fx\n", what, broker, callback, sync, unit,
         callback > 0 ? broker / callback : 0, sync > 0 ? broker / sync : 0);
}

void Target(const char* what, double ratio, double target, bool at_least) {
  const bool met = at_least ? ratio >= target : ratio <= target;
  printf("  %-46s %5.2fx  target %s %.2fx: %s\n", what, ratio, at_least ? ">=" : "<=", target,
         met ? "met" : "NOT met");
}

void GrpcSection(const Options& o) {
  printf("\n[1] gRPC: broker (echo provider) vs bare gRPC echo servers, closed loop\n");
  CallbackEchoService callback;
  EchoService sync;
  int callback_port = 0, sync_port = 0;
  auto callback_server = StartEchoServer(&callback, 0, &callback_port);
  auto sync_server = StartEchoServer(&sync, 256, &sync_port);
  auto broker = StartBroker("{}");
  if (!broker.ok() || !callback_server || !sync_server) {
    printf("  a server failed to start: %s\n",
           broker.ok() ? "echo baseline" : std::string(broker.status().message()).c_str());
    return;
  }
  const std::string callback_addr = absl::StrCat("127.0.0.1:", callback_port);
  const std::string sync_addr = absl::StrCat("127.0.0.1:", sync_port);
  const std::string broker_addr = absl::StrCat("127.0.0.1:", (*broker)->port());
  struct Case {
    int concurrency;
    size_t payload;
    bool mixed;
  };
  std::vector<Case> cases =
      o.smoke
          ? std::vector<Case>{{1, 64, false}, {4, 64, true}}
          : std::vector<Case>{{1, 64, false}, {64, 64, false}, {64, 64, true}, {16, 65536, false}};
  // Short alternating rounds spread a shared machine's noise over all three.
  const int rounds = o.smoke ? 1 : 4;
  double tput64 = 0, p50_c1 = 0, p99_64 = 0;
  bool have_c1 = false, have_64 = false;
  printf(
      "  columns: broker, callback baseline (no thread cap), sync baseline (256-thread cap);\n"
      "  ratios broker/callback, broker/sync. %d alternating rounds of %.2f s per server.\n",
      rounds, absl::ToDoubleSeconds(o.load_time / rounds));
  for (const Case& c : cases) {
    Latencies r, cb, sy;
    for (int i = 0; i < rounds; ++i) {
      const absl::Duration t = o.load_time / rounds;
      Merge(&cb, Load(callback_addr, c.concurrency, t, c.payload, c.mixed));
      Merge(&r, Load(broker_addr, c.concurrency, t, c.payload, c.mixed));
      Merge(&sy, Load(sync_addr, c.concurrency, t, c.payload, c.mixed));
    }
    printf(" concurrency %d, payload %zu B, %s (errors: broker %lld, callback %lld, sync %lld)\n",
           c.concurrency, c.payload, c.mixed ? "mix run/shell/write/read" : "Run only",
           static_cast<long long>(r.errors), static_cast<long long>(cb.errors),
           static_cast<long long>(sy.errors));
    printf("  %-16s %12s %12s %12s  %-6s %8s %8s\n", "", "broker", "callback", "sync-256", "",
           "/callbk", "/sync");
    Row3("throughput", r.Throughput(), cb.Throughput(), sy.Throughput(), "req/s");
    Row3("p50 latency", r.Pct(0.50), cb.Pct(0.50), sy.Pct(0.50), "us");
    Row3("p90 latency", r.Pct(0.90), cb.Pct(0.90), sy.Pct(0.90), "us");
    Row3("p99 latency", r.Pct(0.99), cb.Pct(0.99), sy.Pct(0.99), "us");
    Row3("max latency", r.Pct(1.0), cb.Pct(1.0), sy.Pct(1.0), "us");
    if (c.mixed || c.payload != 64) continue;
    if (c.concurrency == 1 && cb.Pct(0.50) > 0) {
      have_c1 = true;
      p50_c1 = r.Pct(0.50) / cb.Pct(0.50);
    }
    if (c.concurrency == 64 && cb.Throughput() > 0 && cb.Pct(0.99) > 0) {
      have_64 = true;
      tput64 = r.Throughput() / cb.Throughput();
      p99_64 = r.Pct(0.99) / cb.Pct(0.99);
    }
  }
  if (have_c1 || have_64) printf(" issue #11 targets, broker vs the callback baseline:\n");
  if (have_64) Target("throughput at concurrency 64 (Run, 64 B)", tput64, 0.85, true);
  if (have_c1) Target("p50 latency at concurrency 1 (Run, 64 B)", p50_c1, 1.2, false);
  if (have_64) Target("p99 latency at concurrency 64 (Run, 64 B)", p99_64, 1.5, false);
}

// ---- sandbox floor -------------------------------------------------------

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void FloorSection(const Options& o) {
  printf("\n[2] Sandbox floor: print(42), median of %d runs each, interleaved\n", o.floor_runs);
  char tmpl[] = "/tmp/bench-floor-XXXXXX";
  const std::string root = mkdtemp(tmpl);
  chmod(root.c_str(), 0711);
  LocalConfig lc;
  lc.workspace_root = root + "/ws";
  lc.uid_base = 670000;
  auto local = LocalProvider::Create(lc);
  if (!local.ok()) {
    printf("  local provider unavailable: %s\n", std::string(local.status().message()).c_str());
    return;
  }
  auto broker = StartBroker(
      absl::StrCat(R"({"default_provider": "local", "providers": {"local": {"workspace_root": ")",
                   root, R"(/broker", "uid_base": 680000}}})"));
  if (!broker.ok()) return;
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*broker)->port()),
                                     grpc::InsecureChannelCredentials());
  auto stub = pb::SandboxBroker::NewStub(channel);
  const std::string ws = root + "/bare";
  mkdir(ws.c_str(), 0777);
  chmod(ws.c_str(), 0777);
  Clock* clock = Clock::Real();
  std::vector<double> python, bwrap, brokered, in_container;
  std::string last_output;
  // One long-lived sandbox: each run is a fork+exec in its container.
  auto sandbox = (*local)->Create(SandboxSpec{});
  if (!sandbox.ok()) {
    printf("  local sandbox unavailable: %s\n", std::string(sandbox.status().message()).c_str());
    return;
  }
  ExecRequest er;
  er.code = "print(42)";
  for (int i = 0; i < o.floor_runs + 1; ++i) {
    ProcessSpec p;
    p.argv = {"/usr/bin/python3", "-c", "print(42)"};
    p.env = {"PATH=/usr/bin:/bin"};
    absl::Time t = clock->Monotonic();
    (void)RunProcess(p);
    const double d1 = absl::ToDoubleMilliseconds(clock->Monotonic() - t);

    ProcessSpec q;
    q.argv = (*local)->WrapCommand(ws, {"python3", "-u", "-"});
    q.env = {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/workspace", "LANG=C.UTF-8"};
    q.stdin_data = "print(42)";
    q.uid = geteuid() == 0 ? 690000 : -1;
    q.gid = q.uid;
    t = clock->Monotonic();
    auto r = RunProcess(q);
    const double d2 = absl::ToDoubleMilliseconds(clock->Monotonic() - t);

    grpc::ClientContext ctx;
    pb::RunRequest req;
    req.set_session_id("floor");
    req.set_code("print(42)");
    pb::RunResult out;
    t = clock->Monotonic();
    grpc::Status s = stub->Run(&ctx, req, &out);
    const double d3 = absl::ToDoubleMilliseconds(clock->Monotonic() - t);

    t = clock->Monotonic();
    auto e = (*sandbox)->Exec(er);
    const double d4 = absl::ToDoubleMilliseconds(clock->Monotonic() - t);
    if (e.ok() && e->output != "42\n") last_output = "local: " + e->output;
    if (i == 0) continue;  // warm-up (creates the session)
    python.push_back(d1);
    bwrap.push_back(d2);
    brokered.push_back(d3);
    in_container.push_back(d4);
    last_output = s.ok() ? out.output() : std::string(s.error_message());
    if (r.ok() && r->output != "42\n") last_output = "bwrap: " + r->output;
  }
  printf("  outputs check: %s\n", last_output == "42\n" ? "42 (ok)" : last_output.c_str());
  Row("local Exec p50 (run in session container) vs plain python3 -c p50", Median(in_container),
      Median(python), "ms", false);
  Row("broker Run p50 vs bare bwrap p50", Median(brokered), Median(bwrap), "ms", false);
  Row("broker Run p50 vs plain python3 -c p50", Median(brokered), Median(python), "ms", false);
  Row("bare bwrap p50 vs plain python3 -c p50", Median(bwrap), Median(python), "ms", false);
  (void)(*sandbox)->Destroy();
  // First call of a new session: create (container, cgroup, disk image) +
  // the first run, in process and through the broker, beside plain python3.
  std::vector<double> first_local, first_broker, first_python;
  const int first_runs = std::max(3, o.floor_runs / 5);
  for (int i = 0; i < first_runs; ++i) {
    ProcessSpec p;
    p.argv = {"/usr/bin/python3", "-c", "print(42)"};
    p.env = {"PATH=/usr/bin:/bin"};
    absl::Time t = clock->Monotonic();
    (void)RunProcess(p);
    first_python.push_back(absl::ToDoubleMilliseconds(clock->Monotonic() - t));
    t = clock->Monotonic();
    auto sb = (*local)->Create(SandboxSpec{});
    if (sb.ok()) (void)(*sb)->Exec(er);
    first_local.push_back(absl::ToDoubleMilliseconds(clock->Monotonic() - t));
    if (sb.ok()) (void)(*sb)->Destroy();
    grpc::ClientContext ctx;
    pb::RunRequest req;
    req.set_session_id(absl::StrCat("first-", i));
    req.set_code("print(42)");
    pb::RunResult out;
    t = clock->Monotonic();
    (void)stub->Run(&ctx, req, &out);
    first_broker.push_back(absl::ToDoubleMilliseconds(clock->Monotonic() - t));
  }
  Row("local first call (create + run) p50 vs plain python3 -c p50", Median(first_local),
      Median(first_python), "ms", false);
  Row("broker first Run of a new session p50 vs plain python3 -c p50", Median(first_broker),
      Median(first_python), "ms", false);
  broker->reset();
  local->reset();
  (void)RemoveTree(root);
}

// ---- E2B: adapter vs official SDK ------------------------------------------

std::string ExeDir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  std::string p(buf, n > 0 ? static_cast<size_t>(n) : 0);
  return p.substr(0, p.rfind('/'));
}

void E2BSection(const Options& o) {
  printf("\n[3] E2B: our adapter vs the official e2b SDK, same fake, %d x (run, write, read)\n",
         o.e2b_calls);
  FakeE2B::Options fo;
  fo.uid_base = 700000;
  fo.ttl_thread = false;
  auto fake_or = FakeE2B::Start(fo);
  if (!fake_or.ok()) return;
  std::unique_ptr<FakeE2B> fake = std::move(*fake_or);
  Clock* clock = Clock::Real();
  // Ours.
  const int64_t conns_before = fake->connections();
  E2BConfig c;
  c.api_key = fo.api_key;
  c.api_url = fake->url();
  c.sandbox_url = fake->url();
  c.sandbox_timeout_seconds = 300;
  auto provider = E2BProvider::Create(c);
  SandboxSpec spec;
  auto sb = (*provider)->Create(spec);
  if (!sb.ok()) {
    printf("  create failed: %s\n", std::string(sb.status().message()).c_str());
    return;
  }
  std::vector<double> ours, run_ms, write_ms, read_ms;
  for (int i = 0; i < o.e2b_calls; ++i) {
    absl::Time t = clock->Monotonic();
    ExecRequest r;
    r.language = Language::kShell;
    r.code = "echo hi";
    (void)(*sb)->Exec(r);
    absl::Time t1 = clock->Monotonic();
    (void)(*sb)->WriteFile("/tmp/f.txt", "hello");
    absl::Time t2 = clock->Monotonic();
    (void)(*sb)->ReadFile("/tmp/f.txt");
    absl::Time t3 = clock->Monotonic();
    ours.push_back(absl::ToDoubleMilliseconds(t3 - t));
    run_ms.push_back(absl::ToDoubleMilliseconds(t1 - t));
    write_ms.push_back(absl::ToDoubleMilliseconds(t2 - t1));
    read_ms.push_back(absl::ToDoubleMilliseconds(t3 - t2));
  }
  printf("  ours, medians: run %.1f ms, write %.1f ms, read %.1f ms\n", Median(run_ms),
         Median(write_ms), Median(read_ms));
  const int64_t our_conns = fake->connections() - conns_before;
  (void)(*sb)->Destroy();
  // The SDK, if it and a new enough node are installed.
  const std::string root = ExeDir() + "/..";
  const std::string script = root + "/bench/e2b_sdk_bench.js";
  std::string node;
  {
    FILE* p =
        popen(absl::StrCat("bash ", root, "/scripts/node-for-sdks.sh 2>/dev/null").c_str(), "r");
    char buf[1024];
    if (p && fgets(buf, sizeof(buf), p)) node = buf;
    if (p) pclose(p);
    while (!node.empty() && (node.back() == '\n' || node.back() == ' ')) node.pop_back();
  }
  double sdk_ms = 0;
  int64_t sdk_conns = 0;
  if (!node.empty()) {
    const int64_t before = fake->connections();
    FILE* p = popen(absl::StrCat(node, " ", script, " ", fake->url(), " ", fo.api_key, " ",
                                 o.e2b_calls, " 2>&1")
                        .c_str(),
                    "r");
    std::string out;
    char buf[4096];
    while (p && fgets(buf, sizeof(buf), p)) out += buf;
    if (p) pclose(p);
    sdk_conns = fake->connections() - before;
    nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
    if (j.is_object() && j.contains("median_ms")) {
      sdk_ms = j["median_ms"].get<double>();
    } else {
      // A missing SDK (tests/conformance/e2b/node_modules) is one line from
      // node's stack trace, "Error: Cannot find module ...".
      std::string why = out.substr(0, out.find('\n'));
      const size_t e = out.find("\nError: ");
      if (e != std::string::npos) why = out.substr(e + 1, out.find('\n', e + 1) - e - 1);
      printf("  SDK run failed (SDK baseline skipped): %s\n", why.c_str());
    }
  } else {
    printf("  (no node >= 20.18.1: SDK baseline skipped)\n");
  }
  if (sdk_ms > 0) {
    Row("per (run+write+read), median", Median(ours), sdk_ms, "ms", false);
  } else {
    printf("  per (run+write+read), median: ours %.1f ms (no SDK baseline)\n", Median(ours));
  }
  printf(
      "  TCP connections for create + all calls: ours %lld (HttpClient counted %lld), SDK %lld\n",
      static_cast<long long>(our_conns),
      static_cast<long long>((*provider)->http()->connections_opened()),
      static_cast<long long>(sdk_conns));
}

// ---- session scale -------------------------------------------------------

int64_t RssBytes() {
  std::ifstream in("/proc/self/statm");
  int64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

void ScaleSection(const Options& o) {
  printf("\n[4] Session scale: %d idle sessions, echo provider\n", o.sessions);
  ProviderRegistry registry;
  registry.Add(*EchoProvider::Create(nlohmann::json::object()));
  FakeClock clock;
  SessionLimits limits;
  limits.idle_timeout = absl::Seconds(300);
  limits.max_sessions_per_tenant = o.sessions * 2;
  auto manager = std::make_unique<SessionManager>(&registry, &clock, limits, "echo", "bench");
  CreateOptions create;
  const int64_t rss0 = RssBytes();
  Clock* real = Clock::Real();
  absl::Time t = real->Monotonic();
  for (int i = 0; i < o.sessions; ++i) {
    auto l =
        manager->Acquire(absl::StrCat("tenant-", i % 100), absl::StrCat("session-", i), &create);
  }
  const double create_s = absl::ToDoubleSeconds(real->Monotonic() - t);
  const int64_t rss1 = RssBytes();
  printf("  created %d sessions in %.2f s (%.0f/s)\n", o.sessions, create_s, o.sessions / create_s);
  printf("  broker RSS: +%.1f MiB total, %.0f bytes per session (target: 100k under 200 MiB)\n",
         static_cast<double>(rss1 - rss0) / (1 << 20),
         static_cast<double>(rss1 - rss0) / o.sessions);
  // The reaper's work must follow what expires, not what exists: time it
  // with nothing expired, with a 1% slice expired, and with the rest.
  Clock* r = real;
  const int slice = std::max(1, o.sessions / 100);
  t = r->Monotonic();
  const int none = manager->RunOnce();
  const double none_s = absl::ToDoubleSeconds(r->Monotonic() - t);
  clock.Advance(absl::Seconds(100));
  for (int i = slice; i < o.sessions; ++i) {  // all but the slice stay active
    (void)manager->KeepAlive(absl::StrCat("tenant-", i % 100), absl::StrCat("session-", i));
  }
  clock.Advance(absl::Seconds(201));  // the slice is now 301 s idle, the rest 201 s
  t = r->Monotonic();
  const int reaped_slice = manager->RunOnce();
  const double slice_s = absl::ToDoubleSeconds(r->Monotonic() - t);
  clock.Advance(absl::Seconds(100));
  t = r->Monotonic();
  const int reaped_rest = manager->RunOnce();
  const double rest_s = absl::ToDoubleSeconds(r->Monotonic() - t);
  printf("  reaper pass with %d live, none expired: %.3f ms (reaped %d)\n", o.sessions,
         none_s * 1000, none);
  printf("  reaping %d expired of %d live: %.2f ms (%.2f us per session)\n", reaped_slice,
         o.sessions, slice_s * 1000, slice_s * 1e6 / std::max(1, reaped_slice));
  printf("  reaping the other %d: %.2f ms (%.2f us per session; target: 100k under 1 s)\n",
         reaped_rest, rest_s * 1000, rest_s * 1e6 / std::max(1, reaped_rest));
}

// ---- warm pool: first Run of a new session ---------------------------------

void PoolSection(const Options& o) {
  const int sessions = o.smoke ? 3 : 20;
  printf(
      "\n[6] Warm pool: first Run of a new session, fake E2B with create_latency_ms 500, "
      "%d sessions each\n",
      sessions);
  FakeE2B::Options fo;
  fo.uid_base = 710000;
  fo.ttl_thread = false;
  auto fake_or = FakeE2B::Start(fo);
  if (!fake_or.ok()) return;
  std::unique_ptr<FakeE2B> fake = std::move(*fake_or);
  fake->faults().create_latency_ms = 500;  // as POST /_fake/faults {"create_latency_ms": 500}
  Clock* clock = Clock::Real();
  std::vector<double> ms[2];  // [0] no pool, [1] pool
  for (int pooled = 0; pooled < 2; ++pooled) {
    nlohmann::json e2b = {
        {"api_key", fo.api_key}, {"api_url", fake->url()}, {"sandbox_url", fake->url()}};
    if (pooled) e2b["pool"] = {{"size", 2}};
    nlohmann::json extra = {{"default_provider", "e2b"}, {"providers", {{"e2b", e2b}}}};
    auto broker = StartBroker(extra.dump());
    if (!broker.ok()) {
      printf("  broker failed: %s\n", std::string(broker.status().message()).c_str());
      return;
    }
    auto stub = pb::SandboxBroker::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", (*broker)->port()), grpc::InsecureChannelCredentials()));
    // Sessions arrive slower than the pool refills (the steady state the
    // pool is sized for): each one finds it full.
    auto wait_full = [&] {
      for (WarmPool* p : (*broker)->pools()) {
        for (int i = 0; i < 400 && p->ready() < p->options().size; ++i) {
          absl::SleepFor(absl::Milliseconds(25));
        }
      }
    };
    for (int i = 0; i < sessions; ++i) {
      wait_full();
      grpc::ClientContext ctx;
      pb::RunRequest req;
      req.set_session_id(absl::StrCat("pool-", pooled, "-", i));
      req.set_code("print(42)");
      pb::RunResult out;
      const absl::Time t = clock->Monotonic();
      grpc::Status st = stub->Run(&ctx, req, &out);
      ms[pooled].push_back(absl::ToDoubleMilliseconds(clock->Monotonic() - t));
      if (!st.ok() || out.output() != "42\n") {
        printf("  run failed: %s %s\n", st.error_message().c_str(), out.output().c_str());
      }
    }
    (*broker)->sessions()->CloseAll();
    broker->reset();
  }
  printf("  no pool: p50 %.0f ms, max %.0f ms; pool: p50 %.0f ms, max %.0f ms\n", Median(ms[0]),
         *std::max_element(ms[0].begin(), ms[0].end()), Median(ms[1]),
         *std::max_element(ms[1].begin(), ms[1].end()));
  Row("first Run p50: pool (size 2) vs no pool", Median(ms[1]), Median(ms[0]), "ms", false);
}

}  // namespace
}  // namespace sandbox

int main(int argc, char** argv) {
  using namespace sandbox;
  Options o;
  std::string only, target;
  int concurrency = 16;
  size_t payload = 64;
  bool mixed = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--target" && i + 1 < argc) {
      target = argv[++i];  // load an arbitrary broker: host:port
    } else if (a == "--concurrency" && i + 1 < argc) {
      concurrency = atoi(argv[++i]);
    } else if (a == "--payload" && i + 1 < argc) {
      payload = static_cast<size_t>(atoll(argv[++i]));
    } else if (a == "--mix" && i + 1 < argc) {
      mixed = std::string(argv[++i]) == "all";  // run | all (run/shell/write/read)
    } else if (a == "--seconds" && i + 1 < argc) {
      o.load_time = absl::Seconds(atoi(argv[++i]));
    } else if (std::string(argv[i]) == "--only" && i + 1 < argc) {
      only = argv[++i];  // grpc | floor | e2b | scale | store | pool
    } else if (std::string(argv[i]) == "--smoke") {
      o.smoke = true;
      o.load_time = absl::Milliseconds(400);
      o.floor_runs = 3;
      o.e2b_calls = 3;
      o.sessions = 2000;
    }
  }
  SetLogLevel(LogLevel::kWarning);  // the per-call info lines would dominate stderr
  if (!target.empty()) {            // just the load generator, against a running broker
    Latencies l = Load(target, concurrency, o.load_time, payload, mixed);
    printf(
        "load %s: concurrency %d, payload %zu B, %s: %.1f req/s, p50 %.0f us, p90 %.0f us, "
        "p99 %.0f us, max %.0f us, errors %lld\n",
        target.c_str(), concurrency, payload, mixed ? "mix" : "run", l.Throughput(), l.Pct(0.5),
        l.Pct(0.9), l.Pct(0.99), l.Pct(1.0), static_cast<long long>(l.errors));
    return l.errors == 0 ? 0 : 1;
  }
  printf("broker_bench%s: ratios against baselines measured in the same run (%ld cores)\n",
         o.smoke ? " --smoke" : "", sysconf(_SC_NPROCESSORS_ONLN));
  if (only.empty() || only == "grpc") GrpcSection(o);
  if (only.empty() || only == "floor") FloorSection(o);
  if (only.empty() || only == "e2b") E2BSection(o);
  if (only.empty() || only == "scale") ScaleSection(o);
  if (only.empty() || only == "store") StoreSection(o);
  if (only.empty() || only == "pool") PoolSection(o);
  printf("\nbroker_bench: done\n");
  return 0;
}
