#pragma once

// A child process for tests that kill for real (crash and cluster tests):
// forked and exec'd with stdout and stderr in files, SIGKILLed when the
// test lets go of it.

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace sandbox {

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A child process with stdout and stderr in files.
class Proc {
 public:
  // `env`: "NAME=VALUE" entries added to the child's environment.
  Proc(const std::vector<std::string>& argv, const std::string& out, const std::string& err,
       const std::vector<std::string>& env = {})
      : out_(out), err_(err) {
    pid_ = fork();
    if (pid_ == 0) {
      for (const auto& kv : env) putenv(const_cast<char*>(kv.c_str()));
      int o = open(out.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      int e = open(err.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(o, 1);
      dup2(e, 2);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
  }
  ~Proc() { Kill9(); }
  void Kill9() {
    if (Exited() || pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // True once the child has ended on its own (not by Kill9 or Term): a
  // sanitizer report, a crash, a failed start. Reaps it.
  bool Exited() {
    if (pid_ > 0) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        exited_ = true;
        status_ = st;
      }
    }
    return exited_;
  }
  // "exit 66" or "signal 6", once Exited().
  std::string ExitStatus() const {
    if (!exited_) return "running";
    return WIFSIGNALED(status_) ? absl::StrCat("signal ", WTERMSIG(status_))
                                : absl::StrCat("exit ", WEXITSTATUS(status_));
  }
  // SIGTERM, then wait for the exit; the exit status.
  int Term() {
    kill(pid_, SIGTERM);
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = -1;
    return st;
  }
  // SIGSTOP / SIGCONT (a paused replica).
  void Signal(int sig) {
    if (pid_ > 0) kill(pid_, sig);
  }
  pid_t pid() const { return pid_; }
  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  int status_ = 0;
  std::string out_, err_;
};

// The address a sandbox-brokerd child logs once it serves ("broker.serving
// address=HOST:PORT" in its stderr file), or "" if it does not within
// `limit` (polled every 20 ms: waiting for another process).
inline std::string WaitForServingAddress(const std::string& err_path, absl::Duration limit) {
  const absl::Time end = absl::Now() + limit;
  while (true) {
    const std::string log = ReadAll(err_path);
    auto at = log.find("broker.serving address=");
    if (at != std::string::npos) {
      at += 23;
      std::string addr = log.substr(at, log.find_first_not_of("0123456789.:", at) - at);
      if (!addr.empty()) return addr;
    }
    if (absl::Now() >= end) return "";
    absl::SleepFor(absl::Milliseconds(20));
  }
}

}  // namespace sandbox
