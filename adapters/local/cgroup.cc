#include "adapters/local/cgroup.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace sandbox {
namespace {

// The controllers a sandbox needs, as cgroup v2 enables them for children.
constexpr char kV2Controllers[] = "+memory +pids +cpu";

bool PathExists(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0;
}

std::string Slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

absl::Status Put(const std::string& path, const std::string& value) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_TRUNC, 0644);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cgroup: cannot open ", path, ": ", strerror(errno)));
  }
  ssize_t w = write(fd, value.data(), value.size());
  int err = errno;
  close(fd);
  if (w != static_cast<ssize_t>(value.size())) {
    return absl::FailedPreconditionError(
        absl::StrCat("cgroup: cannot write '", value, "' to ", path, ": ", strerror(err)));
  }
  return absl::OkStatus();
}

absl::Status MkDir(const std::string& p) {
  if (mkdir(p.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("cgroup: cannot create ", p, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

// "key value" lines (memory.events, cpu.stat, memory.oom_control).
int64_t Field(const std::string& text, absl::string_view key) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<absl::string_view> kv = absl::StrSplit(line, ' ');
    int64_t v = 0;
    if (kv.size() == 2 && kv[0] == key && absl::SimpleAtoi(kv[1], &v)) return v;
  }
  return 0;
}

int64_t Number(const std::string& path) {
  int64_t v = 0;
  (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(Slurp(path)), &v);
  return v;
}

// The group and its direct subgroups (our layout is two levels deep).
std::vector<std::string> WithSubdirs(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (struct dirent* e = readdir(d)) {
      if (e->d_type == DT_DIR && e->d_name[0] != '.') out.push_back(dir + "/" + e->d_name);
    }
    closedir(d);
  }
  out.push_back(dir);  // last: removed after its children
  return out;
}

std::vector<pid_t> Pids(const std::vector<std::string>& dirs) {
  std::vector<pid_t> out;
  for (const auto& d : dirs) {
    for (absl::string_view l : absl::StrSplit(Slurp(d + "/cgroup.procs"), '\n')) {
      int v;
      if (absl::SimpleAtoi(l, &v) && v > 0) out.push_back(v);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<CgroupFs> CgroupFs::Detect(const std::string& root, const std::string& parent) {
  CgroupFs c;
  c.root_ = root;
  c.parent_ = parent;
  const std::string controllers = Slurp(root + "/cgroup.controllers");
  if (!controllers.empty()) {
    std::vector<std::string> have = absl::StrSplit(absl::StripAsciiWhitespace(controllers), ' ');
    auto has = [&](const char* n) { return std::find(have.begin(), have.end(), n) != have.end(); };
    if (has("memory") && has("pids") && has("cpu")) {
      c.version_ = 2;
      c.mem_ = c.pids_ = c.cpu_ = c.cpuacct_ = root;
      return c;
    }
  }
  if (PathExists(root + "/memory/cgroup.procs") && PathExists(root + "/pids/cgroup.procs") &&
      PathExists(root + "/cpu/cgroup.procs")) {
    c.version_ = 1;
    c.mem_ = root + "/memory";
    c.pids_ = root + "/pids";
    c.cpu_ = root + "/cpu";
    c.cpuacct_ = PathExists(root + "/cpuacct/cgroup.procs") ? root + "/cpuacct" : "";
    return c;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("no usable cgroup filesystem at ", root,
                   " (need cgroup v2 with the memory, pids and cpu controllers, or cgroup v1 "
                   "memory, pids and cpu hierarchies)"));
}

std::string CgroupFs::Describe() const {
  return absl::StrCat("cgroup v", version_, " at ", root_, " (group ", parent_, ")");
}

std::vector<std::string> CgroupFs::Dirs(const std::string& name, const std::string& child) const {
  std::vector<std::string> bases;
  if (version_ == 2) {
    bases = {root_};
  } else {
    bases = {mem_, pids_, cpu_};
    if (!cpuacct_.empty()) bases.push_back(cpuacct_);
  }
  std::vector<std::string> out;
  for (const auto& b : bases) {
    std::string d = absl::StrCat(b, "/", parent_, "/", name);
    if (!child.empty()) absl::StrAppend(&d, "/", child);
    out.push_back(d);
  }
  return out;
}

std::string CgroupFs::MemDir(const std::string& name) const {
  return absl::StrCat(mem_, "/", parent_, "/", name);
}

std::string CgroupFs::PidsDir(const std::string& name, const std::string& child) const {
  std::string d = absl::StrCat(pids_, "/", parent_, "/", name);
  if (!child.empty()) absl::StrAppend(&d, "/", child);
  return d;
}

absl::Status CgroupFs::MakeV2Parent() const {
  if (absl::Status s = Put(root_ + "/cgroup.subtree_control", kV2Controllers); !s.ok()) return s;
  return MkDir(absl::StrCat(root_, "/", parent_));
}

absl::Status CgroupFs::SetTreeCpuWeight(int64_t weight) const {
  if (version_ == 2) {
    if (absl::Status s = MakeV2Parent(); !s.ok()) return s;
    return Put(absl::StrCat(root_, "/", parent_, "/cpu.weight"), absl::StrCat(weight));
  }
  const std::string parent = absl::StrCat(cpu_, "/", parent_);
  if (absl::Status s = MkDir(parent); !s.ok()) return s;
  return Put(parent + "/cpu.shares", absl::StrCat(std::max<int64_t>(2, weight * 1024 / 100)));
}

absl::Status CgroupFs::SetTreeLimits(int64_t memory_bytes, int64_t pids) const {
  auto value = [](int64_t v, const char* none) {
    return v > 0 ? absl::StrCat(v) : std::string(none);
  };
  if (version_ == 2) {
    if (absl::Status s = MakeV2Parent(); !s.ok()) return s;
    const std::string parent = absl::StrCat(root_, "/", parent_);
    absl::Status s = Put(parent + "/memory.max", value(memory_bytes, "max"));
    if (s.ok()) s = Put(parent + "/pids.max", value(pids, "max"));
    return s;
  }
  const std::string mem = absl::StrCat(mem_, "/", parent_);
  const std::string pid = absl::StrCat(pids_, "/", parent_);
  for (const std::string& d : {mem, pid}) {
    if (absl::Status s = MkDir(d); !s.ok()) return s;
  }
  absl::Status s = Put(mem + "/memory.limit_in_bytes", value(memory_bytes, "-1"));
  if (s.ok()) s = Put(pid + "/pids.max", value(pids, "max"));
  return s;
}

absl::Status CgroupFs::CreateSandbox(const std::string& name, const CgroupLimits& limits) const {
  if (version_ == 2) {
    const std::string parent = absl::StrCat(root_, "/", parent_);
    if (absl::Status s = MakeV2Parent(); !s.ok()) return s;
    if (absl::Status s = Put(parent + "/cgroup.subtree_control", kV2Controllers); !s.ok()) {
      return s;
    }
    const std::string d = parent + "/" + name;
    if (absl::Status s = MkDir(d); !s.ok()) return s;
    // Memory accounting in the sandbox's children too, so that each run's
    // memory.events counts its own OOM kills (best effort: without it a run
    // sees the sandbox's count). The sandbox's group itself never holds a
    // process (init and runs are in children), as v2 requires.
    (void)Put(d + "/cgroup.subtree_control", "+memory");
    absl::Status s =
        Put(d + "/memory.max",
            limits.memory_bytes > 0 ? absl::StrCat(limits.memory_bytes) : std::string("max"));
    if (s.ok() && PathExists(d + "/memory.swap.max")) s = Put(d + "/memory.swap.max", "0");
    if (s.ok()) {
      s = Put(d + "/pids.max", limits.pids > 0 ? absl::StrCat(limits.pids) : std::string("max"));
    }
    if (s.ok()) {
      s = Put(
          d + "/cpu.max",
          limits.cpus > 0
              ? absl::StrCat(static_cast<int64_t>(std::llround(limits.cpus * 100000)), " 100000")
              : std::string("max 100000"));
    }
    return s;
  }
  for (const std::string& b : {mem_, pids_, cpu_, cpuacct_}) {
    if (b.empty()) continue;
    if (absl::Status s = MkDir(absl::StrCat(b, "/", parent_)); !s.ok()) return s;
    if (absl::Status s = MkDir(absl::StrCat(b, "/", parent_, "/", name)); !s.ok()) return s;
  }
  const std::string m = MemDir(name);
  const std::string mem = limits.memory_bytes > 0 ? absl::StrCat(limits.memory_bytes) : "-1";
  // memsw (memory+swap) must stay >= the memory limit: raise it first when
  // growing, lower it last when shrinking; setting both equal forbids swap.
  if (PathExists(m + "/memory.memsw.limit_in_bytes")) {
    (void)Put(m + "/memory.memsw.limit_in_bytes", "-1");
  }
  absl::Status s = Put(m + "/memory.limit_in_bytes", mem);
  if (s.ok() && PathExists(m + "/memory.memsw.limit_in_bytes")) {
    s = Put(m + "/memory.memsw.limit_in_bytes", mem);
  }
  if (s.ok()) {
    s = Put(PidsDir(name, "") + "/pids.max",
            limits.pids > 0 ? absl::StrCat(limits.pids) : std::string("max"));
  }
  const std::string c = absl::StrCat(cpu_, "/", parent_, "/", name);
  if (s.ok()) s = Put(c + "/cpu.cfs_period_us", "100000");
  if (s.ok()) {
    s = Put(c + "/cpu.cfs_quota_us",
            limits.cpus > 0 ? absl::StrCat(static_cast<int64_t>(std::llround(limits.cpus * 100000)))
                            : std::string("-1"));
  }
  return s;
}

absl::StatusOr<std::vector<int>> CgroupFs::CreateChild(const std::string& name,
                                                       const std::string& child) const {
  std::vector<int> fds;
  std::vector<std::string> dirs = Dirs(name, child);
  if (version_ == 1) {
    // Each v1 hierarchy is one more migration (and RCU grace period): a run
    // joins its own group in pids (the kill set) and memory (v1 counts OOM
    // kills per group, not up the tree, so that is how a run knows its own),
    // and stays in the sandbox's cpu groups, which init joins and runs
    // inherit. The moves happen in init's spare, before the run is sent.
    dirs = {PidsDir(name, child)};
    if (child == "init") {
      for (const std::string& b : {mem_, cpu_, cpuacct_}) {
        if (!b.empty()) dirs.push_back(absl::StrCat(b, "/", parent_, "/", name));
      }
    } else {
      dirs.push_back(absl::StrCat(MemDir(name), "/", child));
    }
  }
  for (const auto& d : dirs) {
    absl::Status s = MkDir(d);
    int fd =
        s.ok() ? open((d + "/cgroup.procs").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644) : -1;
    if (fd < 0) {
      for (int f : fds) close(f);
      if (s.ok()) {
        s = absl::FailedPreconditionError(
            absl::StrCat("cgroup: cannot open ", d, "/cgroup.procs: ", strerror(errno)));
      }
      return s;
    }
    fds.push_back(fd);
  }
  return fds;
}

bool CgroupFs::Empty(const std::string& name, const std::string& child) const {
  const std::string d = PidsDir(name, child);
  return Pids(child.empty() ? WithSubdirs(d) : std::vector<std::string>{d}).empty();
}

bool CgroupFs::Kill(const std::string& name, const std::string& child) const {
  const std::string d = PidsDir(name, child);
  // Freezing first would make this exact; instead repeat until a pass finds
  // nothing (the pids limit bounds how many a fork loop can add per pass).
  for (int round = 0; round < 2000; ++round) {
    std::vector<std::string> dirs = child.empty() ? WithSubdirs(d) : std::vector<std::string>{d};
    if (version_ == 2 && round == 0 && PathExists(d + "/cgroup.kill"))
      (void)Put(d + "/cgroup.kill", "1");
    std::vector<pid_t> pids = Pids(dirs);
    if (pids.empty()) return true;
    for (pid_t p : pids) kill(p, SIGKILL);
    struct timespec ts = {0, 1000000};  // let the killed leave the group
    nanosleep(&ts, nullptr);
  }
  return false;
}

absl::Status CgroupFs::Remove(const std::string& name, const std::string& child) const {
  absl::Status out;
  for (const auto& d : Dirs(name, child)) {
    for (const auto& sub : WithSubdirs(d)) {
      if (rmdir(sub.c_str()) != 0 && errno != ENOENT && out.ok()) {
        out =
            absl::InternalError(absl::StrCat("cgroup: cannot remove ", sub, ": ", strerror(errno)));
      }
    }
  }
  return out;
}

CgroupUsage CgroupFs::Usage(const std::string& name) const {
  CgroupUsage u;
  const std::string m = MemDir(name);
  if (version_ == 2) {
    u.memory_bytes = Number(m + "/memory.current");
    u.cpu_seconds = static_cast<double>(Field(Slurp(m + "/cpu.stat"), "usage_usec")) / 1e6;
    u.oom_kills = Field(Slurp(m + "/memory.events"), "oom_kill");
  } else {
    u.memory_bytes = Number(m + "/memory.usage_in_bytes");
    if (!cpuacct_.empty()) {
      u.cpu_seconds = static_cast<double>(Number(
                          absl::StrCat(cpuacct_, "/", parent_, "/", name, "/cpuacct.usage"))) /
                      1e9;
    }
    u.oom_kills = OomKills(name, "");
  }
  return u;
}

int64_t CgroupFs::OomKills(const std::string& name, const std::string& child) const {
  const std::string m = MemDir(name);
  const std::string own = child.empty() ? "" : absl::StrCat(m, "/", child);
  if (version_ == 2) {
    // memory.events is hierarchical: a run's group counts its processes'.
    if (!own.empty() && PathExists(own + "/memory.events")) {
      return Field(Slurp(own + "/memory.events"), "oom_kill");
    }
    return Field(Slurp(m + "/memory.events"), "oom_kill");
  }
  // v1 counts each kill in the killed process's own group only.
  if (!own.empty() && PathExists(own + "/memory.oom_control")) {
    return Field(Slurp(own + "/memory.oom_control"), "oom_kill");
  }
  int64_t n = 0;
  for (const auto& d : WithSubdirs(m)) {
    n += Field(Slurp(d + "/memory.oom_control"), "oom_kill");
  }
  return n;
}

bool CgroupFs::Exists(const std::string& name) const { return PathExists(PidsDir(name, "")); }

}  // namespace sandbox
