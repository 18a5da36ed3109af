// sandbox-init: PID 1 of a local sandbox's container (one per session).
//
// Started by bubblewrap (--as-pid-1) with the control socket on fd 3. It
// reaps every process of the container and starts runs the broker asks for:
//
//   broker -> init, one SOCK_SEQPACKET message per run (see run_protocol.h):
//     payload: NUL-terminated strings  cwd, argc, argv..., envc, env...,
//              ncgroup, has_fd3, nofile
//     fds:     run socket, stdin, stdout, stderr, [fd3], cgroup.procs fds...
//   init -> broker, on the run socket: "X <wait status>" when the run's main
//     process ends. The broker writes "K" on the run socket to have init kill
//     the run's process group (the cgroup kill is the broker's own, outside).
//
// The run's child writes "0" to each cgroup.procs fd (opened by the broker as
// root, so the kernel checks the opener's rights) before exec: the run and
// everything it forks lives in the run's own cgroup. init exits when the
// control socket closes (the broker closed the sandbox or died), which makes
// the kernel kill everything left in the pid namespace.
//
// No allocation-heavy libraries: plain libc, statically linked.

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <string>
#include <vector>

namespace {

constexpr int kCtlFd = 3;
constexpr int kMaxFds = 16;

std::map<pid_t, int> g_runs;       // main pid -> run socket
std::map<int, pid_t> g_run_socks;  // run socket -> main pid

[[noreturn]] void ChildFail(const char* what, int err) {
  dprintf(2, "sandbox: cannot start: %s: %s\n", what, strerror(err));
  _exit(127);
}

void StartRun(char* buf, size_t len, int* fds, int nfds) {
  std::vector<char*> fields;
  for (size_t i = 0; i < len;) {
    fields.push_back(buf + i);
    i += strlen(buf + i) + 1;
  }
  auto close_all = [&] {
    for (int i = 0; i < nfds; ++i) close(fds[i]);
  };
  size_t f = 0;
  auto next = [&]() -> char* { return f < fields.size() ? fields[f++] : nullptr; };
  char* cwd = next();
  char* argc_s = next();
  if (!cwd || !argc_s) return close_all();
  long argc = strtol(argc_s, nullptr, 10);
  std::vector<char*> argv;
  for (long i = 0; i < argc; ++i) argv.push_back(next());
  argv.push_back(nullptr);
  char* envc_s = next();
  long envc = envc_s ? strtol(envc_s, nullptr, 10) : 0;
  std::vector<char*> envp;
  for (long i = 0; i < envc; ++i) envp.push_back(next());
  envp.push_back(nullptr);
  char* ncg_s = next();
  char* fd3_s = next();
  char* nofile_s = next();
  if (!nofile_s || argc < 1) return close_all();
  for (long i = 0; i < argc; ++i)
    if (argv[static_cast<size_t>(i)] == nullptr) return close_all();
  long ncg = strtol(ncg_s, nullptr, 10);
  bool has_fd3 = strtol(fd3_s, nullptr, 10) != 0;
  long nofile = strtol(nofile_s, nullptr, 10);
  const int want = 4 + (has_fd3 ? 1 : 0) + static_cast<int>(ncg);
  if (nfds != want) return close_all();
  int run_sock = fds[0];
  // PATH lookup with the run's own PATH.
  const char* path = "/usr/local/bin:/usr/bin:/bin";
  for (char* e : envp)
    if (e && strncmp(e, "PATH=", 5) == 0) path = e + 5;

  pid_t pid = fork();
  if (pid < 0) {
    dprintf(fds[3], "sandbox: cannot start: fork: %s\n", strerror(errno));
    dprintf(run_sock, "X %d", 127 << 8);
    return close_all();
  }
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int s = 1; s < NSIG; ++s) signal(s, SIG_DFL);
    setsid();
    int cg_base = 4 + (has_fd3 ? 1 : 0);
    for (long i = 0; i < ncg; ++i) {
      if (write(fds[cg_base + i], "0", 1) != 1) ChildFail("join cgroup", errno);
    }
    if (dup2(fds[1], 0) < 0 || dup2(fds[2], 1) < 0 || dup2(fds[3], 2) < 0) {
      ChildFail("stdio", errno);
    }
    if (has_fd3) {
      if (dup2(fds[4], 3) < 0) ChildFail("fd 3", errno);
      fcntl(3, F_SETFD, 0);
    }
    syscall(SYS_close_range, has_fd3 ? 4 : 3, ~0U, 0);
    if (nofile > 0) {
      struct rlimit rl = {static_cast<rlim_t>(nofile), static_cast<rlim_t>(nofile)};
      setrlimit(RLIMIT_NOFILE, &rl);
    }
    struct rlimit core = {0, 0};
    setrlimit(RLIMIT_CORE, &core);
    if (cwd[0] && chdir(cwd) != 0) ChildFail("chdir", errno);
    // execvpe with the run's PATH, not init's.
    if (strchr(argv[0], '/')) {
      execve(argv[0], argv.data(), envp.data());
      ChildFail(argv[0], errno);
    }
    int err = ENOENT;
    for (const char* p = path; *p;) {
      const char* colon = strchr(p, ':');
      size_t n = colon ? static_cast<size_t>(colon - p) : strlen(p);
      std::string cand = std::string(p, n) + "/" + argv[0];
      execve(cand.c_str(), argv.data(), envp.data());
      if (errno != ENOENT) err = errno;
      p += n;
      if (*p == ':') ++p;
    }
    dprintf(2, "sandbox: cannot start: %s: command not found\n", argv[0]);
    (void)err;
    _exit(127);
  }
  for (int i = 1; i < nfds; ++i) close(fds[i]);
  g_runs[pid] = run_sock;
  g_run_socks[run_sock] = pid;
}

void ReapAll() {
  while (true) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    auto it = g_runs.find(pid);
    if (it == g_runs.end()) continue;
    char msg[32];
    int n = snprintf(msg, sizeof(msg), "X %d", status);
    (void)!send(it->second, msg, static_cast<size_t>(n), MSG_NOSIGNAL);
    close(it->second);
    g_run_socks.erase(it->second);
    g_runs.erase(it);
  }
}

}  // namespace

int main() {
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, nullptr);
  int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) return 1;
  fcntl(kCtlFd, F_SETFD, FD_CLOEXEC);
  // Ready: the broker learns our host pid from the credentials it receives.
  if (send(kCtlFd, "R", 1, MSG_NOSIGNAL) != 1) return 1;

  std::vector<char> buf(1 << 20);
  while (true) {
    std::vector<struct pollfd> pfds = {{kCtlFd, POLLIN, 0}, {sfd, POLLIN, 0}};
    for (const auto& [sock, pid] : g_run_socks) pfds.push_back({sock, POLLIN, 0});
    int pr = poll(pfds.data(), pfds.size(), -1);
    if (pr < 0) {
      if (errno == EINTR) continue;
      return 1;
    }
    if (pfds[1].revents) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof(si)) == sizeof(si)) {
      }
      ReapAll();
    }
    for (size_t i = 2; i < pfds.size(); ++i) {
      if (!pfds[i].revents) continue;
      auto it = g_run_socks.find(pfds[i].fd);
      if (it == g_run_socks.end()) continue;
      char c;
      // "K" or EOF (the broker gave up on the run): kill its process group.
      (void)!recv(pfds[i].fd, &c, 1, MSG_DONTWAIT);
      kill(-it->second, SIGKILL);
      kill(it->second, SIGKILL);
    }
    if (pfds[0].revents) {
      char cbuf[CMSG_SPACE(sizeof(int) * kMaxFds)];
      struct iovec iov = {buf.data(), buf.size() - 1};
      struct msghdr mh = {};
      mh.msg_iov = &iov;
      mh.msg_iovlen = 1;
      mh.msg_control = cbuf;
      mh.msg_controllen = sizeof(cbuf);
      ssize_t n = recvmsg(kCtlFd, &mh, MSG_CMSG_CLOEXEC);
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return 0;  // broker gone
      if (n < 0) continue;
      int fds[kMaxFds];
      int nfds = 0;
      for (struct cmsghdr* c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
          int k = static_cast<int>((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
          for (int j = 0; j < k && nfds < kMaxFds; ++j) {
            memcpy(&fds[nfds++], CMSG_DATA(c) + j * sizeof(int), sizeof(int));
          }
        }
      }
      buf[static_cast<size_t>(n)] = 0;
      if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
        for (int j = 0; j < nfds; ++j) close(fds[j]);
        continue;
      }
      StartRun(buf.data(), static_cast<size_t>(n), fds, nfds);
    }
  }
}
