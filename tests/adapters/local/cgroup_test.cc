// CgroupFs against fake cgroup trees (plain directories and files in a temp
// dir): what it writes for cgroup v1 and v2, and what it reads back.

#include "adapters/local/cgroup.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "adapters/local/capacity.h"
#include "tests/testing/temp_dir.h"

namespace sandbox {
namespace {

std::string Read(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void Write(const std::string& p, const std::string& v) { std::ofstream(p) << v; }

TEST(CgroupFsV2, DetectsTheUnifiedHierarchyAndWritesLimits) {
  TempDir dir;
  const std::string root = dir.path();
  Write(root + "/cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n");
  auto cg = CgroupFs::Detect(root, "sb");
  ASSERT_TRUE(cg.ok()) << cg.status();
  EXPECT_EQ(cg->version(), 2);
  CgroupLimits l;
  l.memory_bytes = 512 << 20;
  l.cpus = 1.5;
  l.pids = 256;
  // memory.swap.max exists on hosts with swap accounting.
  mkdir((root + "/sb").c_str(), 0755);
  mkdir((root + "/sb/s1").c_str(), 0755);
  Write(root + "/sb/s1/memory.swap.max", "max\n");
  ASSERT_TRUE(cg->CreateSandbox("s1", l).ok());
  EXPECT_EQ(Read(root + "/cgroup.subtree_control"), "+memory +pids +cpu");
  EXPECT_EQ(Read(root + "/sb/cgroup.subtree_control"), "+memory +pids +cpu");
  EXPECT_EQ(Read(root + "/sb/s1/memory.max"), "536870912");
  EXPECT_EQ(Read(root + "/sb/s1/memory.swap.max"), "0");
  EXPECT_EQ(Read(root + "/sb/s1/pids.max"), "256");
  EXPECT_EQ(Read(root + "/sb/s1/cpu.max"), "150000 100000");
  // Runs get memory accounting of their own (their OOM kills).
  EXPECT_EQ(Read(root + "/sb/s1/cgroup.subtree_control"), "+memory");

  auto fds = cg->CreateChild("s1", "run-1");
  ASSERT_TRUE(fds.ok()) << fds.status();
  EXPECT_EQ(fds->size(), 1u);  // one hierarchy
  for (int fd : *fds) close(fd);
  struct stat st;
  EXPECT_EQ(stat((root + "/sb/s1/run-1").c_str(), &st), 0);

  Write(root + "/sb/s1/memory.current", "12345\n");
  Write(root + "/sb/s1/cpu.stat", "usage_usec 2500000\nuser_usec 2000000\n");
  Write(root + "/sb/s1/memory.events", "low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\n");
  CgroupUsage u = cg->Usage("s1");
  EXPECT_EQ(u.memory_bytes, 12345);
  EXPECT_DOUBLE_EQ(u.cpu_seconds, 2.5);
  EXPECT_EQ(u.oom_kills, 2);
  // Without memory.events of its own a run sees the sandbox's count (v2's
  // memory.events is hierarchical)...
  EXPECT_EQ(cg->OomKills("s1", "run-1"), 2);
  // ...with it, only its own processes' kills.
  Write(root + "/sb/s1/run-1/memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n");
  EXPECT_EQ(cg->OomKills("s1", "run-1"), 0);
  EXPECT_TRUE(cg->Empty("s1", "run-1"));
  // Kernels with cgroup.kill get one write; the group is then empty.
  Write(root + "/sb/s1/run-1/cgroup.kill", "");
  EXPECT_TRUE(cg->Kill("s1", "run-1"));
  EXPECT_EQ(Read(root + "/sb/s1/run-1/cgroup.kill"), "1");
}

TEST(CgroupFsV2, UnlimitedIsMax) {
  TempDir dir;
  const std::string root = dir.path();
  Write(root + "/cgroup.controllers", "memory pids cpu\n");
  auto cg = CgroupFs::Detect(root, "sb");
  ASSERT_TRUE(cg.ok());
  ASSERT_TRUE(cg->CreateSandbox("s2", CgroupLimits{}).ok());
  EXPECT_EQ(Read(root + "/sb/s2/memory.max"), "max");
  EXPECT_EQ(Read(root + "/sb/s2/pids.max"), "max");
  EXPECT_EQ(Read(root + "/sb/s2/cpu.max"), "max 100000");
}

TEST(CgroupFsV1, DetectsPerControllerHierarchiesAndWritesLimits) {
  TempDir dir;
  const std::string root = dir.path();
  for (const char* c : {"memory", "pids", "cpu", "cpuacct"}) {
    mkdir((root + "/" + c).c_str(), 0755);
    Write(root + "/" + c + "/cgroup.procs", "");
  }
  auto cg = CgroupFs::Detect(root, "sb");
  ASSERT_TRUE(cg.ok()) << cg.status();
  EXPECT_EQ(cg->version(), 1);
  // memory.memsw.* exists when swap accounting is on.
  mkdir((root + "/memory/sb").c_str(), 0755);
  mkdir((root + "/memory/sb/s1").c_str(), 0755);
  Write(root + "/memory/sb/s1/memory.memsw.limit_in_bytes", "9223372036854771712\n");
  CgroupLimits l;
  l.memory_bytes = 1 << 30;
  l.cpus = 0.5;
  l.pids = 64;
  ASSERT_TRUE(cg->CreateSandbox("s1", l).ok());
  EXPECT_EQ(Read(root + "/memory/sb/s1/memory.limit_in_bytes"), "1073741824");
  EXPECT_EQ(Read(root + "/memory/sb/s1/memory.memsw.limit_in_bytes"), "1073741824");
  EXPECT_EQ(Read(root + "/pids/sb/s1/pids.max"), "64");
  EXPECT_EQ(Read(root + "/cpu/sb/s1/cpu.cfs_period_us"), "100000");
  EXPECT_EQ(Read(root + "/cpu/sb/s1/cpu.cfs_quota_us"), "50000");

  auto fds = cg->CreateChild("s1", "run-7");
  ASSERT_TRUE(fds.ok()) << fds.status();
  EXPECT_EQ(fds->size(), 2u);  // runs: pids and memory
  for (int fd : *fds) close(fd);
  struct stat st;
  EXPECT_EQ(stat((root + "/pids/sb/s1/run-7").c_str(), &st), 0);
  EXPECT_EQ(stat((root + "/memory/sb/s1/run-7").c_str(), &st), 0);
  EXPECT_NE(stat((root + "/cpu/sb/s1/run-7").c_str(), &st), 0);
  auto init = cg->CreateChild("s1", "init");
  ASSERT_TRUE(init.ok());
  EXPECT_EQ(init->size(), 4u);  // pids/…/init + the sandbox's memory, cpu, cpuacct groups
  for (int fd : *init) close(fd);

  Write(root + "/memory/sb/s1/memory.usage_in_bytes", "4096\n");
  Write(root + "/cpuacct/sb/s1/cpuacct.usage", "1500000000\n");
  // v1 counts OOM kills per group: a run reads its own, the sandbox's is
  // summed over its groups.
  Write(root + "/memory/sb/s1/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n");
  Write(root + "/memory/sb/s1/run-7/memory.oom_control",
        "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n");
  mkdir((root + "/memory/sb/s1/run-8").c_str(), 0755);
  Write(root + "/memory/sb/s1/run-8/memory.oom_control",
        "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n");
  EXPECT_EQ(cg->OomKills("s1", "run-7"), 3);
  EXPECT_EQ(cg->OomKills("s1", "run-8"), 0);
  CgroupUsage u = cg->Usage("s1");
  EXPECT_EQ(u.memory_bytes, 4096);
  EXPECT_DOUBLE_EQ(u.cpu_seconds, 1.5);
  EXPECT_EQ(u.oom_kills, 3);  // summed over the sandbox's groups
  EXPECT_TRUE(cg->Exists("s1"));
  EXPECT_FALSE(cg->Exists("s9"));
}

// The weight of all sandboxes together against the rest of the host: v2
// cpu.weight as given, v1 cpu.shares in its own units (1024 per 100).
TEST(CgroupFsV2, TreeCpuWeight) {
  TempDir dir;
  const std::string root = dir.path();
  Write(root + "/cgroup.controllers", "cpu memory pids\n");
  auto cg = CgroupFs::Detect(root, "sb");
  ASSERT_TRUE(cg.ok()) << cg.status();
  ASSERT_TRUE(cg->SetTreeCpuWeight(2500).ok());
  EXPECT_EQ(Read(root + "/cgroup.subtree_control"), "+memory +pids +cpu");
  EXPECT_EQ(Read(root + "/sb/cpu.weight"), "2500");
  ASSERT_TRUE(cg->SetTreeCpuWeight(100).ok());  // back to the default on the next start
  EXPECT_EQ(Read(root + "/sb/cpu.weight"), "100");
}

// The host's capacity as the tree's own limits (0: none).
TEST(CgroupFsV2, TreeLimits) {
  TempDir dir;
  const std::string root = dir.path();
  Write(root + "/cgroup.controllers", "cpu memory pids\n");
  auto cg = CgroupFs::Detect(root, "sb");
  ASSERT_TRUE(cg.ok()) << cg.status();
  ASSERT_TRUE(cg->SetTreeLimits(int64_t{20} << 30, 30000).ok());
  EXPECT_EQ(Read(root + "/sb/memory.max"), "21474836480");
  EXPECT_EQ(Read(root + "/sb/pids.max"), "30000");
  ASSERT_TRUE(cg->SetTreeLimits(0, 0).ok());
  EXPECT_EQ(Read(root + "/sb/memory.max"), "max");
  EXPECT_EQ(Read(root + "/sb/pids.max"), "max");
}

TEST(CgroupFsV1, TreeLimits) {
  TempDir dir;
  const std::string root = dir.path();
  for (const char* c : {"memory", "pids", "cpu"}) {
    mkdir((root + "/" + c).c_str(), 0755);
    Write(root + "/" + c + "/cgroup.procs", "");
  }
  auto cg = CgroupFs::Detect(root, "sb");
  ASSERT_TRUE(cg.ok()) << cg.status();
  ASSERT_TRUE(cg->SetTreeLimits(int64_t{1} << 30, 500).ok());
  EXPECT_EQ(Read(root + "/memory/sb/memory.limit_in_bytes"), "1073741824");
  EXPECT_EQ(Read(root + "/pids/sb/pids.max"), "500");
  ASSERT_TRUE(cg->SetTreeLimits(0, 0).ok());
  EXPECT_EQ(Read(root + "/memory/sb/memory.limit_in_bytes"), "-1");
  EXPECT_EQ(Read(root + "/pids/sb/pids.max"), "max");
}

TEST(CgroupFsV1, TreeCpuWeightIsShares) {
  TempDir dir;
  const std::string root = dir.path();
  for (const char* c : {"memory", "pids", "cpu"}) {
    mkdir((root + "/" + c).c_str(), 0755);
    Write(root + "/" + c + "/cgroup.procs", "");
  }
  auto cg = CgroupFs::Detect(root, "sb");
  ASSERT_TRUE(cg.ok()) << cg.status();
  ASSERT_TRUE(cg->SetTreeCpuWeight(100).ok());
  EXPECT_EQ(Read(root + "/cpu/sb/cpu.shares"), "1024");
  ASSERT_TRUE(cg->SetTreeCpuWeight(10000).ok());
  EXPECT_EQ(Read(root + "/cpu/sb/cpu.shares"), "102400");
  ASSERT_TRUE(cg->SetTreeCpuWeight(1).ok());
  EXPECT_EQ(Read(root + "/cpu/sb/cpu.shares"), "10");
}

TEST(CgroupFs, NoUsableHierarchyIsAClearError) {
  TempDir dir;
  Write(dir.path() + "/cgroup.controllers", "cpu io\n");  // v2 without memory/pids
  auto cg = CgroupFs::Detect(dir.path(), "sb");
  ASSERT_FALSE(cg.ok());
  EXPECT_EQ(cg.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(cg.status().message().find("memory, pids and cpu"), absl::string_view::npos);
}

}  // namespace
// ---- host-wide capacity (capacity.h) -----------------------------------------

TEST(CapacityLedgerTest, ReservesUpToCapacityTimesOvercommitAndNamesTheKey) {
  LocalCapacity c;
  c.memory_bytes = 3000;
  c.pids = 100;
  c.disk_bytes = 0;  // no limit
  c.sandboxes = 3;
  c.pids_overcommit = 2;
  CapacityLedger ledger(c);
  std::map<std::string, std::pair<int64_t, int64_t>> seen;
  ledger.SetReport([&](const std::string& r, int64_t cap, int64_t used) { seen[r] = {cap, used}; });
  EXPECT_EQ(seen["memory_bytes"], std::make_pair(int64_t{3000}, int64_t{0}));
  auto a = ledger.Reserve({1000, 150, 1 << 30});
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = ledger.Reserve({1000, 50, 1 << 30});  // pids 200 = 100 x 2
  ASSERT_TRUE(b.ok()) << b.status();
  auto c3 = ledger.Reserve({1001, 0, 0});
  EXPECT_EQ(c3.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(c3.status().message(),
            "local: providers.local.capacity.memory_bytes reached: 2000 bytes in use by 2 "
            "sandboxes, 1001 bytes asked, 3000 bytes in all (capacity x overcommit); close a "
            "session first");
  EXPECT_EQ(ledger.Reserve({0, 1, 0}).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(seen["pids"], std::make_pair(int64_t{200}, int64_t{200}));
  EXPECT_EQ(seen["disk_bytes"], std::make_pair(int64_t{0}, int64_t{2} << 30));
  auto d = ledger.Reserve({1000, 0, 0});
  ASSERT_TRUE(d.ok());
  auto e = ledger.Reserve({0, 0, 0});  // the fourth sandbox
  EXPECT_NE(e.status().message().find("capacity.sandboxes reached"), std::string::npos)
      << e.status();
  // A sandbox that exists already is counted, never refused.
  CapacityLedger::Hold forced = ledger.Force({5000, 0, 0});
  EXPECT_EQ(ledger.sandboxes(), 4);
  EXPECT_EQ(ledger.in_use().memory_bytes, 8000);
  forced.Release();
  a->Release();
  CapacityLedger::Hold moved = std::move(*b);
  b->Release();  // moved from: nothing
  EXPECT_EQ(ledger.sandboxes(), 2);
  EXPECT_EQ(seen["sandboxes"], std::make_pair(int64_t{3}, int64_t{2}));
  moved.Release();
  d->Release();
  EXPECT_EQ(ledger.in_use().memory_bytes, 0);
  EXPECT_EQ(ledger.in_use().pids, 0);
}

TEST(CapacityLedgerTest, TheHostsCapacityLessAReserve) {
  TempDir dir;
  const std::string proc = dir.path() + "/proc";
  mkdir(proc.c_str(), 0755);
  mkdir((proc + "/sys").c_str(), 0755);
  mkdir((proc + "/sys/kernel").c_str(), 0755);
  Write(proc + "/meminfo", "MemTotal:       25165824 kB\nMemFree:        1000 kB\n");
  Write(proc + "/sys/kernel/pid_max", "4194304\n");
  Write(proc + "/sys/kernel/threads-max", "100000\n");
  LocalCapacity c = HostCapacity(proc, dir.path());
  EXPECT_EQ(c.memory_bytes, (int64_t{24} << 30) - (int64_t{24} << 30) / 10);  // 10% above 1 GiB
  EXPECT_EQ(c.pids, 90000);
  EXPECT_GT(c.disk_bytes, 0);  // the free space of the temp dir's filesystem, less its reserve
  Write(proc + "/meminfo", "MemTotal:       524288 kB\n");    // 512 MiB: less than the reserve
  EXPECT_EQ(HostCapacity(proc, dir.path()).memory_bytes, 0);  // no limit rather than none left
  EXPECT_EQ(HostCapacity(dir.path() + "/nothing", dir.path()).pids, 0);
}

}  // namespace sandbox
