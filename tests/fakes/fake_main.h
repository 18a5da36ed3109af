#pragma once

// The command-line shell shared by the fake provider servers:
//   fake-X [--port N] [--api-key KEY] [--workspace-root DIR] [--uid-base N]
//          [--cpu-weight N]
// The first line on stdout is "listening on 127.0.0.1:PORT"; SIGINT or
// SIGTERM stops it.

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace sandbox {

template <typename Fake>
int FakeMain(int argc, char** argv, const char* name) {
  typename Fake::Options o;
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
    } else if (a == "--cpu-weight" && i + 1 < argc && atoll(argv[i + 1]) >= 1 &&
               atoll(argv[i + 1]) <= 10000) {
      o.cpu_weight = atoll(argv[++i]);
    } else {
      fprintf(stderr,
              "usage: %s [--port N] [--api-key KEY] [--workspace-root DIR] [--uid-base N] "
              "[--cpu-weight 1-10000]\n",
              name);
      return 2;
    }
  }
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);
  auto fake = Fake::Start(o);
  if (!fake.ok()) {
    fprintf(stderr, "%s: %s\n", name, std::string(fake.status().message()).c_str());
    return 1;
  }
  printf("listening on 127.0.0.1:%d\n", (*fake)->port());
  fflush(stdout);
  int sig;
  sigwait(&sigs, &sig);
  return 0;
}

}  // namespace sandbox
