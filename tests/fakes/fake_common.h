#pragma once

// Setup shared by the fake provider servers.

#include <httplib.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "adapters/local/local_provider.h"

namespace sandbox {

// The local provider that runs a fake's sandboxes so they look like the
// cloud provider's image: `home` as home and working directory, `user` as
// the user, a /tmp that lasts the sandbox's life. An empty `*root` becomes a
// fresh temporary directory (and `*own_root` true: the fake removes it).
// Their cgroups live under a group named after the fake (`name`), apart from
// the broker's, with `cpu_weight` (as providers.local.cpu_weight).
inline absl::StatusOr<std::unique_ptr<LocalProvider>> MakeFakeSandboxes(
    const std::string& name, const std::string& home, const std::string& user, int64_t uid_base,
    int64_t cpu_weight, std::string* root, bool* own_root) {
  if (root->empty()) {
    std::string tmpl = absl::StrCat("/tmp/", name, "-XXXXXX");
    *root = mkdtemp(tmpl.data());
    chmod(root->c_str(), 0711);
    *own_root = true;
  }
  LocalConfig lc;
  lc.workspace_root = *root;
  lc.mount_point = home;
  lc.user_name = user;
  lc.persistent_tmp = true;
  lc.uid_base = uid_base;
  lc.cgroup_parent = name;
  lc.cpu_weight = cpu_weight;
  lc.max_transfer_bytes = 64 << 20;
  // A cloud's sandboxes are not this host's to admit: no capacity limit
  // (the SDKs and benchmarks ask a fake for as many as they like).
  lc.capacity = {0, 0, 0, 0};
  return LocalProvider::Create(lc);
}

// httplib's worker pool for a fake: one thread per connection (httplib
// serves a connection, kept alive or streaming, on one thread throughout),
// started when a connection finds no idle thread, up to `max_threads`; then
// connections wait their turn. Threads stay until shutdown.
class FakeServerPool final : public httplib::TaskQueue {
 public:
  explicit FakeServerPool(size_t max_threads) : max_threads_(max_threads) {}
  ~FakeServerPool() override = default;

  void enqueue(std::function<void()> fn) override {
    std::lock_guard<std::mutex> l(mu_);
    jobs_.push_back(std::move(fn));
    if (idle_ < jobs_.size() && threads_.size() < max_threads_) {
      threads_.emplace_back([this] { Work(); });
    } else {
      cv_.notify_one();
    }
  }

  // Runs the jobs already queued, then joins. httplib calls it once its
  // accept loop has ended, so nothing is enqueued concurrently.
  void shutdown() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      shutdown_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

 private:
  void Work() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      ++idle_;
      cv_.wait(l, [&] { return !jobs_.empty() || shutdown_; });
      --idle_;
      if (jobs_.empty()) return;  // shut down and drained
      std::function<void()> fn = std::move(jobs_.front());
      jobs_.pop_front();
      l.unlock();
      fn();
      l.lock();
    }
  }

  const size_t max_threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool shutdown_ = false;
};

// Connections a fake serves at once (each holds a thread: see above), and
// its listen backlog. bench/fake_load checks 500 concurrent process starts.
constexpr size_t kFakeMaxConnections = 1024;
constexpr int kFakeListenBacklog = 4096;  // the kernel caps it at somaxconn

// Server settings of a real API endpoint: many connections at once, kept
// alive, no Nagle stall on small replies, large bodies.
inline void ConfigureFakeServer(httplib::Server& server) {
  server.new_task_queue = [] { return new FakeServerPool(kFakeMaxConnections); };
  server.set_keep_alive_max_count(100000);
  server.set_tcp_nodelay(true);
  server.set_keep_alive_timeout(30);
  server.set_payload_max_length(128 << 20);
}

// Binds 127.0.0.1:`port` (0 = any); the bound port, or -1.
//
// The packaged libcpp-httplib is compiled with CPPHTTPLIB_LISTEN_BACKLOG 5
// (defining the macro here changes nothing: the bind code is in the shared
// library), and a burst of connects overflows a backlog of 5: SYNs dropped,
// connections reset. So the listening socket is caught through the
// socket-options hook and listen() called again: on Linux that raises the
// backlog of a socket already listening.
inline int BindFakeServer(httplib::Server& server, int port) {
  auto sock = std::make_shared<socket_t>(INVALID_SOCKET);
  server.set_socket_options([sock](socket_t s) {
    httplib::default_socket_options(s);
    *sock = s;
  });
  const int bound = port == 0 ? server.bind_to_any_port("127.0.0.1")
                              : (server.bind_to_port("127.0.0.1", port) ? port : -1);
  server.set_socket_options(httplib::default_socket_options);
  if (bound > 0 && *sock != INVALID_SOCKET && ::listen(*sock, kFakeListenBacklog) != 0) return -1;
  return bound;
}

}  // namespace sandbox
