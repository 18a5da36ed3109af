// The sandboxctl binary against a real broker.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

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

TEST_F(SandboxctlTest, CodeKeepsStateAndSavesCharts) {
  EXPECT_EQ(Cli("code 'x = 1'").exit_code, 0);
  CliResult r = Cli("code 'x + 1'");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "2\n");
  const std::string images = dir_.path() + "/images";
  r = Cli("--save-images " + images + " code -",
          "import matplotlib.pyplot as plt\nplt.plot([3, 1, 2])\nplt.show()");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, "[image/png saved to " + images + "/out-3-0.png]\n");
  std::ifstream png(images + "/out-3-0.png", std::ios::binary);
  std::string magic(8, '\0');
  png.read(&magic[0], 8);
  EXPECT_EQ(magic, std::string("\x89PNG\r\n\x1a\n", 8));
  r = Cli("code '1/0'");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("ZeroDivisionError: division by zero"), std::string::npos) << r.out;
  r = Cli("--timeout 1 code 'while True: pass'");
  EXPECT_EQ(r.exit_code, 124);
  EXPECT_EQ(Cli("code x").out, "1\n");
  r = Cli("contexts");
  EXPECT_EQ(r.out, "default-python\t\n");
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

TEST_F(SandboxctlTest, ListStatMakeRemoveMove) {
  EXPECT_EQ(Cli("mkdir a/b").exit_code, 69);  // no parent without -p
  EXPECT_EQ(Cli("mkdir -p a/b").exit_code, 0);
  EXPECT_EQ(Cli("write a/f.txt hello").exit_code, 0);
  CliResult r = Cli("ls --depth 2 a");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("d0755"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/workspace/a/b\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("5  "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("/workspace/a/f.txt\n"), std::string::npos) << r.out;
  r = Cli("--json stat a/f.txt");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("\"path\":\"/workspace/a/f.txt\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"type\":\"FILE_TYPE_FILE\""), std::string::npos) << r.out;
  EXPECT_EQ(Cli("mv a/f.txt a/b/g.txt").exit_code, 0);
  EXPECT_EQ(Cli("read a/b/g.txt").out, "hello");
  EXPECT_EQ(Cli("stat a/f.txt").exit_code, 66);
  EXPECT_EQ(Cli("rm a").exit_code, 69);  // not empty
  EXPECT_EQ(Cli("rm -r a").exit_code, 0);
  EXPECT_EQ(Cli("rm -r a").exit_code, 66);
  EXPECT_EQ(Cli("ls a").exit_code, 66);
  EXPECT_EQ(Cli("mv x").exit_code, 64);
}

TEST_F(SandboxctlTest, UploadAndDownloadStreamFiles) {
  std::string data(3 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 7919) >> 3);
  const std::string local = dir_.path() + "/local.bin";
  FILE* f = fopen(local.c_str(), "wb");
  fwrite(data.data(), 1, data.size(), f);
  fclose(f);
  CliResult r = Cli("upload " + local + " in/data.bin");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("upload in/data.bin: 3145728 bytes in "), std::string::npos) << r.out;
  EXPECT_EQ(Cli("shell 'wc -c < in/data.bin'").out, "3145728\n");
  const std::string back = dir_.path() + "/back.bin";
  r = Cli("download in/data.bin " + back);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  std::string got;
  f = fopen(back.c_str(), "rb");
  ASSERT_NE(f, nullptr);
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) got.append(buf, n);
  fclose(f);
  EXPECT_TRUE(got == data);
  EXPECT_EQ(Cli("upload - small.txt", "from stdin").exit_code, 0);
  EXPECT_EQ(Cli("download small.txt -").out, "from stdin");
  r = Cli("download missing.bin " + dir_.path() + "/missing.bin");
  EXPECT_EQ(r.exit_code, 66);
  EXPECT_NE(access((dir_.path() + "/missing.bin").c_str(), F_OK), 0);
  EXPECT_NE(access((dir_.path() + "/missing.bin.partial").c_str(), F_OK), 0);
  EXPECT_EQ(Cli("upload /no/such/file x").exit_code, 74);
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
