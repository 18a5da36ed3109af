// Code contexts end to end (docs/api.md#code-contexts): a real gRPC server
// on 127.0.0.1:0, the local provider, real IPython kernels (Debian's
// python3-ipykernel) inside the session's container.

#include <algorithm>
#include <thread>

#include "tests/testing/broker_fixture.h"

namespace sandbox {
namespace {

using C = absl::StatusCode;

class ContextsTest : public BrokerFixture {
 protected:
  void SetUp() override { StartBroker(R"({"max_contexts_per_session": 3})"); }

  // The main result's text/plain, or "" when there is none.
  static std::string MainText(const pb::Execution& x) {
    for (const pb::Result& r : x.results()) {
      if (!r.is_main_result()) continue;
      auto it = r.data().find("text/plain");
      if (it != r.data().end()) return it->second;
    }
    return "";
  }
};

TEST_F(ContextsTest, VariablesLiveBetweenRunsAndContextsAreApart) {
  auto sb = Client("state");
  auto first = sb->RunCode("x = 41");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->has_error());
  EXPECT_EQ(first->context().context_id(), "default-python");
  auto second = sb->RunCode("x + 1");
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(MainText(*second), "42");
  EXPECT_EQ(second->execution_count(), first->execution_count() + 1);

  auto other = sb->CreateContext();
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->language(), pb::LANGUAGE_PYTHON);
  auto apart = sb->RunCode("x", other->context_id());
  ASSERT_TRUE(apart.ok()) << apart.status();
  ASSERT_TRUE(apart->has_error());
  EXPECT_EQ(apart->error().name(), "NameError");

  auto listed = sb->ListContexts();
  ASSERT_TRUE(listed.ok()) << listed.status();
  std::vector<std::string> ids;
  for (const pb::Context& c : *listed) ids.push_back(c.context_id());
  std::sort(ids.begin(), ids.end());
  std::vector<std::string> want = {"default-python", other->context_id()};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(ids, want);

  // Restart clears the state; delete ends the context.
  ASSERT_TRUE(sb->RestartContext("default-python").ok());
  auto cleared = sb->RunCode("x");
  ASSERT_TRUE(cleared.ok()) << cleared.status();
  ASSERT_TRUE(cleared->has_error());
  EXPECT_EQ(cleared->error().name(), "NameError");
  EXPECT_TRUE(*sb->DeleteContext(other->context_id()));
  EXPECT_FALSE(*sb->DeleteContext(other->context_id()));
  EXPECT_EQ(sb->RunCode("1", other->context_id()).status().code(), C::kNotFound);
  EXPECT_EQ(sb->RestartContext("nope").status().code(), C::kNotFound);
}

TEST_F(ContextsTest, ConcurrentFirstCallsShareOneSupervisorAndOneDefaultContext) {
  auto sb = Client("together");
  std::vector<std::string> pids(4);
  std::vector<std::thread> callers;
  for (size_t i = 0; i < pids.size(); ++i) {
    callers.emplace_back([&, i] {
      auto x = Client("together")->RunCode("import os\nos.getpid()");
      if (x.ok()) pids[i] = MainText(*x);
    });
  }
  for (auto& t : callers) t.join();
  for (const std::string& pid : pids) {
    EXPECT_FALSE(pid.empty());
    EXPECT_EQ(pid, pids[0]);  // one kernel
  }
  auto listed = sb->ListContexts();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->size(), 1u);
}

TEST_F(ContextsTest, ChartsTablesAndDisplaysAreTypedResults) {
  auto sb = Client("rich");
  auto chart = sb->RunCode("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()");
  ASSERT_TRUE(chart.ok()) << chart.status();
  ASSERT_FALSE(chart->has_error()) << chart->error().value();
  EXPECT_EQ(chart->stderr(), "");  // no font or config noise from the container
  ASSERT_EQ(chart->results_size(), 1);
  auto png = chart->results(0).data().find("image/png");
  ASSERT_NE(png, chart->results(0).data().end());
  ASSERT_GT(png->second.size(), 8u);
  EXPECT_EQ(png->second.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));  // decoded bytes
  EXPECT_FALSE(chart->results(0).is_main_result());

  auto table = sb->RunCode("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})");
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->results_size(), 1);
  EXPECT_TRUE(table->results(0).is_main_result());
  EXPECT_NE(table->results(0).data().at("text/html").find("<table"), std::string::npos);

  auto shown = sb->RunCode(
      "from IPython.display import display, HTML\ndisplay(HTML('<b>hi</b>'))\nprint('out')\n7");
  ASSERT_TRUE(shown.ok()) << shown.status();
  ASSERT_EQ(shown->results_size(), 2);
  EXPECT_FALSE(shown->results(0).is_main_result());
  EXPECT_EQ(shown->results(0).data().at("text/html"), "<b>hi</b>");
  EXPECT_EQ(MainText(*shown), "7");
  EXPECT_EQ(shown->stdout(), "out\n");
}

TEST_F(ContextsTest, AnErrorIsNameValueAndTracebackNamingTheLine) {
  auto sb = Client("errors");
  auto x = sb->RunCode("a = 1\nb = 0\na / b");
  ASSERT_TRUE(x.ok()) << x.status();
  ASSERT_TRUE(x->has_error());
  EXPECT_EQ(x->error().name(), "ZeroDivisionError");
  EXPECT_EQ(x->error().value(), "division by zero");
  std::string tb;
  for (const std::string& line : x->error().traceback()) tb += line + "\n";
  EXPECT_NE(tb.find("----> 3 a / b"), std::string::npos) << tb;
  EXPECT_EQ(tb.find("\x1b["), std::string::npos) << "plain text, no colours";
}

TEST_F(ContextsTest, OutputPastTheLimitIsCutNotAnError) {
  auto sb = Client("chatty");  // max_output_bytes 4096 (the fixture)
  auto x = sb->RunCode("for i in range(200000): print('0123456789')\n'done'");
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_EQ(x->stdout().size(), 4096u);
  EXPECT_EQ(x->stdout().substr(0, 11), "0123456789\n");
  EXPECT_EQ(MainText(*x), "'done'");
}

TEST_F(ContextsTest, ATimeoutInterruptsAndTheStateSurvives) {
  auto sb = Client("interrupt");
  ASSERT_TRUE(sb->RunCode("kept = 'yes'").ok());
  auto spin = sb->RunCode("while True: pass", "", 2);
  ASSERT_TRUE(spin.ok()) << spin.status();
  EXPECT_TRUE(spin->timed_out());
  EXPECT_FALSE(spin->has_error());
  EXPECT_FALSE(spin->context_died());
  auto after = sb->RunCode("kept");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(MainText(*after), "'yes'");
}

TEST_F(ContextsTest, ADeadKernelIsReportedAndStartedAfreshOnTheNextCall) {
  auto sb = Client("dies");
  ASSERT_TRUE(sb->RunCode("v = 1").ok());
  auto died = sb->RunCode("import os\nos._exit(3)");
  ASSERT_TRUE(died.ok()) << died.status();
  EXPECT_TRUE(died->context_died());
  auto next = sb->RunCode("'v' in globals()");
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE(next->context_restarted());
  EXPECT_EQ(MainText(*next), "False");
}

TEST_F(ContextsTest, AContextKilledByTheMemoryLimitIsReportedAsSuch) {
  pb::SessionSpec spec;
  spec.mutable_resources()->set_memory_bytes(int64_t{256} << 20);
  auto sb = Client("oom", "token-alpha-123", spec);
  auto hog = sb->RunCode("blocks = []\nwhile True: blocks.append(bytearray(16 << 20))");
  ASSERT_TRUE(hog.ok()) << hog.status();
  EXPECT_TRUE(hog->context_died());
  EXPECT_TRUE(hog->oom_killed());
  auto next = sb->RunCode("1 + 1");
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE(next->context_restarted());
  EXPECT_EQ(MainText(*next), "2");
}

TEST_F(ContextsTest, ASupervisorKilledBySandboxedCodeIsStartedAgain) {
  auto sb = Client("killed");
  ASSERT_TRUE(sb->RunCode("x = 1").ok());
  auto kill = sb->Shell("pkill -9 -f 'serve /tmp/[.]sandbox-contexts'; echo $?");
  ASSERT_TRUE(kill.ok()) << kill.status();
  EXPECT_EQ(kill->output(), "0\n");
  // The broker's idle connection is dead: a new supervisor, a fresh context.
  auto x = sb->RunCode("'x' in globals()");
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_EQ(MainText(*x), "False");
}

TEST_F(ContextsTest, TheLimitNamesItsKeyAndBadRequestsGetTheirCodes) {
  auto sb = Client("limits");
  ASSERT_TRUE(sb->CreateContext().ok());
  ASSERT_TRUE(sb->CreateContext().ok());
  ASSERT_TRUE(sb->CreateContext().ok());
  auto over = sb->CreateContext();
  EXPECT_EQ(over.status().code(), C::kResourceExhausted);
  EXPECT_NE(over.status().message().find("max_contexts_per_session"), std::string::npos);
  EXPECT_EQ(sb->RunCode("").status().code(), C::kInvalidArgument);
  EXPECT_EQ(sb->RunCode("1", "", -1).status().code(), C::kInvalidArgument);
  EXPECT_EQ(sb->CreateContext(pb::LANGUAGE_SHELL).status().code(), C::kInvalidArgument);
  EXPECT_EQ(sb->RestartContext("").status().code(), C::kInvalidArgument);
}

TEST_F(ContextsTest, ContextsSurviveKeepAliveButNotAClose) {
  auto sb = Client("lifetime");
  ASSERT_TRUE(sb->RunCode("n = 5").ok());
  grpc::ClientContext ka;
  ka.AddMetadata("authorization", "Bearer token-alpha-123");
  pb::KeepAliveRequest kr;
  kr.set_session_id("lifetime");
  pb::KeepAliveResponse kresp;
  ASSERT_TRUE(stub_->KeepAlive(&ka, kr, &kresp).ok());
  auto kept = sb->RunCode("n");
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(MainText(*kept), "5");
  ASSERT_TRUE(sb->Close().ok());
  auto fresh = sb->RunCode("'n' in globals()");
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(MainText(*fresh), "False");
}

TEST_F(ContextsTest, TheSandboxCannotPointTheBrokerAtAnotherSocket) {
  auto sb = Client("hostile");
  // Sandboxed code plants a symlink where the supervisor's directory goes.
  ASSERT_EQ(sb->Shell("ln -s /workspace /tmp/.sandbox-contexts")->exit_code(), 0);
  auto x = sb->RunCode("1");
  EXPECT_EQ(x.status().code(), C::kUnavailable) << x.status();
  // Replaced by a socket of its own making: the broker talks to it, and
  // its nonsense is an error, not a crash.
  ASSERT_EQ(sb->Shell("rm /tmp/.sandbox-contexts && mkdir /tmp/.sandbox-contexts && "
                      "(python3 -c \"import socket,os\n"
                      "s=socket.socket(socket.AF_UNIX); s.bind('/tmp/.sandbox-contexts/ctl.sock');"
                      " s.listen(5)\nwhile True:\n  c,_=s.accept(); c.recv(9999);"
                      " c.sendall(b'{not json\\n'); c.close()\" > /dev/null 2>&1 &) ; "
                      "for i in $(seq 200); do test -S /tmp/.sandbox-contexts/ctl.sock && break;"
                      " sleep 0.05; done")
                ->exit_code(),
            0);
  auto garbage = sb->RunCode("1");
  EXPECT_EQ(garbage.status().code(), C::kUnavailable) << garbage.status();
  // The session still works.
  EXPECT_EQ(sb->Shell("echo ok")->output(), "ok\n");
}

}  // namespace
}  // namespace sandbox
