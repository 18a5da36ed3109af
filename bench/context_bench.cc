// context_bench: the cost of a RunCode in a warm code context
// (docs/api.md#code-contexts), as a ratio against its true limit measured
// side by side in the same run: the same statement sent straight to an
// IPython kernel on the host (bench/kernel_floor.py: jupyter_client, no
// broker, no sandbox). The bar: p50 at most 1.5x.
//
// Both sides keep one warm kernel for the whole run, and rounds alternate
// floor and broker so that drift on a shared machine falls on both.
//
//   context_bench [--runs N] [--rounds R]   defaults 200 runs, 3 rounds
//   context_bench --smoke                   20 runs, 1 round (ctest)

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/remote_sandbox.h"
#include "common/log.h"
#include "grpcpp/create_channel.h"
#include "server/app/broker_server.h"
#include "server/app/provider_setup.h"

namespace sandbox {
namespace {

constexpr char kCode[] = "1+1";

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// bench/kernel_floor.py, kept running: one kernel for every round, as the
// broker's context keeps one.
class Floor {
 public:
  Floor() {
    int in[2], out[2];
    // Close-on-exec: no other child of this process (a sandbox) keeps an end.
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return;
    const std::string script = std::string(SANDBOX_BENCH_DIR) + "/kernel_floor.py";
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      const int devnull = open("/dev/null", O_WRONLY);
      dup2(devnull, 2);  // the kernel's debugger warnings
      close(in[1]);      // else the script never sees its stdin end
      close(out[0]);
      execl("/usr/bin/python3", "python3", script.c_str(), kCode, nullptr);
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_ = fdopen(in[1], "w");
    from_ = fdopen(out[0], "r");
  }
  ~Floor() {
    if (to_) fclose(to_);  // EOF: the script stops its kernel and exits
    if (from_) fclose(from_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }
  // The p50 of `runs` in ms, or -1.
  double Ms(int runs) {
    if (!to_ || !from_) return -1;
    fprintf(to_, "%d\n", runs);
    fflush(to_);
    char buf[64];
    if (!fgets(buf, sizeof(buf), from_)) return -1;
    return atof(buf) / 1000.0;
  }

 private:
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
};

// RunCode's p50 in ms through the broker, or -1.
double BrokerMs(RemoteSandbox& sb, int runs) {
  for (int i = 0; i < 20; ++i) {
    if (!sb.RunCode(kCode).ok()) return -1;
  }
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    const absl::Time t = absl::Now();
    auto x = sb.RunCode(kCode);
    if (!x.ok() || x->results_size() != 1) return -1;
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t));
  }
  return Median(ms);
}

int Main(int runs, int rounds) {
  SetLogLevel(LogLevel::kError);
  char tmpl[] = "/var/tmp/context-bench-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  chmod(dir.c_str(), 0711);  // sandboxes' uids search it
  nlohmann::json cfg = {{"listen", "127.0.0.1:0"},
                        {"auth", nullptr},
                        {"state", {{"backend", "memory"}}},
                        {"providers", {{"local", {{"workspace_root", dir + "/ws"}}}}}};
  auto config = ParseConfig(cfg.dump());
  if (!config.ok()) return fprintf(stderr, "%s\n", config.status().ToString().c_str()), 1;
  auto providers = BuildProviders(*config);
  if (!providers.ok()) return fprintf(stderr, "%s\n", providers.status().ToString().c_str()), 1;
  BrokerServer::Options so;
  so.health_thread = false;
  so.pool_threads = false;
  auto server = BrokerServer::Start(*config, std::move(*providers), so);
  if (!server.ok()) return fprintf(stderr, "%s\n", server.status().ToString().c_str()), 1;
  RemoteSandbox sb(
      pb::SandboxBroker::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*server)->port()),
                                                     grpc::InsecureChannelCredentials())),
      "bench");
  printf("RunCode '%s' in a warm python context, p50 of %d, %d rounds\n", kCode, runs, rounds);
  Floor kernel;
  std::vector<double> ratios;
  int rc = 0;
  for (int r = 0; r < rounds; ++r) {
    const double floor = kernel.Ms(runs);
    const double broker = BrokerMs(sb, runs);
    if (floor <= 0 || broker <= 0) {
      fprintf(stderr, "context_bench: round %d failed (floor %.3f, broker %.3f)\n", r, floor,
              broker);
      rc = 1;
      break;
    }
    ratios.push_back(broker / floor);
    printf("  round %d: broker %.3f ms, kernel on the host %.3f ms: %.2fx\n", r + 1, broker, floor,
           broker / floor);
  }
  if (!ratios.empty()) {
    const double m = Median(ratios);
    printf("median ratio %.2fx (bar: 1.5x, %s)\n", m, m <= 1.5 ? "met" : "NOT met");
  }
  (void)sb.Close();
  (*server)->Shutdown();
  server->reset();  // the provider lets go of its workspace root
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  return rc;
}

}  // namespace
}  // namespace sandbox

int main(int argc, char** argv) {
  int runs = 200, rounds = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--smoke") {
      runs = 20;
      rounds = 1;
    } else if (a == "--runs" && i + 1 < argc) {
      runs = std::stoi(argv[++i]);
    } else if (a == "--rounds" && i + 1 < argc) {
      rounds = std::stoi(argv[++i]);
    } else {
      fprintf(stderr, "usage: context_bench [--smoke] [--runs N] [--rounds R]\n");
      return 64;
    }
  }
  return sandbox::Main(runs, rounds);
}
