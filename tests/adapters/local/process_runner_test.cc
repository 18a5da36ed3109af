#include "adapters/local/process_runner.h"

#include <gtest/gtest.h>

#include <atomic>

#include "absl/strings/str_cat.h"

namespace sandbox {
namespace {

ProcessSpec Bash(const std::string& script) {
  ProcessSpec p;
  p.argv = {"/bin/bash", "-c", script};
  p.env = {"PATH=/usr/bin:/bin"};
  return p;
}

TEST(RunProcess, CombinesStdoutAndStderrInArrivalOrder) {
  ProcessSpec p = Bash("echo one; sleep 0.05; echo two >&2; sleep 0.05; echo three; exit 7");
  std::vector<std::pair<OutputStream, std::string>> chunks;
  p.on_output = [&](OutputStream s, absl::string_view d) {
    chunks.emplace_back(s, std::string(d));
  };
  auto r = RunProcess(p);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->output, "one\ntwo\nthree\n");
  EXPECT_EQ(r->exit_code, 7);
  EXPECT_FALSE(r->timed_out);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[1].first, OutputStream::kStderr);
  EXPECT_EQ(chunks[1].second, "two\n");
}

TEST(RunProcess, WithoutStreamingTheOutputIsInExactWriteOrder) {
  // Rapid alternation between stdout and stderr, no pauses: one shared pipe
  // keeps the order exactly.
  auto r = RunProcess(Bash("for i in $(seq 300); do echo o$i; echo e$i >&2; done"));
  ASSERT_TRUE(r.ok());
  std::string want;
  for (int i = 1; i <= 300; ++i) absl::StrAppend(&want, "o", i, "\ne", i, "\n");
  EXPECT_EQ(r->output, want);
}

TEST(RunProcess, TimeoutKillsTheGroupAndKeepsOutputSoFar) {
  ProcessSpec p = Bash("echo started; (sleep 300; echo never) & sleep 300");
  p.timeout = absl::Milliseconds(300);
  auto r = RunProcess(p);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->timed_out);
  EXPECT_EQ(r->exit_code, 124);
  EXPECT_EQ(r->output, "started\n");
}

TEST(RunProcess, OutputIsCappedAndTheProcessStillFinishes) {
  ProcessSpec p = Bash("head -c 1000000 /dev/zero | tr '\\0' x; echo done >&2");
  p.max_output_bytes = 1000;
  auto r = RunProcess(p);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->output, std::string(1000, 'x'));
  EXPECT_TRUE(r->truncated);
  EXPECT_EQ(r->exit_code, 0);
}

TEST(RunProcess, FeedsStdinAndFd3Exactly) {
  std::string data("quote ' \" $HOME \\ \n\xE2\x82\xAC\x01", 22);
  ProcessSpec p = Bash("cat; cat <&3");
  p.stdin_data = data;
  p.fd3_data = "from fd3";
  auto r = RunProcess(p);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->output, data + "from fd3");
}

TEST(RunProcess, EnvironmentIsExactlyWhatWasGiven) {
  setenv("RUNNER_TEST_SECRET", "hunter2", 1);
  ProcessSpec p = Bash("env | sort");
  p.env = {"A=1", "PATH=/usr/bin:/bin"};
  auto r = RunProcess(p);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->output.find("hunter2"), std::string::npos);
  EXPECT_NE(r->output.find("A=1\n"), std::string::npos);
}

TEST(RunProcess, SignalDeathIs128PlusSignal) {
  auto r = RunProcess(Bash("kill -TERM $$"));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 128 + 15);
}

TEST(RunProcess, CancellationKillsPromptly) {
  ProcessSpec p = Bash("echo up; sleep 300");
  std::atomic<bool> cancel{false};
  p.on_output = [&](OutputStream, absl::string_view) { cancel = true; };
  p.cancelled = [&] { return cancel.load(); };
  p.timeout = absl::Seconds(120);
  auto r = RunProcess(p);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->cancelled);
  EXPECT_FALSE(r->timed_out);
}

TEST(RunProcess, MissingBinaryIsA127Result) {
  ProcessSpec p;
  p.argv = {"/nonexistent/bin"};
  auto r = RunProcess(p);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 127);
  EXPECT_NE(r->output.find("cannot start"), std::string::npos);
}

TEST(RunProcess, LimitsApply) {
  ProcessSpec p =
      Bash("ulimit -f; ulimit -n; head -c 10000 /dev/zero > /tmp/rp_fsize_test; echo rc=$?");
  p.limits.file_size_bytes = 4096;
  p.limits.open_files = 64;
  auto r = RunProcess(p);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->output.substr(0, 5), "4\n64\n");  // bash's ulimit -f counts KiB
  EXPECT_NE(r->output.find("rc=153"), std::string::npos) << r->output;  // SIGXFSZ
  unlink("/tmp/rp_fsize_test");
}

}  // namespace
}  // namespace sandbox
