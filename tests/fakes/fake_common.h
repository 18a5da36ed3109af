#pragma once

// Setup shared by the fake provider servers.

#include <httplib.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "adapters/local/local_provider.h"

namespace sandbox {

// The local provider that runs a fake's sandboxes so they look like the
// cloud provider's image: `home` as home and working directory, `user` as
// the user, a /tmp that lasts the sandbox's life. An empty `*root` becomes a
// fresh temporary directory (and `*own_root` true: the fake removes it).
inline absl::StatusOr<std::unique_ptr<LocalProvider>> MakeFakeSandboxes(
    const std::string& name, const std::string& home, const std::string& user, int64_t uid_base,
    std::string* root, bool* own_root) {
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
  lc.max_transfer_bytes = 64 << 20;
  return LocalProvider::Create(lc);
}

// Server settings of a real API endpoint: many connections kept alive, no
// Nagle stall on small replies, large bodies.
inline void ConfigureFakeServer(httplib::Server& server) {
  server.new_task_queue = [] { return new httplib::ThreadPool(64); };
  server.set_keep_alive_max_count(100000);
  server.set_tcp_nodelay(true);
  server.set_keep_alive_timeout(30);
  server.set_payload_max_length(128 << 20);
}

// Binds 127.0.0.1:`port` (0 = any); the bound port, or -1.
inline int BindFakeServer(httplib::Server& server, int port) {
  if (port == 0) return server.bind_to_any_port("127.0.0.1");
  return server.bind_to_port("127.0.0.1", port) ? port : -1;
}

}  // namespace sandbox
