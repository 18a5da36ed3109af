#pragma once

#include <dirent.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace sandbox {

// True while any host process has `marker` in its command line.
inline bool ProcessWithMarkerExists(const std::string& marker) {
  DIR* d = opendir("/proc");
  bool found = false;
  while (struct dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream in(absl::StrCat("/proc/", e->d_name, "/cmdline"));
    std::stringstream ss;
    ss << in.rdbuf();
    if (ss.str().find(marker) != std::string::npos) found = true;
  }
  closedir(d);
  return found;
}

// Polls until no host process carries `marker` (a kill is asynchronous to
// the call that asked for it); false if one still does after `limit`.
inline bool GoneWithin(const std::string& marker, absl::Duration limit) {
  for (absl::Duration waited; waited < limit; waited += absl::Milliseconds(20)) {
    if (!ProcessWithMarkerExists(marker)) return true;
    usleep(20000);
  }
  return !ProcessWithMarkerExists(marker);
}

}  // namespace sandbox
