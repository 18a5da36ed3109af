#include "adapters/local/init_binary.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/text.h"

namespace sandbox {

std::string FirstDirClosedToOthers(const std::string& path) {
  std::string cur;
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i != path.size() && path[i] != '/') continue;
    cur = path.substr(0, i);
    struct stat st;
    if (stat(cur.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & S_IXOTH) == 0) {
      return cur;
    }
  }
  return "";
}

absl::StatusOr<std::string> CopyInitIntoWorkspaceRoot(const std::string& init_path,
                                                      const std::string& root) {
  const std::string copy = root + "/.sandbox-init";
  auto read = [](const std::string& path, std::string* out) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    *out = ss.str();
    return static_cast<bool>(in);
  };
  std::string want, have;
  if (!read(init_path, &want) || want.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("local: cannot read sandbox-init at ", init_path));
  }
  if (read(copy, &have) && have == want) return copy;
  const std::string tmp = absl::StrCat(copy, ".", RandomHex(6), ".new");
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
  size_t done = 0;
  while (fd >= 0 && done < want.size()) {
    ssize_t n = write(fd, want.data() + done, want.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  bool ok = fd >= 0 && done == want.size() && fchmod(fd, 0755) == 0 && fsync(fd) == 0;
  if (fd >= 0) close(fd);
  ok = ok && rename(tmp.c_str(), copy.c_str()) == 0;
  if (!ok) {
    const int err = errno;
    unlink(tmp.c_str());
    return absl::FailedPreconditionError(
        absl::StrCat("local: cannot copy sandbox-init to ", copy, ": ", strerror(err)));
  }
  return copy;
}

std::string DefaultInitPath() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  std::string exe = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  const std::string dir = exe.substr(0, exe.rfind('/') + 1);
  const std::string beside = dir + "sandbox-init";
  if (access(beside.c_str(), X_OK) == 0) return beside;
  const std::string installed = dir + "../libexec/sandbox-broker/sandbox-init";
  if (access(installed.c_str(), X_OK) == 0) return installed;
  return beside;  // named in the error when neither is there
}

}  // namespace sandbox
