// broker_soak: the daemon under a long, realistic mix (docs/hardening.md).
//
//   broker_soak --provider=local --duration=600      the 10-minute figures
//   broker_soak --provider=echo --duration=600       the broker alone
//   broker_soak --provider=local --duration=20 --workers=4   (CI's short run)
//
// Starts a real sandbox-brokerd (its own process, so its RSS, fds and threads
// are the broker's alone) with a short idle timeout, then `--workers` client
// threads spread calls over `--sessions` session ids: runs with output and
// shell commands (output checked), file writes then reads (bytes checked),
// streams (chunks checked against the whole), client cancels, run timeouts,
// closes, keep-alives and gets, while the reaper closes idle sessions under
// them (idle reaps racing new calls). A sampler records the broker's RSS,
// open fds and threads every `--sample` seconds. At the end every session is
// closed and the harness checks that no session, workspace or sandbox
// process is left, then stops the daemon with SIGTERM.
//
// Reports calls and errors by op and code; an error is unexpected unless the
// op expects it (a cancel's DEADLINE_EXCEEDED, NOT_FOUND for get/keepalive
// of a reaped session). RSS and fd slopes are least-squares fits over the
// samples after warm-up (the first `--warmup` fraction). Exit status 0 only
// with 0 unexpected errors, 0 leaks and a clean daemon exit.

#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "nlohmann/json.hpp"
#include "sandboxbroker/v1/broker.grpc.pb.h"

namespace {

namespace pb = ::sandboxbroker::v1;

struct Options {
  std::string provider = "local";
  int duration_seconds = 60;
  int sessions = 1000;
  int workers = 8;
  double sample_seconds = 2;
  double warmup = 0.2;
  int idle_timeout_seconds = 3;
  std::string brokerd = BROKERD_PATH;
  std::string json_out;
};

struct Sample {
  double t;  // seconds since start
  int64_t rss_kb;
  int fds;
  int threads;
  int sessions;
};

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int CountEntries(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

int64_t StatusField(const std::string& status, const std::string& key) {
  size_t p = status.find(key + ":");
  if (p == std::string::npos) return -1;
  return std::strtoll(status.c_str() + p + key.size() + 1, nullptr, 10);
}

// Processes whose parent chain reaches `root` (the broker's sandboxes).
std::vector<int> Descendants(int root) {
  std::map<int, int> parent;
  DIR* d = opendir("/proc");
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const std::string stat = Slurp(absl::StrCat("/proc/", e->d_name, "/stat"));
    size_t rp = stat.rfind(')');
    if (rp == std::string::npos) continue;
    int ppid = 0;
    char state = 0;
    if (sscanf(stat.c_str() + rp + 1, " %c %d", &state, &ppid) == 2) {
      parent[std::atoi(e->d_name)] = ppid;
    }
  }
  closedir(d);
  std::vector<int> out;
  for (const auto& [pid, pp] : parent) {
    for (int p = pp, hops = 0; p > 1 && hops < 64; p = parent.count(p) ? parent[p] : 0, ++hops) {
      if (p == root) {
        out.push_back(pid);
        break;
      }
    }
  }
  return out;
}

int FreePort() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  close(s);
  return ntohs(a.sin_port);
}

// Least-squares slope of y over t (units per minute).
double SlopePerMinute(const std::vector<Sample>& s, double from, double (*y)(const Sample&)) {
  double n = 0, st = 0, sy = 0, stt = 0, sty = 0;
  for (const Sample& x : s) {
    if (x.t < from) continue;
    const double t = x.t / 60.0, v = y(x);
    n += 1;
    st += t;
    sy += v;
    stt += t * t;
    sty += t * v;
  }
  if (n < 2 || n * stt - st * st == 0) return 0;
  return (n * sty - st * sy) / (n * stt - st * st);
}

class Soak {
 public:
  explicit Soak(Options o) : o_(std::move(o)) {}

  int Main() {
    char tmpl[] = "/tmp/sb-soak-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return Fail("mkdtemp");
    dir_ = tmpl;
    chmod(dir_.c_str(), 0755);  // sandbox uids traverse it to their workspace
    ws_ = dir_ + "/ws";
    const int port = FreePort();
    nlohmann::json cfg = {{"listen", absl::StrCat("127.0.0.1:", port)},
                          {"default_provider", o_.provider},
                          {"idle_timeout_seconds", o_.idle_timeout_seconds},
                          {"reap_interval_seconds", 1},
                          {"max_sessions_per_tenant", o_.sessions * 2},
                          {"max_timeout_seconds", 60},
                          {"max_output_bytes", 65536},
                          {"close_wait_seconds", 10},
                          {"log_level", "warning"},
                          // Its own store: soaks run in parallel (ctest -j)
                          // must never share the default one.
                          {"state", {{"backend", "sqlite"}, {"path", dir_ + "/state.db"}}},
                          {"providers",
                           {{"local",
                             {{"workspace_root", ws_},
                              {"uid_base", 640000},
                              // Up to ~100 live sessions of 1 GiB limits,
                              // most idle: admitted by overcommit, as an
                              // operator with such a load would.
                              {"capacity", {{"overcommit", {{"memory", 8}, {"disk", 8}}}}}}},
                            {"echo", nlohmann::json::object()}}}};
    std::ofstream(dir_ + "/config.json") << cfg.dump(2);
    pid_ = fork();
    if (pid_ == 0) {
      const std::string log = dir_ + "/brokerd.log";
      freopen(log.c_str(), "w", stderr);
      execl(o_.brokerd.c_str(), o_.brokerd.c_str(), "--config", (dir_ + "/config.json").c_str(),
            nullptr);
      _exit(127);
    }
    channel_ =
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
    if (!channel_->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(60))) {
      kill(pid_, SIGKILL);
      return Fail("the broker did not start; see " + dir_ + "/brokerd.log");
    }
    stub_ = pb::SandboxBroker::NewStub(channel_);
    start_ = absl::Now();
    const absl::Time end = start_ + absl::Seconds(o_.duration_seconds);
    std::thread sampler([&] {
      while (absl::Now() < end) {
        TakeSample();
        absl::SleepFor(absl::Seconds(o_.sample_seconds));
      }
    });
    std::vector<std::thread> workers;
    for (int w = 0; w < o_.workers; ++w) workers.emplace_back([this, w, end] { Work(w, end); });
    for (auto& t : workers) t.join();
    sampler.join();
    TakeSample();
    return Finish();
  }

 private:
  static int Fail(const std::string& why) {
    fprintf(stderr, "broker_soak: %s\n", why.c_str());
    return 2;
  }

  void TakeSample() {
    const std::string status = Slurp(absl::StrCat("/proc/", pid_, "/status"));
    Sample s;
    s.t = absl::ToDoubleSeconds(absl::Now() - start_);
    s.rss_kb = StatusField(status, "VmRSS");
    s.threads = static_cast<int>(StatusField(status, "Threads"));
    s.fds = CountEntries(absl::StrCat("/proc/", pid_, "/fd"));
    s.sessions = CountSessions();
    std::lock_guard<std::mutex> l(mu_);
    samples_.push_back(s);
  }

  int CountSessions() {
    int n = 0;
    pb::ListSessionsRequest req;
    req.set_page_size(1000);
    while (true) {
      pb::ListSessionsResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      if (!stub_->ListSessions(&ctx, req, &resp).ok()) return -1;
      n += resp.sessions_size();
      if (resp.next_page_token().empty()) return n;
      req.set_page_token(resp.next_page_token());
    }
  }

  void Record(const std::string& op, grpc::StatusCode code, bool expected,
              const std::string& detail = "") {
    std::lock_guard<std::mutex> l(mu_);
    ++calls_[op][code];
    if (!expected) {
      ++unexpected_;
      if (examples_.size() < 20) {
        examples_.push_back(absl::StrCat(op, ": code ", code, " ", detail.substr(0, 200)));
      }
    }
  }

  std::unique_ptr<grpc::ClientContext> Ctx(int seconds = 60) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
    return ctx;
  }

  void Work(int w, absl::Time end) {
    std::mt19937 rng(static_cast<uint32_t>(w * 7919 + 1));
    const bool local = o_.provider == "local";
    // Weights: run, shell, write+read, stream, cancel, timeout, close, keepalive, get.
    std::vector<int> weights = {30, 10, 15, 10, local ? 4 : 0, local ? 4 : 0, 5, 6, 6};
    std::discrete_distribution<int> pick(weights.begin(), weights.end());
    while (absl::Now() < end) {
      const std::string session =
          absl::StrCat("soak-", std::uniform_int_distribution<int>(0, o_.sessions - 1)(rng));
      {
        std::lock_guard<std::mutex> l(mu_);
        used_.insert(session);
      }
      switch (pick(rng)) {
        case 0:
          DoRun(session, rng);
          break;
        case 1:
          DoShell(session, rng);
          break;
        case 2:
          DoFiles(session, w, rng);
          break;
        case 3:
          DoStream(session);
          break;
        case 4:
          DoCancel(session);
          break;
        case 5:
          DoTimeout(session);
          break;
        case 6:
          DoClose(session);
          break;
        case 7:
          DoKeepAliveOrGet(session, true);
          break;
        case 8:
          DoKeepAliveOrGet(session, false);
          break;
      }
    }
  }

  void DoRun(const std::string& session, std::mt19937& rng) {
    const int n = std::uniform_int_distribution<int>(1, 2000)(rng);
    pb::RunRequest req;
    req.set_session_id(session);
    const bool local = o_.provider == "local";
    req.set_code(local ? absl::StrCat("print('x' * ", n, ")") : std::string(n, 'x'));
    const std::string want = local ? std::string(n, 'x') + "\n" : std::string(n, 'x');
    pb::RunResult out;
    auto ctx = Ctx();
    grpc::Status s = stub_->Run(ctx.get(), req, &out);
    const bool good = s.ok() && out.output() == want && out.exit_code() == 0;
    Record("run", s.error_code(), good, s.ok() ? "wrong output" : s.error_message());
  }

  void DoShell(const std::string& session, std::mt19937& rng) {
    const int k = std::uniform_int_distribution<int>(0, 1 << 30)(rng);
    pb::ShellRequest req;
    req.set_session_id(session);
    const bool local = o_.provider == "local";
    req.set_command(absl::StrCat("echo shell-", k));
    const std::string want = local ? absl::StrCat("shell-", k, "\n") : req.command();
    pb::RunResult out;
    auto ctx = Ctx();
    grpc::Status s = stub_->Shell(ctx.get(), req, &out);
    Record("shell", s.error_code(), s.ok() && out.output() == want,
           s.ok() ? "wrong output: " + out.output() : s.error_message());
  }

  void DoFiles(const std::string& session, int w, std::mt19937& rng) {
    std::string data(std::uniform_int_distribution<int>(0, 8192)(rng), '\0');
    for (char& c : data) c = static_cast<char>(rng());
    const std::string path = absl::StrCat("w", w, "/f.bin");
    pb::WriteFileRequest wr;
    wr.set_session_id(session);
    wr.set_path(path);
    wr.set_contents(absl::Base64Escape(data));
    wr.set_encoding(pb::ENCODING_BASE64);
    pb::WriteFileResponse wresp;
    auto c1 = Ctx();
    grpc::Status s = stub_->WriteFile(c1.get(), wr, &wresp);
    Record("write", s.error_code(), s.ok(), s.error_message());
    if (!s.ok()) return;
    pb::ReadFileRequest rd;
    rd.set_session_id(session);
    rd.set_path(path);
    rd.set_encoding(pb::ENCODING_BASE64);
    pb::ReadFileResponse rresp;
    auto c2 = Ctx();
    s = stub_->ReadFile(c2.get(), rd, &rresp);
    std::string got;
    // Not found: the session was closed or reaped between the two calls.
    const bool good =
        s.ok() && (!rresp.found() || (absl::Base64Unescape(rresp.contents(), &got) && got == data));
    Record(s.ok() && !rresp.found() ? "read(reaped between)" : "read", s.error_code(), good,
           s.ok() ? "wrong bytes" : s.error_message());
  }

  void DoStream(const std::string& session) {
    pb::RunRequest req;
    req.set_session_id(session);
    const bool local = o_.provider == "local";
    req.set_code(local ? "import sys\nfor i in range(5):\n  print('line', i, flush=True)"
                       : "line 0\nline 1\nline 2\nline 3\nline 4\n");
    std::string want;
    for (int i = 0; i < 5; ++i) want += absl::StrCat("line ", i, "\n");
    auto ctx = Ctx();
    auto reader = stub_->RunStream(ctx.get(), req);
    pb::RunEvent ev;
    std::string got;
    bool result = false;
    while (reader->Read(&ev)) {
      if (ev.has_output()) got += ev.output().data();
      if (ev.has_result()) result = ev.result().exit_code() == 0;
    }
    grpc::Status s = reader->Finish();
    Record("stream", s.error_code(), s.ok() && result && got == want,
           s.ok() ? "wrong stream: " + got : s.error_message());
  }

  void DoCancel(const std::string& session) {
    pb::RunRequest req;
    req.set_session_id(session);
    req.set_code("import time\ntime.sleep(30)");
    pb::RunResult out;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(1500));
    grpc::Status s = stub_->Run(&ctx, req, &out);
    Record("cancel", s.error_code(), s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED,
           s.error_message());
  }

  void DoTimeout(const std::string& session) {
    pb::RunRequest req;
    req.set_session_id(session);
    req.set_code("import time\nprint('before', flush=True)\ntime.sleep(30)");
    req.set_timeout_seconds(3);  // ample for python to start on a loaded machine
    pb::RunResult out;
    auto ctx = Ctx();
    grpc::Status s = stub_->Run(ctx.get(), req, &out);
    Record("timeout", s.error_code(),
           s.ok() && out.timed_out() && out.exit_code() == 124 && out.output() == "before\n",
           s.ok() ? "not timed out: " + out.output() : s.error_message());
  }

  void DoClose(const std::string& session) {
    pb::CloseSessionRequest req;
    req.set_session_id(session);
    pb::CloseSessionResponse out;
    auto ctx = Ctx();
    grpc::Status s = stub_->CloseSession(ctx.get(), req, &out);
    Record("close", s.error_code(), s.ok(), s.error_message());
  }

  void DoKeepAliveOrGet(const std::string& session, bool keepalive) {
    auto ctx = Ctx();
    grpc::Status s;
    if (keepalive) {
      pb::KeepAliveRequest req;
      req.set_session_id(session);
      pb::KeepAliveResponse out;
      s = stub_->KeepAlive(ctx.get(), req, &out);
    } else {
      pb::GetSessionRequest req;
      req.set_session_id(session);
      pb::SessionInfo out;
      s = stub_->GetSession(ctx.get(), req, &out);
    }
    Record(keepalive ? "keepalive" : "get", s.error_code(),
           s.ok() || s.error_code() == grpc::StatusCode::NOT_FOUND, s.error_message());
  }

  int Finish() {
    // Close everything, then look for what is left.
    for (const std::string& id : used_) {
      pb::CloseSessionRequest req;
      req.set_session_id(id);
      pb::CloseSessionResponse out;
      auto ctx = Ctx();
      grpc::Status s = stub_->CloseSession(ctx.get(), req, &out);
      Record("final close", s.error_code(), s.ok(), s.error_message());
    }
    const int left_sessions = CountSessions();
    // A reap the final closes raced with may still be removing its workspace
    // (the session is out of the table before its destroy ends): allow a
    // moment, as for the processes below.
    int left_workspaces = 0;
    for (int i = 0; i < 50 && o_.provider == "local"; ++i) {
      left_workspaces = std::max(0, CountEntries(ws_));
      if (left_workspaces == 0) break;
      usleep(100000);
    }
    // Sandboxes are processes under the broker; allow a moment for kills.
    std::vector<int> left_procs;
    for (int i = 0; i < 50; ++i) {
      left_procs = Descendants(pid_);
      if (left_procs.empty()) break;
      usleep(100000);
    }
    kill(pid_, SIGTERM);
    int wstatus = 0;
    waitpid(pid_, &wstatus, 0);
    const bool clean_exit = WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0;

    const double warm = o_.duration_seconds * o_.warmup;
    const double rss_slope = SlopePerMinute(
        samples_, warm, [](const Sample& s) { return static_cast<double>(s.rss_kb); });
    const double fd_slope =
        SlopePerMinute(samples_, warm, [](const Sample& s) { return static_cast<double>(s.fds); });
    const double thread_slope = SlopePerMinute(
        samples_, warm, [](const Sample& s) { return static_cast<double>(s.threads); });
    int64_t total = 0;
    nlohmann::json by_op = nlohmann::json::object();
    for (const auto& [op, codes] : calls_) {
      for (const auto& [code, n] : codes) {
        by_op[op][absl::StrCat(code)] = n;
        total += n;
      }
    }
    auto after = [&](auto field) {
      int64_t lo = INT64_MAX, hi = 0;
      for (const Sample& s : samples_) {
        if (s.t < warm) continue;
        lo = std::min<int64_t>(lo, field(s));
        hi = std::max<int64_t>(hi, field(s));
      }
      return std::make_pair(lo == INT64_MAX ? 0 : lo, hi);
    };
    const auto rss = after([](const Sample& s) { return s.rss_kb; });
    const auto fds = after([](const Sample& s) { return static_cast<int64_t>(s.fds); });
    const auto thr = after([](const Sample& s) { return static_cast<int64_t>(s.threads); });
    const auto live = after([](const Sample& s) { return static_cast<int64_t>(s.sessions); });
    nlohmann::json report = {
        {"provider", o_.provider},
        {"duration_seconds", o_.duration_seconds},
        {"workers", o_.workers},
        {"session_ids", used_.size()},
        {"calls", total},
        {"calls_by_op_and_grpc_code", by_op},
        {"unexpected_errors", unexpected_},
        {"unexpected_examples", examples_},
        {"rss_kb_first", samples_.empty() ? 0 : samples_.front().rss_kb},
        {"rss_kb_after_warmup_min_max", {rss.first, rss.second}},
        {"rss_kb_last", samples_.empty() ? 0 : samples_.back().rss_kb},
        {"rss_kb_per_minute_after_warmup", rss_slope},
        {"fds_after_warmup_min_max", {fds.first, fds.second}},
        {"fds_per_minute_after_warmup", fd_slope},
        {"threads_after_warmup_min_max", {thr.first, thr.second}},
        {"threads_per_minute_after_warmup", thread_slope},
        {"live_sessions_after_warmup_min_max", {live.first, live.second}},
        {"samples", samples_.size()},
        {"leaked_sessions", left_sessions},
        {"leaked_workspaces", left_workspaces},
        {"leaked_sandbox_processes", left_procs.size()},
        {"broker_exit_clean", clean_exit},
    };
    const std::string text = report.dump(2);
    printf("%s\n", text.c_str());
    if (!o_.json_out.empty()) std::ofstream(o_.json_out) << text << "\n";
    const bool ok = unexpected_ == 0 && left_sessions == 0 && left_workspaces == 0 &&
                    left_procs.empty() && clean_exit;
    if (ok) {
      std::string rm = "rm -rf '" + dir_ + "'";
      (void)!system(rm.c_str());
    } else {
      fprintf(stderr, "broker_soak: FAILED; broker log and config kept in %s\n", dir_.c_str());
    }
    return ok ? 0 : 1;
  }

  const Options o_;
  std::string dir_, ws_;
  pid_t pid_ = -1;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::SandboxBroker::Stub> stub_;
  absl::Time start_;
  std::mutex mu_;
  std::vector<Sample> samples_;
  std::map<std::string, std::map<int, int64_t>> calls_;
  int64_t unexpected_ = 0;
  std::vector<std::string> examples_;
  std::set<std::string> used_;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&](const char* flag) -> const char* {
      const size_t n = strlen(flag);
      return a.compare(0, n, flag) == 0 ? argv[i] + n : nullptr;
    };
    if (const char* v = val("--provider=")) {
      o.provider = v;
    } else if (const char* v = val("--duration=")) {
      o.duration_seconds = atoi(v);
    } else if (const char* v = val("--sessions=")) {
      o.sessions = atoi(v);
    } else if (const char* v = val("--workers=")) {
      o.workers = atoi(v);
    } else if (const char* v = val("--sample=")) {
      o.sample_seconds = atof(v);
    } else if (const char* v = val("--warmup=")) {
      o.warmup = atof(v);
    } else if (const char* v = val("--idle-timeout=")) {
      o.idle_timeout_seconds = atoi(v);
    } else if (const char* v = val("--brokerd=")) {
      o.brokerd = v;
    } else if (const char* v = val("--json=")) {
      o.json_out = v;
    } else {
      fprintf(stderr,
              "usage: broker_soak [--provider=local|echo] [--duration=SECONDS] [--sessions=N]\n"
              "  [--workers=N] [--sample=SECONDS] [--warmup=FRACTION] [--idle-timeout=SECONDS]\n"
              "  [--brokerd=PATH] [--json=FILE]\n");
      return 2;
    }
  }
  if (o.provider != "local" && o.provider != "echo") {
    fprintf(stderr, "broker_soak: --provider must be local or echo\n");
    return 2;
  }
  return Soak(std::move(o)).Main();
}
