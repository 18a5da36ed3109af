#include "tests/fakes/fake_e2b.h"

#include <httplib.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "adapters/e2b/e2b_wire.h"
#include "adapters/local/local_provider.h"
#include "adapters/local/workspace_fs.h"
#include "common/event_loop.h"
#include "common/text.h"
#include "nlohmann/json.hpp"
#include "tests/fakes/fake_common.h"

namespace sandbox {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

constexpr char kHome[] = "/home/user";
constexpr char kEnvdVersion[] = "0.6.4";

// A process started through envd, for SendSignal and List.
struct Proc {
  uint32_t pid = 0;
  std::vector<std::string> argv;
  std::atomic<bool> killed{false};
};

struct FakeSandbox {
  std::string id;
  std::string template_id;
  std::string access_token;
  std::map<std::string, std::string> metadata;
  // Egress rules as E2B echoes them (guarded by the fake's mutex): the
  // `network` object ({allowOut, denyOut}) and allow_internet_access.
  nlohmann::ordered_json network;
  std::optional<bool> allow_internet;
  absl::Time started_wall;
  absl::Time end_mono;  // TTL deadline
  absl::Time end_wall;
  std::shared_ptr<Sandbox> box;
  std::mutex procs_mu;
  std::map<uint32_t, std::shared_ptr<Proc>> procs;
};

// Frames produced by a running process, consumed by the HTTP response.
struct Stream {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> frames;
  bool done = false;
  void Push(std::string frame, bool last = false) {
    std::lock_guard<std::mutex> l(mu);
    frames.push_back(std::move(frame));
    if (last) done = true;
    cv.notify_all();
  }
};

std::string Frame(const ojson& j) { return e2b::EncodeEnvelope(0, j.dump()); }

void JsonReply(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(), "application/json");
}

void ErrorReply(httplib::Response& res, int status, const std::string& message) {
  JsonReply(res, status, {{"code", status}, {"message", message}});
}

// Connect unary error: the mapped HTTP status and a string code.
void ConnectError(httplib::Response& res, int status, const char* code,
                  const std::string& message) {
  JsonReply(res, status, {{"code", code}, {"message", message}});
}

// "/home/user/x" for "x"; absolute paths as given.
std::string AbsPath(const std::string& p) {
  if (!p.empty() && p.front() == '/') return p;
  return absl::StrCat(kHome, "/", p);
}

std::string PercentDecode(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    int hi, lo;
    auto hex = [](char c) {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    if (s[i] == '%' && i + 2 < s.size() && (hi = hex(s[i + 1])) >= 0 && (lo = hex(s[i + 2])) >= 0) {
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else if (s[i] == '+') {
      out.push_back(' ');
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

}  // namespace

class FakeE2B::Impl {
 public:
  Impl(Options o) : options_(std::move(o)) {}

  ~Impl() {
    if (ttl_thread_.joinable()) {
      stop_.Notify();
      ttl_thread_.join();
    }
    server_.stop();
    if (listen_thread_.joinable()) listen_thread_.join();
    absl::MutexLock l(&mu_);
    for (auto& [id, sb] : sandboxes_) (void)sb->box->Destroy();
    sandboxes_.clear();
    // First: the provider unmounts what it mounted on the root.
    local_.reset();
    if (own_root_) (void)RemoveTree(options_.workspace_root);
  }

  absl::Status Init() {
    auto p = MakeFakeSandboxes("fake-e2b", kHome, "user", options_.uid_base, options_.cpu_weight,
                               &options_.workspace_root, &own_root_);
    if (!p.ok()) return p.status();
    local_ = std::move(*p);

    ConfigureFakeServer(server_);
    server_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response&) {
      absl::MutexLock l(&peers_mu_);
      peers_.insert(absl::StrCat(req.remote_addr, ":", req.remote_port));
      return httplib::Server::HandlerResponse::Unhandled;
    });
    Routes();
    port_ = BindFakeServer(server_, options_.port);
    if (port_ <= 0) return absl::UnavailableError("fake-e2b: cannot bind");
    listen_thread_ = std::thread([this] { server_.listen_after_bind(); });
    if (options_.ttl_thread) {
      ttl_thread_ = std::thread([this] {
        while (!stop_.WaitForNotificationWithTimeout(absl::Seconds(1))) ExpireNow();
      });
    }
    return absl::OkStatus();
  }

  int port() const { return port_; }
  Faults& faults() { return faults_; }
  int64_t requests() const { return faults_.requests.load(); }
  int64_t connections() const {
    absl::MutexLock l(&peers_mu_);
    return static_cast<int64_t>(peers_.size());
  }

  int live() const {
    absl::MutexLock l(&mu_);
    return static_cast<int>(sandboxes_.size());
  }

  int ExpireNow() {
    std::vector<std::shared_ptr<FakeSandbox>> dead;
    {
      absl::MutexLock l(&mu_);
      const absl::Time now = options_.clock->Monotonic();
      for (auto it = sandboxes_.begin(); it != sandboxes_.end();) {
        if (it->second->end_mono <= now) {
          dead.push_back(it->second);
          it = sandboxes_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& sb : dead) (void)sb->box->Destroy();
    return static_cast<int>(dead.size());
  }

  std::map<std::string, std::string> Metadata(const std::string& id) const {
    absl::MutexLock l(&mu_);
    auto it = sandboxes_.find(id);
    return it == sandboxes_.end() ? std::map<std::string, std::string>() : it->second->metadata;
  }
  std::string Network(const std::string& id) const {
    absl::MutexLock l(&mu_);
    auto it = sandboxes_.find(id);
    if (it == sandboxes_.end()) return "";
    ojson j = ojson::object();
    if (!it->second->network.is_null()) j["network"] = it->second->network;
    if (it->second->allow_internet) j["allow_internet_access"] = *it->second->allow_internet;
    return j.dump();
  }
  int64_t TtlLeft(const std::string& id) const {
    absl::MutexLock l(&mu_);
    auto it = sandboxes_.find(id);
    if (it == sandboxes_.end()) return -1;
    return absl::ToInt64Seconds(it->second->end_mono - options_.clock->Monotonic());
  }

  bool Vanish(const std::string& id) {
    std::shared_ptr<FakeSandbox> sb;
    {
      absl::MutexLock l(&mu_);
      auto it = sandboxes_.find(id);
      if (it == sandboxes_.end()) return false;
      sb = it->second;
      sandboxes_.erase(it);
    }
    (void)sb->box->Destroy();
    return true;
  }

 private:
  // Applies injected faults; true when the request was answered by a fault.
  bool Fault(const httplib::Request&, httplib::Response& res, bool control_plane) {
    return faults_.Apply(res, control_plane, ErrorReply);
  }

  bool CheckApiKey(const httplib::Request& req, httplib::Response& res) {
    if (req.get_header_value("X-API-KEY") != options_.api_key) {
      ErrorReply(res, 401, "Invalid API key");
      return false;
    }
    return true;
  }

  std::shared_ptr<FakeSandbox> Find(const std::string& id) {
    absl::MutexLock l(&mu_);
    auto it = sandboxes_.find(id);
    return it == sandboxes_.end() ? nullptr : it->second;
  }

  // envd routing: the sandbox named by E2b-Sandbox-Id, with its token.
  std::shared_ptr<FakeSandbox> EnvdSandbox(const httplib::Request& req, httplib::Response& res,
                                           bool token_required) {
    const std::string id = req.get_header_value("E2b-Sandbox-Id");
    auto sb = Find(id);
    if (!sb) {
      JsonReply(res, 502,
                {{"sandboxId", id}, {"message", "The sandbox was not found"}, {"code", 502}});
      return nullptr;
    }
    if (token_required && req.get_header_value("X-Access-Token") != sb->access_token) {
      ErrorReply(res, 401,
                 "unauthorized access, please provide a valid access token or method signing if "
                 "supported");
      return nullptr;
    }
    return sb;
  }

  ojson SandboxJson(const FakeSandbox& sb) {
    return {{"sandboxID", sb.id},
            {"clientID", "fakeclient"},
            {"templateID", sb.template_id},
            {"alias", sb.template_id},
            {"envdVersion", kEnvdVersion},
            {"envdAccessToken", sb.access_token},
            {"domain", nullptr},
            {"trafficAccessToken", nullptr}};
  }

  ojson DetailJson(const FakeSandbox& sb) {
    auto ts = [](absl::Time t) {
      return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", t, absl::UTCTimeZone());
    };
    ojson j = {{"sandboxID", sb.id},
               {"templateID", sb.template_id},
               {"alias", sb.template_id},
               {"clientID", "fakeclient"},
               {"cpuCount", 2},
               {"memoryMB", 512},
               {"diskSizeMB", 1024},
               {"envdVersion", kEnvdVersion},
               {"startedAt", ts(sb.started_wall)},
               {"endAt", ts(sb.end_wall)},
               {"state", "running"},
               {"metadata", sb.metadata}};
    // The caller holds mu_ (the rules change under it).
    if (!sb.network.is_null()) j["network"] = sb.network;
    if (sb.allow_internet) j["allowInternetAccess"] = *sb.allow_internet;
    return j;
  }

  // E2B's egress fields of a create or update body: `network.allowOut`
  // (CIDRs, IPs, domains) and `network.denyOut` (CIDRs and IPs only), and
  // allow_internet_access. False with `error` set when malformed.
  static bool ParseNetwork(const json& body, const json& rules, ojson* network,
                           std::optional<bool>* allow_internet, std::string* error) {
    if (body.contains("allow_internet_access")) {
      if (!body["allow_internet_access"].is_boolean()) {
        *error = "allow_internet_access must be a boolean";
        return false;
      }
      *allow_internet = body["allow_internet_access"].get<bool>();
    }
    if (rules.is_null()) return true;
    if (!rules.is_object()) {
      *error = "network must be an object";
      return false;
    }
    ojson out = ojson::object();
    for (const char* key : {"allowOut", "denyOut"}) {
      if (!rules.contains(key)) continue;
      if (!rules[key].is_array()) {
        *error = absl::StrCat("network.", key, " must be a list of strings");
        return false;
      }
      for (const json& entry : rules[key]) {
        if (!entry.is_string()) {
          *error = absl::StrCat("network.", key, " must be a list of strings");
          return false;
        }
        const std::string text = entry.get<std::string>();
        const bool address = IpAddress::Parse(text.substr(0, text.find('/'))).has_value();
        if (std::string(key) == "denyOut" && !address) {
          *error = absl::StrCat("denyOut entry \"", text,
                                "\": domain names are not supported for deny rules");
          return false;
        }
      }
      out[key] = rules[key];
    }
    *network = std::move(out);
    return true;
  }

  void SetTtl(FakeSandbox* sb, int64_t seconds) {
    sb->end_mono = options_.clock->Monotonic() + absl::Seconds(seconds);
    sb->end_wall = options_.clock->Now() + absl::Seconds(seconds);
  }

  void CreateSandbox(const httplib::Request& req, httplib::Response& res, int64_t default_timeout) {
    ++faults_.create_requests;
    if (Fault(req, res, true) || !CheckApiKey(req, res)) return;
    Faults::CreateScope in_flight(&faults_);
    json body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object() || !body.contains("templateID") ||
        !body["templateID"].is_string()) {
      ErrorReply(res, 400, "request body must be a JSON object with a string templateID");
      return;
    }
    auto sb = std::make_shared<FakeSandbox>();
    sb->id = absl::StrCat("i", RandomHex(10));
    sb->template_id = body["templateID"].get<std::string>();
    sb->access_token = absl::StrCat("envd-", RandomHex(12));
    int64_t timeout = default_timeout;
    if (body.contains("timeout")) {
      if (!body["timeout"].is_number_integer() || body["timeout"].get<int64_t>() < 0) {
        ErrorReply(res, 400, "timeout must be a non-negative integer");
        return;
      }
      timeout = body["timeout"].get<int64_t>();
    }
    std::string bad;
    if (!ParseNetwork(body, body.contains("network") ? body["network"] : json(), &sb->network,
                      &sb->allow_internet, &bad)) {
      ErrorReply(res, 400, bad);
      return;
    }
    SandboxSpec spec;
    spec.session_id = sb->id;
    if (body.contains("envVars") && body["envVars"].is_object()) {
      for (auto it = body["envVars"].begin(); it != body["envVars"].end(); ++it) {
        if (it.value().is_string()) spec.env[it.key()] = it.value().get<std::string>();
      }
    }
    if (body.contains("metadata") && body["metadata"].is_object()) {
      for (auto it = body["metadata"].begin(); it != body["metadata"].end(); ++it) {
        if (it.value().is_string()) sb->metadata[it.key()] = it.value().get<std::string>();
      }
    }
    auto box = local_->Create(spec);
    if (!box.ok()) {
      ErrorReply(res, 500, absl::StrCat("sandbox_create_failed: ", box.status().message()));
      return;
    }
    sb->box = std::move(*box);
    sb->started_wall = options_.clock->Now();
    SetTtl(sb.get(), timeout);
    {
      absl::MutexLock l(&mu_);
      sandboxes_[sb->id] = sb;
    }
    ++faults_.creates;
    faults_.CreateLatency();
    res.status = 201;
    res.set_content(SandboxJson(*sb).dump(), "application/json");
  }

  void Routes() {
    using httplib::Request;
    using httplib::Response;

    AddFakeControlRoutes(server_, faults_, [this] { return int64_t{live()}; });
    // ---- control plane ----
    server_.Post("/v2/sandboxes",
                 [this](const Request& req, Response& res) { CreateSandbox(req, res, 300); });
    server_.Post("/sandboxes", [this](const Request& req, Response& res) {
      CreateSandbox(req, res, 15);  // legacy NewSandbox default
    });
    auto list = [this](const Request& req, Response& res) {
      if (Fault(req, res, true) || !CheckApiKey(req, res)) return;
      std::map<std::string, std::string> want;
      if (req.has_param("metadata")) {
        // The SDK encodes each key and value, then the whole query string.
        for (absl::string_view kv : absl::StrSplit(req.get_param_value("metadata"), '&')) {
          std::vector<std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
          if (p.size() == 2)
            want[PercentDecode(PercentDecode(p[0]))] = PercentDecode(PercentDecode(p[1]));
        }
      }
      if (req.has_param("state") && !absl::StrContains(req.get_param_value("state"), "running")) {
        res.set_header("X-Total-Running", "0");
        JsonReply(res, 200, json::array());
        return;
      }
      size_t limit = 100, offset = 0;
      if (req.has_param("limit")) (void)absl::SimpleAtoi(req.get_param_value("limit"), &limit);
      if (req.has_param("nextToken"))
        (void)absl::SimpleAtoi(req.get_param_value("nextToken"), &offset);
      std::vector<ojson> all;
      {
        absl::MutexLock l(&mu_);
        for (auto& [id, sb] : sandboxes_) {
          bool match = true;
          for (auto& [k, v] : want) {
            auto it = sb->metadata.find(k);
            match = match && it != sb->metadata.end() && it->second == v;
          }
          if (match) all.push_back(DetailJson(*sb));
        }
      }
      ojson page = ojson::array();
      for (size_t i = offset; i < all.size() && page.size() < limit; ++i) page.push_back(all[i]);
      if (offset + page.size() < all.size()) {
        res.set_header("X-Next-Token", absl::StrCat(offset + page.size()));
      }
      res.set_header("X-Total-Running", absl::StrCat(all.size()));
      res.status = 200;
      res.set_content(page.dump(), "application/json");
    };
    server_.Get("/v2/sandboxes", list);
    server_.Get("/sandboxes", list);
    server_.Get(R"(/sandboxes/([^/]+))", [this](const Request& req, Response& res) {
      if (Fault(req, res, true) || !CheckApiKey(req, res)) return;
      auto sb = Find(req.matches[1]);
      if (!sb)
        return ErrorReply(res, 404,
                          absl::StrCat("sandbox \"", std::string(req.matches[1]), "\" not found"));
      std::string detail;
      {
        absl::MutexLock l(&mu_);
        detail = DetailJson(*sb).dump();
      }
      res.status = 200;
      res.set_content(detail, "application/json");
    });
    server_.Delete(R"(/sandboxes/([^/]+))", [this](const Request& req, Response& res) {
      if (Fault(req, res, true) || !CheckApiKey(req, res)) return;
      Faults::DeleteScope in_flight(&faults_);
      if (!Vanish(req.matches[1])) {
        return ErrorReply(res, 404,
                          absl::StrCat("sandbox \"", std::string(req.matches[1]), "\" not found"));
      }
      ++faults_.deletes;
      res.status = 204;
    });
    // The whole rule set replaced; an omitted field is cleared.
    server_.Put(R"(/sandboxes/([^/]+)/network)", [this](const Request& req, Response& res) {
      if (Fault(req, res, true) || !CheckApiKey(req, res)) return;
      json body = json::parse(req.body, nullptr, false);
      if (body.is_discarded() || !body.is_object()) {
        return ErrorReply(res, 400, "body must be a JSON object");
      }
      ojson network;
      std::optional<bool> allow_internet;
      std::string bad;
      if (!ParseNetwork(body, body, &network, &allow_internet, &bad)) {
        return ErrorReply(res, 400, bad);
      }
      absl::MutexLock l(&mu_);
      auto it = sandboxes_.find(req.matches[1]);
      if (it == sandboxes_.end()) {
        return ErrorReply(res, 404,
                          absl::StrCat("sandbox \"", std::string(req.matches[1]), "\" not found"));
      }
      it->second->network = network.empty() ? ojson() : network;
      it->second->allow_internet = allow_internet;
      res.status = 204;
    });
    server_.Post(R"(/sandboxes/([^/]+)/timeout)", [this](const Request& req, Response& res) {
      if (Fault(req, res, true) || !CheckApiKey(req, res)) return;
      json body = json::parse(req.body, nullptr, false);
      if (body.is_discarded() || !body.is_object() || !body.contains("timeout") ||
          !body["timeout"].is_number_integer() || body["timeout"].get<int64_t>() < 0) {
        return ErrorReply(res, 400, "body must be {\"timeout\": <seconds>}");
      }
      absl::MutexLock l(&mu_);
      auto it = sandboxes_.find(req.matches[1]);
      if (it == sandboxes_.end()) {
        return ErrorReply(res, 404,
                          absl::StrCat("sandbox \"", std::string(req.matches[1]), "\" not found"));
      }
      SetTtl(it->second.get(), body["timeout"].get<int64_t>());
      res.status = 204;
    });
    auto connect = [this](const Request& req, Response& res) {
      if (Fault(req, res, true) || !CheckApiKey(req, res)) return;
      Faults::ConnectScope in_flight(&faults_);
      json body = json::parse(req.body.empty() ? "{}" : req.body, nullptr, false);
      auto sb = Find(req.matches[1]);
      if (!sb) {
        return ErrorReply(
            res, 404, absl::StrCat("Paused sandbox ", std::string(req.matches[1]), " not found"));
      }
      if (body.is_object() && body.contains("timeout") && body["timeout"].is_number_integer()) {
        absl::MutexLock l(&mu_);
        const absl::Time want =
            options_.clock->Monotonic() + absl::Seconds(body["timeout"].get<int64_t>());
        if (want > sb->end_mono) SetTtl(sb.get(), body["timeout"].get<int64_t>());  // only extends
      }
      res.status = 200;
      res.set_content(SandboxJson(*sb).dump(), "application/json");
    };
    server_.Post(R"(/v2/sandboxes/([^/]+)/connect)", connect);
    server_.Post(R"(/sandboxes/([^/]+)/connect)", connect);

    // ---- envd ----
    server_.Get("/health", [this](const Request& req, Response& res) {
      if (Fault(req, res, false)) return;
      if (!EnvdSandbox(req, res, false)) return;
      res.status = 204;
    });
    server_.Post("/process.Process/Start", [this](const Request& req, Response& res) {
      if (Fault(req, res, false)) return;
      auto sb = EnvdSandbox(req, res, true);
      if (!sb) return;
      StartProcess(sb, req, res);
    });
    server_.Post("/process.Process/SendSignal", [this](const Request& req, Response& res) {
      if (Fault(req, res, false)) return;
      auto sb = EnvdSandbox(req, res, true);
      if (!sb) return;
      json body = json::parse(req.body, nullptr, false);
      uint32_t pid = 0;
      if (!body.is_discarded() && body.is_object() && body.contains("process") &&
          body["process"].is_object() && body["process"].contains("pid") &&
          body["process"]["pid"].is_number_integer()) {
        pid = body["process"]["pid"].get<uint32_t>();
      } else {
        return ConnectError(res, 400, "invalid_argument", "process.pid is required");
      }
      std::lock_guard<std::mutex> l(sb->procs_mu);
      auto it = sb->procs.find(pid);
      if (it == sb->procs.end()) {
        return ConnectError(res, 404, "not_found",
                            absl::StrCat("process with pid ", pid, " not found"));
      }
      it->second->killed = true;
      JsonReply(res, 200, json::object());
    });
    server_.Post("/process.Process/List", [this](const Request& req, Response& res) {
      if (Fault(req, res, false)) return;
      auto sb = EnvdSandbox(req, res, true);
      if (!sb) return;
      json procs = json::array();
      std::lock_guard<std::mutex> l(sb->procs_mu);
      for (auto& [pid, p] : sb->procs) {
        json args = std::vector<std::string>(p->argv.begin() + 1, p->argv.end());
        procs.push_back({{"pid", pid}, {"config", {{"cmd", p->argv[0]}, {"args", args}}}});
      }
      JsonReply(res, 200, {{"processes", procs}});
    });
    server_.Post("/filesystem.Filesystem/Stat", [this](const Request& req, Response& res) {
      if (Fault(req, res, false)) return;
      auto sb = EnvdSandbox(req, res, true);
      if (!sb) return;
      json body = json::parse(req.body, nullptr, false);
      if (body.is_discarded() || !body.is_object() || !body.contains("path") ||
          !body["path"].is_string()) {
        return ConnectError(res, 400, "invalid_argument", "path is required");
      }
      const std::string path = AbsPath(body["path"].get<std::string>());
      auto r = sb->box->ReadFile(path);
      const std::string name = path.substr(path.rfind('/') + 1);
      if (r.ok() && r->has_value()) {
        JsonReply(res, 200,
                  {{"entry",
                    {{"name", name},
                     {"type", "FILE_TYPE_FILE"},
                     {"path", path},
                     {"size", absl::StrCat((*r)->size())}}}});
      } else if (!r.ok() && absl::StrContains(r.status().message(), "is a directory")) {
        JsonReply(res, 200,
                  {{"entry", {{"name", name}, {"type", "FILE_TYPE_DIRECTORY"}, {"path", path}}}});
      } else {
        ConnectError(res, 404, "not_found", absl::StrCat("path '", path, "' does not exist"));
      }
    });
    server_.Get("/files", [this](const Request& req, Response& res) {
      if (Fault(req, res, false)) return;
      Faults::FileScope in_flight(&faults_);
      auto sb = EnvdSandbox(req, res, true);
      if (!sb) return;
      if (!req.has_param("path")) return ErrorReply(res, 400, "path is required");
      const std::string path = AbsPath(req.get_param_value("path"));
      auto r = sb->box->ReadFile(path);
      if (!r.ok()) {
        if (absl::StrContains(r.status().message(), "is a directory")) {
          return ErrorReply(res, 400, absl::StrCat("path '", path, "' is a directory"));
        }
        return ErrorReply(res, 400, std::string(r.status().message()));
      }
      if (!r->has_value()) {
        return ErrorReply(res, 404, absl::StrCat("path '", path, "' does not exist"));
      }
      res.status = 200;
      res.set_content(std::move(**r), "application/octet-stream");
    });
    server_.Post("/files", [this](const Request& req, Response& res) {
      if (Fault(req, res, false)) return;
      Faults::FileScope in_flight(&faults_);
      auto sb = EnvdSandbox(req, res, true);
      if (!sb) return;
      std::vector<std::pair<std::string, std::string>> writes;
      const std::string query_path = req.has_param("path") ? req.get_param_value("path") : "";
      if (req.is_multipart_form_data()) {
        for (const auto& [field, part] : req.files) {
          if (field != "file") continue;
          std::string path = !query_path.empty() ? query_path : part.filename;
          for (const auto& w : writes) {
            if (w.first == path) return ErrorReply(res, 400, "two parts with the same path");
          }
          writes.emplace_back(path, part.content);
        }
      } else if (absl::StartsWith(req.get_header_value("Content-Type"),
                                  "application/octet-stream")) {
        if (query_path.empty())
          return ErrorReply(res, 400, "path is required for octet-stream uploads");
        writes.emplace_back(query_path, req.body);
      } else {
        return ErrorReply(res, 400, "unsupported content type");
      }
      if (writes.empty()) return ErrorReply(res, 400, "no file parts");
      json out = json::array();
      for (auto& [path, data] : writes) {
        const std::string abs = AbsPath(path);
        absl::Status s = sb->box->WriteFile(abs, data);
        if (!s.ok()) {
          return ErrorReply(res, s.code() == absl::StatusCode::kResourceExhausted ? 507 : 400,
                            std::string(s.message()));
        }
        out.push_back({{"path", abs}, {"name", abs.substr(abs.rfind('/') + 1)}, {"type", "file"}});
      }
      JsonReply(res, 200, out);
    });
  }

  void StartProcess(const std::shared_ptr<FakeSandbox>& sb, const httplib::Request& req,
                    httplib::Response& res) {
    if (!absl::StartsWith(req.get_header_value("Content-Type"), "application/connect+json")) {
      return ConnectError(res, 415, "unknown", "content type must be application/connect+json");
    }
    e2b::EnvelopeReader reader;
    reader.Feed(req.body);
    auto env = reader.Next();
    if (!env.ok() || !env->has_value() || ((*env)->flags & e2b::kFlagCompressed)) {
      return ConnectError(res, 400, "invalid_argument", "expected one uncompressed envelope");
    }
    json body = json::parse((*env)->payload, nullptr, false);
    if (body.is_discarded() || !body.is_object() || !body.contains("process") ||
        !body["process"].is_object() || !body["process"].contains("cmd") ||
        !body["process"]["cmd"].is_string()) {
      return ConnectError(res, 400, "invalid_argument", "process.cmd is required");
    }
    const json& pj = body["process"];
    auto proc = std::make_shared<Proc>();
    proc->argv.push_back(pj["cmd"].get<std::string>());
    if (pj.contains("args") && pj["args"].is_array()) {
      for (const auto& a : pj["args"]) {
        if (a.is_string()) proc->argv.push_back(a.get<std::string>());
      }
    }
    ExecRequest er;
    er.argv = proc->argv;
    if (pj.contains("envs") && pj["envs"].is_object()) {
      for (auto it = pj["envs"].begin(); it != pj["envs"].end(); ++it) {
        if (it.value().is_string()) er.env[it.key()] = it.value().get<std::string>();
      }
    }
    if (pj.contains("cwd") && pj["cwd"].is_string()) er.cwd = pj["cwd"].get<std::string>();
    int64_t timeout_ms = 0, keepalive_s = 90;
    (void)absl::SimpleAtoi(req.get_header_value("Connect-Timeout-Ms"), &timeout_ms);
    if (!absl::SimpleAtoi(req.get_header_value("Keepalive-Ping-Interval"), &keepalive_s) ||
        keepalive_s <= 0) {
      keepalive_s = 90;
    }
    // envd kills the process when Connect-Timeout-Ms passes, connected or not.
    er.timeout = timeout_ms > 0 ? absl::Milliseconds(timeout_ms) : absl::Hours(24 * 365);
    er.max_output_bytes = size_t{1} << 40;
    {
      std::lock_guard<std::mutex> l(sb->procs_mu);
      proc->pid = ++next_pid_;
      sb->procs[proc->pid] = proc;
    }
    auto stream = std::make_shared<Stream>();
    stream->Push(Frame({{"event", {{"start", {{"pid", proc->pid}}}}}}));
    er.on_output = [stream](OutputStream s, absl::string_view data) {
      stream->Push(Frame({{"event",
                           {{"data",
                             {{s == OutputStream::kStdout ? "stdout" : "stderr",
                               absl::Base64Escape(std::string(data))}}}}}}));
    };
    er.cancelled = [proc] { return proc->killed.load(); };
    // On the local provider's event loop, no thread per process (500
    // processes at once must not cost the fake 500 threads polling). The
    // sandbox stays alive until `done`; its last reference is dropped on
    // the work pool, never on the loop that runs `done`.
    std::shared_ptr<Sandbox> box = sb->box;
    box->ExecAsync(er, [box, stream, proc, sb](absl::StatusOr<ExecResult> r) mutable {
      struct Release {
        std::shared_ptr<Sandbox>& box;
        ~Release() {
          WorkPool::Shared()->Submit([b = std::move(box)] {});
        }
      } release{box};
      {
        std::lock_guard<std::mutex> l(sb->procs_mu);
        sb->procs.erase(proc->pid);
      }
      if (!r.ok()) {
        const char* code = r.status().code() == absl::StatusCode::kInvalidArgument
                               ? "invalid_argument"
                               : "unavailable";
        stream->Push(
            e2b::EncodeEnvelope(
                e2b::kFlagEndStream,
                json({{"error", {{"code", code}, {"message", std::string(r.status().message())}}}})
                    .dump()),
            true);
        return;
      }
      ojson end;
      if (r->timed_out || r->cancelled) {
        end = {{"exitCode", -1},
               {"exited", false},
               {"status", "signal: killed"},
               {"error", "signal: killed"}};
      } else {
        end["exited"] = true;
        if (r->exit_code != 0) end["exitCode"] = r->exit_code;
        end["status"] = absl::StrCat("exit status ", r->exit_code);
        if (r->exit_code != 0) end["error"] = absl::StrCat("exit status ", r->exit_code);
      }
      stream->Push(Frame({{"event", {{"end", end}}}}));
      const std::string tail =
          r->timed_out
              ? json({{"error",
                       {{"code", "deadline_exceeded"}, {"message", "the operation timed out"}}}})
                    .dump()
              : "{}";
      stream->Push(e2b::EncodeEnvelope(e2b::kFlagEndStream, tail), true);
    });

    res.status = 200;
    res.set_chunked_content_provider(
        "application/connect+json", [stream, keepalive_s](size_t, httplib::DataSink& sink) {
          std::unique_lock<std::mutex> l(stream->mu);
          if (stream->frames.empty() && !stream->done) {
            if (!stream->cv.wait_for(l, std::chrono::seconds(keepalive_s),
                                     [&] { return !stream->frames.empty() || stream->done; })) {
              l.unlock();
              std::string ka = Frame({{"event", {{"keepalive", ojson::object()}}}});
              return sink.write(ka.data(), ka.size());
            }
          }
          std::deque<std::string> frames;
          frames.swap(stream->frames);
          const bool done = stream->done;
          l.unlock();
          for (const auto& f : frames) {
            if (!sink.write(f.data(), f.size())) return false;  // client gone; process goes on
          }
          if (done) sink.done();
          return true;
        });
  }

  Options options_;
  bool own_root_ = false;
  std::unique_ptr<LocalProvider> local_;
  httplib::Server server_;
  int port_ = 0;
  std::thread listen_thread_;
  std::thread ttl_thread_;
  absl::Notification stop_;
  Faults faults_;
  std::atomic<uint32_t> next_pid_{4000};
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<FakeSandbox>> sandboxes_ ABSL_GUARDED_BY(mu_);
  mutable absl::Mutex peers_mu_;
  std::set<std::string> peers_ ABSL_GUARDED_BY(peers_mu_);  // "addr:port" of connections
};

FakeE2B::FakeE2B(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FakeE2B::~FakeE2B() = default;

absl::StatusOr<std::unique_ptr<FakeE2B>> FakeE2B::Start(Options options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  absl::Status s = impl->Init();
  if (!s.ok()) return s;
  return std::unique_ptr<FakeE2B>(new FakeE2B(std::move(impl)));
}

int FakeE2B::port() const { return impl_->port(); }
std::string FakeE2B::url() const { return absl::StrCat("http://127.0.0.1:", impl_->port()); }
Faults& FakeE2B::faults() { return impl_->faults(); }
int FakeE2B::ExpireNow() { return impl_->ExpireNow(); }
bool FakeE2B::Vanish(const std::string& id) { return impl_->Vanish(id); }
int FakeE2B::live_sandboxes() const { return impl_->live(); }
std::map<std::string, std::string> FakeE2B::metadata(const std::string& id) const {
  return impl_->Metadata(id);
}
int64_t FakeE2B::ttl_left_seconds(const std::string& id) const { return impl_->TtlLeft(id); }
std::string FakeE2B::network(const std::string& id) const { return impl_->Network(id); }
int64_t FakeE2B::requests() const { return impl_->requests(); }
int64_t FakeE2B::connections() const { return impl_->connections(); }

}  // namespace sandbox
