// End-to-end: a real gRPC server on 127.0.0.1:0 with the local provider.

#include <dirent.h>
#include <unistd.h>

#include <thread>

#include "absl/strings/escaping.h"
#include "tests/testing/broker_fixture.h"

namespace sandbox {
namespace {

int CountDirs(const std::string& path) {
  int n = 0;
  DIR* d = opendir(path.c_str());
  if (d == nullptr) return 0;
  while (struct dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

class BrokerTest : public BrokerFixture {
 protected:
  void SetUp() override { StartBroker(); }
};

TEST_F(BrokerTest, EveryOperationWorks) {
  auto sb = Client("ops");
  auto info = sb->Start();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->session_id(), "ops");
  EXPECT_EQ(info->provider(), "local");
  EXPECT_EQ(info->state(), pb::SESSION_STATE_READY);
  EXPECT_FALSE(info->sandbox_id().empty());
  EXPECT_EQ(info->idle_expires_at().seconds(), absl::ToUnixSeconds(clock_.Now()) + 2);
  EXPECT_EQ(sb->Start()->sandbox_id(), info->sandbox_id());  // idempotent

  auto py = sb->Run("import sys\nprint('out'); print('err', file=sys.stderr); sys.exit(3)");
  ASSERT_TRUE(py.ok()) << py.status();
  EXPECT_EQ(py->output(), "out\nerr\n");
  EXPECT_EQ(py->exit_code(), 3);
  EXPECT_FALSE(py->timed_out());
  RemoteRunOptions node;
  node.language = pb::LANGUAGE_NODE;
  EXPECT_EQ(sb->Run("console.log(6 * 7)", node)->output(), "42\n");
  auto sh = sb->Shell("echo \"$GREETING from $(pwd)\"", 0, {{"GREETING", "hello"}});
  EXPECT_EQ(sh->output(), "hello from /workspace\n");

  ASSERT_TRUE(sb->WriteFile("notes/a.txt", "caf\u00e9\n").ok());
  const std::string binary("\x00\x01\xfe\xff", 4);
  ASSERT_TRUE(sb->WriteFile("bin.dat", absl::Base64Escape(binary), pb::ENCODING_BASE64).ok());
  EXPECT_EQ(**sb->ReadFile("notes/a.txt"), "caf\u00e9\n");
  EXPECT_EQ(**sb->ReadFile("/workspace/bin.dat", pb::ENCODING_BASE64), absl::Base64Escape(binary));
  EXPECT_EQ(sb->Run("print(len(open('bin.dat','rb').read()))")->output(), "4\n");
  auto missing = sb->ReadFile("missing.txt");
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_FALSE(missing->has_value());

  auto got = sb->Info();
  EXPECT_EQ(got->sandbox_id(), info->sandbox_id());
  auto list = sb->ListSessions();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].session_id(), "ops");
  EXPECT_TRUE(*sb->Close());
  EXPECT_FALSE(*sb->Close());
  EXPECT_EQ(sb->Info().status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(CountDirs(WorkspaceRoot()), 0);
}

TEST_F(BrokerTest, ErrorsHaveTheRightCodesAndLoseNothing) {
  auto sb = Client("errs");
  ASSERT_TRUE(sb->WriteFile("keep.txt", "kept").ok());
  using C = absl::StatusCode;
  auto run = [&](pb::RunRequest r, const std::string& token = "token-alpha-123") {
    auto ctx = Ctx(token);
    pb::RunResult out;
    return FromGrpcStatus(stub_->Run(ctx.get(), r, &out)).code();
  };
  pb::RunRequest ok;
  ok.set_session_id("errs");
  ok.set_code("print(1)");
  pb::RunRequest r = ok;
  r.set_session_id("");
  EXPECT_EQ(run(r), C::kInvalidArgument);
  r.set_session_id("bad id!");
  EXPECT_EQ(run(r), C::kInvalidArgument);
  r.set_session_id(std::string(129, 'a'));
  EXPECT_EQ(run(r), C::kInvalidArgument);
  r = ok;
  r.set_code("");
  EXPECT_EQ(run(r), C::kInvalidArgument);
  r = ok;
  r.set_language(static_cast<pb::Language>(99));
  EXPECT_EQ(run(r), C::kInvalidArgument);
  r = ok;
  r.set_timeout_seconds(61);
  EXPECT_EQ(run(r), C::kInvalidArgument);
  r.set_timeout_seconds(-1);
  EXPECT_EQ(run(r), C::kInvalidArgument);
  r = ok;
  (*r.mutable_env())["A=B"] = "x";
  EXPECT_EQ(run(r), C::kInvalidArgument);
  EXPECT_EQ(run(ok, ""), C::kUnauthenticated);
  EXPECT_EQ(run(ok, "not-a-real-token"), C::kUnauthenticated);
  r = ok;
  r.mutable_spec()->set_provider("nope");
  EXPECT_EQ(run(r), C::kFailedPrecondition);

  EXPECT_EQ(sb->Shell("").status().code(), C::kInvalidArgument);
  EXPECT_EQ(sb->WriteFile("x", "not base64!", pb::ENCODING_BASE64).code(), C::kInvalidArgument);
  EXPECT_EQ(sb->WriteFile("x", "QQ", pb::ENCODING_BASE64).code(), C::kInvalidArgument);
  EXPECT_EQ(sb->WriteFile("../x", "x").code(), C::kPermissionDenied);
  EXPECT_EQ(sb->WriteFile("/etc/passwd", "x").code(), C::kPermissionDenied);
  EXPECT_EQ(sb->ReadFile("../../etc/passwd").status().code(), C::kPermissionDenied);
  EXPECT_EQ(sb->WriteFile("", "x").code(), C::kInvalidArgument);
  EXPECT_EQ(sb->ReadFile("notes").status().code(), absl::StatusCode::kOk);  // missing: found=false
  EXPECT_EQ(Client("nope")->Info().status().code(), C::kNotFound);
  // Bigger than max_message_bytes.
  EXPECT_EQ(sb->WriteFile("big", std::string(2 << 20, 'x')).code(), C::kResourceExhausted);
  {
    auto ctx = Ctx();
    pb::ListSessionsRequest lr;
    lr.set_page_token("%%%");
    pb::ListSessionsResponse out;
    EXPECT_EQ(FromGrpcStatus(stub_->ListSessions(ctx.get(), lr, &out)).code(), C::kInvalidArgument);
  }
  // The session survived all of it.
  EXPECT_EQ(**sb->ReadFile("keep.txt"), "kept");
  EXPECT_EQ(sb->Run("print('still here')")->output(), "still here\n");
}

TEST_F(BrokerTest, ConflictingSpecIsFailedPrecondition) {
  ASSERT_TRUE(Client("spec")->Start().ok());
  pb::SessionSpec other;
  other.set_provider("e2b");
  auto r = Client("spec", "token-alpha-123", other)->Run("print(1)");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(BrokerTest, QuotaIsResourceExhausted) {
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(Client("q" + std::to_string(i))->Start().ok());
  auto r = Client("q5")->Start();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("max_sessions_per_tenant"), std::string::npos);
  EXPECT_TRUE(Client("q5", "token-beta-456")->Start().ok());  // per tenant
}

TEST_F(BrokerTest, TenantsNeverSeeEachOther) {
  auto a = Client("same", "token-alpha-123");
  auto b = Client("same", "token-beta-456");
  ASSERT_TRUE(a->WriteFile("secret.txt", "alpha only").ok());
  ASSERT_TRUE(Client("alpha-only", "token-alpha-123")->Start().ok());
  auto ai = a->Info();
  auto bi = b->Start();
  ASSERT_TRUE(ai.ok() && bi.ok());
  EXPECT_NE(ai->sandbox_id(), bi->sandbox_id());
  EXPECT_FALSE(b->ReadFile("secret.txt")->has_value());
  EXPECT_EQ(b->Shell("ls -A")->output(), "");
  EXPECT_EQ(b->ListSessions()->size(), 1u);
  EXPECT_EQ(Client("alpha-only", "token-beta-456")->Info().status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(*Client("alpha-only", "token-beta-456")->Close());
  EXPECT_TRUE(*b->Close());
  EXPECT_EQ(**a->ReadFile("secret.txt"), "alpha only");
}

TEST_F(BrokerTest, ConcurrentFirstCallsShareOneSandbox) {
  std::vector<std::thread> threads;
  std::vector<std::string> outputs(8);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      auto r = Client("race")->Shell("echo $$ >> /workspace/pids; pwd");
      outputs[i] = r.ok() ? r->output() : std::string(r.status().message());
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& o : outputs) EXPECT_EQ(o, "/workspace\n");
  EXPECT_EQ(CountDirs(WorkspaceRoot()), 1);
  EXPECT_EQ(Client("race")->Shell("wc -l < pids")->output(), "8\n");
}

TEST_F(BrokerTest, IdleSessionsAreReapedAndTheirSandboxDestroyed) {
  auto sb = Client("idle");
  ASSERT_TRUE(sb->WriteFile("f", "x").ok());
  EXPECT_EQ(CountDirs(WorkspaceRoot()), 1);
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(server_->sessions()->RunOnce(), 0);
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(server_->sessions()->RunOnce(), 1);
  EXPECT_EQ(sb->Info().status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(CountDirs(WorkspaceRoot()), 0);
  // A later call gets a fresh, empty sandbox.
  EXPECT_FALSE(sb->ReadFile("f")->has_value());
}

TEST_F(BrokerTest, ARunningCallIsNeverReaped) {
  auto sb = Client("long");
  ASSERT_TRUE(sb->Start().ok());
  std::string out;
  std::thread call([&] {
    auto r = Client("long")->Shell("sleep 1; echo finished");
    out = r.ok() ? r->output() : std::string(r.status().message());
  });
  while (sb->Info()->calls_in_flight() == 0) std::this_thread::yield();
  clock_.Advance(absl::Hours(1));
  EXPECT_EQ(server_->sessions()->RunOnce(), 0);
  call.join();
  EXPECT_EQ(out, "finished\n");
  EXPECT_TRUE(sb->Info().ok());
}

TEST_F(BrokerTest, TimeoutKillsTheRunAndKeepsItsOutput) {
  auto sb = Client("slow");
  auto r = sb->Shell("echo partial; setsid sleep 1000 & sleep 1000", 1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->timed_out());
  EXPECT_EQ(r->exit_code(), 124);
  EXPECT_EQ(r->output(), "partial\n");
  EXPECT_EQ(sb->Run("print('next')")->output(), "next\n");  // session survives
}

TEST_F(BrokerTest, OutputIsCappedAndRepairedToUtf8) {
  auto sb = Client("out");
  auto big = sb->Run("print('x' * 100000)");
  EXPECT_TRUE(big->truncated());
  EXPECT_EQ(big->output(), std::string(4096, 'x'));
  auto bad = sb->Run("import sys; sys.stdout.buffer.write(b'a\\xffb\\xe2\\x82')");
  EXPECT_EQ(bad->output(),
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_FALSE(bad->truncated());
}

TEST_F(BrokerTest, SecretsAndTheNetworkAreOutOfReach) {
  setenv("DAYTONA_API_KEY", "dtn_sekrit_value", 1);
  auto sb = Client("secrets");
  auto env = sb->Shell("env; cat /proc/1/environ 2>/dev/null");
  EXPECT_EQ(env->output().find("sekrit"), std::string::npos) << env->output();
  EXPECT_EQ(env->output().find("token-alpha"), std::string::npos);
  auto net = sb->Run(absl::StrCat(
      "import socket\ntry:\n  socket.create_connection(('127.0.0.1', ", server_->port(),
      "), timeout=2)\n  print('reached the broker')\nexcept OSError:\n  print('blocked')\n"));
  EXPECT_EQ(net->output(), "blocked\n");
}

TEST_F(BrokerTest, SpecSeedsFilesEnvLanguageAndLabels) {
  pb::SessionSpec spec;
  spec.set_language(pb::LANGUAGE_NODE);
  (*spec.mutable_env())["TEAM"] = "blue";
  (*spec.mutable_labels())["owner"] = "agent-7";
  auto* f = spec.add_files();
  f->set_path("input/data.csv");
  f->set_contents("a,b\n1,2\n");
  auto* g = spec.add_files();
  g->set_path("raw.bin");
  g->set_contents(absl::Base64Escape(std::string("\x00\xff", 2)));
  g->set_encoding(pb::ENCODING_BASE64);
  auto sb = Client("seeded", "token-alpha-123", spec);
  auto r = sb->Run(
      "const fs = require('fs'); console.log(process.env.TEAM, fs.readFileSync('input/data.csv', "
      "'utf8').split('\\n')[1], fs.readFileSync('raw.bin').length)");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->output(), "blue 1,2 2\n");
  auto info = sb->Info();
  EXPECT_EQ(info->language(), pb::LANGUAGE_NODE);
  EXPECT_EQ(info->labels().at("owner"), "agent-7");
}

TEST_F(BrokerTest, ABadSeedFileFailsTheCreationAndLeavesNothing) {
  pb::SessionSpec spec;
  auto* f = spec.add_files();
  f->set_path("../escape.txt");
  f->set_contents("x");
  auto r = Client("badseed", "token-alpha-123", spec)->Start();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Client("badseed")->Info().status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(CountDirs(WorkspaceRoot()), 0);
}

TEST_F(BrokerTest, ListSessionsPages) {
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(Client("p" + std::to_string(i))->Start().ok());
  std::vector<std::string> seen;
  std::string token;
  do {
    auto ctx = Ctx();
    pb::ListSessionsRequest req;
    req.set_page_size(2);
    req.set_page_token(token);
    pb::ListSessionsResponse resp;
    ASSERT_TRUE(stub_->ListSessions(ctx.get(), req, &resp).ok());
    EXPECT_LE(resp.sessions_size(), 2);
    for (const auto& s : resp.sessions()) seen.push_back(s.session_id());
    token = resp.next_page_token();
  } while (!token.empty());
  EXPECT_EQ(seen, (std::vector<std::string>{"p0", "p1", "p2", "p3", "p4"}));
}

}  // namespace
}  // namespace sandbox

namespace sandbox {
namespace {

// A broker whose sessions are closed by the session table's destructor
// (memory store, drain_close_sandboxes false): those closes are counted,
// so the metrics must outlive the table (they were destroyed first: a
// use after free under ASan).
class BrokerTeardownTest : public BrokerFixture {};

TEST_F(BrokerTeardownTest, SessionsClosedAtDestructionAreCountedIntoLiveMetrics) {
  StartBroker(R"({"state": {"backend": "memory", "path": null}, "drain_close_sandboxes": false})");
  auto sb = Client("kept");
  ASSERT_TRUE(sb->Run("print(1)").ok());
  ASSERT_EQ(CountDirs(WorkspaceRoot()), 1);
  server_.reset();
  EXPECT_EQ(CountDirs(WorkspaceRoot()), 0);  // the destructor closed it
}

}  // namespace
}  // namespace sandbox
