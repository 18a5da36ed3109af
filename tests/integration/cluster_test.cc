// More than one broker (docs/cluster.md): three real
// sandbox-brokerd replicas on one real etcd, the fake E2B as a separate
// process counted through /_fake/stats. Replicas are killed with SIGKILL
// and paused with SIGSTOP for real; time is waited for only where another
// process must act (a lease expiring in etcd), by polling etcd itself.

#include "server/cluster/cluster.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "adapters/http/http_client.h"
#include "common/text.h"
#include "grpcpp/create_channel.h"
#include "nlohmann/json.hpp"
#include "sandboxbroker/v1/broker.grpc.pb.h"
#include "server/store/etcd/etcd_store.h"
#include "tests/server/etcd_fixture.h"
#include "tests/testing/child_process.h"
#include "tests/testing/temp_dir.h"

#ifndef FAKE_E2B_PATH
#define FAKE_E2B_PATH "fake-e2b"
#endif

namespace sandbox {
namespace {

namespace pb = ::sandboxbroker::v1;
using nlohmann::json;

constexpr int kReplicas = 3;
constexpr int kTtlSeconds = 3;  // room for a sanitizer build on 2 busy cores
constexpr char kToken[] = "cluster-test-token-0123456789";

// The parameter: how many etcd members (1 or 3).
class ClusterTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (!EtcdInstalled()) GTEST_SKIP() << kEtcdPath << " is not installed";
    etcd_ = std::make_unique<EtcdCluster>(GetParam());
    ASSERT_TRUE(etcd_->Start());
    deployment_ = absl::StrCat("cluster-", RandomHex(4));
    StartFake();
  }
  void TearDown() override {
    for (int i = 0; i < kReplicas; ++i) {
      if (brokers_[i] != nullptr && brokers_[i]->Exited()) {
        ADD_FAILURE() << "replica r" << i << " ended by itself (" << brokers_[i]->ExitStatus()
                      << "); its stderr:\n"
                      << ReadAll(brokers_[i]->err());
      } else if (HasFailure() && brokers_[i] != nullptr) {
        std::fprintf(stderr, "---- r%d stderr (tail) ----\n%s\n", i,
                     Tail(ReadAll(brokers_[i]->err())).c_str());
      }
    }
    for (auto& t : background_) t.join();
    for (auto& b : brokers_) b.reset();
    fake_.reset();
    etcd_.reset();
  }
  static std::string Tail(const std::string& s) {
    return s.size() > 6000 ? s.substr(s.size() - 6000) : s;
  }

  void StartFake() {
    mkdir((dir_.path() + "/fake").c_str(), 0711);
    fake_ = std::make_unique<Proc>(
        std::vector<std::string>{FAKE_E2B_PATH, "--port", "0", "--api-key", "cluster_key",
                                 "--workspace-root", dir_.path() + "/fake", "--uid-base", "654000"},
        dir_.path() + "/fake.out", dir_.path() + "/fake.err");
    std::string port;
    ASSERT_TRUE(WaitFor(
        [&] {
          std::string o = ReadAll(fake_->out());
          auto at = o.find("listening on 127.0.0.1:");
          if (at == std::string::npos || o.find('\n', at) == std::string::npos) return false;
          port = o.substr(at + 23, o.find('\n', at) - at - 23);
          return true;
        },
        absl::Seconds(20)))
        << ReadAll(fake_->err());
    fake_url_ = absl::StrCat("http://127.0.0.1:", port);
  }

  json Config(int i, const std::string& provider) {
    json c = {
        {"listen", "127.0.0.1:0"},
        {"default_provider", provider},
        {"deployment_id", deployment_},
        {"orphan_grace_seconds", 2},
        {"orphan_sweep_interval_seconds", 1},
        {"reap_interval_seconds", 1},
        {"drain_grace_seconds", 2},
        {"log_level", "debug"},
        {"state",
         {{"backend", "etcd"},
          {"etcd",
           {{"endpoints", etcd_->endpoints()},
            {"prefix", "/cluster/"},
            {"member_ttl_seconds", kTtlSeconds}}}}},
        {"cluster", {{"member_id", absl::StrCat("r", i)}, {"token", kToken}}},
        {"providers",
         {{"local",
           {{"workspace_root", absl::StrCat(dir_.path(), "/ws", i)},
            {"uid_base", 674000 + 1000 * i}}},
          {"e2b",
           {{"api_key", "cluster_key"}, {"api_url", fake_url_}, {"sandbox_url", fake_url_}}}}}};
    return c;
  }

  // Starts replica i and waits until it serves.
  void StartReplica(int i, const std::string& provider = "e2b",
                    const json& extra = json::object()) {
    const std::string cfg = absl::StrCat(dir_.path(), "/r", i, "-", ++starts_, ".json");
    json c = Config(i, provider);
    c.merge_patch(extra);
    std::ofstream(cfg) << c.dump();
    const std::string err = absl::StrCat(dir_.path(), "/r", i, "-", starts_, ".err");
    brokers_[i] = std::make_unique<Proc>(std::vector<std::string>{BROKERD_PATH, "--config", cfg},
                                         dir_.path() + "/broker.out", err);
    const std::string addr = WaitForServingAddress(err, absl::Seconds(30));
    ASSERT_FALSE(addr.empty()) << ReadAll(err);
    stubs_[i] =
        pb::SandboxBroker::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
    const std::string log = ReadAll(err);
    if (auto at = log.find("mcp.serving address=127.0.0.1:"); at != std::string::npos) {
      mcp_ports_[i] = atoi(log.c_str() + at + 30);
    }
  }
  void StartAll(const std::string& provider = "e2b", const json& extra = json::object()) {
    for (int i = 0; i < kReplicas; ++i) StartReplica(i, provider, extra);
  }

  static std::unique_ptr<grpc::ClientContext> Ctx(absl::Duration timeout = absl::Seconds(30)) {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    return c;
  }
  grpc::Status Shell(int i, const std::string& session, const std::string& command,
                     pb::RunResult* out = nullptr) {
    pb::ShellRequest r;
    r.set_session_id(session);
    r.set_command(command);
    r.set_timeout_seconds(30);
    pb::RunResult ignored;
    return stubs_[i]->Shell(Ctx().get(), r, out ? out : &ignored);
  }
  grpc::Status Write(int i, const std::string& session, const std::string& path,
                     const std::string& data) {
    pb::WriteFileRequest r;
    r.set_session_id(session);
    r.set_path(path);
    r.set_contents(data);
    pb::WriteFileResponse resp;
    return stubs_[i]->WriteFile(Ctx().get(), r, &resp);
  }
  std::string Read(int i, const std::string& session, const std::string& path,
                   absl::Duration timeout = absl::Seconds(30)) {
    pb::ReadFileRequest r;
    r.set_session_id(session);
    r.set_path(path);
    pb::ReadFileResponse resp;
    grpc::Status s = stubs_[i]->ReadFile(Ctx(timeout).get(), r, &resp);
    if (!s.ok()) return absl::StrCat("<error ", s.error_code(), ": ", s.error_message(), ">");
    return resp.found() ? resp.contents() : "<missing>";
  }
  absl::StatusOr<pb::SessionInfo> Info(int i, const std::string& session) {
    pb::GetSessionRequest r;
    r.set_session_id(session);
    pb::SessionInfo info;
    grpc::Status s = stubs_[i]->GetSession(Ctx().get(), r, &info);
    if (!s.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    }
    return info;
  }
  absl::StatusOr<std::vector<pb::SessionInfo>> List(int i, int page_size = 0) {
    std::vector<pb::SessionInfo> out;
    std::string token;
    do {
      pb::ListSessionsRequest r;
      r.set_page_size(page_size);
      r.set_page_token(token);
      pb::ListSessionsResponse resp;
      grpc::Status s = stubs_[i]->ListSessions(Ctx().get(), r, &resp);
      if (!s.ok()) return absl::UnavailableError(s.error_message());
      for (const auto& info : resp.sessions()) out.push_back(info);
      token = resp.next_page_token();
    } while (!token.empty());
    return out;
  }

  json Stats() {
    HttpRequest req;
    req.method = "GET";
    req.url = fake_url_ + "/_fake/stats";
    req.headers = {{"X-API-KEY", "cluster_key"}};
    req.timeout = absl::Seconds(10);
    auto resp = http_.Send(req);
    if (!resp.ok()) return json();
    return json::parse(resp->body, nullptr, false);
  }
  void Faults(const json& j) {
    HttpRequest req;
    req.method = "POST";
    req.url = fake_url_ + "/_fake/faults";
    req.body = j.dump();
    req.headers = {{"Content-Type", "application/json"}, {"X-API-KEY", "cluster_key"}};
    req.timeout = absl::Seconds(10);
    ASSERT_TRUE(http_.Send(req).ok());
  }

  // The cluster's state, read directly.
  std::unique_ptr<EtcdStore> Direct() {
    EtcdStoreOptions o;
    o.etcd.endpoints = etcd_->endpoints();
    o.prefix = "/cluster/";
    auto s = EtcdStore::Open(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }
  std::string OwnerOf(EtcdStore* etcd, const std::string& session) {
    auto o = etcd->GetOwner("default", session);
    if (!o.ok() || !o->has_value()) return "";
    return (*o)->member_id;
  }

  TempDir dir_;
  std::unique_ptr<EtcdCluster> etcd_;
  std::string deployment_;
  std::string fake_url_;
  std::unique_ptr<Proc> fake_;
  std::unique_ptr<Proc> brokers_[kReplicas];
  std::unique_ptr<pb::SandboxBroker::Stub> stubs_[kReplicas];
  int mcp_ports_[kReplicas] = {};
  std::vector<std::thread> background_;
  HttpClient http_{"cluster-test"};
  int starts_ = 0;
};

TEST_P(ClusterTest, FiftyConcurrentFirstCallsOverThreeReplicasMakeOneSandbox) {
  StartAll();
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  std::vector<std::string> errors(50);
  for (int k = 0; k < 50; ++k) {
    threads.emplace_back([&, k] {
      pb::RunResult out;
      grpc::Status s = Shell(k % kReplicas, "shared", "echo hi", &out);
      if (s.ok() && out.output() == "hi\n") {
        ++ok;
      } else {
        errors[k] = absl::StrCat(s.error_code(), ": ", s.error_message(), " / ", out.output());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 50) << errors[0] << errors[1] << errors[2];
  EXPECT_EQ(Stats().value("creates", -1), 1);
  EXPECT_EQ(Stats().value("live", -1), 1);

  // Every replica tells the same story: one sandbox, one owner.
  auto first = Info(0, "shared");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_FALSE(first->owner().empty());
  for (int i = 1; i < kReplicas; ++i) {
    auto info = Info(i, "shared");
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->sandbox_id(), first->sandbox_id());
    EXPECT_EQ(info->owner(), first->owner());
  }
  auto etcd = Direct();
  EXPECT_EQ(OwnerOf(etcd.get(), "shared"), first->owner());

  // Files written through one replica are read through the others
  // (forwarded to the owner).
  ASSERT_TRUE(Write(1, "shared", "note.txt", "through r1").ok());
  EXPECT_EQ(Read(0, "shared", "note.txt"), "through r1");
  EXPECT_EQ(Read(2, "shared", "note.txt"), "through r1");
  EXPECT_EQ(Read(2, "shared", "absent.txt"), "<missing>");

  // RunStream through a replica that is not the owner: the owner's events.
  const int other = first->owner() == "r0" ? 1 : 0;
  pb::RunRequest rr;
  rr.set_session_id("shared");
  rr.set_code("for i in range(3): print('line', i)");
  rr.set_language(pb::LANGUAGE_PYTHON);
  auto ctx = Ctx();
  auto reader = stubs_[other]->RunStream(ctx.get(), rr);
  pb::RunEvent ev;
  std::string streamed;
  bool result = false;
  while (reader->Read(&ev)) {
    if (ev.has_output()) streamed += ev.output().data();
    if (ev.has_result()) result = true;
  }
  grpc::Status st = reader->Finish();
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_TRUE(result);
  EXPECT_EQ(streamed, "line 0\nline 1\nline 2\n");

  // The caller's request id and deadline travel with the forwarded call:
  // the owner logs the id, and a run past the deadline ends at it.
  {
    pb::ShellRequest r;
    r.set_session_id("shared");
    r.set_command("sleep 20");
    r.set_timeout_seconds(60);
    pb::RunResult out;
    grpc::ClientContext c;
    c.AddMetadata("x-request-id", "cluster-req-42");
    c.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    const absl::Time start = absl::Now();
    grpc::Status s = stubs_[other]->Shell(&c, r, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
    EXPECT_LT(absl::Now() - start, absl::Seconds(10));
    const int owner_index = first->owner()[1] - '0';
    EXPECT_TRUE(WaitFor(
        [&] {
          return ReadAll(brokers_[owner_index]->err()).find("request_id=cluster-req-42") !=
                 std::string::npos;
        },
        absl::Seconds(20)))
        << "the owner never logged the forwarded call's request id";
  }

  // Bad input is refused where it arrives and writes nothing to etcd.
  {
    pb::ShellRequest r;
    r.set_session_id("not a valid id!");
    r.set_command("true");
    pb::RunResult out;
    grpc::Status s = stubs_[1]->Shell(Ctx().get(), r, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    auto owners = etcd->LoadOwners("");
    ASSERT_TRUE(owners.ok());
    EXPECT_EQ(owners->size(), 1u);  // "shared" only
  }

  // A client cannot present itself as a replica.
  {
    pb::GetSessionRequest r;
    r.set_session_id("shared");
    pb::SessionInfo info;
    grpc::ClientContext c;
    c.AddMetadata("x-sandbox-broker-cluster-token", "not-the-token-at-all");
    c.AddMetadata("x-sandbox-broker-tenant", "someone-else");
    grpc::Status s = stubs_[0]->GetSession(&c, r, &info);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  }

  // ListSessions from every replica: the same one session, with its owner.
  for (int i = 0; i < kReplicas; ++i) {
    auto list = List(i);
    ASSERT_TRUE(list.ok()) << list.status();
    ASSERT_EQ(list->size(), 1u);
    EXPECT_EQ((*list)[0].session_id(), "shared");
    EXPECT_EQ((*list)[0].owner(), first->owner());
  }

  // Closed through a non-owner: destroyed once, and forgotten everywhere.
  pb::CloseSessionRequest cr;
  cr.set_session_id("shared");
  pb::CloseSessionResponse cresp;
  ASSERT_TRUE(stubs_[other]->CloseSession(Ctx().get(), cr, &cresp).ok());
  EXPECT_TRUE(cresp.existed());
  EXPECT_EQ(Stats().value("live", -1), 0);
  EXPECT_EQ(OwnerOf(etcd.get(), "shared"), "");
  for (int i = 0; i < kReplicas; ++i) {
    auto list = List(i);
    ASSERT_TRUE(list.ok());
    EXPECT_TRUE(list->empty());
  }
}

TEST_P(ClusterTest, SessionsOfAKilledReplicaAreTakenOverWithFilesIntact) {
  StartAll();
  // Two sessions first touched on each replica: each owns its own two.
  std::vector<std::string> ids;
  for (int i = 0; i < kReplicas; ++i) {
    for (int n = 0; n < 2; ++n) {
      const std::string id = absl::StrCat("s", i, "-", n);
      ids.push_back(id);
      ASSERT_TRUE(Write(i, id, "f.txt", "content of " + id).ok());
    }
  }
  auto etcd = Direct();
  std::map<std::string, pb::SessionInfo> before;
  for (const auto& id : ids) {
    auto info = Info(0, id);
    ASSERT_TRUE(info.ok()) << info.status();
    before[id] = *info;
  }
  EXPECT_EQ(OwnerOf(etcd.get(), "s0-0"), "r0");
  const int64_t creates = Stats().value("creates", -1);
  ASSERT_EQ(creates, 6);

  // r0 dies mid-traffic.
  brokers_[0]->Kill9();
  const absl::Time killed = absl::Now();
  // Its sessions answer from r1 within member_ttl_seconds + 5 s, files intact.
  std::string got;
  const bool answered = WaitFor(
      [&] {
        got = Read(1, "s0-0", "f.txt", absl::Seconds(5));
        return got == "content of s0-0";
      },
      absl::Seconds(kTtlSeconds + 5));
  const absl::Duration takeover = absl::Now() - killed;
  EXPECT_TRUE(answered) << got;
  std::printf("takeover after kill -9: %lld ms (member_ttl_seconds %d)\n",
              static_cast<long long>(absl::ToInt64Milliseconds(takeover)), kTtlSeconds);
  EXPECT_EQ(Read(2, "s0-1", "f.txt"), "content of s0-1");
  for (const auto& id : ids) {
    auto info = Info(2, id);
    ASSERT_TRUE(info.ok()) << id << ": " << info.status();
    EXPECT_EQ(info->sandbox_id(), before[id].sandbox_id()) << id;
    EXPECT_EQ(info->generation(), before[id].generation()) << id;
    EXPECT_NE(info->owner(), "r0") << id;
  }
  // Nothing was created again, nothing was lost, no orphan is left.
  EXPECT_EQ(Stats().value("creates", -1), creates);
  EXPECT_EQ(Stats().value("live", -1), 6);
  auto list = List(1);
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 6u);
  // Paged (2 a page) from another replica: the same six, in id order.
  auto paged = List(2, 2);
  ASSERT_TRUE(paged.ok()) << paged.status();
  ASSERT_EQ(paged->size(), 6u);
  for (size_t k = 0; k < 6; ++k) EXPECT_EQ((*paged)[k].session_id(), (*list)[k].session_id());
  EXPECT_TRUE(std::is_sorted(paged->begin(), paged->end(), [](const auto& a, const auto& b) {
    return a.session_id() < b.session_id();
  }));
}

TEST_P(ClusterTest, APausedOwnerPastItsLeaseLosesItsSessionAndDestroysItsLateSandbox) {
  StartAll();
  auto etcd = Direct();
  // r0's create is held open at the provider...
  Faults({{"create_latency_ms", 4000}});
  std::atomic<int> late_code{-1};
  background_.emplace_back([&] {
    grpc::Status s = Write(0, "paused", "who.txt", "r0");
    late_code = s.error_code();
  });
  ASSERT_TRUE(
      WaitFor([&] { return Stats().value("creates_in_flight", 0) == 1; }, absl::Seconds(20)));
  ASSERT_EQ(OwnerOf(etcd.get(), "paused"), "r0");
  // ...and r0 is paused past its lease.
  brokers_[0]->Signal(SIGSTOP);
  // Its lease expires: the ownership goes (and another replica's takeover
  // scan may already have claimed the session, so "not r0" rather than
  // "nobody": ASan's suite once saw r1 take it over between two polls).
  ASSERT_TRUE(WaitFor([&] { return OwnerOf(etcd.get(), "paused") != "r0"; },
                      absl::Seconds(kTtlSeconds + 5)));
  Faults({{"create_latency_ms", 0}});
  // Another replica takes the session and creates its own sandbox.
  ASSERT_TRUE(Write(1, "paused", "who.txt", "r1").ok());
  const std::string new_owner = OwnerOf(etcd.get(), "paused");
  EXPECT_NE(new_owner, "r0");
  EXPECT_FALSE(new_owner.empty());
  brokers_[0]->Signal(SIGCONT);
  // r0's create returns; its write is refused (stale fencing token) and it
  // destroys that sandbox itself: one sandbox survives.
  ASSERT_TRUE(WaitFor([&] { return late_code.load() != -1; }, absl::Seconds(20)));
  EXPECT_NE(late_code.load(), 0);
  EXPECT_TRUE(WaitFor([&] { return Stats().value("live", -1) == 1; }, absl::Seconds(20)))
      << Stats().dump();
  EXPECT_EQ(Stats().value("creates", -1), 2);
  EXPECT_EQ(Read(2, "paused", "who.txt"), "r1");
  auto row = etcd->LoadSession("default", "paused");
  ASSERT_TRUE(row.ok() && row->has_value());
  auto info = Info(1, "paused");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ((*row)->sandbox_id, info->sandbox_id());
  // r0 rejoined as a new member and serves again (forwarding to the owner).
  EXPECT_TRUE(WaitFor([&] { return Read(0, "paused", "who.txt", absl::Seconds(5)) == "r1"; },
                      absl::Seconds(kTtlSeconds + 10)));
  EXPECT_NE(ReadAll(brokers_[0]->err()).find("cluster.lease_lost"), std::string::npos);
}

TEST_P(ClusterTest, LocalSessionsArePlacedByRendezvousAndGetANewGenerationAfterTheirMachineDies) {
  StartAll("local");
  std::map<std::string, int> owned;
  std::vector<std::string> ids;
  for (int n = 0; n < 12; ++n) ids.push_back(absl::StrCat("local-", n));
  for (int n = 0; n < 12; ++n) {
    ASSERT_TRUE(Write(n % kReplicas, ids[n], "f.txt", "x").ok());
  }
  const std::vector<std::string> members = {"r0", "r1", "r2"};
  for (const auto& id : ids) {
    auto info = Info(0, id);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->owner(), Cluster::Rendezvous("default", id, members)) << id;
    EXPECT_EQ(info->generation(), 1);
    ++owned[info->owner()];
  }
  EXPECT_GE(owned.size(), 2u) << "12 sessions all placed on one replica";
  // The machine of one replica is gone: its sessions get new sandboxes
  // (generation 2) on their next call, on a live replica.
  std::string victim_id;
  for (const auto& id : ids) {
    if (Cluster::Rendezvous("default", id, members) == "r2") victim_id = id;
  }
  ASSERT_FALSE(victim_id.empty());
  brokers_[2]->Kill9();
  pb::SessionInfo after;
  ASSERT_TRUE(WaitFor(
      [&] {
        if (!Shell(0, victim_id, "true").ok()) return false;
        auto info = Info(0, victim_id);
        if (!info.ok()) return false;
        after = *info;
        return true;
      },
      absl::Seconds(kTtlSeconds + 5)));
  EXPECT_EQ(after.generation(), 2);
  EXPECT_NE(after.owner(), "r2");
  EXPECT_EQ(Read(1, victim_id, "f.txt"), "<missing>");  // a new sandbox: its files are gone
}

TEST_P(ClusterTest, EtcdRestartedUnderLoadLosesNoSessionAndDoublesNone) {
  StartAll();
  std::vector<std::string> ids;
  for (int i = 0; i < kReplicas; ++i) {
    for (int n = 0; n < 2; ++n) {
      const std::string id = absl::StrCat("load", i, "-", n);
      ids.push_back(id);
      ASSERT_TRUE(Write(i, id, "f.txt", "kept " + id).ok());
    }
  }
  std::map<std::string, std::string> sandbox_of;
  for (const auto& id : ids) {
    auto info = Info(0, id);
    ASSERT_TRUE(info.ok()) << info.status();
    sandbox_of[id] = info->sandbox_id();
  }
  // Traffic on every replica while etcd goes away and comes back.
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, unavailable{0}, other{0};
  std::vector<std::string> others(kReplicas);
  for (int i = 0; i < kReplicas; ++i) {
    background_.emplace_back([&, i] {
      for (int k = 0; !stop.load(); ++k) {
        const std::string& id = ids[(i + k) % ids.size()];
        pb::ShellRequest r;
        r.set_session_id(id);
        r.set_command("cat f.txt");
        pb::RunResult out;
        grpc::Status s = stubs_[i]->Shell(Ctx(absl::Seconds(10)).get(), r, &out);
        if (s.ok() && out.output() == "kept " + id) {
          ++ok;
        } else if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
          ++unavailable;
        } else {
          ++other;
          others[i] = absl::StrCat(s.error_code(), ": ", s.error_message(), " / ", out.output());
        }
      }
    });
  }
  ASSERT_TRUE(WaitFor([&] { return ok.load() >= 30; }, absl::Seconds(20)));
  ASSERT_TRUE(etcd_->Restart());
  const int at_restart = ok.load();
  ASSERT_TRUE(WaitFor([&] { return ok.load() >= at_restart + 60; }, absl::Seconds(30)));
  stop = true;
  for (auto& t : background_) t.join();
  background_.clear();
  std::printf("etcd (%d member(s)) restarted under load: %d calls ok, %d UNAVAILABLE, %d other\n",
              GetParam(), ok.load(), unavailable.load(), other.load());
  // Failing closed means UNAVAILABLE (retry), never another answer.
  EXPECT_EQ(other.load(), 0) << others[0] << others[1] << others[2];
  // No session lost, none doubled: the same sandboxes, files intact.
  for (const auto& id : ids) {
    EXPECT_TRUE(WaitFor([&] { return Read(2, id, "f.txt", absl::Seconds(5)) == "kept " + id; },
                        absl::Seconds(kTtlSeconds + 10)))
        << id;
    // UNAVAILABLE is the answer to retry while a replica rejoins.
    absl::StatusOr<pb::SessionInfo> info;
    EXPECT_TRUE(WaitFor(
        [&] {
          info = Info(1, id);
          return info.ok() || info.status().code() != absl::StatusCode::kUnavailable;
        },
        absl::Seconds(kTtlSeconds + 10)));
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->sandbox_id(), sandbox_of[id]) << id;
  }
  EXPECT_EQ(Stats().value("creates", -1), 6);
  EXPECT_EQ(Stats().value("live", -1), 6);
}

TEST_P(ClusterTest, IdleSessionsOfADeadReplicaAreTakenOverAndReapedOnceWithoutACall) {
  StartAll("e2b", {{"idle_timeout_seconds", 3}});
  for (int n = 0; n < 3; ++n) {
    ASSERT_TRUE(Write(0, absl::StrCat("idle-", n), "f.txt", "x").ok());
  }
  ASSERT_EQ(Stats().value("live", -1), 3);
  brokers_[0]->Kill9();
  // Nobody calls them: the others' scan adopts them and their reapers
  // close them when idle (or find them gone, when the provider's own
  // timeout came first); no row is left and no sandbox is destroyed twice.
  auto etcd = Direct();
  EXPECT_TRUE(WaitFor(
      [&] {
        auto rows = etcd->LoadSessions();
        return Stats().value("live", -1) == 0 && rows.ok() && rows->empty();
      },
      absl::Seconds(30)))
      << Stats().dump();
  EXPECT_LE(Stats().value("deletes", -1), 3);
}

TEST_P(ClusterTest, McpToolCallsGoToTheSessionsOwner) {
  StartAll("e2b", {{"mcp", {{"listen", "127.0.0.1:0"}}}});
  ASSERT_TRUE(Write(0, "m1", "f.txt", "written over grpc").ok());
  ASSERT_GT(mcp_ports_[1], 0);
  auto call = [&](int i, const std::string& tool, const json& args) {
    json meta = {{"io.modelcontextprotocol/protocolVersion", "2026-07-28"},
                 {"io.modelcontextprotocol/clientCapabilities", json::object()}};
    HttpRequest req;
    req.method = "POST";
    req.url = absl::StrCat("http://127.0.0.1:", mcp_ports_[i], "/mcp");
    req.headers = {{"Content-Type", "application/json"},
                   {"Accept", "application/json, text/event-stream"},
                   {"MCP-Protocol-Version", "2026-07-28"},
                   {"Mcp-Method", "tools/call"},
                   {"Mcp-Name", tool}};
    req.body = json({{"jsonrpc", "2.0"},
                     {"id", 1},
                     {"method", "tools/call"},
                     {"params", {{"name", tool}, {"arguments", args}, {"_meta", meta}}}})
                   .dump();
    req.timeout = absl::Seconds(30);
    auto resp = http_.Send(req);
    if (!resp.ok()) return json();
    const std::string& body = resp->body;
    size_t at = body.rfind("data: ");
    return json::parse(at == std::string::npos ? body : body.substr(at + 6), nullptr, false);
  };
  // r1 does not own m1: the tool call runs on r0's sandbox.
  json r = call(1, "sandbox_e2b_shell", {{"command", "cat f.txt"}, {"session", "m1"}});
  ASSERT_TRUE(r.is_object()) << r.dump();
  EXPECT_EQ(r["result"]["structuredContent"].value("output", "<none>"), "written over grpc")
      << r.dump();
  json rf = call(2, "sandbox_e2b_read_file", {{"path", "nope.txt"}, {"session", "m1"}});
  EXPECT_EQ(rf["result"]["structuredContent"].value("found", true), false) << rf.dump();
  // A file's contents are contents, whatever they look like (a JSON object
  // with "output": 1 once killed the forwarding replica), at any size the
  // owner allows (the peer channel once capped answers at 4 MiB).
  ASSERT_TRUE(Write(0, "m1", "f.json", R"({"output": 1, "exitCode": "x"})").ok());
  const std::string big(5 << 20, 'b');
  ASSERT_TRUE(Write(0, "m1", "big.txt", big).ok());
  // Contents that read like the missing-file text are found (the forwarded
  // answer says so in a typed field, not in its text).
  ASSERT_TRUE(Write(0, "m1", "nf.txt", "[file not found]").ok());
  for (const auto& [path, want] :
       {std::pair<std::string, std::string>{"f.json", R"({"output": 1, "exitCode": "x"})"},
        {"big.txt", big},
        {"nf.txt", "[file not found]"}}) {
    json got = call(1, "sandbox_e2b_read_file", {{"path", path}, {"session", "m1"}});
    ASSERT_TRUE(got.is_object()) << path;
    EXPECT_EQ(got["result"]["structuredContent"].value("found", false), true)
        << got.dump().substr(0, 300);
    EXPECT_TRUE(got["result"]["structuredContent"].value("content", "") == want) << path;
  }
  json again = call(1, "sandbox_e2b_shell", {{"command", "echo alive"}, {"session", "m1"}});
  EXPECT_EQ(again["result"]["structuredContent"].value("output", "<none>"), "alive\n");
  EXPECT_EQ(Stats().value("creates", -1), 1);
}

INSTANTIATE_TEST_SUITE_P(Etcd, ClusterTest, ::testing::Values(1, 3),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return absl::StrCat(p.param, "Node");
                         });

}  // namespace
}  // namespace sandbox
