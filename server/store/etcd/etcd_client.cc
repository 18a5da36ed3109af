#include "server/store/etcd/etcd_client.h"

#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "adapters/http/http_client.h"
#include "common/base64.h"
#include "nlohmann/json.hpp"

namespace sandbox {
namespace {

using json = nlohmann::json;

std::string B64(const std::string& s) { return absl::Base64Escape(s); }
std::string I64(int64_t v) { return absl::StrCat(v); }

// Reads fields of etcd's JSON, validating each type; the first problem is
// kept (UNAVAILABLE: whatever answered is not speaking etcd's protocol).
class Reader {
 public:
  explicit Reader(std::string what) : what_(std::move(what)) {}

  int64_t Int(const json& o, const char* name) {
    auto it = o.find(name);
    if (it == o.end() || it->is_null()) return 0;
    if (it->is_number_integer()) return it->get<int64_t>();
    int64_t v = 0;
    if (it->is_string() && absl::SimpleAtoi(it->get_ref<const std::string&>(), &v)) return v;
    Fail(name, "an int64");
    return 0;
  }
  std::string Bytes(const json& o, const char* name) {
    auto it = o.find(name);
    if (it == o.end() || it->is_null()) return "";
    if (it->is_string()) {
      auto d = DecodeBase64Strict(it->get_ref<const std::string&>());
      if (d.ok()) return *std::move(d);
    }
    Fail(name, "base64");
    return "";
  }
  std::string String(const json& o, const char* name) {
    auto it = o.find(name);
    if (it == o.end() || it->is_null()) return "";
    if (it->is_string()) return it->get<std::string>();
    Fail(name, "a string");
    return "";
  }
  bool Bool(const json& o, const char* name) {
    auto it = o.find(name);
    if (it == o.end() || it->is_null()) return false;
    if (it->is_boolean()) return it->get<bool>();
    Fail(name, "a boolean");
    return false;
  }
  // nullptr when missing (an empty list); a non-array is an error.
  const json* Array(const json& o, const char* name) {
    auto it = o.find(name);
    if (it == o.end() || it->is_null()) return nullptr;
    if (it->is_array()) return &*it;
    Fail(name, "an array");
    return nullptr;
  }
  const json* Object(const json& o, const char* name) {
    auto it = o.find(name);
    if (it == o.end() || it->is_null()) return nullptr;
    if (it->is_object()) return &*it;
    Fail(name, "an object");
    return nullptr;
  }
  bool IsObject(const json& o, const char* name) {
    if (o.is_object()) return true;
    Fail(name, "an object");
    return false;
  }
  EtcdKv Kv(const json& o) {
    EtcdKv kv;
    if (!IsObject(o, "kvs[]")) return kv;
    kv.key = Bytes(o, "key");
    kv.value = Bytes(o, "value");
    kv.create_revision = Int(o, "create_revision");
    kv.mod_revision = Int(o, "mod_revision");
    kv.version = Int(o, "version");
    kv.lease = Int(o, "lease");
    return kv;
  }
  std::vector<EtcdKv> Kvs(const json& o) {
    std::vector<EtcdKv> out;
    if (const json* a = Array(o, "kvs")) {
      for (const json& e : *a) out.push_back(Kv(e));
    }
    return out;
  }
  int64_t HeaderRevision(const json& o) {
    const json* h = Object(o, "header");
    return h ? Int(*h, "revision") : 0;
  }

  bool ok() const { return status_.ok(); }
  const absl::Status& status() const { return status_; }

 private:
  void Fail(const char* name, const char* type) {
    if (!status_.ok()) return;
    status_ = absl::UnavailableError(
        absl::StrCat("etcd: malformed response to ", what_, ": \"", name, "\" is not ", type));
  }
  const std::string what_;
  absl::Status status_;
};

absl::StatusOr<json> ParseObject(const std::string& text, const std::string& what) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::UnavailableError(
        absl::StrCat("etcd: malformed response to ", what, ": not a JSON object"));
  }
  return j;
}

const char* TargetName(EtcdCompare::Target t) {
  switch (t) {
    case EtcdCompare::Target::kVersion:
      return "VERSION";
    case EtcdCompare::Target::kCreate:
      return "CREATE";
    case EtcdCompare::Target::kMod:
      return "MOD";
    case EtcdCompare::Target::kValue:
      return "VALUE";
    case EtcdCompare::Target::kLease:
      return "LEASE";
  }
  return "MOD";
}

const char* ResultName(EtcdCompare::Result r) {
  switch (r) {
    case EtcdCompare::Result::kEqual:
      return "EQUAL";
    case EtcdCompare::Result::kGreater:
      return "GREATER";
    case EtcdCompare::Result::kLess:
      return "LESS";
    case EtcdCompare::Result::kNotEqual:
      return "NOT_EQUAL";
  }
  return "EQUAL";
}

json CompareJson(const EtcdCompare& c) {
  json j = {
      {"key", B64(c.key)}, {"target", TargetName(c.target)}, {"result", ResultName(c.result)}};
  switch (c.target) {
    case EtcdCompare::Target::kVersion:
      j["version"] = I64(c.number);
      break;
    case EtcdCompare::Target::kCreate:
      j["create_revision"] = I64(c.number);
      break;
    case EtcdCompare::Target::kMod:
      j["mod_revision"] = I64(c.number);
      break;
    case EtcdCompare::Target::kLease:
      j["lease"] = I64(c.number);
      break;
    case EtcdCompare::Target::kValue:
      j["value"] = B64(c.value);
      break;
  }
  return j;
}

json RangeJson(const std::string& key, const std::string& range_end) {
  json j = {{"key", B64(key)}};
  if (!range_end.empty()) j["range_end"] = B64(range_end);
  return j;
}

json OpJson(const EtcdOp& op) {
  switch (op.type) {
    case EtcdOp::Type::kGet:
      return {{"request_range", RangeJson(op.key, op.range_end)}};
    case EtcdOp::Type::kDelete:
      return {{"request_delete_range", RangeJson(op.key, op.range_end)}};
    case EtcdOp::Type::kPut: {
      json p = {{"key", B64(op.key)}, {"value", B64(op.value)}};
      if (op.lease != 0) p["lease"] = I64(op.lease);
      return {{"request_put", p}};
    }
  }
  return json::object();
}

absl::StatusCode CodeFromGrpc(int64_t code) {
  if (code < 1 || code > 16) return absl::StatusCode::kUnknown;
  return static_cast<absl::StatusCode>(code);
}

}  // namespace

EtcdCompare EtcdCompare::ModRevision(std::string key, Result r, int64_t rev) {
  return {std::move(key), Target::kMod, r, rev, ""};
}
EtcdCompare EtcdCompare::CreateRevision(std::string key, Result r, int64_t rev) {
  return {std::move(key), Target::kCreate, r, rev, ""};
}
EtcdCompare EtcdCompare::Version(std::string key, Result r, int64_t version) {
  return {std::move(key), Target::kVersion, r, version, ""};
}
EtcdCompare EtcdCompare::Value(std::string key, Result r, std::string value) {
  return {std::move(key), Target::kValue, r, 0, std::move(value)};
}

EtcdOp EtcdOp::Get(std::string key) { return {Type::kGet, std::move(key), "", "", 0}; }
EtcdOp EtcdOp::Put(std::string key, std::string value, int64_t lease) {
  return {Type::kPut, std::move(key), "", std::move(value), lease};
}
EtcdOp EtcdOp::Delete(std::string key) { return {Type::kDelete, std::move(key), "", "", 0}; }
EtcdOp EtcdOp::DeletePrefix(const std::string& prefix) {
  return {Type::kDelete, prefix, EtcdClient::PrefixEnd(prefix), "", 0};
}

std::string EtcdClient::PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    unsigned char c = static_cast<unsigned char>(end.back());
    if (c < 0xff) {
      end.back() = static_cast<char>(c + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(EtcdOptions options) {
  if (options.endpoints.empty()) return absl::InvalidArgumentError("etcd: no endpoints");
  for (const std::string& e : options.endpoints) {
    if (!absl::StartsWith(e, "http://") && !absl::StartsWith(e, "https://")) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd: endpoint \"", e, "\" is not an http:// or https:// URL"));
    }
  }
  for (std::string& e : options.endpoints) {
    while (absl::EndsWith(e, "/")) e.pop_back();
  }
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(options)));
}

EtcdClient::EtcdClient(EtcdOptions options)
    : options_(std::move(options)), http_(std::make_unique<HttpClient>("sandbox-broker-etcd")) {}

EtcdClient::~EtcdClient() = default;

absl::StatusOr<std::string> EtcdClient::CallOnce(const std::string& endpoint,
                                                 const std::string& path, const std::string& body,
                                                 const std::string& token, bool* try_next) {
  *try_next = false;
  HttpRequest req;
  req.method = "POST";
  req.url = endpoint + path;
  req.body = body;
  req.headers.emplace_back("Content-Type", "application/json");
  if (!token.empty()) req.headers.emplace_back("Authorization", token);
  req.timeout = options_.request_timeout;
  req.max_response_bytes = size_t{64} << 20;
  req.ca_file = options_.ca_file;
  req.cert_file = options_.cert_file;
  req.key_file = options_.key_file;
  absl::StatusOr<HttpResponse> resp = http_->Send(req);
  if (!resp.ok()) {
    *try_next = IsConnectFailure(resp.status());
    return absl::UnavailableError(
        absl::StrCat("etcd: ", endpoint, path, ": ", resp.status().message()));
  }
  if (resp->status == 200) return std::move(resp->body);
  // etcd's error: {"error": ..., "message": ..., "code": <gRPC code>}.
  json j = json::parse(resp->body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("code") || !j["code"].is_number_integer()) {
    *try_next = resp->status == 502 || resp->status == 503 || resp->status == 504;
    return absl::UnavailableError(absl::StrCat("etcd: ", endpoint, path, " answered HTTP ",
                                               resp->status, " without etcd's error JSON"));
  }
  const int64_t code = j["code"].get<int64_t>();
  std::string message;
  if (j.contains("message") && j["message"].is_string()) message = j["message"];
  if (message.empty() && j.contains("error") && j["error"].is_string()) message = j["error"];
  // etcd's own UNAVAILABLE (no leader, stopping): another member may serve.
  *try_next = code == 14;
  return absl::Status(CodeFromGrpc(code), absl::StrCat("etcd: ", message));
}

absl::StatusOr<std::string> EtcdClient::FetchToken(const std::string& endpoint, bool* try_next) {
  const std::string body =
      json{{"name", options_.username}, {"password", options_.password}}.dump();
  absl::StatusOr<std::string> r = CallOnce(endpoint, "/v3/auth/authenticate", body, "", try_next);
  if (!r.ok()) {
    return absl::Status(r.status().code(),
                        absl::StrCat("etcd: authenticating as \"", options_.username,
                                     "\": ", r.status().message()));
  }
  absl::StatusOr<json> j = ParseObject(*r, "/v3/auth/authenticate");
  if (!j.ok()) return j.status();
  Reader rd("/v3/auth/authenticate");
  std::string token = rd.String(*j, "token");
  if (!rd.ok()) return rd.status();
  if (token.empty()) {
    return absl::UnavailableError("etcd: /v3/auth/authenticate answered no token");
  }
  return token;
}

absl::Status EtcdClient::Authenticate() {
  if (options_.username.empty()) return absl::OkStatus();
  const size_t n = options_.endpoints.size();
  size_t start;
  {
    absl::MutexLock l(&mu_);
    start = preferred_;
  }
  absl::Status last;
  for (size_t i = 0; i < n; ++i) {
    const size_t idx = (start + i) % n;
    bool try_next = false;
    absl::StatusOr<std::string> t = FetchToken(options_.endpoints[idx], &try_next);
    if (t.ok()) {
      absl::MutexLock l(&mu_);
      token_ = *std::move(t);
      preferred_ = idx;
      return absl::OkStatus();
    }
    last = t.status();
    if (!try_next) return last;
  }
  return absl::UnavailableError(
      absl::StrCat("etcd: no endpoint answered (", n, " tried); last: ", last.message()));
}

absl::StatusOr<std::string> EtcdClient::Call(const std::string& path, const std::string& body) {
  const bool auth = !options_.username.empty();
  const size_t n = options_.endpoints.size();
  absl::Status last = absl::UnavailableError("etcd: no endpoint");
  for (int attempt = 0; attempt < 2; ++attempt) {
    size_t start;
    std::string token;
    {
      absl::MutexLock l(&mu_);
      start = preferred_;
      token = token_;
    }
    bool reauth = false;
    for (size_t i = 0; i < n; ++i) {
      const size_t idx = (start + i) % n;
      const std::string& ep = options_.endpoints[idx];
      bool try_next = false;
      if (auth && token.empty()) {
        absl::StatusOr<std::string> t = FetchToken(ep, &try_next);
        if (!t.ok()) {
          last = t.status();
          if (try_next) continue;
          return last;
        }
        token = *std::move(t);
        absl::MutexLock l(&mu_);
        token_ = token;
        preferred_ = idx;
      }
      absl::StatusOr<std::string> r = CallOnce(ep, path, body, token, &try_next);
      if (r.ok()) {
        absl::MutexLock l(&mu_);
        preferred_ = idx;
        return r;
      }
      last = r.status();
      if (try_next) continue;
      if (auth && attempt == 0 && last.code() == absl::StatusCode::kUnauthenticated) {
        // The token expired (or the member restarted): get a new one, once.
        absl::MutexLock l(&mu_);
        if (token_ == token) token_.clear();
        reauth = true;
        break;
      }
      return last;
    }
    if (!reauth) break;
  }
  if (last.code() == absl::StatusCode::kUnavailable) {
    return absl::UnavailableError(
        absl::StrCat("etcd: no endpoint answered (", n, " tried); last: ", last.message()));
  }
  return last;
}

absl::StatusOr<std::optional<EtcdKv>> EtcdClient::Get(const std::string& key) {
  absl::StatusOr<std::string> r = Call("/v3/kv/range", RangeJson(key, "").dump());
  if (!r.ok()) return r.status();
  absl::StatusOr<json> j = ParseObject(*r, "/v3/kv/range");
  if (!j.ok()) return j.status();
  Reader rd("/v3/kv/range");
  std::vector<EtcdKv> kvs = rd.Kvs(*j);
  if (!rd.ok()) return rd.status();
  if (kvs.empty()) return std::optional<EtcdKv>();
  return std::optional<EtcdKv>(std::move(kvs.front()));
}

absl::StatusOr<std::vector<EtcdKv>> EtcdClient::GetPrefix(const std::string& prefix,
                                                          int64_t page_size) {
  if (page_size <= 0) page_size = 500;
  const std::string end = PrefixEnd(prefix);
  std::vector<EtcdKv> out;
  std::string from = prefix;
  int64_t revision = 0;
  for (;;) {
    json req = RangeJson(from, end);
    req["limit"] = I64(page_size);
    if (revision > 0) req["revision"] = I64(revision);
    absl::StatusOr<std::string> r = Call("/v3/kv/range", req.dump());
    if (!r.ok()) return r.status();
    absl::StatusOr<json> j = ParseObject(*r, "/v3/kv/range");
    if (!j.ok()) return j.status();
    Reader rd("/v3/kv/range");
    std::vector<EtcdKv> kvs = rd.Kvs(*j);
    const bool more = rd.Bool(*j, "more");
    if (revision == 0) revision = rd.HeaderRevision(*j);
    if (!rd.ok()) return rd.status();
    for (EtcdKv& kv : kvs) {
      if (kv.key < from || kv.key >= end) {
        return absl::UnavailableError("etcd: /v3/kv/range answered a key outside the range");
      }
    }
    if (kvs.empty()) break;
    from = kvs.back().key;
    from.push_back('\0');  // the next key after the last one
    for (EtcdKv& kv : kvs) out.push_back(std::move(kv));
    if (!more) break;
    if (revision <= 0) {
      return absl::UnavailableError("etcd: /v3/kv/range answered no header revision");
    }
  }
  return out;
}

absl::StatusOr<int64_t> EtcdClient::Put(const std::string& key, const std::string& value,
                                        int64_t lease) {
  json req = {{"key", B64(key)}, {"value", B64(value)}};
  if (lease != 0) req["lease"] = I64(lease);
  absl::StatusOr<std::string> r = Call("/v3/kv/put", req.dump());
  if (!r.ok()) return r.status();
  absl::StatusOr<json> j = ParseObject(*r, "/v3/kv/put");
  if (!j.ok()) return j.status();
  Reader rd("/v3/kv/put");
  int64_t rev = rd.HeaderRevision(*j);
  if (!rd.ok()) return rd.status();
  return rev;
}

namespace {
absl::StatusOr<int64_t> ParseDeleted(const absl::StatusOr<std::string>& r) {
  if (!r.ok()) return r.status();
  absl::StatusOr<json> j = ParseObject(*r, "/v3/kv/deleterange");
  if (!j.ok()) return j.status();
  Reader rd("/v3/kv/deleterange");
  int64_t n = rd.Int(*j, "deleted");
  if (!rd.ok()) return rd.status();
  return n;
}
}  // namespace

absl::StatusOr<int64_t> EtcdClient::Delete(const std::string& key) {
  return ParseDeleted(Call("/v3/kv/deleterange", RangeJson(key, "").dump()));
}

absl::StatusOr<int64_t> EtcdClient::DeletePrefix(const std::string& prefix) {
  return ParseDeleted(Call("/v3/kv/deleterange", RangeJson(prefix, PrefixEnd(prefix)).dump()));
}

absl::StatusOr<EtcdTxnResult> EtcdClient::Txn(const std::vector<EtcdCompare>& compares,
                                              const std::vector<EtcdOp>& success,
                                              const std::vector<EtcdOp>& failure) {
  json req = json::object();
  json c = json::array(), s = json::array(), f = json::array();
  for (const EtcdCompare& x : compares) c.push_back(CompareJson(x));
  for (const EtcdOp& x : success) s.push_back(OpJson(x));
  for (const EtcdOp& x : failure) f.push_back(OpJson(x));
  req["compare"] = std::move(c);
  req["success"] = std::move(s);
  req["failure"] = std::move(f);
  absl::StatusOr<std::string> r = Call("/v3/kv/txn", req.dump());
  if (!r.ok()) return r.status();
  absl::StatusOr<json> j = ParseObject(*r, "/v3/kv/txn");
  if (!j.ok()) return j.status();
  Reader rd("/v3/kv/txn");
  EtcdTxnResult out;
  out.succeeded = rd.Bool(*j, "succeeded");
  out.revision = rd.HeaderRevision(*j);
  const std::vector<EtcdOp>& ran = out.succeeded ? success : failure;
  if (const json* a = rd.Array(*j, "responses")) {
    for (const json& e : *a) {
      if (!rd.IsObject(e, "responses[]")) break;
      EtcdOpResult op;
      if (const json* g = rd.Object(e, "response_range")) {
        op.type = EtcdOp::Type::kGet;
        op.kvs = rd.Kvs(*g);
      } else if (const json* d = rd.Object(e, "response_delete_range")) {
        op.type = EtcdOp::Type::kDelete;
        op.deleted = rd.Int(*d, "deleted");
      } else if (rd.Object(e, "response_put") != nullptr) {
        op.type = EtcdOp::Type::kPut;
      } else if (rd.ok()) {
        // An empty PutResponse may come as {} (all defaults).
        op.type = EtcdOp::Type::kPut;
      }
      out.responses.push_back(std::move(op));
    }
  }
  if (!rd.ok()) return rd.status();
  if (out.responses.size() != ran.size()) {
    return absl::UnavailableError(absl::StrCat("etcd: /v3/kv/txn answered ", out.responses.size(),
                                               " responses for ", ran.size(), " operations"));
  }
  for (size_t i = 0; i < ran.size(); ++i) {
    if (out.responses[i].type != ran[i].type && ran[i].type != EtcdOp::Type::kPut) {
      return absl::UnavailableError("etcd: /v3/kv/txn answered mismatched responses");
    }
    out.responses[i].type = ran[i].type;
  }
  return out;
}

absl::StatusOr<EtcdLease> EtcdClient::LeaseGrant(int64_t ttl_seconds) {
  absl::StatusOr<std::string> r = Call("/v3/lease/grant", json{{"TTL", I64(ttl_seconds)}}.dump());
  if (!r.ok()) return r.status();
  absl::StatusOr<json> j = ParseObject(*r, "/v3/lease/grant");
  if (!j.ok()) return j.status();
  Reader rd("/v3/lease/grant");
  EtcdLease lease;
  lease.id = rd.Int(*j, "ID");
  lease.ttl_seconds = rd.Int(*j, "TTL");
  std::string error = rd.String(*j, "error");
  if (!rd.ok()) return rd.status();
  if (!error.empty()) return absl::UnavailableError(absl::StrCat("etcd: lease grant: ", error));
  if (lease.id == 0 || lease.ttl_seconds <= 0) {
    return absl::UnavailableError("etcd: /v3/lease/grant answered no lease");
  }
  return lease;
}

absl::StatusOr<int64_t> EtcdClient::LeaseKeepAlive(int64_t lease_id) {
  // A bidirectional stream through the gateway: one request object in, one
  // {"result": LeaseKeepAliveResponse} (or {"error": ...}) out.
  absl::StatusOr<std::string> r = Call("/v3/lease/keepalive", json{{"ID", I64(lease_id)}}.dump());
  if (!r.ok()) return r.status();
  // Streamed: possibly several newline-separated objects; the first counts.
  std::string first = *r;
  size_t nl = first.find('\n');
  if (nl != std::string::npos) first.resize(nl);
  absl::StatusOr<json> j = ParseObject(first, "/v3/lease/keepalive");
  if (!j.ok()) return j.status();
  Reader rd("/v3/lease/keepalive");
  if (const json* err = rd.Object(*j, "error")) {
    const int64_t code = rd.Int(*err, "code");
    std::string message = rd.String(*err, "message");
    if (!rd.ok()) return rd.status();
    return absl::Status(CodeFromGrpc(code), absl::StrCat("etcd: lease keepalive: ", message));
  }
  const json* res = rd.Object(*j, "result");
  if (!rd.ok()) return rd.status();
  if (res == nullptr) return absl::UnavailableError("etcd: /v3/lease/keepalive answered no result");
  const int64_t ttl = rd.Int(*res, "TTL");
  if (!rd.ok()) return rd.status();
  if (ttl <= 0) {
    return absl::NotFoundError(absl::StrCat("etcd: lease ", lease_id, " expired or revoked"));
  }
  return ttl;
}

absl::Status EtcdClient::LeaseRevoke(int64_t lease_id) {
  absl::StatusOr<std::string> r = Call("/v3/lease/revoke", json{{"ID", I64(lease_id)}}.dump());
  if (!r.ok() && r.status().code() == absl::StatusCode::kNotFound) return absl::OkStatus();
  if (!r.ok()) return r.status();
  return ParseObject(*r, "/v3/lease/revoke").status();
}

}  // namespace sandbox
