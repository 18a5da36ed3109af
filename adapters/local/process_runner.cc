#include "adapters/local/process_runner.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "adapters/api/output.h"
#include "common/child_reaper.h"
#include "common/clock.h"

namespace sandbox {
namespace {

// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    reset(o.release());
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int f = -1) {
    if (fd_ >= 0) close(fd_);
    fd_ = f;
  }

 private:
  int fd_ = -1;
};

absl::StatusOr<Fd> MemFdWith(const std::string& data) {
  Fd fd(static_cast<int>(syscall(SYS_memfd_create, "sandbox-input", MFD_CLOEXEC)));
  if (fd.get() < 0) {
    return absl::InternalError(absl::StrCat("memfd_create: ", strerror(errno)));
  }
  size_t off = 0;
  while (off < data.size()) {
    ssize_t w = write(fd.get(), data.data() + off, data.size() - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("write memfd: ", strerror(errno)));
    }
    off += static_cast<size_t>(w);
  }
  if (lseek(fd.get(), 0, SEEK_SET) != 0) {
    return absl::InternalError(absl::StrCat("lseek memfd: ", strerror(errno)));
  }
  return fd;
}

void SetLimit(int resource, uint64_t value) {
  if (value == 0) return;
  struct rlimit rl;
  rl.rlim_cur = value;
  rl.rlim_max = value;
  setrlimit(resource, &rl);
}

[[noreturn]] void ChildFail(const char* what) {
  // Async-signal-safe only: no allocation after fork.
  const char* prefix = "sandbox: cannot start: ";
  (void)!write(2, prefix, strlen(prefix));
  (void)!write(2, what, strlen(what));
  (void)!write(2, "\n", 1);
  _exit(127);
}

// Runs in the child between fork and exec. Async-signal-safe calls only.
[[noreturn]] void ExecChild(const ProcessSpec& spec, char* const* argv, char* const* envp,
                            int stdin_fd, int out_w, int err_w, int fd3) {
  setpgid(0, 0);
  sigset_t all;
  sigemptyset(&all);
  sigprocmask(SIG_SETMASK, &all, nullptr);
  signal(SIGPIPE, SIG_DFL);

  int in = stdin_fd >= 0 ? stdin_fd : open("/dev/null", O_RDONLY);
  if (in < 0 || dup2(in, 0) < 0) ChildFail("stdin");
  if (dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0) ChildFail("stdout");
  if (fd3 >= 0) {
    if (fd3 == 3) {
      fcntl(3, F_SETFD, 0);
    } else if (dup2(fd3, 3) < 0) {
      ChildFail("fd 3");
    }
  }
  syscall(SYS_close_range, fd3 >= 0 ? 4 : 3, ~0U, 0);

  SetLimit(RLIMIT_CPU, spec.limits.cpu_seconds);
  SetLimit(RLIMIT_AS, spec.limits.address_space_bytes);
  SetLimit(RLIMIT_NPROC, spec.limits.max_processes);
  SetLimit(RLIMIT_FSIZE, spec.limits.file_size_bytes);
  SetLimit(RLIMIT_NOFILE, spec.limits.open_files);
  SetLimit(RLIMIT_CORE, 1);  // 1 byte: effectively no core dumps
  if (spec.gid >= 0) {
    if (setgroups(0, nullptr) != 0) ChildFail("setgroups");
    if (setgid(static_cast<gid_t>(spec.gid)) != 0) ChildFail("setgid");
  }
  if (spec.uid >= 0 && setuid(static_cast<uid_t>(spec.uid)) != 0) {
    ChildFail("setuid");
  }
  if (!spec.cwd.empty() && chdir(spec.cwd.c_str()) != 0) ChildFail("chdir");
  execve(argv[0], argv, envp);
  ChildFail(strerror(errno));
}

}  // namespace

absl::StatusOr<ExecResult> RunProcess(const ProcessSpec& spec) {
  if (spec.argv.empty()) return absl::InvalidArgumentError("empty argv");
  Clock* clock = Clock::Real();  // a child process runs in real time

  Fd stdin_fd, fd3;
  if (!spec.stdin_data.empty()) {
    auto m = MemFdWith(spec.stdin_data);
    if (!m.ok()) return m.status();
    stdin_fd = std::move(*m);
  }
  if (!spec.fd3_data.empty()) {
    auto m = MemFdWith(spec.fd3_data);
    if (!m.ok()) return m.status();
    fd3 = std::move(*m);
  }
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  Fd out_r(out_pipe[0]), out_w(out_pipe[1]);
  // Without a per-stream consumer, stdout and stderr share one pipe: the
  // output is then in exact write order. Streaming needs them apart.
  const bool split = static_cast<bool>(spec.on_output);
  if (split && pipe2(err_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  Fd err_r(split ? err_pipe[0] : -1), err_w(split ? err_pipe[1] : -1);

  std::vector<char*> argv, envp;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  const absl::Time start = clock->Monotonic();
  // Claimed, so the daemon's reaper of orphans never takes this child's
  // exit status: only the waits below do.
  pid_t pid = ChildReaper::ForkClaimed();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    ExecChild(spec, argv.data(), envp.data(), stdin_fd.get(), out_w.get(),
              split ? err_w.get() : out_w.get(), fd3.get());
  }
  setpgid(pid, pid);  // also in the parent, so a kill cannot race the child
  out_w.reset();
  err_w.reset();
  stdin_fd.reset();
  fd3.reset();
  if (spec.on_pid) spec.on_pid(pid);

  Fd pidfd(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
  OutputCollector collector(spec.max_output_bytes, spec.on_output);
  const absl::Time deadline = start + spec.timeout;
  // After the child exits, its descendants may still hold the pipes (only
  // possible without a pid namespace); read what they write for this long.
  const absl::Duration kDrainAfterExit = absl::Seconds(1);
  absl::Time drain_deadline = absl::InfiniteFuture();
  bool exited = false, killed = false, timed_out = false, cancelled = false;
  int status = 0;
  char buf[64 * 1024];

  auto kill_group = [&] {
    if (!killed) {
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      killed = true;
    }
  };
  auto try_reap = [&] {
    if (exited) return;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r < 0 && errno == ECHILD) {
      // Someone else reaped it (a waitpid(-1) elsewhere in the process; the
      // daemon's own reaper never does, see ChildReaper). Its status is
      // lost: report 255 rather than spin until the deadline.
      status = 255 << 8;
      r = pid;
    }
    if (r == pid) {
      exited = true;
      drain_deadline = clock->Monotonic() + kDrainAfterExit;
      // Anything left in the group dies with its leader's run.
      kill(-pid, SIGKILL);
    }
  };

  while (true) {
    const bool pipes_open = out_r.get() >= 0 || err_r.get() >= 0;
    if (exited && !pipes_open) break;
    const absl::Time now = clock->Monotonic();
    if (exited && now >= drain_deadline) break;
    if (!exited && !killed && now >= deadline) {
      timed_out = true;
      kill_group();
    }
    if (!exited && !killed && spec.cancelled && spec.cancelled()) {
      cancelled = true;
      kill_group();
    }
    absl::Duration wait =
        exited ? drain_deadline - now : (killed ? absl::Milliseconds(10) : deadline - now);
    if (spec.cancelled) wait = std::min(wait, absl::Milliseconds(50));
    if (pidfd.get() < 0 && !exited) wait = std::min(wait, absl::Milliseconds(10));
    int wait_ms = static_cast<int>(
        std::max<int64_t>(0, absl::ToInt64Milliseconds(wait + absl::Microseconds(999))));

    struct pollfd fds[3];
    int n = 0;
    int out_idx = -1, err_idx = -1;
    if (out_r.get() >= 0) {
      out_idx = n;
      fds[n++] = {out_r.get(), POLLIN, 0};
    }
    if (err_r.get() >= 0) {
      err_idx = n;
      fds[n++] = {err_r.get(), POLLIN, 0};
    }
    // The pidfd turns readable when the child exits; try_reap() below
    // collects it either way.
    if (!exited && pidfd.get() >= 0) fds[n++] = {pidfd.get(), POLLIN, 0};
    int pr = poll(fds, static_cast<nfds_t>(n), wait_ms);
    if (pr < 0 && errno != EINTR) break;
    auto drain = [&](int idx, Fd& fd, OutputStream stream) {
      if (idx < 0 || !(fds[idx].revents & (POLLIN | POLLHUP | POLLERR))) return;
      ssize_t r = read(fd.get(), buf, sizeof(buf));
      if (r > 0) {
        collector.Append(stream, absl::string_view(buf, static_cast<size_t>(r)));
      } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
        fd.reset();
      }
    };
    if (pr > 0) {
      drain(out_idx, out_r, OutputStream::kStdout);
      drain(err_idx, err_r, OutputStream::kStderr);
    }
    try_reap();
  }
  if (!exited) {
    // Pipes closed or poll failed without the child exiting: make sure it
    // is gone before reaping, so the caller never blocks forever.
    kill_group();
    waitpid(pid, &status, 0);
  }
  ChildReaper::Release(pid);
  if (spec.on_pid) spec.on_pid(-1);

  return FinishResult(collector, status, timed_out, cancelled);
}

ExecResult FinishResult(OutputCollector& collector, int wait_status, bool timed_out,
                        bool cancelled) {
  ExecResult result;
  result.truncated = collector.truncated();
  result.output = collector.Take();
  result.timed_out = timed_out;
  result.cancelled = cancelled;
  if (timed_out) {
    result.exit_code = 124;
  } else if (WIFEXITED(wait_status)) {
    result.exit_code = WEXITSTATUS(wait_status);
  } else if (WIFSIGNALED(wait_status)) {
    result.exit_code = 128 + WTERMSIG(wait_status);
  }
  return result;
}

}  // namespace sandbox
