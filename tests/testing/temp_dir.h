#pragma once

#include <stdlib.h>
#include <sys/stat.h>

#include <string>

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
  ~TempDir() { (void)RemoveTree(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace sandbox
