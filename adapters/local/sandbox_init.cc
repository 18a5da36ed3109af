// sandbox-init: PID 1 of a local sandbox's container (one per session).
//
// Started by bubblewrap (--as-pid-1) with the control socket on fd 3. It
// reaps every process of the container and starts runs the broker asks for.
// Messages, broker -> init, one SOCK_SEQPACKET message each; the payload is
// NUL-terminated strings:
//
//   run:   "run", token, cwd, argc, argv..., envc, env..., ncgroup, has_fd3,
//          nofile
//          fds: run socket, stdin, stdout, stderr, [fd3], cgroup.procs fds...
//   spare: "spare", token, ncgroup
//          fds: cgroup.procs fds
//
//   init -> broker, on the run socket: "X <wait status>" when the run's main
//     process ends. The broker writes "K" on the run socket to have init kill
//     the run's process group (the cgroup kill is the broker's own, outside).
//
// A run's process writes "0" to each cgroup.procs fd (opened by the broker as
// root, so the kernel checks the opener's rights) before exec: the run and
// everything it forks lives in the run's own cgroup. Moving a process between
// cgroups takes the kernel's cgroup_threadgroup_rwsem for writing, which
// waits for an RCU grace period (2-20 ms here, more under load) unless
// another move just happened. So that no run waits for it, the broker has
// init keep one *spare*: a process forked ahead of time that has already
// joined the next run's cgroups and waits for that run's message. A run
// message whose token names the live spare is handed to it, and it execs at
// once; any other run (no spare, a spare that died, a token that does not
// match) is forked and joins its cgroups then, from the same fds. A new
// spare message replaces any earlier spare.
//
// init exits when the control socket closes (the broker closed the sandbox
// or died), which makes the kernel kill everything left in the pid namespace.
//
// No allocation-heavy libraries: plain libc, statically linked.

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

constexpr int kCtlFd = 3;
constexpr int kMaxFds = 16;
constexpr size_t kMaxMsg = 1 << 20;

std::map<pid_t, int> g_runs;       // main pid -> run socket
std::map<int, pid_t> g_run_socks;  // run socket -> main pid

// The spare: forked, in the next run's cgroups, waiting on `sock`.
struct Spare {
  pid_t pid = -1;
  int sock = -1;  // init's end
  std::string token;
};
Spare g_spare;

[[noreturn]] void ChildFail(const char* what, int err) {
  dprintf(2, "sandbox: cannot start: %s: %s\n", what, strerror(err));
  _exit(127);
}

std::vector<char*> Fields(char* buf, size_t len) {
  std::vector<char*> fields;
  for (size_t i = 0; i < len;) {
    fields.push_back(buf + i);
    i += strlen(buf + i) + 1;
  }
  return fields;
}

// A parsed run message (pointers into its buffer).
struct RunMsg {
  const char* token = nullptr;
  const char* cwd = nullptr;
  std::vector<char*> argv;  // NULL-terminated
  std::vector<char*> envp;  // NULL-terminated
  long ncg = 0;
  bool has_fd3 = false;
  long nofile = 0;
  // fds the message carries after the run socket: stdin, stdout, stderr,
  // [fd3], then ncg cgroup.procs fds.
  int io_fds() const { return 3 + (has_fd3 ? 1 : 0); }
};

bool ParseRun(char* buf, size_t len, RunMsg* m) {
  std::vector<char*> fields = Fields(buf, len);
  size_t f = 0;
  auto next = [&]() -> char* { return f < fields.size() ? fields[f++] : nullptr; };
  char* kind = next();
  if (!kind || strcmp(kind, "run") != 0) return false;
  m->token = next();
  m->cwd = next();
  char* argc_s = next();
  if (!m->token || !m->cwd || !argc_s) return false;
  // A count, then that many strings, into a NULL-terminated vector.
  auto strings = [&next](const char* count_s, long min, std::vector<char*>* out) {
    const long count = count_s ? strtol(count_s, nullptr, 10) : -1;
    if (count < min || count > 100000) return false;
    for (long i = 0; i < count; ++i) {
      char* v = next();
      if (!v) return false;
      out->push_back(v);
    }
    out->push_back(nullptr);
    return true;
  };
  if (!strings(argc_s, 1, &m->argv) || !strings(next(), 0, &m->envp)) return false;
  char* ncg_s = next();
  char* fd3_s = next();
  char* nofile_s = next();
  if (!ncg_s || !fd3_s || !nofile_s) return false;
  m->ncg = strtol(ncg_s, nullptr, 10);
  m->has_fd3 = strtol(fd3_s, nullptr, 10) != 0;
  m->nofile = strtol(nofile_s, nullptr, 10);
  return m->ncg >= 0 && m->ncg <= kMaxFds;
}

// In a freshly forked child: default signal handling, its own session (the
// run's process group is what "K" kills).
void ChildDefaults() {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  for (int s = 1; s < NSIG; ++s) signal(s, SIG_DFL);
  setsid();
}

void JoinCgroups(const int* cg, long n) {
  for (long i = 0; i < n; ++i) {
    if (write(cg[i], "0", 1) != 1) ChildFail("join cgroup", errno);
  }
}

// The run's process from here on: stdio, fd 3, limits, cwd, exec.
// `io` holds stdin, stdout, stderr and (has_fd3) fd 3.
[[noreturn]] void ExecRun(const RunMsg& m, const int* io) {
  if (dup2(io[0], 0) < 0 || dup2(io[1], 1) < 0 || dup2(io[2], 2) < 0) {
    ChildFail("stdio", errno);
  }
  if (m.has_fd3) {
    if (dup2(io[3], 3) < 0) ChildFail("fd 3", errno);
    fcntl(3, F_SETFD, 0);
  }
  syscall(SYS_close_range, m.has_fd3 ? 4 : 3, ~0U, 0);
  if (m.nofile > 0) {
    struct rlimit rl = {static_cast<rlim_t>(m.nofile), static_cast<rlim_t>(m.nofile)};
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  struct rlimit core = {0, 0};
  setrlimit(RLIMIT_CORE, &core);
  if (m.cwd[0] && chdir(m.cwd) != 0) ChildFail("chdir", errno);
  char* const* argv = m.argv.data();
  char* const* envp = m.envp.data();
  // execvpe with the run's PATH, not init's.
  if (strchr(argv[0], '/')) {
    execve(argv[0], argv, envp);
    ChildFail(argv[0], errno);
  }
  const char* path = "/usr/local/bin:/usr/bin:/bin";
  for (char* const* e = envp; *e; ++e)
    if (strncmp(*e, "PATH=", 5) == 0) path = *e + 5;
  for (const char* p = path; *p;) {
    const char* colon = strchr(p, ':');
    size_t n = colon ? static_cast<size_t>(colon - p) : strlen(p);
    std::string cand = std::string(p, n) + "/" + argv[0];
    execve(cand.c_str(), argv, envp);
    p += n;
    if (*p == ':') ++p;
  }
  dprintf(2, "sandbox: cannot start: %s: command not found\n", argv[0]);
  _exit(127);
}

// Receives one message with fds; returns its length (0: the peer closed,
// -1: an error, errno set; -2: a truncated message, whose fds are closed).
ssize_t RecvWithFds(int sock, char* buf, size_t cap, int* fds, int* nfds, int flags) {
  char cbuf[CMSG_SPACE(sizeof(int) * kMaxFds)];
  struct iovec iov = {buf, cap - 1};
  struct msghdr mh = {};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = cbuf;
  mh.msg_controllen = sizeof(cbuf);
  ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | flags);
  *nfds = 0;
  if (n <= 0) return n;
  for (struct cmsghdr* c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      int k = static_cast<int>((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      for (int j = 0; j < k; ++j) {
        int fd;
        memcpy(&fd, CMSG_DATA(c) + j * sizeof(int), sizeof(int));
        if (*nfds < kMaxFds) {
          fds[(*nfds)++] = fd;
        } else {
          close(fd);
        }
      }
    }
  }
  buf[n] = 0;
  if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
    for (int j = 0; j < *nfds; ++j) close(fds[j]);
    *nfds = 0;
    return -2;
  }
  return n;
}

void DropSpare() {
  if (g_spare.pid > 0) kill(g_spare.pid, SIGKILL);  // reaped by ReapAll
  if (g_spare.sock >= 0) close(g_spare.sock);
  g_spare = Spare();
}

// "spare": fork a process that joins the given cgroups now and waits for its
// run. Runs without one are started the slow way, so a failure here only
// costs time.
void StartSpare(char* buf, size_t len, int* fds, int nfds) {
  DropSpare();
  std::vector<char*> fields = Fields(buf, len);
  if (fields.size() < 3 || nfds != atoi(fields[2])) {
    for (int i = 0; i < nfds; ++i) close(fds[i]);
    return;
  }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    for (int i = 0; i < nfds; ++i) close(fds[i]);
    return;
  }
  pid_t pid = fork();
  if (pid == 0) {
    ChildDefaults();
    JoinCgroups(fds, nfds);
    // Keep only the socket to init (as fd 3): nothing of init's (the control
    // socket, other runs' sockets) stays open in the run.
    if (dup2(sv[1], kCtlFd) < 0) _exit(127);
    syscall(SYS_close_range, kCtlFd + 1, ~0U, 0);
    static char mbuf[kMaxMsg];
    int rfds[kMaxFds];
    int rn = 0;
    ssize_t n;
    do {
      n = RecvWithFds(kCtlFd, mbuf, sizeof(mbuf), rfds, &rn, 0);
    } while (n == -1 && errno == EINTR);
    if (n <= 0) _exit(0);  // init dropped this spare
    close(kCtlFd);
    RunMsg m;
    if (!ParseRun(mbuf, static_cast<size_t>(n), &m) || rn < m.io_fds()) _exit(127);
    ExecRun(m, rfds);
  }
  close(sv[1]);
  for (int i = 0; i < nfds; ++i) close(fds[i]);
  if (pid < 0) {
    close(sv[0]);
    return;
  }
  g_spare.pid = pid;
  g_spare.sock = sv[0];
  g_spare.token = fields[1];
}

// Hands a run to the spare when the message names it; true if it took it.
bool GiveToSpare(const RunMsg& m, const char* buf, size_t len, int* fds, int nfds) {
  if (g_spare.pid <= 0 || strcmp(m.token, "0") == 0 || g_spare.token != m.token) return false;
  const int nio = m.io_fds();  // the run socket stays with init
  char cbuf[CMSG_SPACE(sizeof(int) * kMaxFds)];
  struct iovec iov = {const_cast<char*>(buf), len};
  struct msghdr mh = {};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = cbuf;
  mh.msg_controllen = CMSG_SPACE(sizeof(int) * nio);
  struct cmsghdr* c = CMSG_FIRSTHDR(&mh);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * nio);
  memcpy(CMSG_DATA(c), fds + 1, sizeof(int) * nio);
  const pid_t pid = g_spare.pid;
  bool sent = sendmsg(g_spare.sock, &mh, MSG_NOSIGNAL) >= 0;
  close(g_spare.sock);
  g_spare = Spare();
  if (!sent) {
    kill(pid, SIGKILL);
    return false;
  }
  for (int i = 1; i < nfds; ++i) close(fds[i]);
  g_runs[pid] = fds[0];
  g_run_socks[fds[0]] = pid;
  return true;
}

void StartRun(char* buf, size_t len, int* fds, int nfds) {
  auto close_all = [&] {
    for (int i = 0; i < nfds; ++i) close(fds[i]);
  };
  // The spare gets the message as it came (ParseRun writes nothing).
  RunMsg m;
  if (!ParseRun(buf, len, &m)) return close_all();
  if (nfds != 1 + m.io_fds() + static_cast<int>(m.ncg)) return close_all();
  if (GiveToSpare(m, buf, len, fds, nfds)) return;
  int run_sock = fds[0];
  pid_t pid = fork();
  if (pid < 0) {
    dprintf(fds[3], "sandbox: cannot start: fork: %s\n", strerror(errno));
    dprintf(run_sock, "X %d", 127 << 8);
    return close_all();
  }
  if (pid == 0) {
    ChildDefaults();
    JoinCgroups(fds + 1 + m.io_fds(), m.ncg);
    ExecRun(m, fds + 1);
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
    if (pid == g_spare.pid) {
      close(g_spare.sock);
      g_spare = Spare();
      continue;
    }
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
  // Not dumpable: code in the container runs as our uid, and could
  // otherwise ptrace us (stop or kill the container's PID 1) or take our
  // descriptors with pidfd_getfd (the control socket, the host log file on
  // fds 1 and 2). Runs exec, which makes them dumpable again.
  if (prctl(PR_SET_DUMPABLE, 0) != 0) return 1;
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, nullptr);
  int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) return 1;
  fcntl(kCtlFd, F_SETFD, FD_CLOEXEC);
  // Ready: the broker learns our host pid from the credentials it receives,
  // and gets the container's /tmp (O_PATH) to reach it by for file calls:
  // never by /proc/<our pid>, which needs ptrace rights over us (we are not
  // dumpable) and names another process once we are gone.
  const int tmp = open("/tmp", O_PATH | O_DIRECTORY | O_CLOEXEC);
  char ready = 'R';
  struct iovec iov = {&ready, 1};
  struct msghdr mh = {};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  alignas(struct cmsghdr) char cbuf[CMSG_SPACE(sizeof(int))] = {};
  if (tmp >= 0) {
    mh.msg_control = cbuf;
    mh.msg_controllen = sizeof(cbuf);
    struct cmsghdr* cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &tmp, sizeof(int));
  }
  if (sendmsg(kCtlFd, &mh, MSG_NOSIGNAL) != 1) return 1;
  if (tmp >= 0) close(tmp);

  // Not zeroed: only the pages messages reach become resident. A megabyte
  // of touched memory here made every run's fork copy and write-protect
  // 256 page table entries, then fault on them and tear them down at exec.
  std::unique_ptr<char[]> buf(new char[kMaxMsg]);
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
      int fds[kMaxFds];
      int nfds = 0;
      ssize_t n = RecvWithFds(kCtlFd, buf.get(), kMaxMsg, fds, &nfds, MSG_DONTWAIT);
      if (n == 0 || (n == -1 && errno != EINTR && errno != EAGAIN)) return 0;  // broker gone
      if (n < 0) continue;
      if (strcmp(buf.get(), "spare") == 0) {
        StartSpare(buf.get(), static_cast<size_t>(n), fds, nfds);
        continue;
      }
      StartRun(buf.get(), static_cast<size_t>(n), fds, nfds);
    }
  }
}
