#pragma once

// A real etcd (/usr/bin/etcd) on loopback for one test: free ports picked by
// binding port 0, a fresh data dir, ready when /health says so, SIGKILLed in
// the destructor (and when the test process dies: PR_SET_PDEATHSIG, set by
// the forking thread, the test's main thread). Kill9() and Restart() (same
// ports, same data dir) let tests take it away and bring it back.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "adapters/http/http_client.h"
#include "tests/testing/temp_dir.h"

namespace sandbox {

inline constexpr char kEtcdPath[] = "/usr/bin/etcd";

inline bool EtcdInstalled() { return access(kEtcdPath, X_OK) == 0; }

// A port nobody is listening on now (bound to port 0, then released).
inline int FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// Polls `cond` every 50 ms until it holds or `limit` passes.
template <typename F>
bool WaitFor(F cond, absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  while (absl::Now() < deadline) {
    if (cond()) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return cond();
}

struct EtcdTls {
  std::string cert_file, key_file;  // the server's
  std::string client_ca_file;       // non-empty: clients must present a cert
};

class EtcdServer {
 public:
  explicit EtcdServer(EtcdTls tls = {}) : tls_(std::move(tls)) { PickPorts(); }

  // Free loopback ports for a first start. A port picked free can be taken
  // by another process (an outgoing connection's ephemeral port) before
  // etcd binds it; a first start that dies retries on new ports.
  void PickPorts() {
    client_port_ = FreeLoopbackPort();
    peer_port_ = FreeLoopbackPort();
    while (peer_port_ == client_port_) peer_port_ = FreeLoopbackPort();
    std::error_code ec;
    std::filesystem::remove_all(dir_.path() + "/data", ec);
  }
  // Whether the last Launch's etcd exited by itself (e.g. could not bind).
  bool Died() const { return died_; }
  ~EtcdServer() { Kill9(); }

  std::string endpoint() const {
    return absl::StrCat(tls_.cert_file.empty() ? "http" : "https", "://127.0.0.1:", client_port_);
  }
  const std::string& data_dir_parent() const { return dir_.path(); }

  std::string peer_url() const { return absl::StrCat("http://127.0.0.1:", peer_port_); }
  // A member of a cluster (EtcdCluster): its name and the whole
  // --initial-cluster list.
  void SetMember(std::string name, std::string initial_cluster) {
    name_ = std::move(name);
    initial_cluster_ = std::move(initial_cluster);
  }

  // Starts etcd and waits until it is healthy. False on timeout. A first
  // start whose etcd died (a port taken meanwhile) tries new ports, twice.
  bool Start() {
    for (int attempt = 0;; ++attempt) {
      Launch();
      if (WaitHealthy(absl::Seconds(30))) {
        started_ = true;
        return true;
      }
      if (started_ || !died_ || attempt == 2) return false;
      PickPorts();
    }
  }

  // Starts etcd without waiting (the members of a cluster are healthy only
  // once a quorum runs).
  void Launch() {
    died_ = false;
    const std::string client = endpoint();
    const std::string peer = peer_url();
    std::vector<std::string> args = {
        kEtcdPath,
        "--name",
        name_,
        "--data-dir",
        dir_.path() + "/data",
        "--listen-client-urls",
        client,
        "--advertise-client-urls",
        client,
        "--listen-peer-urls",
        peer,
        "--initial-advertise-peer-urls",
        peer,
        "--initial-cluster",
        initial_cluster_.empty() ? name_ + "=" + peer : initial_cluster_,
        "--initial-cluster-token",
        "sandbox-broker-test",
        "--log-level",
        "warn"};
    if (!tls_.cert_file.empty()) {
      args.insert(args.end(), {"--cert-file", tls_.cert_file, "--key-file", tls_.key_file});
    }
    if (!tls_.client_ca_file.empty()) {
      args.insert(args.end(), {"--client-cert-auth", "--trusted-ca-file", tls_.client_ca_file});
    }
    const std::string log = dir_.path() + "/etcd.log";
    pid_ = fork();
    if (pid_ == 0) {
      // A test that crashes or is killed takes its etcd with it.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(kEtcdPath, argv.data());
      _exit(127);
    }
  }

  bool WaitHealthy(absl::Duration limit) {
    HttpClient http("etcd-fixture");
    return WaitFor(
               [&] {
                 int status = 0;
                 if (pid_ > 0 && waitpid(pid_, &status, WNOHANG) == pid_) {
                   pid_ = -1;  // it died
                   died_ = true;
                   return true;
                 }
                 HttpRequest req;
                 req.url = endpoint() + "/health";
                 req.timeout = absl::Seconds(2);
                 req.ca_file = tls_.cert_file;
                 req.cert_file = tls_.client_ca_file.empty() ? "" : tls_.cert_file;
                 req.key_file = tls_.client_ca_file.empty() ? "" : tls_.key_file;
                 auto r = http.Send(req);
                 return r.ok() && r->status == 200 && absl::StrContains(r->body, "\"true\"");
               },
               limit) &&
           pid_ > 0;
  }

  void Kill9() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  bool Restart() {
    Kill9();
    return Start();
  }

 private:
  EtcdTls tls_;
  TempDir dir_;
  int client_port_ = 0;
  int peer_port_ = 0;
  pid_t pid_ = -1;
  bool died_ = false;
  bool started_ = false;  // once healthy, restarts keep the ports
  std::string name_ = "t";
  std::string initial_cluster_;
};

// `n` etcd members on loopback forming one cluster.
class EtcdCluster {
 public:
  explicit EtcdCluster(int n) : members_(n) { SetMembers(); }
  // Starts every member and waits until each is healthy. A first start in
  // which a member died (a port taken meanwhile) tries new ports, twice.
  bool Start() {
    for (int attempt = 0;; ++attempt) {
      for (auto& m : members_) m.Launch();
      bool healthy = true, died = false;
      for (auto& m : members_) {
        if (!m.WaitHealthy(absl::Seconds(30))) {
          healthy = false;
          died = m.Died();
          break;
        }
      }
      if (healthy) {
        started_ = true;
        return true;
      }
      if (started_ || !died || attempt == 2) return false;
      for (auto& m : members_) {
        m.Kill9();
        m.PickPorts();
      }
      SetMembers();
    }
  }
  std::vector<std::string> endpoints() const {
    std::vector<std::string> out;
    for (const auto& m : members_) out.push_back(m.endpoint());
    return out;
  }
  EtcdServer& member(int i) { return members_[i]; }
  // Every member killed with SIGKILL, then started again on its data.
  bool Restart() {
    for (auto& m : members_) m.Kill9();
    return Start();
  }
  int size() const { return static_cast<int>(members_.size()); }

 private:
  void SetMembers() {
    std::string initial;
    for (size_t i = 0; i < members_.size(); ++i) {
      absl::StrAppend(&initial, i ? "," : "", "m", i, "=", members_[i].peer_url());
    }
    for (size_t i = 0; i < members_.size(); ++i) {
      members_[i].SetMember(absl::StrCat("m", i), initial);
    }
  }
  std::vector<EtcdServer> members_;
  bool started_ = false;
};

}  // namespace sandbox
