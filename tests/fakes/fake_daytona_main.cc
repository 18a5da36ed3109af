// fake-daytona: the fake E2B server as a development tool.
//   fake-daytona --port 0 --api-key dtn_test_key
// The first line on stdout is "listening on 127.0.0.1:PORT"; the API is then
// under http://127.0.0.1:PORT/api.

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tests/fakes/fake_daytona.h"

int main(int argc, char** argv) {
  sandbox::FakeDaytona::Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--port" && i + 1 < argc) {
      o.port = atoi(argv[++i]);
    } else if (a == "--api-key" && i + 1 < argc) {
      o.api_key = argv[++i];
    } else if (a == "--workspace-root" && i + 1 < argc) {
      o.workspace_root = argv[++i];
    } else if (a == "--uid-base" && i + 1 < argc) {
      o.uid_base = atoll(argv[++i]);
    } else {
      fprintf(
          stderr,
          "usage: fake-daytona [--port N] [--api-key KEY] [--workspace-root DIR] [--uid-base N]\n");
      return 2;
    }
  }
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);
  auto fake = sandbox::FakeDaytona::Start(o);
  if (!fake.ok()) {
    fprintf(stderr, "fake-daytona: %s\n", std::string(fake.status().message()).c_str());
    return 1;
  }
  printf("listening on 127.0.0.1:%d\n", (*fake)->port());
  fflush(stdout);
  int sig;
  sigwait(&sigs, &sig);
  return 0;
}
