// The etcd session store; the key layout is in etcd_store.h.

#include "server/store/etcd/etcd_store.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <random>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base64.h"
#include "common/log.h"
#include "common/text.h"
#include "nlohmann/json.hpp"

namespace sandbox {
namespace {

using json = nlohmann::json;

constexpr char kSchemaVersion[] = "1";
constexpr size_t kChunk = 64;  // keys per transaction (etcd: --max-txn-ops 128)
constexpr size_t kChunkBytes = size_t{512} << 10;
constexpr int kUpdateAttempts = 32;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Reads a stored record's fields, validating types; the first problem wins.
class FieldReader {
 public:
  FieldReader(const std::string& key, const std::string& text) : key_(key) {
    j_ = json::parse(text, nullptr, false);
    if (j_.is_discarded() || !j_.is_object()) Fail("not a JSON object");
  }
  std::string Str(const char* name) {
    if (!status_.ok()) return "";
    auto it = j_.find(name);
    if (it == j_.end()) return "";
    if (!it->is_string()) Fail(absl::StrCat("\"", name, "\" is not a string"));
    return status_.ok() ? it->get<std::string>() : "";
  }
  int64_t Int(const char* name) {
    if (!status_.ok()) return 0;
    auto it = j_.find(name);
    if (it == j_.end()) return 0;
    if (!it->is_number_integer()) {
      Fail(absl::StrCat("\"", name, "\" is not an integer"));
      return 0;
    }
    return it->get<int64_t>();
  }
  double Double(const char* name) {
    if (!status_.ok()) return 0;
    auto it = j_.find(name);
    if (it == j_.end()) return 0;
    if (!it->is_number()) {
      Fail(absl::StrCat("\"", name, "\" is not a number"));
      return 0;
    }
    return it->get<double>();
  }
  std::string Bytes(const char* name) {
    std::string s = Str(name);
    if (!status_.ok()) return "";
    auto d = DecodeBase64Strict(s);
    if (!d.ok()) {
      Fail(absl::StrCat("\"", name, "\" is not base64"));
      return "";
    }
    return *std::move(d);
  }
  const absl::Status& status() const { return status_; }

 private:
  void Fail(const std::string& why) {
    if (status_.ok()) {
      status_ = absl::DataLossError(
          absl::StrCat("state: etcd key ", key_, " holds a malformed record: ", why));
    }
  }
  const std::string key_;
  json j_;
  absl::Status status_;
};

std::string SessionJson(const SessionRecord& r) {
  return Dump({{"tenant", r.tenant},
               {"session_id", r.session_id},
               {"provider", r.provider},
               {"attempt_id", r.attempt_id},
               {"sandbox_id", r.sandbox_id},
               {"state", static_cast<int>(r.state)},
               {"generation", r.generation},
               {"spec_json", r.spec_json},
               {"created_at_us", absl::ToUnixMicros(r.created_at)},
               {"last_active_us", absl::ToUnixMicros(r.last_active_at)},
               {"version", r.version}});
}

absl::StatusOr<SessionRecord> ParseSession(const std::string& key, const std::string& text) {
  FieldReader f(key, text);
  SessionRecord r;
  r.tenant = f.Str("tenant");
  r.session_id = f.Str("session_id");
  r.provider = f.Str("provider");
  r.attempt_id = f.Str("attempt_id");
  r.sandbox_id = f.Str("sandbox_id");
  const int64_t state = f.Int("state");
  r.generation = f.Int("generation");
  r.spec_json = f.Str("spec_json");
  r.created_at = absl::FromUnixMicros(f.Int("created_at_us"));
  r.last_active_at = absl::FromUnixMicros(f.Int("last_active_us"));
  r.version = f.Int("version");
  if (!f.status().ok()) return f.status();
  if (state < 0 || state > static_cast<int>(StoredState::kGone)) {
    return absl::DataLossError(absl::StrCat("state: etcd key ", key, " has a bad state"));
  }
  r.state = static_cast<StoredState>(state);
  return r;
}

std::string RunJson(const RunRecord& r) {
  return Dump({{"tenant", r.tenant},
               {"session_id", r.session_id},
               {"run_id", r.run_id},
               {"request_hash", r.request_hash},
               {"state", static_cast<int>(r.state)},
               {"status_code", r.status_code},
               {"status_message", r.status_message},
               {"result_b64", absl::Base64Escape(r.result)},
               {"started_us", absl::ToUnixMicros(r.started_at)},
               {"finished_us", absl::ToUnixMicros(r.finished_at)}});
}

absl::StatusOr<RunRecord> ParseRun(const std::string& key, const std::string& text) {
  FieldReader f(key, text);
  RunRecord r;
  r.tenant = f.Str("tenant");
  r.session_id = f.Str("session_id");
  r.run_id = f.Str("run_id");
  r.request_hash = f.Str("request_hash");
  const int64_t state = f.Int("state");
  r.status_code = static_cast<int>(f.Int("status_code"));
  r.status_message = f.Str("status_message");
  r.result = f.Bytes("result_b64");
  r.started_at = absl::FromUnixMicros(f.Int("started_us"));
  r.finished_at = absl::FromUnixMicros(f.Int("finished_us"));
  if (!f.status().ok()) return f.status();
  if (state != 0 && state != 1) {
    return absl::DataLossError(absl::StrCat("state: etcd key ", key, " has a bad run state"));
  }
  r.state = static_cast<RunState>(state);
  return r;
}

std::string UsageJson(const UsageRow& u) {
  const UsageCounters& c = u.counters;
  return Dump({{"tenant", u.tenant},
               {"provider", u.provider},
               {"sessions_created", c.sessions_created},
               {"runs", c.runs},
               {"run_seconds", c.run_seconds},
               {"sandbox_seconds", c.sandbox_seconds},
               {"cpu_seconds", c.cpu_seconds},
               {"output_bytes", c.output_bytes},
               {"file_transfer_bytes", c.file_transfer_bytes},
               {"oom_kills", c.oom_kills},
               {"quota_refusals", c.quota_refusals},
               {"egress_bytes", c.egress_bytes}});
}

absl::StatusOr<UsageRow> ParseUsage(const std::string& key, const std::string& text) {
  FieldReader f(key, text);
  UsageRow u;
  u.tenant = f.Str("tenant");
  u.provider = f.Str("provider");
  UsageCounters& c = u.counters;
  c.sessions_created = f.Int("sessions_created");
  c.runs = f.Int("runs");
  c.run_seconds = f.Double("run_seconds");
  c.sandbox_seconds = f.Double("sandbox_seconds");
  c.cpu_seconds = f.Double("cpu_seconds");
  c.output_bytes = f.Int("output_bytes");
  c.file_transfer_bytes = f.Int("file_transfer_bytes");
  c.oom_kills = f.Int("oom_kills");
  c.quota_refusals = f.Int("quota_refusals");
  c.egress_bytes = f.Int("egress_bytes");  // absent in rows from before
  if (!f.status().ok()) return f.status();
  return u;
}

absl::StatusOr<SessionOwner> ParseOwner(const EtcdKv& kv) {
  FieldReader f(kv.key, kv.value);
  SessionOwner o;
  o.member_id = f.Str("member_id");
  o.lease = f.Int("lease");
  if (!f.status().ok()) return f.status();
  o.fence = kv.mod_revision;
  return o;
}

absl::Status Stale(const std::string& tenant, const std::string& id, int64_t fence,
                   const EtcdTxnResult& r) {
  std::string now = "gone";
  if (!r.responses.empty() && !r.responses[0].kvs.empty()) {
    now = absl::StrCat("at revision ", r.responses[0].kvs[0].mod_revision);
  }
  return OwnershipLost(absl::StrCat("state: fencing token stale for session ", tenant, "/", id,
                                    " (token ", fence, "; owner key ", now, ")"));
}

absl::Status CheckFence(int64_t fence) {
  // mod_revision 0 would match an absent owner key.
  if (fence <= 0) return absl::InvalidArgumentError("state: fencing token must be > 0");
  return absl::OkStatus();
}

}  // namespace

std::string EtcdKeyComponent(const std::string& s) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (c == '%' || c == '/' || c < 0x20 || c >= 0x7f) {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

// ---- EtcdMember -------------------------------------------------------------

EtcdMember::EtcdMember(EtcdStore* store, std::string id, int64_t lease, int64_t ttl_seconds)
    : store_(store), id_(std::move(id)), lease_(lease), ttl_seconds_(ttl_seconds) {}

EtcdMember::~EtcdMember() {
  StopKeepAlive();
  (void)Leave();
}

void EtcdMember::Run() {
  const absl::Duration period = absl::Milliseconds(ttl_seconds_ * 1000 / 3);
  while (!stop_.WaitForNotificationWithTimeout(period)) {
    absl::Status s = KeepAliveOnce();
    if (lost()) return;
    (void)s;  // transient (etcd unreachable): try again next period
  }
}

absl::Status EtcdMember::KeepAliveOnce() {
  if (lost()) return absl::NotFoundError(absl::StrCat("state: member ", id_, " expired"));
  absl::StatusOr<int64_t> ttl = store_->client()->LeaseKeepAlive(lease_);
  if (ttl.ok()) return absl::OkStatus();
  if (ttl.status().code() == absl::StatusCode::kNotFound) {
    lost_.store(true);
    store_->MemberGone(id_, lease_);
    Log(LogLevel::kWarning, "state.etcd.lease_lost",
        {{"holder", id_},
         {"lease", lease_},
         {"message", "the lease expired (etcd unreachable for longer than its TTL?)"}});
  }
  return ttl.status();
}

void EtcdMember::StopKeepAlive() {
  absl::MutexLock l(&stop_mu_);
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

absl::Status EtcdMember::Leave() {
  if (left_.exchange(true)) return absl::OkStatus();
  StopKeepAlive();
  store_->MemberGone(id_, lease_);
  absl::Status s = store_->client()->LeaseRevoke(lease_);
  if (!s.ok()) left_.store(false);
  return s;
}

// ---- EtcdStore --------------------------------------------------------------

EtcdStore::EtcdStore(EtcdStoreOptions options, std::unique_ptr<EtcdClient> client)
    : options_(std::move(options)), prefix_(options_.prefix), client_(std::move(client)) {}

EtcdStore::~EtcdStore() = default;

absl::StatusOr<std::unique_ptr<EtcdStore>> EtcdStore::Open(EtcdStoreOptions options) {
  if (options.prefix.empty() || options.prefix.front() != '/') {
    return absl::InvalidArgumentError("state.etcd.prefix: must start with '/'");
  }
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(options.etcd);
  if (!client.ok()) return client.status();
  std::unique_ptr<EtcdStore> store(new EtcdStore(std::move(options), *std::move(client)));
  absl::Status s = store->Init();
  if (!s.ok()) return s;
  return store;
}

absl::Status EtcdStore::Init() {
  const std::string schema_key = prefix_ + "meta/schema_version";
  const std::string dep_key = prefix_ + "meta/deployment_id";
  const std::string created_key = prefix_ + "meta/created_at_us";
  absl::StatusOr<EtcdTxnResult> r =
      client_->Txn({EtcdCompare::Absent(schema_key)},
                   {EtcdOp::Put(schema_key, kSchemaVersion),
                    EtcdOp::Put(dep_key, absl::StrCat("dep-", RandomHex(8))),
                    EtcdOp::Put(created_key, absl::StrCat(absl::ToUnixMicros(absl::Now())))},
                   {EtcdOp::Get(schema_key), EtcdOp::Get(dep_key), EtcdOp::Get(created_key)});
  if (!r.ok()) return r.status();
  std::string schema = kSchemaVersion, dep, created;
  if (r->succeeded) {
    absl::StatusOr<EtcdTxnResult> g =
        client_->Txn({}, {EtcdOp::Get(schema_key), EtcdOp::Get(dep_key), EtcdOp::Get(created_key)});
    if (!g.ok()) return g.status();
    r = std::move(g);
  }
  auto value = [&](size_t i) {
    return r->responses[i].kvs.empty() ? std::string() : r->responses[i].kvs[0].value;
  };
  schema = value(0);
  dep = value(1);
  created = value(2);
  if (schema != kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat("state: etcd prefix ", prefix_,
                                                      " has schema version \"", schema,
                                                      "\", this broker knows ", kSchemaVersion));
  }
  int64_t us = 0;
  if (dep.empty() || !absl::SimpleAtoi(created, &us)) {
    return absl::FailedPreconditionError(
        absl::StrCat("state: etcd prefix ", prefix_, " has a bad deployment_id or created_at_us"));
  }
  created_at_ = absl::FromUnixMicros(us);
  absl::MutexLock l(&mu_);
  deployment_id_ = dep;
  return absl::OkStatus();
}

std::string EtcdStore::deployment_id() const {
  absl::MutexLock l(&mu_);
  return deployment_id_;
}

absl::Status EtcdStore::SetDeploymentId(const std::string& id) {
  absl::StatusOr<int64_t> r = client_->Put(prefix_ + "meta/deployment_id", id);
  if (!r.ok()) return r.status();
  absl::MutexLock l(&mu_);
  deployment_id_ = id;
  return absl::OkStatus();
}

std::string EtcdStore::SessionKey(const std::string& tenant, const std::string& id) const {
  return absl::StrCat(prefix_, "sessions/", EtcdKeyComponent(tenant), "/", EtcdKeyComponent(id));
}
std::string EtcdStore::RunsPrefix(const std::string& tenant, const std::string& id) const {
  return absl::StrCat(prefix_, "runs/", EtcdKeyComponent(tenant), "/", EtcdKeyComponent(id), "/");
}
std::string EtcdStore::RunKey(const std::string& tenant, const std::string& id,
                              const std::string& run_id) const {
  return RunsPrefix(tenant, id) + EtcdKeyComponent(run_id);
}
std::string EtcdStore::UsageKey(const std::string& tenant, const std::string& provider) const {
  return absl::StrCat(prefix_, "usage/", EtcdKeyComponent(tenant), "/", EtcdKeyComponent(provider));
}
std::string EtcdStore::MemberKey(const std::string& id) const {
  return absl::StrCat(prefix_, "members/", EtcdKeyComponent(id));
}
std::string EtcdStore::OwnerKey(const std::string& tenant, const std::string& id) const {
  return absl::StrCat(prefix_, "owners/", EtcdKeyComponent(tenant), "/", EtcdKeyComponent(id));
}

absl::StatusOr<std::vector<SessionRecord>> EtcdStore::LoadSessions() {
  return LoadTenantSessions("");
}

absl::Status EtcdStore::PutSession(const SessionRecord& record) {
  return client_->Put(SessionKey(record.tenant, record.session_id), SessionJson(record)).status();
}

absl::Status EtcdStore::PutSessions(const std::vector<SessionRecord>& records) {
  // Chunks of at most kChunk keys and about kChunkBytes (etcd refuses
  // requests over --max-request-bytes, 1.5 MiB by default).
  std::vector<EtcdOp> ops;
  size_t bytes = 0;
  auto flush = [&]() -> absl::Status {
    if (ops.empty()) return absl::OkStatus();
    absl::StatusOr<EtcdTxnResult> r = client_->Txn({}, ops);
    ops.clear();
    bytes = 0;
    return r.status();
  };
  for (const SessionRecord& rec : records) {
    EtcdOp op = EtcdOp::Put(SessionKey(rec.tenant, rec.session_id), SessionJson(rec));
    const size_t size = op.key.size() + op.value.size();
    if (!ops.empty() && (ops.size() >= kChunk || bytes + size > kChunkBytes)) {
      if (absl::Status s = flush(); !s.ok()) return s;
    }
    bytes += size;
    ops.push_back(std::move(op));
  }
  return flush();
}

absl::Status EtcdStore::DeleteSession(const std::string& tenant, const std::string& id) {
  return client_
      ->Txn({},
            {EtcdOp::Delete(SessionKey(tenant, id)), EtcdOp::DeletePrefix(RunsPrefix(tenant, id))})
      .status();
}

absl::Status EtcdStore::UpdateKeys(
    const std::vector<std::string>& keys,
    const std::function<std::optional<std::string>(size_t, const std::optional<std::string>&)>&
        update) {
  size_t window = kChunk;  // halved while the write would be over kChunkBytes
  for (size_t i = 0; i < keys.size();) {
    const size_t end = std::min(keys.size(), i + window);
    bool done = false;
    bool too_big = false;
    for (int attempt = 0; attempt < kUpdateAttempts && !done && !too_big; ++attempt) {
      std::vector<EtcdOp> gets;
      for (size_t j = i; j < end; ++j) gets.push_back(EtcdOp::Get(keys[j]));
      absl::StatusOr<EtcdTxnResult> read = client_->Txn({}, gets);
      if (!read.ok()) return read.status();
      std::vector<EtcdCompare> compares;
      std::vector<EtcdOp> puts;
      size_t bytes = 0;
      for (size_t j = i; j < end; ++j) {
        const EtcdOpResult& got = read->responses[j - i];
        std::optional<std::string> old;
        if (!got.kvs.empty()) old = got.kvs[0].value;
        std::optional<std::string> next = update(j, old);
        if (!next.has_value()) continue;
        compares.push_back(old.has_value()
                               ? EtcdCompare::ModRevision(keys[j], EtcdCompare::Result::kEqual,
                                                          got.kvs[0].mod_revision)
                               : EtcdCompare::Absent(keys[j]));
        bytes += keys[j].size() + next->size();
        puts.push_back(EtcdOp::Put(keys[j], *std::move(next)));
      }
      if (bytes > kChunkBytes && end - i > 1) {
        too_big = true;  // fewer keys per transaction, same start
        break;
      }
      if (puts.empty()) {
        done = true;
        break;
      }
      absl::StatusOr<EtcdTxnResult> w = client_->Txn(compares, puts);
      if (!w.ok()) return w.status();
      done = w->succeeded;
      if (!done) {
        // Another writer (a peer replica's usage flush) won the race: back
        // off a random few milliseconds, so two writers in step part ways.
        thread_local std::minstd_rand rng(std::random_device{}());
        const int cap_ms = std::min(2 << std::min(attempt, 4), 32);
        absl::SleepFor(absl::Milliseconds(1 + static_cast<int>(rng() % cap_ms)));
      }
    }
    if (too_big) {
      window = std::max<size_t>(1, (end - i) / 2);
      continue;
    }
    if (!done) {
      return absl::AbortedError(absl::StrCat("state: etcd: keys kept changing during a ",
                                             kUpdateAttempts, "-attempt read-modify-write"));
    }
    i = end;
  }
  return absl::OkStatus();
}

absl::Status EtcdStore::TouchSessions(const std::vector<Touch>& touches) {
  std::vector<std::string> keys;
  keys.reserve(touches.size());
  for (const Touch& t : touches) keys.push_back(SessionKey(t.tenant, t.session_id));
  return UpdateKeys(
      keys, [&](size_t i, const std::optional<std::string>& old) -> std::optional<std::string> {
        if (!old.has_value()) return std::nullopt;  // gone: nothing to touch
        absl::StatusOr<SessionRecord> r = ParseSession(keys[i], *old);
        if (!r.ok()) return std::nullopt;  // left for LoadSessions to report
        r->last_active_at = touches[i].last_active_at;
        return SessionJson(*r);
      });
}

absl::StatusOr<std::vector<RunRecord>> EtcdStore::LoadRuns() {
  absl::StatusOr<std::vector<EtcdKv>> kvs =
      client_->GetPrefix(prefix_ + "runs/", options_.page_size);
  if (!kvs.ok()) return kvs.status();
  std::vector<RunRecord> out;
  out.reserve(kvs->size());
  for (const EtcdKv& kv : *kvs) {
    absl::StatusOr<RunRecord> r = ParseRun(kv.key, kv.value);
    if (!r.ok()) return r.status();
    out.push_back(*std::move(r));
  }
  return out;
}

absl::Status EtcdStore::PutRun(const RunRecord& record) {
  return client_->Put(RunKey(record.tenant, record.session_id, record.run_id), RunJson(record))
      .status();
}

absl::Status EtcdStore::DeleteRun(const std::string& tenant, const std::string& id,
                                  const std::string& run_id) {
  return client_->Delete(RunKey(tenant, id, run_id)).status();
}

absl::Status EtcdStore::AddUsage(const std::vector<UsageRow>& deltas) {
  std::map<std::pair<std::string, std::string>, UsageCounters> sum;
  for (const UsageRow& d : deltas) sum[{d.tenant, d.provider}].Add(d.counters);
  std::vector<std::string> keys;
  std::vector<UsageRow> rows;
  for (const auto& [k, c] : sum) {
    keys.push_back(UsageKey(k.first, k.second));
    rows.push_back(UsageRow{k.first, k.second, c});
  }
  absl::Status bad;
  absl::Status s = UpdateKeys(
      keys, [&](size_t i, const std::optional<std::string>& old) -> std::optional<std::string> {
        UsageRow total{rows[i].tenant, rows[i].provider, {}};
        if (old.has_value()) {
          absl::StatusOr<UsageRow> prev = ParseUsage(keys[i], *old);
          if (!prev.ok()) {
            bad = prev.status();  // never overwrite totals we cannot read
            return std::nullopt;
          }
          total.counters = prev->counters;
        }
        total.counters.Add(rows[i].counters);
        return UsageJson(total);
      });
  if (!s.ok()) return s;
  return bad;
}

absl::StatusOr<std::vector<UsageRow>> EtcdStore::LoadUsage() {
  absl::StatusOr<std::vector<EtcdKv>> kvs =
      client_->GetPrefix(prefix_ + "usage/", options_.page_size);
  if (!kvs.ok()) return kvs.status();
  std::vector<UsageRow> out;
  for (const EtcdKv& kv : *kvs) {
    absl::StatusOr<UsageRow> r = ParseUsage(kv.key, kv.value);
    if (!r.ok()) return r.status();
    out.push_back(*std::move(r));
  }
  return out;
}

// ---- cluster primitives -----------------------------------------------------

absl::StatusOr<std::unique_ptr<EtcdMember>> EtcdStore::HoldKey(const std::string& key,
                                                               const std::string& member_id,
                                                               const std::string& value,
                                                               absl::Duration ttl,
                                                               bool background_keepalive) {
  const int64_t ttl_s =
      std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1))));
  absl::StatusOr<EtcdLease> lease = client_->LeaseGrant(ttl_s);
  if (!lease.ok()) return lease.status();
  absl::StatusOr<EtcdTxnResult> r = client_->Txn(
      {EtcdCompare::Absent(key)}, {EtcdOp::Put(key, value, lease->id)}, {EtcdOp::Get(key)});
  if (!r.ok() || !r->succeeded) {
    (void)client_->LeaseRevoke(lease->id);
    if (!r.ok()) return r.status();
    return absl::AlreadyExistsError(absl::StrCat("state: etcd key ", key, " is held"));
  }
  if (!member_id.empty()) {
    absl::MutexLock l(&mu_);
    members_[member_id] = lease->id;
  }
  std::unique_ptr<EtcdMember> m(
      new EtcdMember(this, member_id.empty() ? key : member_id, lease->id, lease->ttl_seconds));
  if (background_keepalive) m->thread_ = std::thread([p = m.get()] { p->Run(); });
  return m;
}

absl::StatusOr<std::unique_ptr<EtcdMember>> EtcdStore::RegisterMember(
    const std::string& id, const std::string& advertise_address, absl::Duration ttl,
    bool background_keepalive) {
  if (id.empty()) return absl::InvalidArgumentError("state: member id is empty");
  auto m = HoldKey(MemberKey(id), id, Dump({{"id", id}, {"advertise_address", advertise_address}}),
                   ttl, background_keepalive);
  if (m.status().code() == absl::StatusCode::kAlreadyExists) {
    return absl::AlreadyExistsError(absl::StrCat(
        "state: member id ", id,
        " is registered by a live replica (a crashed one's registration expires with its lease)"));
  }
  return m;
}

absl::StatusOr<std::unique_ptr<EtcdMember>> EtcdStore::LockPrefix(const std::string& holder,
                                                                  absl::Duration ttl,
                                                                  absl::Duration wait) {
  const std::string key = prefix_ + "lock";
  const absl::Time deadline = absl::Now() + wait;
  for (;;) {
    auto m = HoldKey(key, "", Dump({{"holder", holder}, {"pid", static_cast<int64_t>(getpid())}}),
                     ttl, /*background_keepalive=*/true);
    if (m.ok() || m.status().code() != absl::StatusCode::kAlreadyExists) return m;
    if (absl::Now() >= deadline) {
      std::string who = "another broker";
      auto kv = client_->Get(key);
      if (kv.ok() && kv->has_value()) who = (*kv)->value;
      return absl::FailedPreconditionError(absl::StrCat(
          "state: etcd prefix ", prefix_, " is in use by ", who,
          " (one broker per prefix until replicas are supported; a crashed broker's hold "
          "expires after state.etcd.member_ttl_seconds)"));
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

void EtcdStore::MemberGone(const std::string& id, int64_t lease) {
  absl::MutexLock l(&mu_);
  auto it = members_.find(id);
  if (it != members_.end() && it->second == lease) members_.erase(it);
}

absl::StatusOr<std::vector<MemberInfo>> EtcdStore::ListMembers() {
  absl::StatusOr<std::vector<EtcdKv>> kvs =
      client_->GetPrefix(prefix_ + "members/", options_.page_size);
  if (!kvs.ok()) return kvs.status();
  std::vector<MemberInfo> out;
  for (const EtcdKv& kv : *kvs) {
    FieldReader f(kv.key, kv.value);
    MemberInfo m;
    m.id = f.Str("id");
    m.advertise_address = f.Str("advertise_address");
    if (!f.status().ok()) return f.status();
    m.lease = kv.lease;
    out.push_back(std::move(m));
  }
  return out;
}

absl::StatusOr<ClaimResult> EtcdStore::ClaimSession(const std::string& tenant,
                                                    const std::string& id,
                                                    const std::string& member_id) {
  int64_t lease = 0;
  {
    absl::MutexLock l(&mu_);
    auto it = members_.find(member_id);
    if (it == members_.end()) {
      return OwnershipLost(
          absl::StrCat("state: ", member_id, " is not a live member registered here"));
    }
    lease = it->second;
  }
  const std::string key = OwnerKey(tenant, id);
  absl::StatusOr<EtcdTxnResult> r =
      client_->Txn({EtcdCompare::Absent(key)},
                   {EtcdOp::Put(key, Dump({{"member_id", member_id}, {"lease", lease}}), lease)},
                   {EtcdOp::Get(key)});
  if (!r.ok()) {
    if (r.status().code() == absl::StatusCode::kNotFound) {  // the lease is gone
      MemberGone(member_id, lease);
      return absl::FailedPreconditionError(
          absl::StrCat("state: member ", member_id, "'s lease expired"));
    }
    return r.status();
  }
  ClaimResult out;
  if (r->succeeded) {
    out.claimed = true;
    out.owner = SessionOwner{member_id, lease, r->revision};
    return out;
  }
  if (r->responses.empty() || r->responses[0].kvs.empty()) {
    return absl::AbortedError("state: owner key changed during the claim; try again");
  }
  absl::StatusOr<SessionOwner> owner = ParseOwner(r->responses[0].kvs[0]);
  if (!owner.ok()) return owner.status();
  out.owner = *std::move(owner);
  out.claimed = out.owner.member_id == member_id && out.owner.lease == lease;
  return out;
}

absl::StatusOr<std::optional<SessionOwner>> EtcdStore::GetOwner(const std::string& tenant,
                                                                const std::string& id) {
  absl::StatusOr<std::optional<EtcdKv>> kv = client_->Get(OwnerKey(tenant, id));
  if (!kv.ok()) return kv.status();
  if (!kv->has_value()) return std::optional<SessionOwner>();
  absl::StatusOr<SessionOwner> o = ParseOwner(**kv);
  if (!o.ok()) return o.status();
  return std::optional<SessionOwner>(*std::move(o));
}

absl::Status EtcdStore::PutSessionFenced(const SessionRecord& record, int64_t fence) {
  if (absl::Status s = CheckFence(fence); !s.ok()) return s;
  const std::string owner = OwnerKey(record.tenant, record.session_id);
  absl::StatusOr<EtcdTxnResult> r =
      client_->Txn({EtcdCompare::ModRevision(owner, EtcdCompare::Result::kEqual, fence)},
                   {EtcdOp::Put(SessionKey(record.tenant, record.session_id), SessionJson(record))},
                   {EtcdOp::Get(owner)});
  if (!r.ok()) return r.status();
  if (!r->succeeded) return Stale(record.tenant, record.session_id, fence, *r);
  return absl::OkStatus();
}

absl::Status EtcdStore::DeleteSessionFenced(const std::string& tenant, const std::string& id,
                                            int64_t fence) {
  if (absl::Status s = CheckFence(fence); !s.ok()) return s;
  const std::string owner = OwnerKey(tenant, id);
  absl::StatusOr<EtcdTxnResult> r = client_->Txn(
      {EtcdCompare::ModRevision(owner, EtcdCompare::Result::kEqual, fence)},
      {EtcdOp::Delete(SessionKey(tenant, id)), EtcdOp::DeletePrefix(RunsPrefix(tenant, id))},
      {EtcdOp::Get(owner)});
  if (!r.ok()) return r.status();
  if (!r->succeeded) return Stale(tenant, id, fence, *r);
  return absl::OkStatus();
}

absl::Status EtcdStore::ReleaseSession(const std::string& tenant, const std::string& id,
                                       int64_t fence) {
  if (absl::Status s = CheckFence(fence); !s.ok()) return s;
  const std::string owner = OwnerKey(tenant, id);
  absl::StatusOr<EtcdTxnResult> r =
      client_->Txn({EtcdCompare::ModRevision(owner, EtcdCompare::Result::kEqual, fence)},
                   {EtcdOp::Delete(owner)}, {EtcdOp::Get(owner)});
  if (!r.ok()) return r.status();
  if (!r->succeeded) return Stale(tenant, id, fence, *r);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<SessionRecord>> EtcdStore::LoadSession(const std::string& tenant,
                                                                    const std::string& id) {
  const std::string key = SessionKey(tenant, id);
  absl::StatusOr<std::optional<EtcdKv>> kv = client_->Get(key);
  if (!kv.ok()) return kv.status();
  if (!kv->has_value()) return std::optional<SessionRecord>();
  absl::StatusOr<SessionRecord> r = ParseSession(key, (*kv)->value);
  if (!r.ok()) return r.status();
  return std::optional<SessionRecord>(*std::move(r));
}

absl::StatusOr<std::vector<SessionRecord>> EtcdStore::LoadTenantSessions(
    const std::string& tenant) {
  const std::string under = tenant.empty()
                                ? absl::StrCat(prefix_, "sessions/")
                                : absl::StrCat(prefix_, "sessions/", EtcdKeyComponent(tenant), "/");
  absl::StatusOr<std::vector<EtcdKv>> kvs = client_->GetPrefix(under, options_.page_size);
  if (!kvs.ok()) return kvs.status();
  std::vector<SessionRecord> out;
  out.reserve(kvs->size());
  for (const EtcdKv& kv : *kvs) {
    absl::StatusOr<SessionRecord> r = ParseSession(kv.key, kv.value);
    if (!r.ok()) return r.status();
    out.push_back(*std::move(r));
  }
  return out;
}

absl::StatusOr<absl::flat_hash_map<std::string, SessionOwner>> EtcdStore::LoadOwners(
    const std::string& tenant) {
  const std::string under = tenant.empty()
                                ? absl::StrCat(prefix_, "owners/")
                                : absl::StrCat(prefix_, "owners/", EtcdKeyComponent(tenant), "/");
  absl::StatusOr<std::vector<EtcdKv>> kvs = client_->GetPrefix(under, options_.page_size);
  if (!kvs.ok()) return kvs.status();
  absl::flat_hash_map<std::string, SessionOwner> out;
  for (const EtcdKv& kv : *kvs) {
    absl::StatusOr<SessionOwner> o = ParseOwner(kv);
    if (!o.ok()) return o.status();
    out[kv.key] = *std::move(o);
  }
  return out;
}

}  // namespace sandbox
