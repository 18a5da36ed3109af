// A chaos soak (issue #41; docs/hardening.md#chaos-soak): three
// sandbox-brokerd replicas on a three-member etcd, with the local provider
// and fake-e2b, under a mixed workload from many clients, while faults are
// injected at random for the whole run, and invariant checkers run all the
// time, not only at the end:
//
//   - at most one live sandbox per session at the fake (a crash's orphan is
//     allowed until the orphan sweep's grace has passed);
//   - every write a client saw acknowledged reads back the same, unless the
//     session went on in a new sandbox generation (a local session whose
//     replica died: by design its workspace stays on that machine);
//   - no call waits past its deadline;
//   - after the final close and sweep: no sandbox left at the fake and no
//     workspace left on the hosts.
// Broker RSS and descriptors are sampled every second and reported.
//
// Faults: kill -9 and restart of a replica; SIGSTOP of a replica past its
// lease, then SIGCONT; kill -9 and restart of one etcd member; a full etcd
// outage shorter than the TTL; fake-e2b latency and failures
// (/_fake/faults).
//
//   chaos_soak [--duration SECONDS] [--workers N] [--sessions N] [--ttl S]
//              [--fault-every SECONDS] [--seed N]
// Prints a JSON report; exits 1 on any violation (or a failed start).

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "adapters/http/http_client.h"
#include "grpcpp/create_channel.h"
#include "nlohmann/json.hpp"
#include "sandboxbroker/v1/broker.grpc.pb.h"
#include "tests/server/etcd_fixture.h"
#include "tests/testing/child_process.h"

namespace sandbox {
namespace {

namespace pb = ::sandboxbroker::v1;
using nlohmann::json;

constexpr int kReplicas = 3;
constexpr char kToken[] = "chaos-cluster-token-0123456789";
constexpr char kApiKey[] = "chaos_key";
constexpr int kOrphanGraceSeconds = 2;
constexpr absl::Duration kDeadline = absl::Seconds(20);
// A call may come back this long after its deadline (scheduling, a paused
// replica's socket) before it counts as having waited past it.
constexpr absl::Duration kDeadlineSlack = absl::Seconds(3);

struct Options {
  std::string dir;  // where the binaries are
  int duration = 180;
  int workers = 6;
  int sessions = 16;
  int ttl = 4;
  int fault_every = 10;
  uint64_t seed = 1;
};

std::string ExeDir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  std::string p(buf, n > 0 ? static_cast<size_t>(n) : 0);
  return p.substr(0, p.rfind('/'));
}

// Violations, counts and samples, shared by every thread.
class Report {
 public:
  void Violation(const std::string& what) {
    std::lock_guard<std::mutex> l(mu_);
    ++violations_;
    if (examples_.size() < 30) examples_.push_back(what);
    fprintf(stderr, "chaos_soak: VIOLATION %s\n", what.c_str());
  }
  void Call(const std::string& op, grpc::StatusCode code) {
    std::lock_guard<std::mutex> l(mu_);
    ++calls_[op][code];
  }
  void Fault(const std::string& what) {
    std::lock_guard<std::mutex> l(mu_);
    ++faults_[what];
    fprintf(stderr, "chaos_soak: fault %s\n", what.c_str());
  }
  void Sample(int replica, int64_t rss_kib, int fds) {
    std::lock_guard<std::mutex> l(mu_);
    auto& s = samples_[replica];
    s.rss_min = std::min(s.rss_min, rss_kib);
    s.rss_max = std::max(s.rss_max, rss_kib);
    s.fds_min = std::min(s.fds_min, fds);
    s.fds_max = std::max(s.fds_max, fds);
  }
  int64_t violations() const {
    std::lock_guard<std::mutex> l(mu_);
    return violations_;
  }
  json ToJson() const {
    std::lock_guard<std::mutex> l(mu_);
    json calls = json::object();
    int64_t total = 0;
    for (const auto& [op, codes] : calls_) {
      for (const auto& [code, n] : codes) {
        calls[op][absl::StrCat(code)] = n;
        total += n;
      }
    }
    json samples = json::object();
    for (const auto& [r, s] : samples_) {
      samples[absl::StrCat("r", r)] = {{"rss_kib", {s.rss_min, s.rss_max}},
                                       {"fds", {s.fds_min, s.fds_max}}};
    }
    return {{"calls_total", total},  {"calls_by_op_and_code", calls},
            {"faults", faults_},     {"violations", violations_},
            {"examples", examples_}, {"replica_rss_and_fds_min_max", samples}};
  }

 private:
  struct Range {
    int64_t rss_min = INT64_MAX, rss_max = 0;
    int fds_min = INT32_MAX, fds_max = 0;
  };
  mutable std::mutex mu_;
  int64_t violations_ = 0;
  std::vector<std::string> examples_;
  std::map<std::string, std::map<int, int64_t>> calls_;
  std::map<std::string, int64_t> faults_;
  std::map<int, Range> samples_;
};

// The three replicas: started, killed, paused and restarted by the fault
// thread while the workers call them.
class Replicas {
 public:
  Replicas(const Options& o, std::string dir, std::vector<std::string> etcd, std::string fake_url)
      : o_(o), dir_(std::move(dir)), etcd_(std::move(etcd)), fake_url_(std::move(fake_url)) {}

  bool Start(int i) {
    json c = {
        {"listen", "127.0.0.1:0"},
        {"default_provider", "e2b"},
        {"deployment_id", "chaos"},
        {"orphan_grace_seconds", kOrphanGraceSeconds},
        {"orphan_sweep_interval_seconds", 1},
        {"reap_interval_seconds", 1},
        {"idle_timeout_seconds", 600},
        {"drain_grace_seconds", 2},
        {"max_sessions_per_tenant", 1000},
        {"log_level", "info"},
        {"auth", {{"tokens", {{"chaos-token-1", "chaos"}}}}},
        {"state",
         {{"backend", "etcd"},
          {"etcd", {{"endpoints", etcd_}, {"prefix", "/chaos/"}, {"member_ttl_seconds", o_.ttl}}}}},
        {"cluster", {{"member_id", absl::StrCat("r", i)}, {"token", kToken}}},
        {"providers",
         {{"local",
           {{"workspace_root", Workspaces(i)},
            {"uid_base", 676000 + 1000 * i},
            {"limits", {{"memory_bytes", 256 << 20}, {"disk_bytes", 64 << 20}}}}},
          {"e2b", {{"api_key", kApiKey}, {"api_url", fake_url_}, {"sandbox_url", fake_url_}}}}}};
    const int n = ++starts_;
    const std::string cfg = absl::StrCat(dir_, "/r", i, "-", n, ".json");
    std::ofstream(cfg) << c.dump();
    const std::string err = absl::StrCat(dir_, "/r", i, "-", n, ".err");
    auto proc = std::make_shared<Proc>(
        std::vector<std::string>{o_.dir + "/sandbox-brokerd", "--config", cfg},
        dir_ + "/brokers.out", err);
    const std::string addr = WaitForServingAddress(err, absl::Seconds(60));
    if (addr.empty()) {
      fprintf(stderr, "chaos_soak: replica r%d did not start:\n%s\n", i, ReadAll(err).c_str());
      return false;
    }
    grpc::ChannelArguments args;
    args.SetInt("grpc.use_local_subchannel_pool", 1);
    std::shared_ptr<pb::SandboxBroker::Stub> stub = pb::SandboxBroker::NewStub(
        grpc::CreateCustomChannel(addr, grpc::InsecureChannelCredentials(), args));
    std::lock_guard<std::mutex> l(mu_);
    procs_[i] = std::move(proc);
    stubs_[i] = std::move(stub);
    return true;
  }
  // Null while the replica is down.
  std::shared_ptr<pb::SandboxBroker::Stub> Stub(int i) {
    std::lock_guard<std::mutex> l(mu_);
    return stubs_[i];
  }
  std::shared_ptr<Proc> Process(int i) {
    std::lock_guard<std::mutex> l(mu_);
    return procs_[i];
  }
  void Kill9(int i) {
    std::shared_ptr<Proc> p;
    {
      std::lock_guard<std::mutex> l(mu_);
      p = std::move(procs_[i]);
      stubs_[i] = nullptr;
    }
    if (p) p->Kill9();
  }
  // A replica that ended by itself (a crash, a sanitizer report): its tail.
  std::string Crashed() {
    std::lock_guard<std::mutex> l(mu_);
    for (int i = 0; i < kReplicas; ++i) {
      if (procs_[i] && procs_[i]->Exited()) {
        const std::string err = ReadAll(procs_[i]->err());
        return absl::StrCat("r", i, " ended by itself (", procs_[i]->ExitStatus(),
                            "): ", err.substr(err.size() > 3000 ? err.size() - 3000 : 0));
      }
    }
    return "";
  }
  std::string Workspaces(int i) const { return absl::StrCat(dir_, "/ws", i); }

 private:
  const Options o_;
  const std::string dir_;
  const std::vector<std::string> etcd_;
  const std::string fake_url_;
  std::mutex mu_;
  int starts_ = 0;
  std::shared_ptr<Proc> procs_[kReplicas];
  std::shared_ptr<pb::SandboxBroker::Stub> stubs_[kReplicas];
};

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->AddMetadata("authorization", "Bearer chaos-token-1");
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + kDeadline));
  return ctx;
}

// Session k's id and provider: even ones on e2b (the fake), odd ones local.
std::string SessionId(int k) { return absl::StrCat("chaos-", k); }
std::string ProviderOf(int k) { return k % 2 == 0 ? "e2b" : "local"; }

// What a worker wrote to one of its files in a session, and expects to read
// back. Each file has one writer and one reader (its worker, serially), so
// the checker itself never races. A write whose outcome the client does not
// know (an error) retires the file's name: it may still land later.
struct Slot {
  int version = 0;
  bool acked = false;
  std::string content;
  int64_t generation = 0;  // the session's sandbox generation at the write
};

class Workload {
 public:
  Workload(const Options& o, Replicas* replicas, Report* report)
      : o_(o), replicas_(replicas), report_(report), slots_(o.workers) {}

  void Worker(int w, const std::atomic<bool>& stop) {
    std::mt19937_64 rng(o_.seed * 1000 + w);
    int64_t seq = 0;
    while (!stop.load()) {
      const int k = static_cast<int>(rng() % o_.sessions);
      auto stub = replicas_->Stub(static_cast<int>(rng() % kReplicas));
      if (stub == nullptr) continue;
      const int op = static_cast<int>(rng() % 10);
      const int file = static_cast<int>(rng() % 4);
      Slot& slot = slots_[w][{k, file}];  // this worker's own: no lock
      const std::string path = absl::StrCat("w", w, "-", file, "-v", slot.version, ".txt");
      if (op < 4) {
        Write(stub.get(), k, path, absl::StrCat(SessionId(k), ":", w, ":", ++seq, ":", rng()),
              &slot);
      } else if (op < 7) {
        Verify(stub.get(), k, path, &slot);
      } else {
        Run(stub.get(), k, op == 9);
      }
    }
  }

 private:
  pb::SessionSpec Spec(int k) const {
    pb::SessionSpec s;
    s.set_provider(ProviderOf(k));
    return s;
  }
  // The call's status, counted; a call that came back past its deadline
  // (plus slack) is a violation.
  template <typename F>
  grpc::Status Timed(const std::string& op, F call) {
    const absl::Time start = absl::Now();
    grpc::Status s = call();
    const absl::Duration took = absl::Now() - start;
    report_->Call(op, s.error_code());
    if (took > kDeadline + kDeadlineSlack) {
      report_->Violation(absl::StrCat(op, " waited ", absl::FormatDuration(took),
                                      " past its deadline of ", absl::FormatDuration(kDeadline)));
    }
    return s;
  }
  // 0 when the session's generation cannot be read now.
  int64_t Generation(pb::SandboxBroker::Stub* stub, int k) {
    pb::GetSessionRequest req;
    req.set_session_id(SessionId(k));
    pb::SessionInfo info;
    grpc::Status s = Timed("GetSession", [&] { return stub->GetSession(Ctx().get(), req, &info); });
    return s.ok() ? info.generation() : 0;
  }
  void Write(pb::SandboxBroker::Stub* stub, int k, const std::string& path,
             const std::string& content, Slot* slot) {
    const int64_t before = Generation(stub, k);
    pb::WriteFileRequest req;
    req.set_session_id(SessionId(k));
    req.set_path(path);
    req.set_contents(content);
    *req.mutable_spec() = Spec(k);
    pb::WriteFileResponse resp;
    grpc::Status s = Timed("WriteFile", [&] { return stub->WriteFile(Ctx().get(), req, &resp); });
    if (!s.ok()) {
      // Not acknowledged: its effect is unknown (it may still land), so
      // the name is retired and the next write uses a new one.
      const int next = slot->version + 1;
      *slot = Slot();
      slot->version = next;
      return;
    }
    // Acknowledged in a known generation (the same before and after the
    // call): it must read back until the session goes on in a new one.
    const int64_t after = Generation(stub, k);
    slot->acked = before > 0 && before == after;
    slot->content = content;
    slot->generation = after;
  }
  void Verify(pb::SandboxBroker::Stub* stub, int k, const std::string& path, Slot* slot) {
    if (!slot->acked) return;
    pb::ReadFileRequest req;
    req.set_session_id(SessionId(k));
    req.set_path(path);
    *req.mutable_spec() = Spec(k);
    pb::ReadFileResponse resp;
    grpc::Status s = Timed("ReadFile", [&] { return stub->ReadFile(Ctx().get(), req, &resp); });
    if (!s.ok()) return;  // retryable during a fault: checked again later
    if (resp.found() && resp.contents() == slot->content) return;
    const int64_t now = Generation(stub, k);
    if (now == 0) return;  // not known now: checked again later
    if (now > slot->generation) {
      slot->acked = false;  // a new sandbox: the old one's files went with it
      return;
    }
    report_->Violation(absl::StrCat("session ", SessionId(k), " (", ProviderOf(k), ") ", path,
                                    ": an acknowledged write reads back ",
                                    resp.found() ? "different" : "missing", " in generation ",
                                    now));
    slot->acked = false;  // reported once
  }
  void Run(pb::SandboxBroker::Stub* stub, int k, bool shell) {
    pb::RunResult out;
    grpc::Status s;
    if (shell) {
      pb::ShellRequest req;
      req.set_session_id(SessionId(k));
      req.set_command("echo ok");
      *req.mutable_spec() = Spec(k);
      s = Timed("Shell", [&] { return stub->Shell(Ctx().get(), req, &out); });
    } else {
      pb::RunRequest req;
      req.set_session_id(SessionId(k));
      req.set_code("print(6 * 7)");
      *req.mutable_spec() = Spec(k);
      s = Timed("Run", [&] { return stub->Run(Ctx().get(), req, &out); });
    }
    const std::string want = shell ? "ok\n" : "42\n";
    if (s.ok() && !out.timed_out() && out.output() != want) {
      report_->Violation(absl::StrCat("session ", SessionId(k), ": a run answered \"",
                                      out.output().substr(0, 80), "\", not \"", want, "\""));
    }
  }

  const Options o_;
  Replicas* replicas_;
  Report* report_;
  // Per worker: (session, file) -> what it wrote there.
  std::vector<std::map<std::pair<int, int>, Slot>> slots_;
};

// The fake's running sandboxes per session (tenant/session metadata).
absl::StatusOr<std::map<std::string, int>> LiveAtFake(HttpClient* http, const std::string& url) {
  HttpRequest req;
  req.url = url + "/v2/sandboxes?limit=1000";
  req.headers = {{"X-API-KEY", kApiKey}};
  req.timeout = absl::Seconds(5);
  absl::StatusOr<HttpResponse> r = http->Send(req);
  if (!r.ok()) return r.status();
  if (r->status != 200) return absl::UnavailableError(absl::StrCat("list: ", r->status));
  json list = json::parse(r->body, nullptr, false);
  if (!list.is_array()) return absl::UnavailableError("list: not an array");
  std::map<std::string, int> out;
  for (const json& sb : list) {
    if (!sb.is_object() || !sb.contains("metadata") || !sb["metadata"].is_object()) continue;
    const json& md = sb["metadata"];
    const std::string session = md.value("sandbox-broker.session-id", std::string());
    if (!session.empty()) ++out[md.value("sandbox-broker.tenant", std::string()) + "/" + session];
  }
  return out;
}

void PostFaults(HttpClient* http, const std::string& url, const json& faults) {
  HttpRequest req;
  req.method = "POST";
  req.url = url + "/_fake/faults";
  req.body = faults.dump();
  req.timeout = absl::Seconds(5);
  (void)http->Send(req);
}

// Checks the fake every second: a session with two live sandboxes for
// longer than the orphan sweep needs to remove a crash's orphan.
void CheckFake(const std::string& url, Report* report, const std::atomic<bool>& stop) {
  HttpClient http("chaos-soak");
  struct Doubled {
    absl::Time since;
    bool reported = false;
  };
  std::map<std::string, Doubled> doubled;
  const absl::Duration allowed = absl::Seconds(kOrphanGraceSeconds + 10);
  while (!stop.load()) {
    absl::SleepFor(absl::Seconds(1));
    absl::StatusOr<std::map<std::string, int>> live = LiveAtFake(&http, url);
    if (!live.ok()) continue;  // the fake may be failing on purpose
    const absl::Time now = absl::Now();
    std::map<std::string, Doubled> still;
    for (const auto& [session, n] : *live) {
      if (n < 2) continue;
      auto it = doubled.find(session);
      Doubled d = it == doubled.end() ? Doubled{now, false} : it->second;
      if (!d.reported && now - d.since > allowed) {
        d.reported = true;
        report->Violation(absl::StrCat(session, ": ", n, " live sandboxes at the fake for ",
                                       absl::FormatDuration(now - d.since)));
      }
      still[session] = d;
    }
    doubled = std::move(still);
  }
}

// Every second: each live replica's RSS and open descriptors.
void SampleReplicas(Replicas* replicas, Report* report, const std::atomic<bool>& stop) {
  while (!stop.load()) {
    absl::SleepFor(absl::Seconds(1));
    for (int i = 0; i < kReplicas; ++i) {
      std::shared_ptr<Proc> p = replicas->Process(i);
      if (p == nullptr || p->pid() <= 0) continue;
      std::ifstream status(absl::StrCat("/proc/", p->pid(), "/status"));
      std::string line;
      int64_t rss = 0;
      while (std::getline(status, line)) {
        if (line.rfind("VmRSS:", 0) == 0) rss = atoll(line.c_str() + 6);
      }
      int fds = 0;
      if (DIR* d = opendir(absl::StrCat("/proc/", p->pid(), "/fd").c_str())) {
        while (struct dirent* e = readdir(d)) fds += e->d_name[0] != '.';
        closedir(d);
      }
      if (rss > 0) report->Sample(i, rss, fds);
    }
  }
}

// One fault, chosen at random, then the system is left to recover.
void InjectFault(std::mt19937_64& rng, const Options& o, Replicas* replicas, EtcdCluster* etcd,
                 HttpClient* http, const std::string& fake_url, Report* report) {
  const int r = static_cast<int>(rng() % kReplicas);
  switch (rng() % 5) {
    case 0: {
      report->Fault("replica_kill9_restart");
      replicas->Kill9(r);
      absl::SleepFor(absl::Seconds(1));
      if (!replicas->Start(r)) report->Violation(absl::StrCat("r", r, " did not restart"));
      return;
    }
    case 1: {
      report->Fault("replica_sigstop_past_lease");
      std::shared_ptr<Proc> p = replicas->Process(r);
      if (p == nullptr) return;
      p->Signal(SIGSTOP);
      absl::SleepFor(absl::Seconds(o.ttl + 2));
      p->Signal(SIGCONT);
      return;
    }
    case 2: {
      report->Fault("etcd_member_kill9_restart");
      EtcdServer& m = etcd->member(static_cast<int>(rng() % etcd->size()));
      m.Kill9();
      absl::SleepFor(absl::Seconds(2));
      if (!m.Start()) report->Violation("an etcd member did not restart");
      return;
    }
    case 3: {
      report->Fault("etcd_full_outage_under_ttl");
      for (int i = 0; i < etcd->size(); ++i) etcd->member(i).Kill9();
      absl::SleepFor(absl::Milliseconds(o.ttl * 400));
      if (!etcd->Start()) report->Violation("etcd did not come back after an outage");
      return;
    }
    default: {
      report->Fault("fake_e2b_latency_and_failures");
      PostFaults(http, fake_url, {{"latency_ms", 300}, {"error_every_n", 7}});
      absl::SleepFor(absl::Seconds(5));
      PostFaults(http, fake_url, {{"latency_ms", 0}, {"error_every_n", 0}});
      return;
    }
  }
}

// Closes every session through any live replica.
void CloseAll(const Options& o, Replicas* replicas) {
  for (int k = 0; k < o.sessions; ++k) {
    for (int attempt = 0; attempt < 30; ++attempt) {
      auto stub = replicas->Stub(attempt % kReplicas);
      if (stub == nullptr) continue;
      pb::CloseSessionRequest req;
      req.set_session_id(SessionId(k));
      pb::CloseSessionResponse resp;
      grpc::Status s = stub->CloseSession(Ctx().get(), req, &resp);
      if (s.ok() || s.error_code() == grpc::StatusCode::NOT_FOUND) break;
      absl::SleepFor(absl::Milliseconds(500));
    }
  }
}

// Sandboxes' directories left in the replicas' workspace roots.
int WorkspacesLeft(Replicas* replicas) {
  int n = 0;
  for (int i = 0; i < kReplicas; ++i) {
    if (DIR* d = opendir(replicas->Workspaces(i).c_str())) {
      while (struct dirent* e = readdir(d)) n += std::string(e->d_name).rfind("local-", 0) == 0;
      closedir(d);
    }
  }
  return n;
}

int Main(const Options& o) {
  if (!EtcdInstalled()) {
    fprintf(stderr, "chaos_soak: %s is not installed\n", kEtcdPath);
    return 1;
  }
  TempDir dir;
  chmod(dir.path().c_str(), 0711);  // sandbox uids traverse it to their workspaces
  EtcdCluster etcd(3);
  if (!etcd.Start()) {
    fprintf(stderr, "chaos_soak: etcd did not start\n");
    return 1;
  }
  mkdir((dir.path() + "/fake").c_str(), 0711);
  Proc fake({o.dir + "/fake-e2b", "--port", "0", "--api-key", kApiKey, "--workspace-root",
             dir.path() + "/fake", "--uid-base", "656000"},
            dir.path() + "/fake.out", dir.path() + "/fake.err");
  std::string fake_url;
  for (int i = 0; i < 1000 && fake_url.empty(); ++i) {
    const std::string out = ReadAll(fake.out());
    const auto at = out.find("listening on 127.0.0.1:");
    if (at != std::string::npos && out.find('\n', at) != std::string::npos) {
      fake_url = "http://127.0.0.1:" + out.substr(at + 23, out.find('\n', at) - at - 23);
    } else {
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  if (fake_url.empty()) {
    fprintf(stderr, "chaos_soak: fake-e2b did not start:\n%s\n", ReadAll(fake.err()).c_str());
    return 1;
  }
  Report report;
  Replicas replicas(o, dir.path(), etcd.endpoints(), fake_url);
  for (int i = 0; i < kReplicas; ++i) {
    if (!replicas.Start(i)) return 1;
  }
  fprintf(stderr,
          "chaos_soak: 3 replicas, 3 etcd members, fake-e2b; %d workers, %d sessions, %d s, "
          "member_ttl_seconds %d, a fault every ~%d s, seed %llu\n",
          o.workers, o.sessions, o.duration, o.ttl, o.fault_every,
          static_cast<unsigned long long>(o.seed));

  Workload load(o, &replicas, &report);
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int w = 0; w < o.workers; ++w) threads.emplace_back([&, w] { load.Worker(w, stop); });
  threads.emplace_back([&] { CheckFake(fake_url, &report, stop); });
  threads.emplace_back([&] { SampleReplicas(&replicas, &report, stop); });

  HttpClient http("chaos-soak");
  std::mt19937_64 rng(o.seed);
  const absl::Time end = absl::Now() + absl::Seconds(o.duration);
  while (absl::Now() < end) {
    const int wait_ms = o.fault_every * 500 + static_cast<int>(rng() % (o.fault_every * 1000));
    absl::SleepFor(std::min(absl::Milliseconds(wait_ms), end - absl::Now()));
    if (std::string crashed = replicas.Crashed(); !crashed.empty()) {
      report.Violation(crashed);
      break;
    }
    if (absl::Now() < end) InjectFault(rng, o, &replicas, &etcd, &http, fake_url, &report);
  }
  stop = true;
  for (auto& t : threads) t.join();

  // The final close and sweep: nothing may be left anywhere.
  CloseAll(o, &replicas);
  const absl::Time settle_end = absl::Now() + absl::Seconds(o.ttl + kOrphanGraceSeconds + 30);
  int fake_left = -1, workspaces_left = -1;
  while (absl::Now() < settle_end) {
    absl::StatusOr<std::map<std::string, int>> live = LiveAtFake(&http, fake_url);
    fake_left = 0;
    if (live.ok()) {
      for (const auto& [session, n] : *live) fake_left += n;
    }
    workspaces_left = WorkspacesLeft(&replicas);
    if (live.ok() && fake_left == 0 && workspaces_left == 0) break;
    absl::SleepFor(absl::Milliseconds(500));
  }
  if (fake_left != 0) {
    report.Violation(absl::StrCat(fake_left, " sandboxes left at the fake after the final sweep"));
  }
  if (workspaces_left != 0) {
    report.Violation(absl::StrCat(workspaces_left, " workspaces left after the final sweep"));
  }
  if (std::string crashed = replicas.Crashed(); !crashed.empty()) report.Violation(crashed);
  json out = report.ToJson();
  out["duration_seconds"] = o.duration;
  out["seed"] = o.seed;
  printf("%s\n", out.dump(2).c_str());
  for (int i = 0; i < kReplicas; ++i) replicas.Kill9(i);
  return report.violations() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace sandbox

int main(int argc, char** argv) {
  sandbox::Options o;
  o.dir = sandbox::ExeDir();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string v = argv[i + 1];
    bool ok = true;
    if (flag == "--duration") {
      ok = absl::SimpleAtoi(v, &o.duration);
    } else if (flag == "--workers") {
      ok = absl::SimpleAtoi(v, &o.workers);
    } else if (flag == "--sessions") {
      ok = absl::SimpleAtoi(v, &o.sessions);
    } else if (flag == "--ttl") {
      ok = absl::SimpleAtoi(v, &o.ttl) && o.ttl >= 2;
    } else if (flag == "--fault-every") {
      ok = absl::SimpleAtoi(v, &o.fault_every) && o.fault_every >= 1;
    } else if (flag == "--seed") {
      ok = absl::SimpleAtoi(v, &o.seed);
    } else {
      ok = false;
    }
    if (!ok) {
      fprintf(stderr, "chaos_soak: bad flag %s %s\n", flag.c_str(), v.c_str());
      return 2;
    }
  }
  return sandbox::Main(o);
}
