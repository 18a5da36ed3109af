#include "adapters/local/local_provider.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "adapters/local/disk_image.h"
#include "tests/testing/child_process.h"
#include "tests/testing/processes.h"
#include "tests/testing/temp_dir.h"

namespace sandbox {
namespace {

class LocalProviderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LocalConfig c;
    c.workspace_root = dir_.path() + "/ws";
    c.uid_base = 610000;
    c.limits.pids = 32;
    c.limits.memory_bytes = int64_t{512} << 20;
    c.limits.disk_bytes = int64_t{64} << 20;
    auto p = LocalProvider::Create(c);
    ASSERT_TRUE(p.ok()) << p.status();
    provider_ = std::move(*p);
    SandboxSpec spec;
    spec.session_id = "s1";
    auto sb = provider_->Create(spec);
    ASSERT_TRUE(sb.ok()) << sb.status();
    sandbox_ = std::move(*sb);
  }

  ExecResult Exec(Language lang, const std::string& code,
                  absl::Duration timeout = absl::Seconds(30),
                  std::map<std::string, std::string> env = {}) {
    ExecRequest r;
    r.language = lang;
    r.code = code;
    r.timeout = timeout;
    r.env = std::move(env);
    auto res = sandbox_->Exec(r);
    EXPECT_TRUE(res.ok()) << res.status();
    return res.ok() ? *res : ExecResult{};
  }

  TempDir dir_;
  std::unique_ptr<LocalProvider> provider_;
  std::unique_ptr<Sandbox> sandbox_;
};

TEST_F(LocalProviderTest, RunsEachLanguageWithCodeOfAnyBytesExactly) {
  const std::string py = "s = 'it\\'s \"quoted\" \\\\ $HOME `x` \u00fc \u20ac'\nprint(s)\n";
  EXPECT_EQ(Exec(Language::kPython, py).output, "it's \"quoted\" \\ $HOME `x` \u00fc \u20ac\n");
  EXPECT_EQ(Exec(Language::kNode, "console.log(`a'b\"c ${1+1}`)").output, "a'b\"c 2\n");
  ExecResult sh = Exec(Language::kShell, "printf '%s\\n' \"$0\" >/dev/null; echo \"x'y\"; exit 4");
  EXPECT_EQ(sh.output, "x'y\n");
  EXPECT_EQ(sh.exit_code, 4);
}

// Shell scripts up to 64 KiB go as `bash -c`, whose last command replaces
// bash; larger ones are read from fd 3 (and forked, as any script file).
TEST_F(LocalProviderTest, ShellScriptsOfAnySizeRun) {
  const std::string probe = "true; sh -c 'test $$ = $1 && echo replaced || echo forked' sh $$";
  EXPECT_EQ(Exec(Language::kShell, probe).output, "replaced\n");
  std::string big(100 << 10, '#');
  big += "\necho \"big $((6 * 7))\"\n" + probe + "\nexit 3\n";
  ExecResult large = Exec(Language::kShell, big);
  EXPECT_EQ(large.output, "big 42\nforked\n");
  EXPECT_EQ(large.exit_code, 3);
}

TEST_F(LocalProviderTest, EnvironmentIsClearedButForPathHomeLangShellAndTheRequest) {
  setenv("E2B_API_KEY", "e2b_sekrit_host_key", 1);
  ExecResult r = Exec(Language::kShell, "env | sort", absl::Seconds(30), {{"MY_VAR", "v1"}});
  EXPECT_NE(r.output.find("MY_VAR=v1\n"), std::string::npos);
  EXPECT_NE(r.output.find("HOME=/workspace\n"), std::string::npos);
  EXPECT_NE(r.output.find("SHELL=/bin/bash\n"), std::string::npos);
  // With SHELL set bash does not look its user up: no NSS module (such as
  // libnss_systemd, where nsswitch.conf names it) is loaded into it.
  EXPECT_EQ(Exec(Language::kShell, "true; grep -c libnss_ /proc/$$/maps").output, "0\n");
  EXPECT_EQ(r.output.find("sekrit"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("E2B_API_KEY"), std::string::npos);
}

// Code has an account of its own (whoami, getpass and os.userInfo work, as
// in a cloud sandbox), and the host's accounts are not listed.
TEST_F(LocalProviderTest, CodeRunsAsAUserOfItsOwnAndSeesNoHostAccounts) {
  // Looked up in the sandbox's own files only, whatever the host's
  // nsswitch.conf names.
  EXPECT_EQ(Exec(Language::kShell, "grep '^passwd:' /etc/nsswitch.conf").output, "passwd: files\n");
  ExecResult r = Exec(Language::kShell,
                      "whoami; id -un; id -gn; getent passwd | cut -d: -f1 | tr '\\n' ' '; echo;"
                      " getent group | cut -d: -f1 | tr '\\n' ' '; echo;"
                      " getent passwd $(id -u) | cut -d: -f6");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output,
            "sandbox\nsandbox\nsandbox\nsandbox root nobody \nsandbox root nogroup \n/workspace\n");
  EXPECT_EQ(Exec(Language::kPython, "import getpass; print(getpass.getuser())").output,
            "sandbox\n");
}

TEST_F(LocalProviderTest, HostFilesAndProcessesAreInvisible) {
  std::string secret_file = dir_.path() + "/broker-config.json";
  std::ofstream(secret_file) << "{\"api_key\": \"sekrit\"}";
  ExecResult r =
      Exec(Language::kShell,
           absl::StrCat("cat ", secret_file,
                        " 2>&1; cat /etc/shadow 2>&1; ls /root /home 2>&1;"
                        " cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c KEY;"
                        " ls /proc | grep -c '^[0-9]'"));
  EXPECT_EQ(r.output.find("sekrit"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("No such file"), std::string::npos) << r.output;
  // Only the sandbox's own few processes exist in its pid namespace.
  EXPECT_NE(r.output.find("\n0\n"), std::string::npos) << r.output;
}

TEST_F(LocalProviderTest, CodeCannotTraceInitOrTakeItsDescriptors) {
  // PID 1 (sandbox-init) runs as the code's uid and holds the control
  // socket and a host log file: it is not dumpable, so neither ptrace nor
  // pidfd_getfd reaches it (on a host without Yama's restrictions too).
  ExecResult r = Exec(Language::kPython, R"(
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def call(name, f):
    ctypes.set_errno(0)
    rc = f()
    print(name, rc, errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()))
pidfd = os.pidfd_open(1)
for fd in (1, 2, 3):
    call("getfd", lambda: libc.syscall(438, pidfd, fd, 0))
call("attach", lambda: libc.ptrace(16, 1, None, None))
print(open("/proc/1/status").read().count("TracerPid:\t0"))
# Read access, which Yama's ptrace_scope does not restrict: refused too.
try:
    os.listdir("/proc/1/fd")
    print("fds listed")
except PermissionError:
    print("fds refused")
)");
  EXPECT_EQ(r.output,
            "getfd -1 EPERM\ngetfd -1 EPERM\ngetfd -1 EPERM\nattach -1 EPERM\n1\nfds refused\n")
      << r.output;
  // Files in /tmp still move both ways (through the broker's descriptor of
  // the container's /tmp, not a path by pid).
  ASSERT_TRUE(sandbox_->WriteFile("/tmp/in.txt", "to code").ok());
  EXPECT_EQ(Exec(Language::kShell, "cat /tmp/in.txt; echo back > /tmp/out.txt").output, "to code");
  EXPECT_EQ(**sandbox_->ReadFile("/tmp/out.txt"), "back\n");
  // /tmp itself is a working directory.
  ExecRequest in_tmp;
  in_tmp.language = Language::kShell;
  in_tmp.code = "pwd; ls";
  in_tmp.cwd = "/tmp";
  in_tmp.timeout = absl::Seconds(30);
  auto listed = sandbox_->Exec(in_tmp);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->output, "/tmp\nin.txt\nout.txt\n");
}

TEST_F(LocalProviderTest, BackgroundOutputAfterARunCostsTheBrokerLittleCpu) {
  // Two writers that never pause, left behind by a run: their pipes are
  // still read (they live on, no SIGPIPE) but at a bounded rate, so they
  // block on full pipes instead of keeping a broker core busy.
  ExecResult r = Exec(Language::kShell,
                      "yes & echo $! > /tmp/y1; yes >&2 & echo $! > /tmp/y2;"
                      " (head -c 400000 /dev/zero; touch /tmp/wrote) & echo started");
  EXPECT_EQ(r.exit_code, 0);  // its output may hold some of the writers' too
  auto cpu = [] {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return absl::DurationFromTimeval(u.ru_utime) + absl::DurationFromTimeval(u.ru_stime);
  };
  const absl::Duration before = cpu();
  EXPECT_EQ(Exec(Language::kShell, "sleep 2").exit_code, 0);  // the window: 2 s of writing
  const absl::Duration used = cpu() - before;
  EXPECT_LT(used, absl::Milliseconds(500)) << used;  // unthrottled: about 2 s of a core
  EXPECT_EQ(Exec(Language::kShell, "kill -0 $(cat /tmp/y1) && kill -0 $(cat /tmp/y2) && echo alive")
                .output,
            "alive\n");
  // Throttled, not stopped: a bounded writer gets its 400 KB out (the first
  // 256 KiB at once, the rest within a few seconds).
  EXPECT_EQ(Exec(Language::kShell,
                 "for i in $(seq 300); do [ -e /tmp/wrote ] && break; sleep 0.1; done;"
                 " [ -e /tmp/wrote ] && echo wrote")
                .output,
            "wrote\n");
}

TEST_F(LocalProviderTest, NetworkIsBlocked) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(s, 1), 0);
  socklen_t len = sizeof(a);
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  ExecResult r = Exec(Language::kPython, absl::StrCat(R"(
import socket
for host in ["127.0.0.1", "10.0.0.1"]:
    try:
        socket.create_connection((host, )",
                                                      port, R"(), timeout=2)
        print("connected", host)
    except OSError as e:
        print("blocked", host)
try:
    socket.getaddrinfo("example.com", 80)
    print("resolved")
except OSError:
    print("no dns")
)"));
  EXPECT_EQ(r.output, "blocked 127.0.0.1\nblocked 10.0.0.1\nno dns\n");
  close(s);
}

TEST_F(LocalProviderTest, TimeoutKillsTheWholeTreeIncludingADetachedGrandchild) {
  const std::string marker = absl::StrCat("grandchild-marker-", getpid());
  ExecResult r = Exec(
      Language::kShell,
      absl::StrCat("echo before; setsid bash -c 'sleep 1000; : ", marker, "' & disown; sleep 1000"),
      absl::Milliseconds(1500));
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.exit_code, 124);
  EXPECT_EQ(r.output, "before\n");
  // The namespace dies with its init; allow the kernel a moment to reap.
  EXPECT_TRUE(GoneWithin(marker, absl::Seconds(5)));
}

TEST_F(LocalProviderTest, ResourceLimitsHold) {
  ExecResult procs =
      Exec(Language::kShell,
           "for i in $(seq 64); do sleep 2 & done 2>&1 | grep -c 'Resource temporarily' "
           ">/dev/null && echo limited; wait");
  EXPECT_NE(procs.output.find("limited"), std::string::npos) << procs.output;
  // Past the sandbox's memory: the kernel kills the run, the sandbox lives.
  ExecResult mem = Exec(Language::kPython,
                        "print('start', flush=True)\nb = b'x' * (700 << 20)\nprint('allocated')\n");
  EXPECT_TRUE(mem.oom_killed);
  EXPECT_EQ(mem.exit_code, 137);
  EXPECT_EQ(mem.output, "start\n");
  EXPECT_EQ(Exec(Language::kPython, "print(42)").output, "42\n");
}

TEST_F(LocalProviderTest, SystemIsReadOnlyAndTmpLastsTheSandboxsLife) {
  ExecResult r =
      Exec(Language::kShell, "touch /usr/x 2>/dev/null || echo ro; echo t > /tmp/t && cat /tmp/t");
  EXPECT_EQ(r.output, "ro\nt\n");
  EXPECT_EQ(Exec(Language::kShell, "cat /tmp/t").output, "t\n");
  EXPECT_EQ(**sandbox_->ReadFile("/tmp/t"), "t\n");
  absl::Status w = sandbox_->WriteFile("/tmp/api", "from api");
  ASSERT_TRUE(w.ok()) << w;
  EXPECT_EQ(Exec(Language::kShell, "cat /tmp/api; stat -c %U /tmp/api").output.substr(0, 8),
            "from api");
}

TEST_F(LocalProviderTest, FilesMoveBetweenTheApiAndCode) {
  ASSERT_TRUE(sandbox_->WriteFile("data/in.txt", "from api").ok());
  ExecResult r = Exec(Language::kPython,
                      "print(open('data/in.txt').read()); open('out.txt','w').write('from code')");
  EXPECT_EQ(r.output, "from api\n");
  EXPECT_EQ(**sandbox_->ReadFile("/workspace/out.txt"), "from code");
  // A symlink planted by sandboxed code does not lead the broker outside.
  Exec(Language::kShell, "ln -s /etc/passwd pw; ln -s / root");
  EXPECT_EQ(sandbox_->ReadFile("pw").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(sandbox_->WriteFile("root/etc/evil", "x").code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(LocalProviderTest, SandboxesDoNotSeeEachOther) {
  ASSERT_TRUE(sandbox_->WriteFile("mine.txt", "a").ok());
  auto other = provider_->Create(SandboxSpec{});
  ASSERT_TRUE(other.ok());
  EXPECT_NE((*other)->id(), sandbox_->id());
  ExecRequest req;
  req.language = Language::kShell;
  req.code = absl::StrCat("ls -A /workspace; ls ", dir_.path(), "/ws 2>&1 | head -1; id -u");
  auto r = (*other)->Exec(req);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->output.find("mine.txt"), std::string::npos) << r->output;
  EXPECT_EQ(r->output.find(sandbox_->id()), std::string::npos) << r->output;
  EXPECT_FALSE((*other)->ReadFile("mine.txt")->has_value());
}

// The mount points a process sees (its /proc/PID/mountinfo, fifth field).
std::vector<std::string> MountPointsOf(pid_t pid) {
  std::vector<std::string> out;
  std::ifstream in(absl::StrCat("/proc/", pid, "/mountinfo"));
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string id, parent, dev, root, point;
    f >> id >> parent >> dev >> root >> point;
    out.push_back(point);
  }
  return out;
}

// The host pid of the bwrap process whose command line binds `workspace`.
pid_t BwrapFor(const std::string& workspace) {
  DIR* d = opendir("/proc");
  pid_t found = 0;
  while (struct dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream in(absl::StrCat("/proc/", e->d_name, "/cmdline"));
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string cmd = ss.str();
    if (absl::StrContains(cmd.substr(0, cmd.find('\0')), "bwrap") &&
        absl::StrContains(cmd, std::string("\0") + workspace + std::string(1, '\0'))) {
      found = atoi(e->d_name);
    }
  }
  closedir(d);
  return found;
}

// Each workspace disk is a mount on the host; a new container's bwrap works
// in a mount namespace that has its own workspace and no other (bwrap reads
// the whole mount table for each of its mounts). The host keeps them all,
// and every sandbox keeps working.
TEST_F(LocalProviderTest, ContainersStartWithOnlyTheirOwnWorkspaceMounted) {
  auto other = provider_->Create(SandboxSpec{});
  ASSERT_TRUE(other.ok()) << other.status();
  const std::string root = dir_.path() + "/ws";
  const std::string mine = root + "/" + sandbox_->id() + "/workspace";
  const std::string theirs = root + "/" + (*other)->id() + "/workspace";
  EXPECT_TRUE(IsMountPoint(root));
  EXPECT_TRUE(IsMountPoint(mine));
  EXPECT_TRUE(IsMountPoint(theirs));
  const pid_t bwrap = BwrapFor(theirs);
  ASSERT_GT(bwrap, 0);
  const std::vector<std::string> seen = MountPointsOf(bwrap);
  EXPECT_NE(std::find(seen.begin(), seen.end(), theirs), seen.end());
  EXPECT_EQ(std::find(seen.begin(), seen.end(), mine), seen.end());
  EXPECT_NE(std::find(seen.begin(), seen.end(), root), seen.end());
  for (Sandbox* sb : {sandbox_.get(), other->get()}) {
    ASSERT_TRUE(sb->WriteFile("id.txt", sb->id()).ok());
    ExecRequest req;
    req.language = Language::kShell;
    req.code = "cat /workspace/id.txt; echo; df --output=size -B1M /workspace | tail -1";
    auto r = sb->Exec(req);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(absl::StartsWith(r->output, sb->id() + "\n")) << r->output;
    // The workspace is the 64 MiB disk, not the directory below the mount.
    EXPECT_LE(std::atoi(r->output.substr(r->output.find('\n') + 1).c_str()), 64) << r->output;
  }
  EXPECT_TRUE((*other)->Destroy().ok());
  EXPECT_FALSE(IsMountPoint(theirs));
  EXPECT_TRUE(IsMountPoint(mine));
}

TEST_F(LocalProviderTest, DestroyKillsRunningCodeAndRemovesTheWorkspace) {
  ASSERT_TRUE(sandbox_->WriteFile("f", "x").ok());
  const std::string ws = dir_.path() + "/ws/" + sandbox_->id();
  ASSERT_EQ(access((ws + "/workspace/f").c_str(), F_OK), 0);
  ASSERT_EQ(access(ws.c_str(), F_OK), 0);
  absl::Notification started, done;
  absl::StatusOr<ExecResult> result;
  std::thread t([&] {
    ExecRequest req;
    req.language = Language::kShell;
    req.code = "echo running; sleep 300";
    req.timeout = absl::Seconds(120);
    req.on_output = [&](OutputStream, absl::string_view) {
      if (!started.HasBeenNotified()) started.Notify();
    };
    result = sandbox_->Exec(req);
    done.Notify();
  });
  // The run's first output says it has really started.
  started.WaitForNotification();
  ASSERT_TRUE(sandbox_->Destroy().ok());
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  t.join();
  ASSERT_TRUE(result.ok());
  EXPECT_FALSE(result->timed_out);
  EXPECT_EQ(result->exit_code, 128 + 9);
  EXPECT_NE(access(ws.c_str(), F_OK), 0);
  EXPECT_TRUE(sandbox_->Destroy().ok());  // idempotent
  ExecRequest req;
  req.code = "print(1)";
  EXPECT_EQ(sandbox_->Exec(req).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(LocalProviderTest, BackgroundProcessesLiveOnAndAttachAfterACrashKeepsOnlyFiles) {
  ASSERT_TRUE(sandbox_->WriteFile("kept.txt", "survives").ok());
  ExecResult bg = Exec(Language::kShell, "sleep 1000 & echo $! > /tmp/bgpid; echo started");
  EXPECT_EQ(bg.output, "started\n");
  EXPECT_EQ(Exec(Language::kShell, "kill -0 $(cat /tmp/bgpid) && echo alive").output, "alive\n");
  const std::string id = sandbox_->id();
  EXPECT_EQ(provider_->ListSandboxIds(), std::vector<std::string>{id});
  // A broker killed by SIGKILL never destroys its sandboxes: leak this one.
  Sandbox* leaked = sandbox_.release();
#if defined(__SANITIZE_ADDRESS__)
  __lsan_ignore_object(leaked);  // on purpose: a killed broker frees nothing
#endif
  (void)leaked;
  auto again = provider_->Attach(id, SandboxSpec{});
  ASSERT_TRUE(again.ok()) << again.status();
  ExecRequest r;
  r.language = Language::kShell;
  r.code = "cat kept.txt; echo; ls /tmp | wc -l; ps -e 2>/dev/null | grep -c sleep || true";
  auto out = (*again)->Exec(r);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->output.substr(0, 9), "survives\n") << out->output;
  EXPECT_NE(out->output.find("\n0\n"), std::string::npos) << out->output;  // fresh /tmp
  // Not an id this provider makes (not hex): INVALID_ARGUMENT; a well-formed
  // id with no workspace: gone (durable sessions drop such a session).
  EXPECT_EQ(provider_->Attach("local-nonexistent", SandboxSpec{}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(provider_->Attach("local-probe-0123abcd", SandboxSpec{}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(IsSandboxGone(provider_->Attach("local-00000000dead", SandboxSpec{}).status()));
  ASSERT_TRUE((*again)->Destroy().ok());
  EXPECT_TRUE(provider_->ListSandboxIds().empty());
  EXPECT_TRUE(provider_->RemoveSandbox(id).ok());  // already gone: fine
}

// Durable sessions on containment's layout: the owner marker makes a
// sandbox listable by its deployment from before its directory exists until
// after it is gone; Detach keeps the workspace (and its disk image) for
// Attach; untagged sandboxes and the probe are never listed.
TEST_F(LocalProviderTest, OwnedSandboxesAreListedDetachedReattachedAndDestroyed) {
  SandboxSpec spec;
  spec.tenant = "t1";
  spec.session_id = "s2";
  spec.deployment_id = "dep-1";
  spec.attempt_id = "att-1";
  auto sb = provider_->Create(spec);
  ASSERT_TRUE(sb.ok()) << sb.status();
  const std::string id = (*sb)->id();
  auto owned = provider_->ListOwned("dep-1");
  ASSERT_TRUE(owned.ok()) << owned.status();
  ASSERT_EQ(owned->size(), 1u);  // not sandbox_ (untagged)
  EXPECT_EQ((*owned)[0].sandbox_id, id);
  EXPECT_EQ((*owned)[0].attempt_id, "att-1");
  EXPECT_EQ((*owned)[0].tenant, "t1");
  EXPECT_EQ((*owned)[0].session_id, "s2");
  EXPECT_NE((*owned)[0].created_at, absl::InfinitePast());
  ASSERT_TRUE(provider_->ListOwned("dep-2").ok());
  EXPECT_TRUE(provider_->ListOwned("dep-2")->empty());
  // The health probe's sandbox is never tagged, so never listed.
  ASSERT_TRUE(provider_->CheckHealth().ok());
  EXPECT_EQ(provider_->ListOwned("dep-1")->size(), 1u);
  EXPECT_EQ(provider_->ListOwned("")->size(), 0u);

  ASSERT_TRUE((*sb)->WriteFile("kept.txt", "across a restart").ok());
  (*sb)->Detach();
  sb->reset();  // the destructor after Detach leaves it alone
  struct stat st;
  EXPECT_EQ(stat(provider_->SandboxDir(id).c_str(), &st), 0);
  EXPECT_EQ(provider_->ListOwned("dep-1")->size(), 1u);
  auto again = provider_->Attach(id, spec);
  ASSERT_TRUE(again.ok()) << again.status();
  ExecRequest r;
  r.language = Language::kShell;
  r.code = "cat kept.txt";
  auto out = (*again)->Exec(r);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->output, "across a restart");
  ASSERT_TRUE((*again)->Destroy().ok());
  EXPECT_NE(stat(provider_->SandboxDir(id).c_str(), &st), 0);
  EXPECT_TRUE(provider_->ListOwned("dep-1")->empty());  // marker removed last
  EXPECT_TRUE(IsSandboxGone(provider_->Attach(id, spec).status()));
}

// A create killed after its marker (and maybe its directory) but before its
// workspace: listed, and Attach cleans up what is left and reports it gone.
TEST_F(LocalProviderTest, HalfCreatedOwnedSandboxIsListedAndRemovable) {
  const std::string root = dir_.path() + "/ws";
  const std::string id = "local-00000000beef";
  mkdir((root + "/.owners").c_str(), 0700);
  std::ofstream(root + "/.owners/" + id)
      << R"({"deployment_id":"dep-1","attempt_id":"a","created_at":1})";
  mkdir((root + "/" + id).c_str(), 0711);  // no workspace/ yet
  auto owned = provider_->ListOwned("dep-1");
  ASSERT_TRUE(owned.ok()) << owned.status();
  ASSERT_EQ(owned->size(), 1u);
  EXPECT_EQ((*owned)[0].sandbox_id, id);
  EXPECT_TRUE(IsSandboxGone(provider_->Attach(id, SandboxSpec{}).status()));
  struct stat st;
  EXPECT_NE(stat((root + "/" + id).c_str(), &st), 0);
  EXPECT_TRUE(provider_->ListOwned("dep-1")->empty());
}

// The spare (sandbox_init.cc) is an optimisation, never a dependency: runs
// started while it is busy or after it died are forked and join their
// cgroups themselves, with the same results.
std::vector<pid_t> SparesOf(const std::string& sandbox_id) {
  // The spare is a fork of init that has not exec'd: its comm is init's
  // (bubblewrap runs a copy, ".sandbox-init").
  std::vector<pid_t> out;
  const std::string base = "/sys/fs/cgroup/pids/sandbox-broker/" + sandbox_id;
  DIR* d = opendir(base.c_str());
  if (d == nullptr) return out;
  while (struct dirent* e = readdir(d)) {
    if (strncmp(e->d_name, "run-", 4) != 0) continue;
    std::ifstream procs(base + "/" + e->d_name + "/cgroup.procs");
    for (pid_t pid; procs >> pid;) {
      std::ifstream comm(absl::StrCat("/proc/", pid, "/comm"));
      std::string name;
      if (std::getline(comm, name) && absl::EndsWith(name, "sandbox-init")) out.push_back(pid);
    }
  }
  closedir(d);
  return out;
}

TEST_F(LocalProviderTest, RunsWorkWithoutTheSpareAndSeveralAtOnce) {
  if (access("/sys/fs/cgroup/pids/cgroup.procs", F_OK) != 0) {
    GTEST_SKIP() << "needs cgroup v1's pids hierarchy to find the spare";
  }
  EXPECT_EQ(Exec(Language::kShell, "echo one").output, "one\n");
  // After a run's answer the next spare is readied: it waits in a run group.
  std::vector<pid_t> spares;
  for (int i = 0; i < 5000 && spares.size() != 1; ++i) {
    spares = SparesOf(sandbox_->id());
    if (spares.size() != 1) usleep(1000);
  }
  ASSERT_EQ(spares.size(), 1u);
  // A spare that died: the next run starts without it. (Dead, not dying: a
  // run handed over at the very moment of its death dies with it, as any
  // run whose process is killed.)
  ASSERT_EQ(kill(spares[0], SIGKILL), 0);
  auto dead = [pid = spares[0]] {
    std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
    std::string line;
    if (!std::getline(stat, line)) return true;  // reaped
    const size_t paren = line.rfind(')');
    return paren != std::string::npos && line.size() > paren + 2 && line[paren + 2] == 'Z';
  };
  for (int i = 0; i < 5000 && !dead(); ++i) usleep(1000);
  ASSERT_TRUE(dead());
  EXPECT_EQ(Exec(Language::kShell, "echo two").output, "two\n");
  // Several at once in one session: one takes the spare, the others fork.
  std::vector<std::thread> threads;
  std::vector<std::string> outputs(6);
  for (int i = 0; i < 6; ++i) {
    threads.emplace_back([this, i, &outputs] {
      ExecRequest r;
      r.language = Language::kShell;
      r.code = absl::StrCat("sleep 0.2; echo run ", i);
      r.timeout = absl::Seconds(30);
      auto res = sandbox_->Exec(r);
      outputs[static_cast<size_t>(i)] = res.ok() ? res->output : res.status().ToString();
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(outputs[static_cast<size_t>(i)], absl::StrCat("run ", i, "\n"));
  // Each run had a group of its own: a timeout kills only its run.
  ExecResult slow = Exec(Language::kShell, "sleep 30 & sleep 30", absl::Milliseconds(300));
  EXPECT_TRUE(slow.timed_out);
  EXPECT_EQ(Exec(Language::kShell, "echo three").output, "three\n");
}

TEST(LocalProviderConfig, CpuWeightIsBounded) {
  auto ok = ParseLocalConfig(nlohmann::json::parse(R"({"cpu_weight": 2500})"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->cpu_weight, 2500);
  EXPECT_EQ(ParseLocalConfig(nlohmann::json::object())->cpu_weight, 100);
  for (const char* bad : {R"({"cpu_weight": 0})", R"({"cpu_weight": 10001})"}) {
    auto r = ParseLocalConfig(nlohmann::json::parse(bad));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("providers.local.cpu_weight"), absl::string_view::npos)
        << r.status().message();
  }
}

// On this machine's real cgroups: the provider gives its parent group the
// configured weight when it starts (a parent of the test's own, removed after).
TEST(LocalProviderStartup, GivesTheSandboxTreeItsCpuWeight) {
  TempDir dir;
  LocalConfig c;
  c.workspace_root = dir.path() + "/ws";
  c.uid_base = 613000;
  c.cgroup_parent = absl::StrCat("sandbox-broker-weight-test-", getpid());
  c.cpu_weight = 300;
  auto p = LocalProvider::Create(c);
  ASSERT_TRUE(p.ok()) << p.status();
  const bool cgroups = (*p)->enforcement().cgroups;
  const std::string detail = (*p)->enforcement().detail;
  p->reset();
  const std::string v1 = absl::StrCat(c.cgroup_root, "/cpu/", c.cgroup_parent, "/cpu.shares");
  const std::string v2 = absl::StrCat(c.cgroup_root, "/", c.cgroup_parent, "/cpu.weight");
  const std::string shares = ReadAll(v1), weight = ReadAll(v2);
  for (const char* h : {"/memory/", "/pids/", "/cpu/", "/cpuacct/", "/"}) {
    rmdir(absl::StrCat(c.cgroup_root, h, c.cgroup_parent).c_str());
  }
  if (!cgroups) GTEST_SKIP() << "no writable cgroups here: " << detail;
  EXPECT_NE(detail.find("cpu weight 300"), std::string::npos) << detail;
  if (!shares.empty()) {
    EXPECT_EQ(absl::StripAsciiWhitespace(shares), "3072");
  } else {
    EXPECT_EQ(absl::StripAsciiWhitespace(weight), "300");
  }
}

// Host-wide admission: sandboxes' limits are reserved against
// providers.local.capacity; one that would pass it is refused naming the
// key before anything is made, a destroyed one gives its share back, and
// the parent group carries the capacity as its own limits (a parent of the
// test's own, removed after).
TEST(LocalProviderStartup, TheHostsCapacityAdmitsSandboxesAndLimitsTheTree) {
  TempDir dir;
  LocalConfig c;
  c.workspace_root = dir.path() + "/ws";
  c.uid_base = 614000;
  c.cgroup_parent = absl::StrCat("sandbox-broker-capacity-test-", getpid());
  c.capacity.memory_bytes = int64_t{3} << 29;  // 1.5 GiB: room for one 1 GiB sandbox
  c.capacity.pids = 4096;
  auto p = LocalProvider::Create(c);
  ASSERT_TRUE(p.ok()) << p.status();
  absl::Mutex mu;
  std::map<std::string, std::pair<int64_t, int64_t>> seen;
  ProviderHooks hooks;
  hooks.on_capacity = [&](const std::string& r, int64_t cap, int64_t used) {
    absl::MutexLock l(&mu);
    seen[r] = {cap, used};
  };
  (*p)->SetHooks(hooks);
  SandboxSpec spec;
  spec.tenant = "t";
  spec.session_id = "cap-1";
  auto first = (*p)->Create(spec);
  ASSERT_TRUE(first.ok()) << first.status();
  spec.session_id = "cap-2";
  auto second = (*p)->Create(spec);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted) << second.status();
  EXPECT_NE(second.status().message().find("providers.local.capacity.memory_bytes reached: "
                                           "1073741824 bytes in use by 1 sandboxes"),
            std::string::npos)
      << second.status();
  {
    absl::MutexLock l(&mu);
    EXPECT_EQ(seen["memory_bytes"], std::make_pair(int64_t{3} << 29, int64_t{1} << 30));
  }
  ASSERT_TRUE((*first)->Destroy().ok());
  first->reset();
  EXPECT_EQ((*p)->capacity().sandboxes(), 0);
  auto third = (*p)->Create(spec);
  ASSERT_TRUE(third.ok()) << third.status();
  ASSERT_TRUE((*third)->Destroy().ok());
  third->reset();
  const bool cgroups = (*p)->enforcement().cgroups;
  const std::string detail = (*p)->enforcement().detail;
  p->reset();
  const std::string v1 =
      ReadAll(absl::StrCat(c.cgroup_root, "/memory/", c.cgroup_parent, "/memory.limit_in_bytes"));
  const std::string v2 = ReadAll(absl::StrCat(c.cgroup_root, "/", c.cgroup_parent, "/memory.max"));
  const std::string pids = ReadAll(
      absl::StrCat(c.cgroup_root, v1.empty() ? "/" : "/pids/", c.cgroup_parent, "/pids.max"));
  for (const char* h : {"/memory/", "/pids/", "/cpu/", "/cpuacct/", "/"}) {
    rmdir(absl::StrCat(c.cgroup_root, h, c.cgroup_parent).c_str());
  }
  if (!cgroups) GTEST_SKIP() << "no writable cgroups here: " << detail;
  EXPECT_EQ(absl::StripAsciiWhitespace(v1.empty() ? v2 : v1), "1610612736");
  EXPECT_EQ(absl::StripAsciiWhitespace(pids), "4096");
}

// A workspace_root with workspaces mounted below it while it was not a
// mount itself (an older version's) is left as it is: binding it would
// hide them. Sandboxes then start with every mount in view, and work.
TEST(LocalProviderStartup, WorkspacesMountedFromBeforeStayInView) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting needs root";
  TempDir dir;
  const std::string root = dir.path() + "/ws", old = root + "/local-old/workspace";
  for (const std::string& d : {root, root + "/local-old", old}) {
    ASSERT_EQ(mkdir(d.c_str(), 0711), 0) << d;
  }
  ASSERT_EQ(mount("tmpfs", old.c_str(), "tmpfs", 0, "size=1m"), 0) << strerror(errno);
  std::ofstream(old + "/kept") << "x";
  LocalConfig c;
  c.workspace_root = root;
  c.uid_base = 617000;
  c.limits.disk_bytes = int64_t{16} << 20;
  auto p = LocalProvider::Create(c);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(IsMountPoint(root));
  EXPECT_EQ(access((old + "/kept").c_str(), F_OK), 0);
  auto sb = (*p)->Create(SandboxSpec{});
  ASSERT_TRUE(sb.ok()) << sb.status();
  const std::vector<std::string> seen =
      MountPointsOf(BwrapFor(root + "/" + (*sb)->id() + "/workspace"));
  EXPECT_NE(std::find(seen.begin(), seen.end(), old), seen.end());
  ExecRequest req;
  req.language = Language::kShell;
  req.code = "echo ok";
  auto r = (*sb)->Exec(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->output, "ok\n");
  EXPECT_TRUE((*sb)->Destroy().ok());
  EXPECT_EQ(access((old + "/kept").c_str(), F_OK), 0);
}

TEST(LocalProviderStartup, StrictRefusesWithoutCgroupsAndBestEffortSaysSo) {
  TempDir dir;
  LocalConfig c;
  c.workspace_root = dir.path() + "/ws";
  c.uid_base = 612000;
  c.cgroup_root = dir.path() + "/no-cgroups";  // nothing mounted there
  auto strict = LocalProvider::Create(c);
  ASSERT_FALSE(strict.ok());
  EXPECT_EQ(strict.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(strict.status().message().find("\"best_effort\""), absl::string_view::npos)
      << strict.status().message();
  c.enforcement = Enforcement::kBestEffort;
  auto weak = LocalProvider::Create(c);
  ASSERT_TRUE(weak.ok()) << weak.status();
  EXPECT_NE((*weak)->Degraded().find("best_effort"), std::string::npos);
  EXPECT_FALSE((*weak)->enforcement().cgroups);
  auto sb = (*weak)->Create(SandboxSpec{});
  ASSERT_TRUE(sb.ok()) << sb.status();
  ExecRequest r;
  r.code = "print(6 * 7)";
  EXPECT_EQ((*sb)->Exec(r)->output, "42\n");
}

TEST(LocalProviderConfig, RetiredKeysNameTheirReplacement) {
  auto old = ParseLocalConfig(nlohmann::json::parse(R"({"memory_bytes": 1073741824})"));
  EXPECT_EQ(old.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(old.status().message().find("limits.memory_bytes"), absl::string_view::npos);
  auto ok = ParseLocalConfig(nlohmann::json::parse(
      R"({"limits": {"cpus": 0.5, "pids": 64}, "max_limits": {"cpus": 2}, "enforcement": "best_effort"})"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->limits.cpus, 0.5);
  EXPECT_EQ(ok->limits.pids, 64);
  EXPECT_EQ(ok->max_limits.cpus, 2);
  auto over = ParseLocalConfig(
      nlohmann::json::parse(R"({"limits": {"cpus": 3}, "max_limits": {"cpus": 2}})"));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  auto bad = ParseLocalConfig(nlohmann::json::parse(R"({"enforcement": "lax"})"));
  EXPECT_EQ(bad.status().message(),
            "providers.local.enforcement: must be one of: strict, best_effort");
}

TEST(LocalProviderConfig, BadValuesAreNamed) {
  auto bad = ParseLocalConfig(nlohmann::json::parse(R"({"isolation": "chroot"})"));
  EXPECT_EQ(bad.status().message(), "providers.local.isolation: must be one of: bwrap, none");
  auto unknown = ParseLocalConfig(nlohmann::json::parse(R"({"memory": 5})"));
  EXPECT_EQ(unknown.status().message(), "providers.local.memory: unknown key");
  auto mp = ParseLocalConfig(nlohmann::json::parse(R"({"mount_point": "rel"})"));
  EXPECT_EQ(mp.status().code(), absl::StatusCode::kInvalidArgument);
}

// A clone under /root (mode 0700): the sandbox's own uid cannot reach
// sandbox-init by path, and it need not (bubblewrap mounts it from a
// descriptor the broker opened).
TEST(LocalProviderStartup, SandboxInitUnderADirectoryClosedToOthersStillStarts) {
  TempDir dir;
  const std::string closed = dir.path() + "/home", init = closed + "/sandbox-init";
  ASSERT_EQ(mkdir(closed.c_str(), 0700), 0);
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  ASSERT_GT(n, 0);
  std::string built(exe, static_cast<size_t>(n));
  built = built.substr(0, built.rfind('/') + 1) + "sandbox-init";
  {
    std::ifstream from(built, std::ios::binary);
    std::ofstream to(init, std::ios::binary);
    to << from.rdbuf();
  }
  ASSERT_EQ(chmod(init.c_str(), 0700), 0);
  LocalConfig c;
  c.workspace_root = dir.path() + "/ws";
  c.uid_base = 618000;
  c.init_path = init;
  auto p = LocalProvider::Create(c);
  ASSERT_TRUE(p.ok()) << p.status();
  auto sb = (*p)->Create(SandboxSpec{});
  ASSERT_TRUE(sb.ok()) << sb.status();
  ExecRequest r;
  r.language = Language::kShell;
  r.code = "echo ok";
  auto res = (*sb)->Exec(r);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->output, "ok\n");
  EXPECT_TRUE((*sb)->Destroy().ok());
}

// A workspace_root the sandboxes' uids cannot reach is refused at start,
// naming the directory that closes the way and the fix.
TEST(LocalProviderStartup, WorkspaceRootClosedToOthersIsRefusedNamingTheDirectory) {
  if (geteuid() != 0) GTEST_SKIP() << "sandboxes get uids of their own only as root";
  TempDir dir;
  const std::string closed = dir.path() + "/home";
  ASSERT_EQ(mkdir(closed.c_str(), 0700), 0);
  LocalConfig c;
  c.workspace_root = closed + "/ws";
  c.uid_base = 619000;
  auto p = LocalProvider::Create(c);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(p.status().message().find(closed + " is mode 0700"), absl::string_view::npos)
      << p.status();
  EXPECT_NE(p.status().message().find("chmod o+x " + closed), absl::string_view::npos)
      << p.status();
}

TEST(LocalProviderStartup, MissingBubblewrapFailsClearly) {
  TempDir dir;
  LocalConfig c;
  c.workspace_root = dir.path();
  c.bwrap_path = "/nonexistent/bwrap";
  auto p = LocalProvider::Create(c);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(p.status().message().find("bubblewrap not found"), absl::string_view::npos);
}

}  // namespace
}  // namespace sandbox

namespace sandbox {
namespace {

// ExecAsync: the run waits on the event loop; a consumer that is not ready
// pauses the program (its pipe fills), and resuming lets it finish with
// every byte.
TEST_F(LocalProviderTest, AsyncRunsPauseForASlowConsumerAndLoseNothing) {
  absl::Mutex mu;
  size_t got = 0;
  int chunks = 0;
  std::function<void()> resume;
  bool paused = false;
  absl::Notification finished;
  absl::StatusOr<ExecResult> result;
  ExecRequest r;
  r.language = Language::kShell;
  // 4 MiB, far more than a pipe holds, then a marker file.
  r.code = "head -c 4194304 /dev/zero; touch done";
  r.max_output_bytes = 8 << 20;
  r.on_output = [&](OutputStream, absl::string_view data) {
    absl::MutexLock l(&mu);
    got += data.size();
    ++chunks;
  };
  r.output_ready = [&](std::function<void()> resume_fn) {
    absl::MutexLock l(&mu);
    if (paused || resume) return true;  // paused once, then always ready
    paused = true;
    resume = std::move(resume_fn);
    return false;
  };
  sandbox_->ExecAsync(r, [&](absl::StatusOr<ExecResult> res) {
    result = std::move(res);
    finished.Notify();
  });
  {
    absl::MutexLock l(&mu);
    auto is_paused = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return paused; };
    mu.Await(absl::Condition(&is_paused));
  }
  // While paused nothing more is read: the program cannot finish.
  EXPECT_FALSE(finished.WaitForNotificationWithTimeout(absl::Milliseconds(300)));
  {
    absl::MutexLock l(&mu);
    EXPECT_EQ(chunks, 1);
  }
  auto marker = sandbox_->ReadFile("done");
  ASSERT_TRUE(marker.ok());
  EXPECT_FALSE(marker->has_value());
  std::function<void()> go;
  {
    absl::MutexLock l(&mu);
    go = resume;
  }
  go();
  finished.WaitForNotification();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 0);
  EXPECT_EQ(result->output.size(), size_t{4194304});
  absl::MutexLock l(&mu);
  EXPECT_EQ(got, size_t{4194304});
  EXPECT_TRUE(sandbox_->ReadFile("done")->has_value());
}

}  // namespace
}  // namespace sandbox

namespace sandbox {
namespace {

// The workspace disk's mount check (every create and close): a mount root
// only, not a directory inside one.
TEST(DiskImage, IsMountPointSeesMountRootsOnly) {
  EXPECT_TRUE(IsMountPoint("/"));
  EXPECT_TRUE(IsMountPoint("/proc"));
  EXPECT_FALSE(IsMountPoint("/proc/self"));
  TempDir t;
  const std::string dir = t.path() + "/m";
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  EXPECT_FALSE(IsMountPoint(dir));
  if (geteuid() != 0) GTEST_SKIP() << "mounting needs root";
  ASSERT_EQ(mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=1m"), 0) << strerror(errno);
  EXPECT_TRUE(IsMountPoint(dir));
  ASSERT_EQ(mkdir((dir + "/inner").c_str(), 0700), 0);
  EXPECT_FALSE(IsMountPoint(dir + "/inner"));
  EXPECT_TRUE(UnmountDisk(dir).ok());
  EXPECT_FALSE(IsMountPoint(dir));
  EXPECT_FALSE(IsMountPoint(t.path() + "/missing"));
}

// A new image goes on a loop device and is mounted with syscalls alone, the
// device autocleared (freed with the mount); an existing one through
// mount(8), and it is the same filesystem.
TEST(DiskImage, NewImagesAreMountedWithSyscallsOnAnAutoclearedLoopDevice) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting needs root";
  TempDir t;
  const std::string img = t.path() + "/img", a = t.path() + "/a", b = t.path() + "/b";
  ASSERT_EQ(mkdir(a.c_str(), 0700), 0);
  ASSERT_EQ(mkdir(b.c_str(), 0700), 0);
  ASSERT_TRUE(CreateDiskImage(img, 16 << 20, 0, -1).ok());
  ASSERT_TRUE(MountNewImage(img, a));
  ASSERT_TRUE(IsMountPoint(a));
  // "... MOUNT-POINT OPTIONS ... - FSTYPE SOURCE ...": the source device.
  auto source = [](const std::string& point) {
    std::ifstream in("/proc/self/mountinfo");
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string id, parent, dev, root, p, word;
      f >> id >> parent >> dev >> root >> p;
      if (p != point) continue;
      while (f >> word && word != "-") {
      }
      f >> word >> word;
      return word;
    }
    return std::string();
  };
  const std::string dev = source(a);
  ASSERT_TRUE(absl::StartsWith(dev, "/dev/loop")) << dev;
  std::ifstream autoclear("/sys/block/" + dev.substr(5) + "/loop/autoclear");
  std::string flag;
  autoclear >> flag;
  EXPECT_EQ(flag, "1");
  std::ofstream(a + "/f") << "x";
  EXPECT_TRUE(UnmountDisk(a).ok());
  EXPECT_FALSE(IsMountPoint(a));
  ASSERT_TRUE(MountDiskImage(img, b, false).ok());
  EXPECT_EQ(access((b + "/f").c_str(), F_OK), 0);
  EXPECT_TRUE(UnmountDisk(b).ok());
}

TEST(DiskImage, MountsBelowListsWhatIsMountedUnderADirectory) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting needs root";
  TempDir t;
  char real[PATH_MAX];
  ASSERT_NE(realpath(t.path().c_str(), real), nullptr);
  const std::string r = std::string(real) + "/r";
  for (const std::string& d : {r, r + "/a", r + "/b c", std::string(real) + "/rr"}) {
    ASSERT_EQ(mkdir(d.c_str(), 0700), 0) << d;
  }
  for (const std::string& d : {r + "/a", r + "/b c", std::string(real) + "/rr"}) {
    ASSERT_EQ(mount("tmpfs", d.c_str(), "tmpfs", 0, "size=1m"), 0) << strerror(errno);
  }
  std::vector<std::string> got = MountsBelow(t.path() + "/r");
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<std::string>{r + "/a", r + "/b c"}));
  EXPECT_TRUE(MountsBelow(r + "/a").empty());
  EXPECT_TRUE(MountsBelow("/").empty());
  EXPECT_TRUE(MountsBelow(t.path() + "/missing").empty());
  // TempDir reads /proc/self/mounts without undoing its escapes.
  EXPECT_EQ(umount2((r + "/b c").c_str(), MNT_DETACH), 0);
}

}  // namespace
}  // namespace sandbox
