// sandbox-brokerd: the daemon. Components, in order: config -> logging ->
// providers -> broker server (sessions, reaper, gRPC) -> signal wait.

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "common/child_reaper.h"
#include "common/failpoint.h"
#include "common/log.h"
#include "common/process_defaults.h"
#include "server/app/broker_server.h"
#include "server/app/provider_setup.h"
#include "server/config/config.h"

namespace {

constexpr char kUsage[] =
    "usage: sandbox-brokerd [--config FILE] [--listen ADDR] [--check-config] [--version]\n"
    "\n"
    "Serves the sandboxbroker.v1.SandboxBroker gRPC API.\n"
    "  --config FILE   JSON config (see docs/config.md)\n"
    "  --listen ADDR   overrides the config's listen address (host:port)\n"
    "  --check-config  validate the config (and each provider's section), then exit\n"
    "Signals: SIGTERM/SIGINT drain gracefully (drain_grace_seconds); a second one\n"
    "forces the exit. SIGHUP reloads tokens, admin tokens and tenant policy.\n"
    "With no config: the local provider on 127.0.0.1:50051.\n";

int Fail(const std::string& msg) {
  fprintf(stderr, "sandbox-brokerd: %s\n", msg.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace sandbox;
  // Before any thread: the soak's RSS slope (docs/hardening.md).
  const ServingDefaults defaults = ApplyServingDefaults();
  std::string config_path, listen;
  bool check_only = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      if (a == flag && i + 1 < argc) return argv[++i];
      size_t n = strlen(flag);
      if (a.compare(0, n, flag) == 0 && a.size() > n && a[n] == '=') return argv[i] + n + 1;
      return nullptr;
    };
    if (a == "-h" || a == "--help") {
      fputs(kUsage, stdout);
      return 0;
    } else if (a == "--version") {
      printf("sandbox-brokerd %s\n", SANDBOX_BROKER_VERSION);
      return 0;
    } else if (const char* v = value("--config")) {
      config_path = v;
    } else if (const char* v = value("--listen")) {
      listen = v;
    } else if (a == "--check-config") {
      check_only = true;
    } else {
      fputs(kUsage, stderr);
      return Fail("unknown argument: " + a);
    }
  }

  absl::StatusOr<BrokerConfig> config =
      config_path.empty() ? ParseConfig("{}") : LoadConfigFile(config_path);
  if (!config.ok()) return Fail(std::string(config.status().message()));
  if (!listen.empty()) config->listen = listen;
  if (check_only) {
    absl::Status s = CheckProviderConfigs(*config);
    if (!s.ok()) return Fail(std::string(s.message()));
    printf("config ok\n");
    return 0;
  }
  SetLogJson(config->log_format == "json");
  SetLogLevel(config->log_level == "debug"     ? LogLevel::kDebug
              : config->log_level == "warning" ? LogLevel::kWarning
              : config->log_level == "error"   ? LogLevel::kError
                                               : LogLevel::kInfo);
  // Each connection, transfer and sandbox pipe holds a descriptor
  // (process_defaults.h): a low hard limit caps the calls in flight.
  const bool few_files = defaults.open_files < 16384;
  Log(few_files ? LogLevel::kWarning : LogLevel::kInfo, "broker.open_files",
      {{"limit", static_cast<int64_t>(defaults.open_files)},
       {"was", static_cast<int64_t>(defaults.open_files_before)},
       {"note", few_files ? "the hard RLIMIT_NOFILE caps connections and calls in flight; raise "
                            "it (systemd LimitNOFILE=, podman --ulimit nofile=)"
                          : "the soft RLIMIT_NOFILE raised to the hard one"}});
  // Crash tests' failpoints (common/failpoint.h): never armed in production
  // unless the variable is set, and then said loudly.
  absl::StatusOr<std::string> failpoints = FailpointsFromEnvironment();
  if (!failpoints.ok()) return Fail(std::string(failpoints.status().message()));
  if (!failpoints->empty()) {
    Log(LogLevel::kWarning, "broker.failpoints_armed",
        {{"points", *failpoints},
         {"note", "for crash tests only: the daemon will stop or stall there"}});
  }

  // Signals are taken synchronously by this thread; block them before any
  // other thread starts so they all inherit the mask.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGHUP);
  // SIGCHLD too: the child reaper's thread takes it (sigtimedwait).
  sigset_t blocked = sigs;
  sigaddset(&blocked, SIGCHLD);
  pthread_sigmask(SIG_BLOCK, &blocked, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // Orphans handed to us (always as PID 1 in a container; anywhere once we
  // are a subreaper) are reaped; children RunProcess waits for are not.
  if (absl::Status s = ChildReaper::Start(); !s.ok()) return Fail(std::string(s.message()));

  auto providers = BuildProviders(*config);
  if (!providers.ok()) return Fail(std::string(providers.status().message()));
  BrokerServer::Options options;
  options.config_path = config_path;
  options.listen_override = listen;
  auto server = BrokerServer::Start(*config, std::move(*providers), options);
  if (!server.ok()) return Fail(std::string(server.status().message()));

  int sig = 0;
  // Between signals, the heap's free pages go back to the system once a
  // minute (process_defaults.h).
  const timespec release_every = {kReleaseFreeHeapSeconds, 0};
  while (true) {
    sig = sigtimedwait(&sigs, nullptr, &release_every);
    if (sig < 0) {  // EAGAIN: a minute without a signal (or EINTR)
      ReleaseFreeHeap();
      continue;
    }
    if (sig != SIGHUP) break;
    // Reload without restart; the outcome is logged (and audited).
    Log(LogLevel::kInfo, "broker.signal", {{"signal", strsignal(sig)}});
    (void)(*server)->Reload("sighup");
  }
  sigdelset(&sigs, SIGHUP);
  Log(LogLevel::kInfo, "broker.signal", {{"signal", strsignal(sig)}});
  // A second signal while shutting down forces the exit.
  std::thread([sigs]() mutable {
    int s2 = 0;
    sigwait(&sigs, &s2);
    FlushLogs();
    _exit(1);
  }).detach();
  (*server)->Drain();
  Log(LogLevel::kInfo, "broker.exit", {});
  FlushLogs();
  return 0;
}
