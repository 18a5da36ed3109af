// The etcd store and client against a real etcd on loopback (the fixture
// starts /usr/bin/etcd per test), plus a fake "etcd" answering garbage.

#include "server/store/etcd/etcd_store.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <fstream>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/store/etcd/etcd_client.h"
#include "tests/server/etcd_fixture.h"
#include "tests/testing/test_cert.h"

namespace sandbox {
namespace {

SessionRecord Row(const std::string& tenant, const std::string& id, StoredState state) {
  SessionRecord r;
  r.tenant = tenant;
  r.session_id = id;
  r.provider = "local";
  r.attempt_id = "att-" + id;
  r.sandbox_id = state == StoredState::kCreating ? "" : "sb-" + id;
  r.state = state;
  r.generation = 2;
  r.spec_json = R"({"template":"t"})";
  r.created_at = absl::FromUnixSeconds(1800000000);
  r.last_active_at = absl::FromUnixSeconds(1800000100);
  return r;
}

class EtcdStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdInstalled()) GTEST_SKIP() << kEtcdPath << " is not installed";
    ASSERT_TRUE(etcd_.Start()) << "etcd did not become healthy";
    store_ = OpenStore();
    ASSERT_NE(store_, nullptr);
  }

  EtcdStoreOptions Options(const std::string& prefix = "/sandbox-broker/") {
    EtcdStoreOptions o;
    o.etcd.endpoints = {etcd_.endpoint()};
    o.etcd.request_timeout = absl::Seconds(3);
    o.prefix = prefix;
    return o;
  }
  std::unique_ptr<EtcdStore> OpenStore(const std::string& prefix = "/sandbox-broker/") {
    auto s = EtcdStore::Open(Options(prefix));
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

  EtcdServer etcd_;
  std::unique_ptr<EtcdStore> store_;
};

// ---- the SessionStore contract (as tests/server/session_store_test.cc) ----

TEST_F(EtcdStoreTest, SessionsPutReplaceTouchDelete) {
  EXPECT_EQ(store_->backend(), "etcd");
  EXPECT_TRUE(store_->durable());
  EXPECT_FALSE(store_->deployment_id().empty());
  ASSERT_TRUE(store_->PutSession(Row("t", "a", StoredState::kCreating)).ok());
  ASSERT_TRUE(store_->PutSession(Row("t", "b", StoredState::kReady)).ok());
  ASSERT_TRUE(store_->PutSession(Row("t", "a", StoredState::kReady)).ok());  // replaces
  ASSERT_TRUE(
      store_->TouchSessions({{"t", "b", absl::FromUnixSeconds(1800000500)}, {"t", "zz", {}}}).ok());
  auto rows = store_->LoadSessions();
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);
  for (const auto& r : *rows) {
    EXPECT_EQ(r.tenant, "t");
    EXPECT_EQ(r.state, StoredState::kReady);
    EXPECT_EQ(r.sandbox_id, "sb-" + r.session_id);
    EXPECT_EQ(r.attempt_id, "att-" + r.session_id);
    EXPECT_EQ(r.provider, "local");
    EXPECT_EQ(r.generation, 2);
    EXPECT_EQ(r.spec_json, R"({"template":"t"})");
    EXPECT_EQ(r.created_at, absl::FromUnixSeconds(1800000000));
    EXPECT_EQ(r.last_active_at,
              absl::FromUnixSeconds(r.session_id == "b" ? 1800000500 : 1800000100));
  }
  ASSERT_TRUE(store_->DeleteSession("t", "a").ok());
  ASSERT_TRUE(store_->DeleteSession("t", "missing").ok());
  EXPECT_EQ(store_->LoadSessions()->size(), 1u);
  // A touch of a deleted session does not bring it back.
  ASSERT_TRUE(store_->TouchSessions({{"t", "a", absl::FromUnixSeconds(1)}}).ok());
  EXPECT_EQ(store_->LoadSessions()->size(), 1u);
}

TEST_F(EtcdStoreTest, RunsPutReplaceAndGoWithTheirSession) {
  RunRecord r;
  r.tenant = "t";
  r.session_id = "a";
  r.run_id = "r1";
  r.request_hash = "h";
  r.started_at = absl::FromUnixSeconds(1800000000);
  ASSERT_TRUE(store_->PutRun(r).ok());
  r.state = RunState::kDone;
  r.result = std::string("out\0put\xff", 8);
  r.status_code = 0;
  r.finished_at = absl::FromUnixSeconds(1800000001);
  ASSERT_TRUE(store_->PutRun(r).ok());
  r.run_id = "r2";
  ASSERT_TRUE(store_->PutRun(r).ok());
  // Another session whose id extends "a": its runs stay.
  RunRecord other = r;
  other.session_id = "ab";
  ASSERT_TRUE(store_->PutRun(other).ok());
  auto runs = store_->LoadRuns();
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 3u);
  EXPECT_EQ((*runs)[0].state, RunState::kDone);
  EXPECT_EQ((*runs)[0].result, std::string("out\0put\xff", 8));  // bytes, not text
  EXPECT_EQ((*runs)[0].request_hash, "h");
  EXPECT_EQ((*runs)[0].started_at, absl::FromUnixSeconds(1800000000));
  EXPECT_EQ((*runs)[0].finished_at, absl::FromUnixSeconds(1800000001));
  ASSERT_TRUE(store_->DeleteRun("t", "a", "r2").ok());
  EXPECT_EQ(store_->LoadRuns()->size(), 2u);
  ASSERT_TRUE(store_->PutSession(Row("t", "a", StoredState::kReady)).ok());
  ASSERT_TRUE(store_->DeleteSession("t", "a").ok());
  runs = store_->LoadRuns();
  ASSERT_EQ(runs->size(), 1u);
  EXPECT_EQ((*runs)[0].session_id, "ab");
}

TEST_F(EtcdStoreTest, UsageAddsDeltasToTheirRow) {
  UsageCounters a;
  a.runs = 2;
  a.run_seconds = 1.5;
  a.output_bytes = 10;
  UsageCounters b;
  b.runs = 1;
  b.cpu_seconds = 0.25;
  b.quota_refusals = 3;
  ASSERT_TRUE(store_->AddUsage({{"alpha", "echo", a}, {"beta", "-", b}}).ok());
  ASSERT_TRUE(store_->AddUsage({{"alpha", "echo", b}}).ok());
  auto rows = store_->LoadUsage();
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);
  std::map<UsageKey, UsageCounters> by;
  for (const UsageRow& r : *rows) by[{r.tenant, r.provider}] = r.counters;
  const UsageCounters& ae = by[UsageKey("alpha", "echo")];
  EXPECT_EQ(ae.runs, 3);
  EXPECT_DOUBLE_EQ(ae.run_seconds, 1.5);
  EXPECT_DOUBLE_EQ(ae.cpu_seconds, 0.25);
  EXPECT_EQ(ae.output_bytes, 10);
  EXPECT_EQ(ae.quota_refusals, 3);
  EXPECT_EQ(by[UsageKey("beta", "-")].quota_refusals, 3);
  EXPECT_NE(store_->created_at(), absl::InfinitePast());
}

TEST_F(EtcdStoreTest, ConcurrentUsageAddsAreNotLost) {
  auto other = OpenStore();
  ASSERT_NE(other, nullptr);
  UsageCounters one;
  one.runs = 1;
  std::thread t1([&] {
    for (int i = 0; i < 20; ++i) EXPECT_TRUE(store_->AddUsage({{"t", "p", one}}).ok());
  });
  std::thread t2([&] {
    for (int i = 0; i < 20; ++i) EXPECT_TRUE(other->AddUsage({{"t", "p", one}}).ok());
  });
  t1.join();
  t2.join();
  auto rows = store_->LoadUsage();
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0].counters.runs, 40);
}

TEST_F(EtcdStoreTest, ReopenKeepsRowsAndTheDeploymentId) {
  const std::string dep = store_->deployment_id();
  const absl::Time created = store_->created_at();
  ASSERT_TRUE(store_->PutSession(Row("t", "a", StoredState::kReady)).ok());
  store_.reset();
  auto again = OpenStore();
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->deployment_id(), dep);
  EXPECT_EQ(again->created_at(), created);
  EXPECT_EQ(again->LoadSessions()->size(), 1u);
  ASSERT_TRUE(again->SetDeploymentId("dep-configured").ok());
  again.reset();
  EXPECT_EQ(OpenStore()->deployment_id(), "dep-configured");
  // Another prefix is another store.
  auto elsewhere = OpenStore("/other/");
  ASSERT_NE(elsewhere, nullptr);
  EXPECT_NE(elsewhere->deployment_id(), "dep-configured");
  EXPECT_TRUE(elsewhere->LoadSessions()->empty());
}

TEST_F(EtcdStoreTest, KeyComponentsAreEscaped) {
  EXPECT_EQ(EtcdKeyComponent("a/b%c\n"), "a%2Fb%25c%0A");
  EXPECT_EQ(store_->SessionKey("t", "a/b"), "/sandbox-broker/sessions/t/a%2Fb");
  ASSERT_TRUE(store_->PutSession(Row("a", "b/c", StoredState::kReady)).ok());
  ASSERT_TRUE(store_->PutSession(Row("a/b", "c", StoredState::kReady)).ok());
  auto rows = store_->LoadSessions();
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), 2u);
  ASSERT_TRUE(store_->DeleteSession("a", "b/c").ok());
  rows = store_->LoadSessions();
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0].tenant, "a/b");
}

TEST_F(EtcdStoreTest, PagingOverManyKeys) {
  EtcdStoreOptions o = Options();
  o.page_size = 37;
  auto small_pages = EtcdStore::Open(o);
  ASSERT_TRUE(small_pages.ok()) << small_pages.status();
  std::vector<SessionRecord> rows;
  for (int i = 0; i < 500; ++i) rows.push_back(Row("t", absl::StrCat("s", i), StoredState::kReady));
  ASSERT_TRUE((*small_pages)->PutSessions(rows).ok());  // several transactions of 64
  auto loaded = (*small_pages)->LoadSessions();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->size(), 500u);
  std::set<std::string> ids;
  for (const SessionRecord& r : *loaded) ids.insert(r.session_id);
  EXPECT_EQ(ids.size(), 500u);
  // The client itself: pages of 1, and a page size that divides the count.
  EtcdClient* c = store_->client();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(c->Put(absl::StrCat("/p/k", i), "v").ok());
  ASSERT_TRUE(c->Put("/p", "not under /p/").ok());
  ASSERT_TRUE(c->Put("/p0", "not under /p/").ok());
  for (int page : {1, 5, 10, 500}) {
    auto kvs = c->GetPrefix("/p/", page);
    ASSERT_TRUE(kvs.ok()) << kvs.status();
    ASSERT_EQ(kvs->size(), 10u) << page;
    EXPECT_EQ((*kvs)[0].key, "/p/k0");
    EXPECT_EQ((*kvs)[9].key, "/p/k9");
  }
  // Touching many sessions (more than one transaction).
  std::vector<SessionStore::Touch> touches;
  for (int i = 0; i < 150; ++i) {
    touches.push_back({"t", absl::StrCat("s", i), absl::FromUnixSeconds(1900000000)});
  }
  ASSERT_TRUE(store_->TouchSessions(touches).ok());
  int touched = 0;
  auto after = store_->LoadSessions();
  ASSERT_TRUE(after.ok());
  for (const SessionRecord& r : *after) {
    touched += r.last_active_at == absl::FromUnixSeconds(1900000000);
  }
  EXPECT_EQ(touched, 150);
  EXPECT_EQ(c->DeletePrefix("/p/").value_or(-1), 10);
}

TEST_F(EtcdStoreTest, LargeBatchesStayUnderEtcdsRequestLimit) {
  // 100 rows of 40 KB: 4 MB; 64 of them (one txn by count) are over etcd's 1.5 MiB.
  std::vector<SessionRecord> rows;
  for (int i = 0; i < 100; ++i) {
    rows.push_back(Row("t", absl::StrCat("big", i), StoredState::kReady));
    rows.back().spec_json = absl::StrCat(R"({"pad":")", std::string(40000, 'x'), R"("})");
  }
  ASSERT_TRUE(store_->PutSessions(rows).ok());
  auto loaded = store_->LoadSessions();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->size(), 100u);
  EXPECT_EQ((*loaded)[0].spec_json.size(), rows[0].spec_json.size());
  // Touching them all rewrites 4 MB too.
  std::vector<SessionStore::Touch> touches;
  for (const SessionRecord& r : rows) {
    touches.push_back({r.tenant, r.session_id, absl::FromUnixSeconds(1900000000)});
  }
  ASSERT_TRUE(store_->TouchSessions(touches).ok());
  loaded = store_->LoadSessions();
  ASSERT_TRUE(loaded.ok());
  for (const SessionRecord& r : *loaded) {
    EXPECT_EQ(r.last_active_at, absl::FromUnixSeconds(1900000000));
  }
}

TEST_F(EtcdStoreTest, ClientTxnCompares) {
  EtcdClient* c = store_->client();
  using R = EtcdCompare::Result;
  auto put = c->Put("/x", "1");
  ASSERT_TRUE(put.ok());
  auto kv = c->Get("/x");
  ASSERT_TRUE(kv.ok() && kv->has_value());
  EXPECT_EQ((*kv)->mod_revision, *put);
  EXPECT_EQ((*kv)->version, 1);
  auto t =
      c->Txn({EtcdCompare::Value("/x", R::kEqual, "1"), EtcdCompare::Version("/x", R::kEqual, 1),
              EtcdCompare::CreateRevision("/x", R::kEqual, (*kv)->create_revision),
              EtcdCompare::ModRevision("/x", R::kLess, *put + 1)},
             {EtcdOp::Put("/x", "2"), EtcdOp::Get("/x")}, {EtcdOp::Get("/x")});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->succeeded);
  ASSERT_EQ(t->responses.size(), 2u);
  ASSERT_EQ(t->responses[1].kvs.size(), 1u);
  EXPECT_EQ(t->responses[1].kvs[0].value, "2");
  t = c->Txn({EtcdCompare::Value("/x", R::kEqual, "1")}, {EtcdOp::Put("/x", "3")},
             {EtcdOp::Get("/x"), EtcdOp::Delete("/x")});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_FALSE(t->succeeded);
  ASSERT_EQ(t->responses.size(), 2u);
  EXPECT_EQ(t->responses[0].kvs[0].value, "2");
  EXPECT_EQ(t->responses[1].deleted, 1);
  EXPECT_FALSE(c->Get("/x")->has_value());
  EXPECT_EQ(c->Delete("/x").value_or(-1), 0);
  // etcd's own errors keep their code: a put under a lease that is not there.
  EXPECT_EQ(c->Put("/y", "v", 12345).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c->LeaseKeepAlive(12345).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(c->LeaseRevoke(12345).ok());
}

// ---- membership, ownership, fencing ----

TEST_F(EtcdStoreTest, MembersRegisterAndExpireWhenKeepaliveStops) {
  auto a = store_->RegisterMember("replica-a", "10.0.0.1:50051", absl::Seconds(2));
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = store_->RegisterMember("replica-b", "10.0.0.2:50051", absl::Seconds(2),
                                  /*background_keepalive=*/false);
  ASSERT_TRUE(b.ok()) << b.status();
  auto members = store_->ListMembers();
  ASSERT_TRUE(members.ok()) << members.status();
  ASSERT_EQ(members->size(), 2u);
  EXPECT_EQ((*members)[0].id, "replica-a");
  EXPECT_EQ((*members)[0].advertise_address, "10.0.0.1:50051");
  EXPECT_EQ((*members)[0].lease, (*a)->lease());
  // The same id twice is refused while the first is alive.
  EXPECT_EQ(store_->RegisterMember("replica-a", "x", absl::Seconds(2)).status().code(),
            absl::StatusCode::kAlreadyExists);

  // b is not renewed: it goes after its TTL; a (renewed in the background)
  // stays, long past its own TTL.
  ASSERT_TRUE(WaitFor(
      [&] {
        auto m = store_->ListMembers();
        return m.ok() && m->size() == 1 && (*m)[0].id == "replica-a";
      },
      absl::Seconds(15)));
  EXPECT_EQ((*b)->KeepAliveOnce().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE((*b)->lost());
  EXPECT_EQ(store_->ClaimSession("t", "s", "replica-b").status().code(),
            absl::StatusCode::kFailedPrecondition);
  const absl::Time until = absl::Now() + absl::Seconds(3);
  while (absl::Now() < until) {
    auto m = store_->ListMembers();
    ASSERT_TRUE(m.ok());
    ASSERT_EQ(m->size(), 1u) << "replica-a expired although kept alive";
    absl::SleepFor(absl::Milliseconds(250));
  }
  EXPECT_FALSE((*a)->lost());

  // a stops renewing (hung): it expires too, and its ownerships with it.
  auto claim = store_->ClaimSession("t", "s", "replica-a");
  ASSERT_TRUE(claim.ok() && claim->claimed) << claim.status();
  (*a)->StopKeepAlive();
  ASSERT_TRUE(WaitFor(
      [&] {
        auto m = store_->ListMembers();
        auto o = store_->GetOwner("t", "s");
        return m.ok() && m->empty() && o.ok() && !o->has_value();
      },
      absl::Seconds(15)));
  // The id is free again.
  auto a2 = store_->RegisterMember("replica-a", "10.0.0.9:50051", absl::Seconds(5));
  ASSERT_TRUE(a2.ok()) << a2.status();
  ASSERT_TRUE((*a2)->Leave().ok());  // a clean leave: gone at once
  EXPECT_TRUE(store_->ListMembers()->empty());
}

TEST_F(EtcdStoreTest, ClaimByTwoMembersExactlyOneWins) {
  auto other = OpenStore();  // another replica: its own client
  ASSERT_NE(other, nullptr);
  auto a = store_->RegisterMember("a", "a:1", absl::Seconds(10));
  auto b = other->RegisterMember("b", "b:1", absl::Seconds(10));
  ASSERT_TRUE(a.ok() && b.ok());
  constexpr int kSessions = 20;
  std::vector<absl::StatusOr<ClaimResult>> ra(kSessions, absl::UnknownError("")),
      rb(kSessions, absl::UnknownError(""));
  std::thread ta([&] {
    for (int i = 0; i < kSessions; ++i)
      ra[i] = store_->ClaimSession("t", absl::StrCat("s", i), "a");
  });
  std::thread tb([&] {
    for (int i = 0; i < kSessions; ++i) rb[i] = other->ClaimSession("t", absl::StrCat("s", i), "b");
  });
  ta.join();
  tb.join();
  for (int i = 0; i < kSessions; ++i) {
    ASSERT_TRUE(ra[i].ok()) << ra[i].status();
    ASSERT_TRUE(rb[i].ok()) << rb[i].status();
    EXPECT_NE(ra[i]->claimed, rb[i]->claimed) << i;  // exactly one
    const ClaimResult& win = ra[i]->claimed ? *ra[i] : *rb[i];
    const ClaimResult& lose = ra[i]->claimed ? *rb[i] : *ra[i];
    EXPECT_EQ(lose.owner.member_id, win.owner.member_id);  // the loser learns who won
    EXPECT_EQ(lose.owner.fence, win.owner.fence);
    EXPECT_GT(win.owner.fence, 0);
    auto o = store_->GetOwner("t", absl::StrCat("s", i));
    ASSERT_TRUE(o.ok() && o->has_value());
    EXPECT_EQ((*o)->member_id, win.owner.member_id);
    EXPECT_EQ((*o)->fence, win.owner.fence);
  }
  // Claiming again as the owner is idempotent: same token.
  auto again = store_->ClaimSession("t", "s0", ra[0]->owner.member_id);
  if (ra[0]->owner.member_id == "b") again = other->ClaimSession("t", "s0", "b");
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->claimed);
  EXPECT_EQ(again->owner.fence, ra[0]->owner.fence);
  EXPECT_EQ(store_->ClaimSession("t", "s0", "nobody").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(EtcdStoreTest, FencedWriteWithStaleTokenIsRejected) {
  auto other = OpenStore();
  ASSERT_NE(other, nullptr);
  auto a = store_->RegisterMember("a", "a:1", absl::Seconds(10));
  auto b = other->RegisterMember("b", "b:1", absl::Seconds(10));
  ASSERT_TRUE(a.ok() && b.ok());
  auto ca = store_->ClaimSession("t", "s", "a");
  ASSERT_TRUE(ca.ok() && ca->claimed);
  const int64_t fence_a = ca->owner.fence;
  SessionRecord r = Row("t", "s", StoredState::kCreating);
  ASSERT_TRUE(store_->PutSessionFenced(r, fence_a).ok());
  // Writing the session does not move the token.
  r.state = StoredState::kReady;
  ASSERT_TRUE(store_->PutSessionFenced(r, fence_a).ok());
  EXPECT_FALSE(other->ClaimSession("t", "s", "b")->claimed);

  // a lets go; b takes over with a new token; a's old token is stale.
  ASSERT_TRUE(store_->ReleaseSession("t", "s", fence_a).ok());
  auto cb = other->ClaimSession("t", "s", "b");
  ASSERT_TRUE(cb.ok() && cb->claimed);
  EXPECT_GT(cb->owner.fence, fence_a);
  SessionRecord by_b = r;
  by_b.sandbox_id = "sb-of-b";
  ASSERT_TRUE(other->PutSessionFenced(by_b, cb->owner.fence).ok());
  SessionRecord by_a = r;
  by_a.sandbox_id = "sb-of-a";
  absl::Status stale = store_->PutSessionFenced(by_a, fence_a);
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.message().find("fencing token stale"), absl::string_view::npos) << stale;
  EXPECT_TRUE(IsOwnershipLost(stale));  // typed: callers never read the code or the text
  EXPECT_EQ(store_->DeleteSessionFenced("t", "s", fence_a).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->ReleaseSession("t", "s", fence_a).code(),
            absl::StatusCode::kFailedPrecondition);
  auto rows = store_->LoadSessions();
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0].sandbox_id, "sb-of-b");  // a's write did not land
  // No token never passes (mod_revision 0 would match a missing owner key).
  EXPECT_EQ(store_->PutSessionFenced(by_a, 0).code(), absl::StatusCode::kInvalidArgument);
  // Nobody owns an unclaimed session: a fenced write to it fails.
  EXPECT_EQ(store_->PutSessionFenced(Row("t", "unowned", StoredState::kReady), fence_a).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(other->DeleteSessionFenced("t", "s", cb->owner.fence).ok());
  EXPECT_TRUE(store_->LoadSessions()->empty());
}

TEST_F(EtcdStoreTest, OneHolderOfThePrefixLock) {
  auto first = store_->LockPrefix("broker-1", absl::Seconds(2), absl::ZeroDuration());
  ASSERT_TRUE(first.ok()) << first.status();
  auto other = OpenStore();
  auto refused = other->LockPrefix("broker-2", absl::Seconds(2), absl::ZeroDuration());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(IsOwnershipLost(refused.status()));  // another refusal, not a lost session
  EXPECT_NE(refused.status().message().find("broker-1"), absl::string_view::npos)
      << refused.status();
  // Another prefix is free.
  EXPECT_TRUE(
      OpenStore("/other/")->LockPrefix("broker-2", absl::Seconds(2), absl::ZeroDuration()).ok());
  // A holder that stops renewing (crashed) is waited out.
  (*first)->StopKeepAlive();
  auto second = other->LockPrefix("broker-2", absl::Seconds(2), absl::Seconds(15));
  ASSERT_TRUE(second.ok()) << second.status();
  // Released when destroyed: the next one gets it at once.
  second->reset();
  EXPECT_TRUE(store_->LockPrefix("broker-3", absl::Seconds(2), absl::ZeroDuration()).ok());
}

// ---- failures ----

TEST_F(EtcdStoreTest, EtcdKilledGivesUnavailableThenRecovers) {
  auto m = store_->RegisterMember("a", "a:1", absl::Seconds(30));
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE(store_->PutSession(Row("t", "kept", StoredState::kReady)).ok());
  auto claim = store_->ClaimSession("t", "kept", "a");
  ASSERT_TRUE(claim.ok() && claim->claimed);
  etcd_.Kill9();

  auto unavailable = [](const absl::Status& s) {
    return s.code() == absl::StatusCode::kUnavailable;
  };
  EXPECT_TRUE(unavailable(store_->LoadSessions().status()));
  EXPECT_TRUE(unavailable(store_->LoadRuns().status()));
  EXPECT_TRUE(unavailable(store_->LoadUsage().status()));
  EXPECT_TRUE(unavailable(store_->PutSession(Row("t", "new", StoredState::kCreating))));
  EXPECT_TRUE(unavailable(store_->TouchSessions({{"t", "kept", absl::Now()}})));
  EXPECT_TRUE(unavailable(store_->DeleteSession("t", "kept")));
  EXPECT_TRUE(unavailable(store_->ClaimSession("t", "other", "a").status()));
  EXPECT_TRUE(unavailable(
      store_->PutSessionFenced(Row("t", "kept", StoredState::kReady), claim->owner.fence)));
  EXPECT_TRUE(unavailable(store_->ListMembers().status()));
  EXPECT_TRUE(unavailable(store_->RegisterMember("b", "b:1", absl::Seconds(5)).status()));
  EXPECT_TRUE(unavailable((*m)->KeepAliveOnce()));
  EXPECT_FALSE((*m)->lost());  // unreachable is not expired
  auto fresh = EtcdStore::Open(Options());
  EXPECT_TRUE(unavailable(fresh.status())) << fresh.status();

  ASSERT_TRUE(etcd_.Start());  // same data dir
  auto rows = store_->LoadSessions();
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0].session_id, "kept");
  EXPECT_TRUE((*m)->KeepAliveOnce().ok());
  EXPECT_TRUE(store_->PutSessionFenced((*rows)[0], claim->owner.fence).ok());
  EXPECT_TRUE(store_->PutSession(Row("t", "new", StoredState::kCreating)).ok());
  EXPECT_EQ(store_->LoadSessions()->size(), 2u);
}

TEST_F(EtcdStoreTest, FailsOverToTheNextEndpoint) {
  EtcdStoreOptions o = Options();
  o.etcd.endpoints = {absl::StrCat("http://127.0.0.1:", FreeLoopbackPort()), etcd_.endpoint()};
  auto s = EtcdStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE((*s)->PutSession(Row("t", "a", StoredState::kReady)).ok());
  EXPECT_EQ(store_->LoadSessions()->size(), 1u);
  o.etcd.endpoints = {absl::StrCat("http://127.0.0.1:", FreeLoopbackPort())};
  EXPECT_EQ(EtcdStore::Open(o).status().code(), absl::StatusCode::kUnavailable);
  o.etcd.endpoints = {"127.0.0.1:2379"};
  EXPECT_EQ(EtcdStore::Open(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(EtcdStoreTest, MalformedStoredRecordsAreErrorsNotCrashes) {
  EtcdClient* c = store_->client();
  ASSERT_TRUE(c->Put(store_->SessionKey("t", "bad"), "{not json").ok());
  EXPECT_EQ(store_->LoadSessions().status().code(), absl::StatusCode::kDataLoss);
  ASSERT_TRUE(c->Put(store_->SessionKey("t", "bad"), R"({"tenant":5})").ok());
  EXPECT_EQ(store_->LoadSessions().status().code(), absl::StatusCode::kDataLoss);
  // A touch leaves an unreadable record alone.
  EXPECT_TRUE(store_->TouchSessions({{"t", "bad", absl::Now()}}).ok());
  ASSERT_TRUE(c->Put(store_->RunKey("t", "s", "r"), R"({"result_b64":"***"})").ok());
  EXPECT_EQ(store_->LoadRuns().status().code(), absl::StatusCode::kDataLoss);
  // Usage totals that cannot be read are never overwritten.
  ASSERT_TRUE(c->Put(store_->UsageKey("t", "p"), R"({"runs":"many"})").ok());
  UsageCounters one;
  one.runs = 1;
  EXPECT_EQ(store_->AddUsage({{"t", "p", one}}).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(c->Get(store_->UsageKey("t", "p"))->value().value, R"({"runs":"many"})");
  ASSERT_TRUE(c->Put(store_->prefix() + "meta/schema_version", "99").ok());
  EXPECT_EQ(EtcdStore::Open(Options()).status().code(), absl::StatusCode::kFailedPrecondition);
}

// ---- auth and TLS ----

TEST_F(EtcdStoreTest, AuthWithPasswordAndNoSecretInErrors) {
  HttpClient http("test");
  auto post = [&](const std::string& path, const std::string& body) {
    HttpRequest req;
    req.method = "POST";
    req.url = etcd_.endpoint() + path;
    req.body = body;
    auto r = http.Send(req);
    return r.ok() ? r->status : -1;
  };
  ASSERT_EQ(post("/v3/auth/user/add", R"({"name":"root","password":"s3cret-pw"})"), 200);
  ASSERT_EQ(post("/v3/auth/role/add", R"({"name":"root"})"), 200);
  ASSERT_EQ(post("/v3/auth/user/grant", R"({"user":"root","role":"root"})"), 200);
  ASSERT_EQ(post("/v3/auth/enable", "{}"), 200);

  EtcdStoreOptions o = Options();
  o.etcd.username = "root";
  o.etcd.password = "s3cret-pw";
  auto s = EtcdStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE((*s)->PutSession(Row("t", "a", StoredState::kReady)).ok());
  EXPECT_EQ((*s)->LoadSessions()->size(), 1u);
  // A restarted etcd forgets its simple tokens: the client authenticates again.
  ASSERT_TRUE(etcd_.Restart());
  auto after = (*s)->LoadSessions();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->size(), 1u);

  o.etcd.password = "wrong-pw-XYZ";
  auto bad = EtcdStore::Open(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(std::string(bad.status().message()).find("wrong-pw-XYZ"), std::string::npos)
      << bad.status();
  o.etcd.username.clear();
  auto anonymous = EtcdStore::Open(o);
  ASSERT_FALSE(anonymous.ok());
  EXPECT_NE(anonymous.status().code(), absl::StatusCode::kUnavailable) << anonymous.status();
}

class EtcdTlsTest : public ::testing::Test {};

TEST_F(EtcdTlsTest, HttpsWithClientCertificate) {
  if (!EtcdInstalled()) GTEST_SKIP() << kEtcdPath << " is not installed";
  TempDir dir;
  Cert cert = MakeCert(dir.path());
  // The self-signed certificate is its own CA: server and client use it.
  EtcdServer etcd(EtcdTls{cert.cert_file, cert.key_file, cert.cert_file});
  ASSERT_TRUE(etcd.Start());
  EtcdStoreOptions o;
  o.etcd.endpoints = {etcd.endpoint()};
  o.etcd.ca_file = cert.cert_file;
  o.etcd.cert_file = cert.cert_file;
  o.etcd.key_file = cert.key_file;
  auto s = EtcdStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE((*s)->PutSession(Row("t", "a", StoredState::kReady)).ok());
  EXPECT_EQ((*s)->LoadSessions()->size(), 1u);
  o.etcd.cert_file.clear();
  o.etcd.key_file.clear();
  EXPECT_FALSE(EtcdStore::Open(o).ok());  // no client certificate
  o.etcd.ca_file.clear();
  EXPECT_EQ(EtcdStore::Open(o).status().code(), absl::StatusCode::kUnavailable);  // unknown CA
}

// ---- a fake "etcd" answering garbage ----

class GarbageEtcd {
 public:
  GarbageEtcd() {
    server_.Post(".*", [this](const httplib::Request& req, httplib::Response& res) {
      absl::MutexLock l(&mu_);
      res.status = status_;
      res.set_content(body_, "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~GarbageEtcd() {
    server_.stop();
    thread_.join();
  }
  void Answer(int status, std::string body) {
    absl::MutexLock l(&mu_);
    status_ = status;
    body_ = std::move(body);
  }
  std::string endpoint() const { return absl::StrCat("http://127.0.0.1:", port_); }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  absl::Mutex mu_;
  int status_ = 200;
  std::string body_ = "{}";
};

TEST(EtcdGarbageTest, WrongJsonTypesAreCleanErrors) {
  GarbageEtcd fake;
  EtcdOptions o;
  o.endpoints = {fake.endpoint()};
  o.request_timeout = absl::Seconds(3);
  auto c = EtcdClient::Create(o);
  ASSERT_TRUE(c.ok());
  const std::vector<std::pair<int, std::string>> answers = {
      {200, "not json at all"},
      {200, "[]"},
      {200, "null"},
      {200, R"({"kvs":"nope"})"},
      {200, R"({"kvs":[5]})"},
      {200, R"({"kvs":[{"key":5}]})"},
      {200, R"({"kvs":[{"key":"!!notbase64"}]})"},
      {200, R"({"kvs":[{"key":"L3Av","mod_revision":{}}]})"},
      {200, R"({"kvs":[{"key":"L3Av","version":"12abc"}]})"},
      {200, R"({"header":"x"})"},
      {200, R"({"header":{"revision":[1]}})"},
      {200, R"({"more":"yes"})"},
      {200, R"({"succeeded":1,"responses":{}})"},
      {200, R"({"succeeded":true,"responses":[7]})"},
      {200, R"({"succeeded":true,"responses":[{"response_range":[]}]})"},
      {200, R"({"ID":"abc","TTL":true})"},
      {200, R"({"result":"x"})"},
      {200, R"({"result":{"TTL":{}}})"},
      {200, R"({"error":7})"},
      {200, R"({"deleted":"lots"})"},
      {500, "<html>oops</html>"},
      {503, R"({"code":"14"})"},
      {400, R"({"code":999,"message":"weird"})"},
  };
  // Whatever fails, fails with an "etcd: ..." status (never a crash).
  auto clean = [](const absl::Status& s) {
    return s.ok() || absl::StartsWith(s.message(), "etcd: ");
  };
  for (const auto& [status, body] : answers) {
    SCOPED_TRACE(body);
    fake.Answer(status, body);
    EXPECT_TRUE(clean((*c)->Get("/k").status()));
    EXPECT_TRUE(clean((*c)->GetPrefix("/p/").status()));
    EXPECT_TRUE(clean((*c)->Put("/k", "v").status()));
    EXPECT_TRUE(clean((*c)->Delete("/k").status()));
    auto txn = (*c)->Txn({EtcdCompare::Absent("/k")}, {EtcdOp::Get("/k")}, {EtcdOp::Get("/k")});
    EXPECT_FALSE(txn.ok());
    EXPECT_TRUE(clean(txn.status()));
    auto lease = (*c)->LeaseGrant(5);
    EXPECT_FALSE(lease.ok());
    EXPECT_TRUE(clean(lease.status()));
    auto ka = (*c)->LeaseKeepAlive(1);
    EXPECT_FALSE(ka.ok());
    EXPECT_TRUE(clean(ka.status()));
    EtcdStoreOptions so;
    so.etcd = o;
    EXPECT_FALSE(EtcdStore::Open(so).ok());
  }
  // Well-formed JSON of the wrong shape for one call is UNAVAILABLE, not a crash.
  fake.Answer(200, R"({"kvs":[{"key":5}]})");
  EXPECT_EQ((*c)->Get("/k").status().code(), absl::StatusCode::kUnavailable);
  // A key outside the range asked for is refused.
  fake.Answer(200, R"({"kvs":[{"key":"eg=="}]})");  // "z"
  EXPECT_EQ((*c)->GetPrefix("/p/").status().code(), absl::StatusCode::kUnavailable);
  // etcd's error JSON keeps etcd's code; an out-of-range code is UNKNOWN.
  fake.Answer(400, R"({"code":9,"message":"etcdserver: something"})");
  EXPECT_EQ((*c)->Get("/k").status().code(), absl::StatusCode::kFailedPrecondition);
  fake.Answer(400, R"({"code":999,"message":"weird"})");
  EXPECT_EQ((*c)->Get("/k").status().code(), absl::StatusCode::kUnknown);
}

TEST(EtcdGarbageTest, TokenFromAGarbageAuthServerIsAnError) {
  GarbageEtcd fake;
  EtcdOptions o;
  o.endpoints = {fake.endpoint()};
  o.username = "u";
  o.password = "pw-never-shown";
  auto c = EtcdClient::Create(o);
  ASSERT_TRUE(c.ok());
  for (const char* body : {R"({"token":5})", R"({"token":""})", "{}", "garbage"}) {
    fake.Answer(200, body);
    absl::Status s = (*c)->Authenticate();
    EXPECT_FALSE(s.ok()) << body;
    EXPECT_EQ(std::string(s.message()).find("pw-never-shown"), std::string::npos);
    EXPECT_FALSE((*c)->Get("/k").ok());
  }
}

}  // namespace
}  // namespace sandbox
