#include "common/child_reaper.h"

#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"

namespace sandbox {
namespace {

struct State {
  // Held shared around fork + claim, exclusively by a scan: a scan never
  // sees a child that is forked but not yet claimed.
  absl::Mutex fork_mu;
  absl::Mutex mu;
  // pid -> claims (a pid can be reused while an old claim is being released).
  std::map<pid_t, int> claimed ABSL_GUARDED_BY(mu);
  std::atomic<uint64_t> reaped{0};
  std::atomic<bool> started{false};
};

State& S() {
  static State* s = new State();
  return *s;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// This process's children (any state), from /proc/self/task/*/children
// (CONFIG_PROC_CHILDREN), else from every process's stat line.
std::vector<pid_t> Children() {
  std::vector<pid_t> out;
  bool have_children_files = false;
  if (DIR* d = opendir("/proc/self/task")) {
    while (struct dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      const std::string path = absl::StrCat("/proc/self/task/", e->d_name, "/children");
      if (access(path.c_str(), R_OK) != 0) continue;
      have_children_files = true;
      for (absl::string_view p : absl::StrSplit(ReadAll(path), ' ', absl::SkipWhitespace())) {
        int pid = 0;
        if (absl::SimpleAtoi(p, &pid)) out.push_back(pid);
      }
    }
    closedir(d);
  }
  if (have_children_files) return out;
  const pid_t self = getpid();
  if (DIR* d = opendir("/proc")) {
    while (struct dirent* e = readdir(d)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
      const std::string stat = ReadAll(absl::StrCat("/proc/", e->d_name, "/stat"));
      size_t close = stat.rfind(')');
      if (close == std::string::npos) continue;
      std::vector<absl::string_view> f =
          absl::StrSplit(absl::string_view(stat).substr(close + 1), ' ', absl::SkipWhitespace());
      int pid = 0, ppid = 0;
      if (f.size() > 1 && absl::SimpleAtoi(f[1], &ppid) && ppid == self &&
          absl::SimpleAtoi(e->d_name, &pid)) {
        out.push_back(pid);
      }
    }
    closedir(d);
  }
  return out;
}

}  // namespace

pid_t ChildReaper::ForkClaimed() {
  State& s = S();
  // Not a scoped lock: the child must not touch the mutex (a waiting
  // writer's state belongs to parent threads it does not have), so only the
  // parent unlocks.
  s.fork_mu.ReaderLock();
  pid_t pid = fork();
  if (pid == 0) return 0;
  if (pid > 0) {
    absl::MutexLock l(&s.mu);
    ++s.claimed[pid];
  }
  s.fork_mu.ReaderUnlock();
  return pid;
}

void ChildReaper::Release(pid_t pid) {
  State& s = S();
  absl::MutexLock l(&s.mu);
  auto it = s.claimed.find(pid);
  if (it != s.claimed.end() && --it->second == 0) s.claimed.erase(it);
}

int ChildReaper::ReapOnce() {
  State& s = S();
  absl::WriterMutexLock fl(&s.fork_mu);
  int n = 0;
  for (pid_t pid : Children()) {
    {
      absl::MutexLock l(&s.mu);
      if (s.claimed.count(pid) != 0) continue;
    }
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) ++n;  // 0: still running
  }
  s.reaped += static_cast<uint64_t>(n);
  return n;
}

uint64_t ChildReaper::reaped_total() { return S().reaped.load(); }

absl::Status ChildReaper::Start(absl::Duration backstop) {
  State& s = S();
  if (s.started.exchange(true)) return absl::OkStatus();
  if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) {
    s.started = false;
    return absl::InternalError(absl::StrCat("prctl(PR_SET_CHILD_SUBREAPER): ", strerror(errno)));
  }
  Log(LogLevel::kInfo, "broker.subreaper",
      {{"pid", static_cast<int64_t>(getpid())},
       {"message", "reaping every orphaned child (child subreaper)"}});
  std::thread([backstop] {
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    const struct timespec ts = absl::ToTimespec(backstop);
    while (true) {
      sigtimedwait(&chld, nullptr, &ts);  // a signal, a timeout or EINTR: scan
      ReapOnce();
    }
  }).detach();
  return absl::OkStatus();
}

}  // namespace sandbox
