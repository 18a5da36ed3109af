// The sandboxctl binary against a real broker.

#include <sys/wait.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "tests/testing/broker_fixture.h"

namespace sandbox {
namespace {

struct CliResult {
  int exit_code;
  std::string out;
};

class SandboxctlTest : public BrokerFixture {
 protected:
  void SetUp() override { StartBroker(R"({"auth": null})"); }

  CliResult Cli(const std::string& args, const std::string& stdin_data = "") {
    std::string in = dir_.path() + "/stdin";
    FILE* f = fopen(in.c_str(), "wb");
    fwrite(stdin_data.data(), 1, stdin_data.size(), f);
    fclose(f);
    std::string cmd = absl::StrCat(SANDBOXCTL_PATH, " --addr 127.0.0.1:", server_->port(),
                                   " --session cli-test ", args, " < ", in, " 2>&1");
    FILE* p = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
    int status = pclose(p);
    return {WEXITSTATUS(status), out};
  }
};

TEST_F(SandboxctlTest, RunAndShellExitWithTheProgramsCode) {
  CliResult r = Cli("run 'print(40 + 2)'");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "42\n");
  r = Cli("--lang node run -", "console.log('from stdin'); process.exit(3)");
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.out, "from stdin\n");
  r = Cli("--env X=1 shell 'echo $X; exit 7'");
  EXPECT_EQ(r.exit_code, 7);
  EXPECT_EQ(r.out, "1\n");
  r = Cli("--timeout 1 shell 'sleep 30'");
  EXPECT_EQ(r.exit_code, 124);
  EXPECT_EQ(r.out, "sandboxctl: timed out\n");
}

TEST_F(SandboxctlTest, FilesRoundTripBinarySafe) {
  const std::string binary("\x00\x01 bytes \xff\n", 11);
  EXPECT_EQ(Cli("write data.bin -", binary).exit_code, 0);
  CliResult r = Cli("read data.bin");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, binary);
  r = Cli("read missing.txt");
  EXPECT_EQ(r.exit_code, 66);
}

TEST_F(SandboxctlTest, SessionsInfoCloseAndErrors) {
  ASSERT_EQ(Cli("run 'print(1)'").exit_code, 0);
  CliResult r = Cli("sessions");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("cli-test\tprovider=local"), std::string::npos) << r.out;
  EXPECT_EQ(Cli("info").exit_code, 0);
  EXPECT_EQ(Cli("close").out, "closed\n");
  r = Cli("info");
  EXPECT_EQ(r.exit_code, 69);
  EXPECT_NE(r.out.find("NOT_FOUND"), std::string::npos);
  r = Cli("--provider nope run 'print(1)'");
  EXPECT_EQ(r.exit_code, 69);
  EXPECT_NE(r.out.find("FAILED_PRECONDITION: unknown provider \"nope\""), std::string::npos);
  EXPECT_EQ(Cli("frobnicate").exit_code, 64);
  EXPECT_EQ(Cli("--lang cobol run x").exit_code, 64);
}

TEST_F(SandboxctlTest, StreamToolsAndKeepAlive) {
  CliResult r = Cli("--stream run 'import sys; print(1, flush=True); print(2, file=sys.stderr)'");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "1\n2\n");
  r = Cli("--dialect openai tools");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("{\"type\":\"function\",\"function\":{\"name\":\"sandbox_local_run\""),
            std::string::npos)
      << r.out;
  r = Cli("call-tool sandbox_local_shell '{\"command\": \"echo via-tool\"}'");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "{\"output\":\"via-tool\\n\",\"exitCode\":0}\n");
  r = Cli("call-tool sandbox_local_shell -", "{}");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.out, "error: missing required argument \"command\" (a string)\n");
  EXPECT_EQ(Cli("keepalive").out.substr(0, 13), "idle_expires=");
  r = Cli("health");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "SERVING\n");
  EXPECT_EQ(Cli("health sandboxbroker.v1.SandboxBroker/local").out, "SERVING\n");
  EXPECT_EQ(Cli("health no.such.Service").exit_code, 69);
}

}  // namespace
}  // namespace sandbox
