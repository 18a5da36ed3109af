#pragma once

// A small etcd v3 client over etcd's JSON gateway (grpc-gateway; served by
// etcd 3.4 on its client URLs under /v3/...) and our libcurl HttpClient.
//
// Why the gateway and not gRPC stubs: it needs no code generation from the
// golang-etcd-server-dev protos (and no stripping of their gogoproto/http
// annotations), no gRPC in the store's link line, and it reuses the HTTP
// client (pooling, TLS, timeouts) the providers already use. The cost: JSON
// and base64 on the wire, and lease keepalive as one request per renewal.
//
// Wire facts (etcd 3.4, embed/serve.go + grpc-gateway JSONPb{OrigName}):
// field names are the proto names (snake_case, "ID"/"TTL" as declared),
// int64 fields are JSON strings, bytes are base64, enums are names, and
// fields at their default value are omitted (a failed txn has no
// "succeeded"; an empty range has no "kvs"). Errors come as a non-200
// status with {"error","message","code"} (code: a gRPC status code).
//
// Errors: UNAVAILABLE when no endpoint answers (or one answers something
// that is not etcd's JSON); otherwise etcd's own gRPC code with its message.
// Secrets (password, token) never appear in errors or logs. Thread-safe.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace sandbox {

class HttpClient;

struct EtcdOptions {
  // http://host:port or https://host:port; tried in order, starting with the
  // last one that answered.
  std::vector<std::string> endpoints;
  // TLS (https endpoints): CA bundle, client certificate and key (PEM files).
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  // etcd auth: with a username, Authenticate() gets a token (again when it
  // expires). The password is kept in memory only.
  std::string username;
  std::string password;
  // Per request, per endpoint.
  absl::Duration request_timeout = absl::Seconds(5);
};

struct EtcdKv {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

// One comparison of a transaction (etcdserverpb.Compare).
struct EtcdCompare {
  enum class Target { kVersion, kCreate, kMod, kValue, kLease };
  enum class Result { kEqual, kGreater, kLess, kNotEqual };
  std::string key;
  Target target = Target::kMod;
  Result result = Result::kEqual;
  int64_t number = 0;  // for kVersion, kCreate, kMod, kLease
  std::string value;   // for kValue

  static EtcdCompare ModRevision(std::string key, Result r, int64_t rev);
  static EtcdCompare CreateRevision(std::string key, Result r, int64_t rev);
  static EtcdCompare Version(std::string key, Result r, int64_t version);
  static EtcdCompare Value(std::string key, Result r, std::string value);
  // The key does not exist (create_revision == 0).
  static EtcdCompare Absent(std::string key) {
    return CreateRevision(std::move(key), Result::kEqual, 0);
  }
};

// One operation of a transaction (etcdserverpb.RequestOp).
struct EtcdOp {
  enum class Type { kGet, kPut, kDelete };
  Type type = Type::kGet;
  std::string key;
  std::string range_end;  // kGet/kDelete: "" = the key alone
  std::string value;      // kPut
  int64_t lease = 0;      // kPut

  static EtcdOp Get(std::string key);
  static EtcdOp Put(std::string key, std::string value, int64_t lease = 0);
  static EtcdOp Delete(std::string key);
  static EtcdOp DeletePrefix(const std::string& prefix);
};

// One operation's response, in the order of the ops that ran.
struct EtcdOpResult {
  EtcdOp::Type type = EtcdOp::Type::kGet;
  std::vector<EtcdKv> kvs;  // kGet
  int64_t deleted = 0;      // kDelete
};

struct EtcdTxnResult {
  bool succeeded = false;
  int64_t revision = 0;                 // the store's revision after the txn
  std::vector<EtcdOpResult> responses;  // of success (or failure) ops
};

struct EtcdLease {
  int64_t id = 0;
  int64_t ttl_seconds = 0;
};

class EtcdClient {
 public:
  // INVALID_ARGUMENT for no endpoints or one that is not http(s)://.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(EtcdOptions options);
  ~EtcdClient();

  // The key, or nullopt.
  absl::StatusOr<std::optional<EtcdKv>> Get(const std::string& key);
  // Every key under `prefix`, in key order, read in pages of `page_size`
  // keys all at the revision of the first page (one consistent snapshot).
  absl::StatusOr<std::vector<EtcdKv>> GetPrefix(const std::string& prefix, int64_t page_size = 500);
  // Returns the revision of the write.
  absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value, int64_t lease = 0);
  // Returns how many keys went.
  absl::StatusOr<int64_t> Delete(const std::string& key);
  absl::StatusOr<int64_t> DeletePrefix(const std::string& prefix);
  // If every compare holds, runs `success`, else `failure`, atomically.
  // etcd limits each list to --max-txn-ops (default 128).
  absl::StatusOr<EtcdTxnResult> Txn(const std::vector<EtcdCompare>& compares,
                                    const std::vector<EtcdOp>& success,
                                    const std::vector<EtcdOp>& failure = {});

  absl::StatusOr<EtcdLease> LeaseGrant(int64_t ttl_seconds);
  // One renewal; returns the new TTL. NOT_FOUND when the lease expired (or
  // was revoked).
  absl::StatusOr<int64_t> LeaseKeepAlive(int64_t lease_id);
  // Revoking a missing lease is OK.
  absl::Status LeaseRevoke(int64_t lease_id);

  // Fetches a token now (also done lazily by the first call). OK without a
  // username.
  absl::Status Authenticate();

  // The smallest key above every key with this prefix ("\0" for "": all).
  static std::string PrefixEnd(const std::string& prefix);

 private:
  explicit EtcdClient(EtcdOptions options);

  // POSTs `body` (JSON) to `path` on the endpoints, with the token; returns
  // the response's JSON text. Handles failover and re-authentication.
  absl::StatusOr<std::string> Call(const std::string& path, const std::string& body);
  absl::StatusOr<std::string> CallOnce(const std::string& endpoint, const std::string& path,
                                       const std::string& body, const std::string& token,
                                       bool* try_next);
  absl::StatusOr<std::string> FetchToken(const std::string& endpoint, bool* try_next);

  const EtcdOptions options_;
  std::unique_ptr<HttpClient> http_;
  absl::Mutex mu_;
  size_t preferred_ ABSL_GUARDED_BY(mu_) = 0;
  std::string token_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sandbox
