#pragma once

#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "adapters/local/workspace_fs.h"

namespace sandbox {

// A fresh directory under the test temp dir, removed on destruction.
// Mode 0711 so sandbox uids can traverse it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = "/tmp/sbtest-XXXXXX";
    path_ = mkdtemp(tmpl.data());
    chmod(path_.c_str(), 0711);
  }
  // Mounts left under it (a killed broker's workspace images) are detached
  // first, so no test run leaves loop devices and mounts on the machine.
  ~TempDir() {
    std::vector<std::string> mounts;
    std::ifstream in("/proc/self/mounts");
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string dev, dir;
      fields >> dev >> dir;
      if (dir.compare(0, path_.size() + 1, path_ + "/") == 0) mounts.push_back(dir);
    }
    std::sort(mounts.begin(), mounts.end(),
              [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
    for (const std::string& m : mounts) umount2(m.c_str(), MNT_DETACH);
    (void)RemoveTree(path_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace sandbox
