// Thousands of calls in flight (docs/operations.md): calls that
// wait hold no thread, and the limits queue, then refuse naming themselves.

#include <sys/epoll.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/synchronization/notification.h"
#include "common/event_loop.h"
#include "common/limiter.h"
#include "prometheus/text_serializer.h"
#include "tests/fakes/fake_daytona.h"
#include "tests/fakes/fake_e2b.h"
#include "tests/testing/broker_fixture.h"
#include "tests/testing/threads.h"

namespace sandbox {
namespace {

// Waits (polling a condition, not a duration) until `done` or 60 s.
template <typename Fn>
bool WaitFor(Fn done) {
  for (int i = 0; i < 60000; ++i) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return done();
}

// Calls fired with the callback client API (no client thread per call).
class Calls {
 public:
  explicit Calls(pb::SandboxBroker::Stub* stub) : stub_(stub) {}
  ~Calls() { Wait(); }

  // Starts a Run; returns its index.
  int Run(const std::string& session, const std::string& code,
          const std::string& token = "token-alpha-123") {
    auto c = Begin(token);
    c->req.set_session_id(session);
    c->req.set_code(code);
    stub_->async()->Run(&c->ctx, &c->req, &c->resp, [this, c](grpc::Status s) { End(c, s); });
    return c->index;
  }

  // Starts a WriteFile (its result: "wrote N") or a StartSession (its
  // result: the session's state); returns its index.
  int WriteFile(const std::string& session, const std::string& path, const std::string& data,
                const std::string& token = "token-alpha-123") {
    auto c = Begin(token);
    auto req = std::make_shared<pb::WriteFileRequest>();
    auto resp = std::make_shared<pb::WriteFileResponse>();
    req->set_session_id(session);
    req->set_path(path);
    req->set_contents(data);
    stub_->async()->WriteFile(&c->ctx, req.get(), resp.get(), [this, c, req, resp](grpc::Status s) {
      c->resp.set_output(absl::StrCat("wrote ", resp->bytes_written()));
      End(c, s);
    });
    return c->index;
  }
  // Starts a ReadFile (its result: the contents, or "missing").
  int ReadFile(const std::string& session, const std::string& path,
               const std::string& token = "token-alpha-123") {
    auto c = Begin(token);
    auto req = std::make_shared<pb::ReadFileRequest>();
    auto resp = std::make_shared<pb::ReadFileResponse>();
    req->set_session_id(session);
    req->set_path(path);
    stub_->async()->ReadFile(&c->ctx, req.get(), resp.get(), [this, c, req, resp](grpc::Status s) {
      c->resp.set_output(resp->found() ? resp->contents() : "missing");
      End(c, s);
    });
    return c->index;
  }
  // Starts a CallTool (its result: the tool's text, "error: " first for a
  // tool error).
  int CallTool(const std::string& session, const std::string& tool, const nlohmann::json& args,
               const std::string& token = "token-alpha-123") {
    auto c = Begin(token);
    auto req = std::make_shared<pb::CallToolRequest>();
    auto resp = std::make_shared<pb::CallToolResponse>();
    req->set_session_id(session);
    req->set_name(tool);
    req->set_arguments_json(args.dump());
    stub_->async()->CallTool(&c->ctx, req.get(), resp.get(), [this, c, req, resp](grpc::Status s) {
      c->resp.set_output(absl::StrCat(resp->is_error() ? "error: " : "", resp->content()));
      End(c, s);
    });
    return c->index;
  }
  // Starts a CloseSession (its result: "existed" or "absent").
  int CloseSession(const std::string& session, const std::string& token = "token-alpha-123") {
    auto c = Begin(token);
    auto req = std::make_shared<pb::CloseSessionRequest>();
    auto resp = std::make_shared<pb::CloseSessionResponse>();
    req->set_session_id(session);
    stub_->async()->CloseSession(&c->ctx, req.get(), resp.get(),
                                 [this, c, req, resp](grpc::Status s) {
                                   c->resp.set_output(resp->existed() ? "existed" : "absent");
                                   End(c, s);
                                 });
    return c->index;
  }
  int StartSession(const std::string& session, const std::string& token = "token-alpha-123") {
    auto c = Begin(token);
    auto req = std::make_shared<pb::StartSessionRequest>();
    auto resp = std::make_shared<pb::SessionInfo>();
    req->set_session_id(session);
    stub_->async()->StartSession(&c->ctx, req.get(), resp.get(),
                                 [this, c, req, resp](grpc::Status s) {
                                   c->resp.set_output(pb::SessionState_Name(resp->state()));
                                   End(c, s);
                                 });
    return c->index;
  }

  void Wait() {
    absl::MutexLock l(&mu_);
    auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; };
    mu_.Await(absl::Condition(&none));
  }
  grpc::Status status(int i) {
    absl::MutexLock l(&mu_);
    return calls_[i]->status;
  }
  int order(int i) {
    absl::MutexLock l(&mu_);
    return calls_[i]->order;
  }
  bool finished(int i) {
    absl::MutexLock l(&mu_);
    return calls_[i]->order >= 0;
  }
  std::string output(int i) {
    absl::MutexLock l(&mu_);
    return calls_[i]->resp.output();
  }

 private:
  struct Call {
    grpc::ClientContext ctx;
    pb::RunRequest req;
    pb::RunResult resp;
    grpc::Status status;
    int order = -1;
    int index = -1;
  };
  std::shared_ptr<Call> Begin(const std::string& token) {
    auto c = std::make_shared<Call>();
    c->ctx.AddMetadata("authorization", "Bearer " + token);
    absl::MutexLock l(&mu_);
    c->index = static_cast<int>(calls_.size());
    calls_.push_back(c);
    ++pending_;
    return c;
  }
  void End(const std::shared_ptr<Call>& c, grpc::Status s) {
    absl::MutexLock l(&mu_);
    c->status = s;
    c->order = order_++;
    --pending_;
  }
  pb::SandboxBroker::Stub* const stub_;
  absl::Mutex mu_;
  std::vector<std::shared_ptr<Call>> calls_ ABSL_GUARDED_BY(mu_);
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  int order_ ABSL_GUARDED_BY(mu_) = 0;
};

class ConcurrencyTest : public BrokerFixture {
 protected:
  // The broker's metrics in Prometheus text, limit gauges freshly published.
  std::string Metrics() {
    server_->PublishLimits();
    return prometheus::TextSerializer().Serialize(server_->metrics()->registry()->Collect());
  }
  void CreatesAllReachTheProvider(Faults& faults);
  // `tools`: as the tools sandbox_<provider>_write_file / read_file.
  void FileTransfersAllReachTheProvider(Faults& faults, const std::string& tools = "");
  // A fake E2B, and the broker's config for it with 4 serving threads.
  std::unique_ptr<FakeE2B> StartFakeE2B() {
    FakeE2B::Options o;
    o.api_key = "e2b_test_key";
    o.ttl_thread = false;
    auto fake = FakeE2B::Start(o);
    EXPECT_TRUE(fake.ok()) << fake.status();
    return fake.ok() ? std::move(*fake) : nullptr;
  }
  // The same for a fake Daytona.
  std::unique_ptr<FakeDaytona> StartFakeDaytona() {
    FakeDaytona::Options o;
    o.api_key = "dtn_test_key";
    o.timer_thread = false;
    auto fake = FakeDaytona::Start(o);
    EXPECT_TRUE(fake.ok()) << fake.status();
    return fake.ok() ? std::move(*fake) : nullptr;
  }
  static std::string DaytonaConfig(const FakeDaytona& fake) {
    nlohmann::json extra = {
        {"default_provider", "daytona"},
        {"max_threads", 4},
        {"max_sessions_per_tenant", 100},
        {"providers", {{"daytona", {{"api_key", "dtn_test_key"}, {"api_url", fake.api_url()}}}}}};
    return extra.dump();
  }
  static std::string E2BConfig(const FakeE2B& fake) {
    nlohmann::json extra = {
        {"default_provider", "e2b"},
        {"max_threads", 4},
        {"max_sessions_per_tenant", 100},
        {"providers",
         {{"e2b",
           {{"api_key", "e2b_test_key"}, {"api_url", fake.url()}, {"sandbox_url", fake.url()}}}}}};
    return extra.dump();
  }
};

TEST_F(ConcurrencyTest, HeldCallsHoldNoThreads) {
  StartBroker(R"({"default_provider": "echo", "providers": {"echo": {"hold_ms": 3000}}})");
  {
    Calls warm(stub_.get());
    warm.Run("held", "warm");  // the session exists; gRPC's threads are up
  }
  const int before = ProcessThreadCount();
  constexpr int kCalls = 1000;
  Calls calls(stub_.get());
  for (int i = 0; i < kCalls; ++i) calls.Run("held", absl::StrCat("call ", i));
  ASSERT_TRUE(WaitFor([&] { return server_->service()->calls_in_flight() == kCalls; }))
      << server_->service()->calls_in_flight();
  const int during = ProcessThreadCount();
  calls.Wait();
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_TRUE(calls.status(i).ok()) << i << ": " << calls.status(i).error_message();
    EXPECT_EQ(calls.output(i), absl::StrCat("call ", i));
  }
  // gRPC may add a few threads of its own; a thread per call would be 1000.
  EXPECT_LT(during - before, 24) << before << " -> " << during;
}

TEST_F(ConcurrencyTest, PastMaxCallsInFlightACallQueuesThenFailsNamingTheLimit) {
  StartBroker(R"({"default_provider": "echo", "providers": {"echo": {"hold_ms": 2000}},
      "limits": {"max_calls_in_flight": 2, "max_queued_calls": 1, "queue_timeout_ms": 200}})");
  Limiter* limit = server_->service()->call_limiter();
  Calls calls(stub_.get());
  const int a = calls.Run("q", "a");
  const int b = calls.Run("q", "b");
  ASSERT_TRUE(WaitFor([&] { return limit->stats().in_use == 2; }));
  const int queued = calls.Run("q", "c");
  ASSERT_TRUE(WaitFor([&] { return limit->stats().queued == 1; }));
  const int refused = calls.Run("q", "d");
  ASSERT_TRUE(WaitFor([&] { return calls.finished(refused); }));
  EXPECT_EQ(calls.status(refused).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(calls.status(refused).error_message(),
            "max_calls_in_flight (2) reached and 1 calls are already queued; retry later");
  ASSERT_TRUE(WaitFor([&] { return calls.finished(queued); }));
  EXPECT_EQ(calls.status(queued).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(calls.status(queued).error_message(),
            "max_calls_in_flight (2) reached; waited 200 ms (queue_timeout_ms) for a slot; "
            "retry later");
  calls.Wait();
  EXPECT_TRUE(calls.status(a).ok()) << calls.status(a).error_message();
  EXPECT_TRUE(calls.status(b).ok()) << calls.status(b).error_message();
  EXPECT_EQ(limit->stats().refused, 2);
  EXPECT_EQ(limit->stats().in_use, 0);
}

TEST_F(ConcurrencyTest, OneTenantAtItsRunLimitDoesNotDelayAnother) {
  StartBroker(R"({"default_provider": "echo", "providers": {"echo": {"hold_ms": 1000}},
      "limits": {"max_concurrent_runs_per_tenant": 1, "queue_timeout_ms": 30000}})");
  Calls calls(stub_.get());
  // The per-tenant gauges say who holds the slot and who waits.
  const int alpha1 = calls.Run("a", "1");
  // alpha1 holds the slot (in flight is not enough: it may still be
  // creating its session, and a later call could take the slot first).
  ASSERT_TRUE(WaitFor([&] {
    return Metrics().find("sandbox_broker_tenant_runs_in_use{tenant=\"alpha\"} 1") !=
           std::string::npos;
  })) << Metrics();
  const int alpha2 = calls.Run("a", "2");  // waits for alpha1's slot
  ASSERT_TRUE(WaitFor([&] {
    return Metrics().find("sandbox_broker_tenant_runs_queued{tenant=\"alpha\"} 1") !=
           std::string::npos;
  })) << Metrics();
  EXPECT_NE(Metrics().find("sandbox_broker_tenant_runs_in_use{tenant=\"alpha\"} 1"),
            std::string::npos);
  const int beta = calls.Run("b", "3", "token-beta-456");
  calls.Wait();
  for (int i : {alpha1, alpha2, beta}) EXPECT_TRUE(calls.status(i).ok()) << i;
  // beta ran beside alpha1; alpha2 only after it.
  EXPECT_LT(calls.order(beta), calls.order(alpha2));
  EXPECT_LT(calls.order(alpha1), calls.order(alpha2));
}

TEST_F(ConcurrencyTest, RunsPastTheTenantLimitFailNamingIt) {
  StartBroker(R"({"default_provider": "echo", "providers": {"echo": {"hold_ms": 2000}},
      "limits": {"max_concurrent_runs_per_tenant": 1, "queue_timeout_ms": 100}})");
  Calls calls(stub_.get());
  const int first = calls.Run("t", "1");
  // first holds the tenant's one slot (in flight is not enough: it may still
  // be creating the session, and second could take the slot before it).
  ASSERT_TRUE(WaitFor([&] {
    return Metrics().find("sandbox_broker_tenant_runs_in_use{tenant=\"alpha\"} 1") !=
           std::string::npos;
  }));
  const int second = calls.Run("t", "2");
  ASSERT_TRUE(WaitFor([&] { return calls.finished(second); }));
  EXPECT_EQ(calls.status(second).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(calls.status(second).error_message(),
            "max_concurrent_runs_per_tenant (1) reached; waited 100 ms (queue_timeout_ms) for a "
            "slot; retry later");
  calls.Wait();
  EXPECT_TRUE(calls.status(first).ok());
  const std::string m =
      prometheus::TextSerializer().Serialize(server_->metrics()->registry()->Collect());
  EXPECT_NE(m.find("sandbox_broker_tenant_run_refusals_total{tenant=\"alpha\"} 1"),
            std::string::npos)
      << m;
}

// RunStream flow control end to end (docs/operations.md): a
// client that stops reading makes the broker stop reading the program's
// output once its bounded buffer is full, so the program blocks on its pipe
// instead of the broker's memory growing; when the client reads again,
// every byte arrives in order.
TEST_F(ConcurrencyTest, ASlowStreamReaderPausesTheProgramAndLosesNothing) {
  constexpr int kChunk = 64 * 1024, kChunks = 1024;  // 64 MiB in all
  StartBroker(R"({"max_output_bytes": 134217728, "max_timeout_seconds": 300})");
  auto sb = Client("slow-reader");
  ASSERT_TRUE(sb->Start().ok());
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer token-alpha-123");
  pb::RunRequest req;
  req.set_session_id("slow-reader");
  req.set_timeout_seconds(300);
  req.set_code(ChunkWriter(kChunks, kChunk));
  auto reader = stub_->RunStream(&ctx, req);
  std::string got;
  pb::RunEvent ev;
  ASSERT_TRUE(reader->Read(&ev));
  got += ev.output().data();
  // Now read nothing: the program must come to a stop, well short of the end.
  const int last = ChunksWhenPaused(sb.get(), absl::Seconds(120));
  ASSERT_GE(last, 0) << "the program never paused";
  // What is in flight: the broker's 256 KiB buffer, the pipe, and gRPC's and
  // the kernel's socket windows (HTTP/2 flow control) on both sides.
  printf("slow reader: the program paused after %d of %d chunks of 64 KiB\n", last, kChunks);
  EXPECT_LT(last, 256) << last << " of " << kChunks << " chunks written with no reader";
  // Read again: every chunk, in order, then the result.
  bool result = false;
  while (reader->Read(&ev)) {
    if (ev.has_output()) got += ev.output().data();
    if (ev.has_result()) {
      result = true;
      EXPECT_EQ(ev.result().exit_code(), 0);
      EXPECT_FALSE(ev.result().truncated());
    }
  }
  grpc::Status s = reader->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(result);
  ASSERT_EQ(got.size(), static_cast<size_t>(kChunk) * kChunks);
  for (int i = 0; i < kChunks; ++i) {
    const std::string head = std::to_string(i);
    ASSERT_EQ(got.compare(static_cast<size_t>(i) * kChunk, head.size(), head), 0) << "chunk " << i;
  }
  EXPECT_EQ(ChunksWhenPaused(sb.get(), absl::Seconds(60)), kChunks);  // it ran to the end
}

TEST_F(ConcurrencyTest, LocalRunsWaitOnTheEventLoop) {
  StartBroker(R"({"max_sessions_per_tenant": 50})");
  constexpr int kSessions = 12;
  for (int i = 0; i < kSessions; ++i) {
    ASSERT_TRUE(Client(absl::StrCat("l", i))->Start().ok());
  }
  const int before = ProcessThreadCount();
  Calls calls(stub_.get());
  for (int i = 0; i < kSessions; ++i) {
    calls.Run(absl::StrCat("l", i), "import time; time.sleep(1); print('slept')");
  }
  ASSERT_TRUE(WaitFor([&] { return server_->service()->calls_in_flight() == kSessions; }));
  const int during = ProcessThreadCount();
  calls.Wait();
  for (int i = 0; i < kSessions; ++i) {
    ASSERT_TRUE(calls.status(i).ok()) << calls.status(i).error_message();
    EXPECT_EQ(calls.output(i), "slept\n");
  }
  EXPECT_LT(during - before, kSessions) << before << " -> " << during;
}

TEST_F(ConcurrencyTest, CreatesPastMaxConcurrentCreatesFailNamingIt) {
  FakeE2B::Options o;
  o.api_key = "e2b_test_key";
  o.ttl_thread = false;
  auto fake = FakeE2B::Start(o);
  ASSERT_TRUE(fake.ok()) << fake.status();
  (*fake)->faults().create_latency_ms = 1500;
  nlohmann::json extra = {{"default_provider", "e2b"},
                          {"limits", {{"queue_timeout_ms", 100}}},
                          {"providers",
                           {{"e2b",
                             {{"api_key", "e2b_test_key"},
                              {"api_url", (*fake)->url()},
                              {"sandbox_url", (*fake)->url()},
                              {"max_concurrent_creates", 1}}}}}};
  StartBroker(extra.dump());
  Calls calls(stub_.get());
  const int first = calls.Run("c1", "print(1)");
  ASSERT_TRUE(WaitFor([&] { return (*fake)->faults().creates.load() == 1; }));
  const int second = calls.Run("c2", "print(2)");
  ASSERT_TRUE(WaitFor([&] { return calls.finished(second); }));
  EXPECT_EQ(calls.status(second).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(calls.status(second).error_message(),
            "providers.e2b.max_concurrent_creates (1) reached; waited 100 ms (queue_timeout_ms) "
            "for a slot; retry later");
  calls.Wait();
  EXPECT_TRUE(calls.status(first).ok()) << calls.status(first).error_message();
  EXPECT_EQ((*fake)->faults().creates.load(), 1);
  server_.reset();  // before the fake
}

TEST_F(ConcurrencyTest, FirstCallsForOneSessionShareOneCreateAndWaitWithoutThreads) {
  FakeE2B::Options o;
  o.api_key = "e2b_test_key";
  o.ttl_thread = false;
  auto fake = FakeE2B::Start(o);
  ASSERT_TRUE(fake.ok()) << fake.status();
  (*fake)->faults().create_latency_ms = 1500;
  nlohmann::json extra = {{"default_provider", "e2b"},
                          {"providers",
                           {{"e2b",
                             {{"api_key", "e2b_test_key"},
                              {"api_url", (*fake)->url()},
                              {"sandbox_url", (*fake)->url()}}}}}};
  StartBroker(extra.dump());
  {
    Calls warm(stub_.get());  // gRPC's threads and the blocking pool's first
    warm.Run("warm", "print(0)");
  }
  const int before = ProcessThreadCount();
  constexpr int kCalls = 50;
  Calls calls(stub_.get());
  for (int i = 0; i < kCalls; ++i) calls.Run("one", absl::StrCat("print(", i, ")"));
  ASSERT_TRUE(WaitFor([&] { return server_->service()->calls_in_flight() == kCalls; }));
  const int during = ProcessThreadCount();
  calls.Wait();
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_TRUE(calls.status(i).ok()) << calls.status(i).error_message();
    EXPECT_EQ(calls.output(i), absl::StrCat(i, "\n"));
  }
  EXPECT_EQ((*fake)->faults().creates.load(), 2);  // "warm" and "one"
  // One thread creates; the other 49 calls wait on the creation, not on a
  // thread each.
  EXPECT_LT(during - before, 16) << before << " -> " << during;
  server_.reset();  // before the fake
}

// A remote create holds no thread while the provider works: with only 4
// blocking threads, 24 new sessions' creates are at the provider at once.
// Waited for by condition (the fake holds every create until released).
void ConcurrencyTest::CreatesAllReachTheProvider(Faults& faults) {
  faults.hold_creates = 1;
  // New sessions' first calls: Run, WriteFile and StartSession alike.
  constexpr int kSessions = 24;
  Calls calls(stub_.get());
  for (int i = 0; i < kSessions; ++i) {
    const std::string session = absl::StrCat("s", i);
    if (i % 3 == 0) calls.Run(session, absl::StrCat("print(", i, ")"));
    if (i % 3 == 1) calls.WriteFile(session, "seed.txt", std::string(static_cast<size_t>(i), 'x'));
    if (i % 3 == 2) calls.StartSession(session);
  }
  // A create that held one of the 4 threads would stop this at 4.
  EXPECT_TRUE(WaitFor([&] { return faults.creates_in_flight.load() == kSessions; }))
      << faults.creates_in_flight.load() << " creates in flight";
  faults.hold_creates = 0;
  calls.Wait();
  for (int i = 0; i < kSessions; ++i) {
    ASSERT_TRUE(calls.status(i).ok()) << i << ": " << calls.status(i).error_message();
    const std::string want = i % 3 == 0   ? absl::StrCat(i, "\n")
                             : i % 3 == 1 ? absl::StrCat("wrote ", i)
                                          : std::string("SESSION_STATE_READY");
    EXPECT_EQ(calls.output(i), want) << i;
  }
  EXPECT_EQ(faults.creates.load(), kSessions);
  server_.reset();  // before the fake
}

TEST_F(ConcurrencyTest, E2BCreatesHoldNoThreadWhileTheProviderWorks) {
  std::unique_ptr<FakeE2B> fake = StartFakeE2B();
  ASSERT_NE(fake, nullptr);
  StartBroker(E2BConfig(*fake));
  CreatesAllReachTheProvider(fake->faults());
}

// File transfers wait on the provider holding no thread: with 4 serving
// threads, 12 sessions' writes and reads (24 transfers) are all at the fake
// at once, then all answered; then their 12 closes' deletes likewise.
void ConcurrencyTest::FileTransfersAllReachTheProvider(Faults& faults, const std::string& tools) {
  constexpr int kSessions = 12;
  {
    Calls seed(stub_.get());
    for (int i = 0; i < kSessions; ++i) {
      seed.WriteFile(absl::StrCat("s", i), "r.txt", absl::StrCat("read me ", i));
    }
    seed.Wait();
    for (int i = 0; i < kSessions; ++i) ASSERT_TRUE(seed.status(i).ok()) << i;
  }
  faults.hold_files = 1;
  Calls calls(stub_.get());
  for (int i = 0; i < kSessions; ++i) {
    const std::string session = absl::StrCat("s", i);
    const std::string w(static_cast<size_t>(i + 1), 'w');
    if (tools.empty()) {
      calls.WriteFile(session, "w.txt", w);
      calls.ReadFile(session, "r.txt");
    } else {
      calls.CallTool(session, absl::StrCat("sandbox_", tools, "_write_file"),
                     {{"path", "w.txt"}, {"contents", w}});
      calls.CallTool(session, absl::StrCat("sandbox_", tools, "_read_file"), {{"path", "r.txt"}});
    }
  }
  // A transfer that held one of the 4 threads would stop this at 4.
  EXPECT_TRUE(WaitFor([&] { return faults.files_in_flight.load() == 2 * kSessions; }))
      << faults.files_in_flight.load() << " transfers in flight";
  faults.hold_files = 0;
  calls.Wait();
  for (int i = 0; i < kSessions; ++i) {
    ASSERT_TRUE(calls.status(2 * i).ok()) << i << ": " << calls.status(2 * i).error_message();
    EXPECT_EQ(calls.output(2 * i), tools.empty() ? absl::StrCat("wrote ", i + 1) : "ok");
    ASSERT_TRUE(calls.status(2 * i + 1).ok())
        << i << ": " << calls.status(2 * i + 1).error_message();
    EXPECT_EQ(calls.output(2 * i + 1), absl::StrCat("read me ", i));
  }
  {
    Calls check(stub_.get());
    for (int i = 0; i < kSessions; ++i) check.ReadFile(absl::StrCat("s", i), "w.txt");
    check.Wait();
    for (int i = 0; i < kSessions; ++i) {
      EXPECT_EQ(check.output(i), std::string(static_cast<size_t>(i + 1), 'w')) << i;
    }
  }
  EXPECT_EQ(faults.creates.load(), kSessions);
  // Closes wait on the provider's delete holding no thread either.
  faults.hold_deletes = 1;
  {
    Calls closes(stub_.get());
    for (int i = 0; i < kSessions; ++i) closes.CloseSession(absl::StrCat("s", i));
    EXPECT_TRUE(WaitFor([&] { return faults.deletes_in_flight.load() == kSessions; }))
        << faults.deletes_in_flight.load() << " deletes in flight";
    faults.hold_deletes = 0;
    closes.Wait();
    for (int i = 0; i < kSessions; ++i) {
      ASSERT_TRUE(closes.status(i).ok()) << i << ": " << closes.status(i).error_message();
      EXPECT_EQ(closes.output(i), "existed") << i;
    }
  }
  EXPECT_EQ(faults.deletes.load(), kSessions);
  EXPECT_EQ(server_->sessions()->size(), 0);
  server_.reset();  // before the fake
}

TEST_F(ConcurrencyTest, E2BFileTransfersHoldNoThread) {
  std::unique_ptr<FakeE2B> fake = StartFakeE2B();
  ASSERT_NE(fake, nullptr);
  StartBroker(E2BConfig(*fake));
  FileTransfersAllReachTheProvider(fake->faults());
}

// The same through gRPC CallTool (the agent's tool calls).
TEST_F(ConcurrencyTest, E2BToolCallsHoldNoThread) {
  std::unique_ptr<FakeE2B> fake = StartFakeE2B();
  ASSERT_NE(fake, nullptr);
  StartBroker(E2BConfig(*fake));
  FileTransfersAllReachTheProvider(fake->faults(), "e2b");
}

TEST_F(ConcurrencyTest, DaytonaFileTransfersHoldNoThread) {
  std::unique_ptr<FakeDaytona> fake = StartFakeDaytona();
  ASSERT_NE(fake, nullptr);
  StartBroker(DaytonaConfig(*fake));
  FileTransfersAllReachTheProvider(fake->faults());
}

// After a restart each session's sandbox is attached on its first call
// (E2B: /connect), holding no thread while the provider answers; calls that
// arrive during the attach wait for it and are answered by it.
TEST_F(ConcurrencyTest, AttachesAfterARestartHoldNoThreadAndWakeEveryWaitingCall) {
  std::unique_ptr<FakeE2B> fake = StartFakeE2B();
  ASSERT_NE(fake, nullptr);
  StartBroker(E2BConfig(*fake));
  constexpr int kSessions = 12;
  {
    Calls calls(stub_.get());
    for (int i = 0; i < kSessions; ++i) calls.Run(absl::StrCat("s", i), "x = 1");
    calls.Wait();
    for (int i = 0; i < kSessions; ++i) ASSERT_TRUE(calls.status(i).ok()) << i;
  }
  server_.reset();  // a graceful stop: the sandboxes stay at the provider
  Faults& faults = fake->faults();
  faults.hold_connects = 1;
  StartBroker(E2BConfig(*fake));
  // Two calls per session, of three kinds: each session's first starts the
  // attach, the second waits for it.
  Calls calls(stub_.get());
  for (int i = 0; i < kSessions; ++i) {
    const std::string session = absl::StrCat("s", i);
    calls.Run(session, absl::StrCat("print(", i, ")"));
    if (i % 2 == 0) calls.WriteFile(session, "f.txt", std::string(static_cast<size_t>(i), 'y'));
    if (i % 2 == 1) calls.Run(session, absl::StrCat("print(", i, " * 10)"));
  }
  // An attach that held one of the 4 threads would stop this at 4.
  EXPECT_TRUE(WaitFor([&] { return faults.connects_in_flight.load() == kSessions; }))
      << faults.connects_in_flight.load() << " attaches in flight";
  faults.hold_connects = 0;
  calls.Wait();
  for (int i = 0; i < kSessions; ++i) {
    ASSERT_TRUE(calls.status(2 * i).ok()) << i << ": " << calls.status(2 * i).error_message();
    EXPECT_EQ(calls.output(2 * i), absl::StrCat(i, "\n"));
    ASSERT_TRUE(calls.status(2 * i + 1).ok())
        << i << ": " << calls.status(2 * i + 1).error_message();
    EXPECT_EQ(calls.output(2 * i + 1),
              i % 2 == 0 ? absl::StrCat("wrote ", i) : absl::StrCat(i * 10, "\n"));
  }
  // Adopted, not created anew.
  EXPECT_EQ(faults.creates.load(), kSessions);
  server_.reset();  // before the fake
}

TEST_F(ConcurrencyTest, DaytonaCreatesHoldNoThreadWhileTheProviderWorks) {
  std::unique_ptr<FakeDaytona> fake = StartFakeDaytona();
  ASSERT_NE(fake, nullptr);
  StartBroker(DaytonaConfig(*fake));
  CreatesAllReachTheProvider(fake->faults());
}

TEST(LimiterTest, GrantsInOrderAndHoldsNoThreadWhileQueued) {
  EventLoop loop;
  Limiter l("max_x", 1, 10, absl::Seconds(60), &loop);
  std::vector<int> granted;
  absl::Mutex mu;
  for (int i = 0; i < 4; ++i) {
    l.Acquire([&, i](absl::Status s) {
      ASSERT_TRUE(s.ok());
      absl::MutexLock m(&mu);
      granted.push_back(i);
    });
  }
  EXPECT_EQ(l.stats().in_use, 1);
  EXPECT_EQ(l.stats().queued, 3);
  for (int i = 0; i < 4; ++i) l.Release();
  absl::MutexLock m(&mu);
  EXPECT_EQ(granted, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(l.stats().in_use, 0);
}

TEST(LimiterTest, ZeroIsUnlimitedAndAFullQueueRefusesAtOnce) {
  EventLoop loop;
  Limiter unlimited("max_y", 0, 0, absl::Seconds(1), &loop);
  for (int i = 0; i < 1000; ++i) EXPECT_TRUE(unlimited.AcquireBlocking().ok());
  Limiter l("max_z", 1, 0, absl::Seconds(1), &loop);
  EXPECT_TRUE(l.AcquireBlocking().ok());
  absl::Status s = l.AcquireBlocking();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), "max_z (1) reached and 0 calls are already queued; retry later");
  l.Release();
  EXPECT_TRUE(l.AcquireBlocking().ok());
}

TEST(EventLoopTest, TimersRunInDueOrderAndCancelledOnesNever) {
  EventLoop loop;
  absl::Mutex mu;
  std::vector<int> ran;
  absl::Notification last;
  loop.After(absl::Milliseconds(30), [&] {
    absl::MutexLock l(&mu);
    ran.push_back(3);
    last.Notify();
  });
  auto cancelled = loop.After(absl::Milliseconds(10), [&] {
    absl::MutexLock l(&mu);
    ran.push_back(99);
  });
  loop.After(absl::Milliseconds(20), [&] {
    absl::MutexLock l(&mu);
    ran.push_back(2);
  });
  loop.Post([&] {
    absl::MutexLock l(&mu);
    ran.push_back(1);
  });
  EXPECT_TRUE(loop.Cancel(cancelled));
  last.WaitForNotification();
  absl::MutexLock l(&mu);
  EXPECT_EQ(ran, (std::vector<int>{1, 2, 3}));
}

// A check that waits UntilNextTick fires on a multiple of the period of the
// loops' (steady) clock, whenever it was scheduled: all such checks share a
// wakeup.
TEST(EventLoopTest, UntilNextTickLandsOnAMultipleOfThePeriod) {
  auto now = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  for (absl::Duration period : {absl::Seconds(1), absl::Hours(1)}) {
    const int64_t p = absl::ToInt64Nanoseconds(period);
    const int64_t before = now();
    const absl::Duration d = EventLoop::UntilNextTick(period);
    const int64_t after = now();
    EXPECT_GT(d, absl::ZeroDuration());
    EXPECT_LE(d, period);
    // The due time is (the call's now) + d, between these two.
    const int64_t lo = before + absl::ToInt64Nanoseconds(d);
    const int64_t hi = after + absl::ToInt64Nanoseconds(d);
    const int64_t tick = hi / p * p;
    EXPECT_GE(tick, lo) << absl::FormatDuration(period);
    EXPECT_LE(tick, hi);
  }
}

TEST(EventLoopTest, WatchesAPipeUntilUnwatched) {
  EventLoop loop;
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  absl::Notification got;
  std::string data;
  ASSERT_TRUE(loop.Watch(p[0], EPOLLIN, [&](uint32_t) {
    char buf[16];
    ssize_t n = read(p[0], buf, sizeof(buf));
    if (n > 0) data.append(buf, n);
    if (data == "hello") {
      loop.Unwatch(p[0]);
      got.Notify();
    }
  }));
  ASSERT_EQ(write(p[1], "hel", 3), 3);
  ASSERT_EQ(write(p[1], "lo", 2), 2);
  got.WaitForNotification();
  EXPECT_EQ(data, "hello");
  EXPECT_EQ(loop.pending(), 0u);
  close(p[0]);
  close(p[1]);
}

}  // namespace
}  // namespace sandbox
