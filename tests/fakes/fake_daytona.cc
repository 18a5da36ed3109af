#include "tests/fakes/fake_daytona.h"

#include <httplib.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <map>
#include <regex>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "adapters/local/local_provider.h"
#include "adapters/local/workspace_fs.h"
#include "common/text.h"
#include "nlohmann/json.hpp"
#include "tests/fakes/fake_common.h"

namespace sandbox {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

constexpr char kHome[] = "/home/daytona";
constexpr char kBoundary[] = "DAYTONA-FILE-BOUNDARY";

struct Box {
  std::string id;
  std::string name;
  std::string snapshot;
  std::string target;
  std::map<std::string, std::string> env;
  std::map<std::string, std::string> labels;
  std::string state = "started";
  int64_t auto_stop = 15;                 // minutes, 0 = disabled
  int64_t auto_delete = -1;               // minutes, <0 = disabled, 0 = on stop
  int64_t cpu = 1, memory = 1, disk = 3;  // as asked for (CPUs, GiB, GiB), else these
  // Egress as asked for (recorded, not enforced).
  bool network_block_all = false;
  std::string network_allow_list, domain_allow_list;
  absl::Time created_wall;
  absl::Time last_activity;  // monotonic
  absl::Time stopped_at;     // monotonic
  std::shared_ptr<Sandbox> sandbox;
};

std::string Timestamp(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", t, absl::UTCTimeZone());
}

// The control plane's (NestJS) error body.
void ApiError(httplib::Response& res, int status, const std::string& message) {
  static const std::map<int, const char*> kReason = {{400, "Bad Request"},
                                                     {401, "Unauthorized"},
                                                     {403, "Forbidden"},
                                                     {404, "Not Found"},
                                                     {409, "Conflict"},
                                                     {429, "Too Many Requests"},
                                                     {500, "Internal Server Error"},
                                                     {503, "Service Unavailable"}};
  auto it = kReason.find(status);
  res.status = status;
  res.set_content(json({{"statusCode", status},
                        {"error", it == kReason.end() ? "Error" : it->second},
                        {"message", message},
                        {"timestamp", Timestamp(absl::Now())}})
                      .dump(),
                  "application/json");
}

// The toolbox daemon's error body.
json DaemonErrorJson(int status, const std::string& code, const std::string& message,
                     const std::string& path) {
  return {{"statusCode", status},
          {"message", message},
          {"code", code},
          {"timestamp", Timestamp(absl::Now())},
          {"path", path},
          {"method", "POST"},
          {"source", "DAYTONA_DAEMON"}};
}
void DaemonError(httplib::Response& res, int status, const std::string& code,
                 const std::string& message, const std::string& path) {
  res.status = status;
  res.set_content(DaemonErrorJson(status, code, message, path).dump(), "application/json");
}

std::string AbsPath(const std::string& p) {
  if (!p.empty() && p.front() == '/') return p;
  return absl::StrCat(kHome, "/", p);
}

bool ValidEnvKey(const std::string& k) {
  static const std::regex re("^[A-Za-z_][A-Za-z0-9_]*$");
  return std::regex_match(k, re);
}

}  // namespace

class FakeDaytona::Impl {
 public:
  explicit Impl(Options o) : options_(std::move(o)) {}

  ~Impl() {
    if (timer_thread_.joinable()) {
      stop_.Notify();
      timer_thread_.join();
    }
    server_.stop();
    if (listen_thread_.joinable()) listen_thread_.join();
    absl::MutexLock l(&mu_);
    for (auto& [id, b] : boxes_) (void)b->sandbox->Destroy();
    boxes_.clear();
    // First: the provider unmounts what it mounted on the root.
    local_.reset();
    if (own_root_) (void)RemoveTree(options_.workspace_root);
  }

  absl::Status Init() {
    auto p = MakeFakeSandboxes("fake-daytona", kHome, "daytona", options_.uid_base,
                               options_.cpu_weight, &options_.workspace_root, &own_root_);
    if (!p.ok()) return p.status();
    local_ = std::move(*p);
    ConfigureFakeServer(server_);
    Routes();
    port_ = BindFakeServer(server_, options_.port);
    if (port_ <= 0) return absl::UnavailableError("fake-daytona: cannot bind");
    listen_thread_ = std::thread([this] { server_.listen_after_bind(); });
    if (options_.timer_thread) {
      timer_thread_ = std::thread([this] {
        while (!stop_.WaitForNotificationWithTimeout(absl::Seconds(1))) ApplyTimers();
      });
    }
    return absl::OkStatus();
  }

  int port() const { return port_; }
  Faults& faults() { return faults_; }
  void set_stuck(bool s) { stuck_starting_ = s; }

  int ApplyTimers() {
    std::vector<std::shared_ptr<Box>> to_destroy;
    int changed = 0;
    {
      absl::MutexLock l(&mu_);
      const absl::Time now = options_.clock->Monotonic();
      for (auto it = boxes_.begin(); it != boxes_.end();) {
        Box& b = *it->second;
        if (b.state == "started" && b.auto_stop > 0 &&
            now - b.last_activity >= absl::Minutes(b.auto_stop)) {
          b.state = "stopped";
          b.stopped_at = now;
          ++changed;
        }
        if (b.state == "stopped" && b.auto_delete >= 0 &&
            now - b.stopped_at >= absl::Minutes(b.auto_delete)) {
          to_destroy.push_back(it->second);
          it = boxes_.erase(it);
          ++changed;
          continue;
        }
        ++it;
      }
    }
    for (auto& b : to_destroy) (void)b->sandbox->Destroy();
    return changed;
  }

  bool Vanish(const std::string& id) {
    std::shared_ptr<Box> b;
    {
      absl::MutexLock l(&mu_);
      auto it = boxes_.find(id);
      if (it == boxes_.end()) return false;
      b = it->second;
      boxes_.erase(it);
    }
    (void)b->sandbox->Destroy();
    return true;
  }

  int live() const {
    absl::MutexLock l(&mu_);
    return static_cast<int>(boxes_.size());
  }
  std::map<std::string, std::string> Labels(const std::string& id) const {
    absl::MutexLock l(&mu_);
    auto it = boxes_.find(id);
    return it == boxes_.end() ? std::map<std::string, std::string>() : it->second->labels;
  }
  std::string Network(const std::string& id) const {
    absl::MutexLock l(&mu_);
    auto it = boxes_.find(id);
    if (it == boxes_.end()) return "";
    const Box& b = *it->second;
    return ojson{{"networkBlockAll", b.network_block_all},
                 {"networkAllowList", b.network_allow_list},
                 {"domainAllowList", b.domain_allow_list}}
        .dump();
  }
  std::string State(const std::string& id) const {
    absl::MutexLock l(&mu_);
    auto it = boxes_.find(id);
    return it == boxes_.end() ? "" : it->second->state;
  }
  std::map<std::string, int64_t> Resources(const std::string& id) const {
    absl::MutexLock l(&mu_);
    auto it = boxes_.find(id);
    if (it == boxes_.end()) return {};
    return {{"cpu", it->second->cpu}, {"memory", it->second->memory}, {"disk", it->second->disk}};
  }
  int64_t AutoStop(const std::string& id) const {
    absl::MutexLock l(&mu_);
    auto it = boxes_.find(id);
    return it == boxes_.end() ? -1 : it->second->auto_stop;
  }

 private:
  std::string ToolboxUrl() const { return absl::StrCat("http://127.0.0.1:", port_, "/toolbox"); }

  bool Fault(httplib::Response& res, bool control_plane) {
    return faults_.Apply(res, control_plane, ApiError);
  }

  bool Auth(const httplib::Request& req, httplib::Response& res) {
    if (req.get_header_value("Authorization") != absl::StrCat("Bearer ", options_.api_key)) {
      ApiError(res, 401, "Invalid credentials");
      return false;
    }
    return true;
  }

  // By id or name.
  std::shared_ptr<Box> Find(const std::string& id_or_name) {
    absl::MutexLock l(&mu_);
    auto it = boxes_.find(id_or_name);
    if (it != boxes_.end()) return it->second;
    for (auto& [id, b] : boxes_) {
      if (b->name == id_or_name) return b;
    }
    return nullptr;
  }

  ojson Dto(const Box& b) {
    absl::MutexLock l(&mu_);
    return DtoLocked(b);
  }
  ojson DtoLocked(const Box& b) {
    const absl::Time last_wall =
        options_.clock->Now() - (options_.clock->Monotonic() - b.last_activity);
    return {{"id", b.id},
            {"organizationId", "org-fake"},
            {"name", b.name},
            {"snapshot", b.snapshot},
            {"user", "daytona"},
            {"env", b.env},
            {"labels", b.labels},
            {"public", false},
            {"networkBlockAll", b.network_block_all},
            {"target", b.target},
            {"cpu", b.cpu},
            {"gpu", 0},
            {"memory", b.memory},
            {"disk", b.disk},
            {"state", b.state},
            {"desiredState", b.state == "started" || b.state == "starting" ? "started" : b.state},
            {"backupState", "None"},
            {"autoStopInterval", b.auto_stop},
            {"autoArchiveInterval", 10080},
            {"autoDeleteInterval", b.auto_delete},
            {"volumes", json::array()},
            {"createdAt", Timestamp(b.created_wall)},
            {"updatedAt", Timestamp(options_.clock->Now())},
            {"lastActivityAt", Timestamp(last_wall)},
            {"daemonVersion", "fake"},
            {"toolboxProxyUrl", ToolboxUrl()},
            {"networkAllowList", b.network_allow_list},
            {"domainAllowList", b.domain_allow_list}};
  }

  void Reply(httplib::Response& res, int status, const ojson& j) {
    res.status = status;
    res.set_content(j.dump(), "application/json");
  }

  void Routes() {
    AddFakeControlRoutes(server_, faults_, [this] { return int64_t{live()}; });
    using httplib::Request;
    using httplib::Response;

    server_.Post("/api/sandbox", [this](const Request& req, Response& res) {
      ++faults_.create_requests;
      if (Fault(res, true) || !Auth(req, res)) return;
      Faults::CreateScope in_flight(&faults_);
      json body = json::parse(req.body, nullptr, false);
      if (body.is_discarded() || !body.is_object())
        return ApiError(res, 400, "body must be a JSON object");
      auto b = std::make_shared<Box>();
      b->id = absl::StrCat("sbx-", RandomHex(8));
      b->name = body.value("name", b->id);
      b->snapshot = body.value("snapshot", "daytonaio/sandbox:0.0.0-fake");
      b->target = body.value("target", "us");
      for (const char* k : {"env", "labels"}) {
        if (body.contains(k) && !body[k].is_object()) {
          return ApiError(res, 400, absl::StrCat(k, " must be an object"));
        }
      }
      if (body.contains("env")) {
        for (auto it = body["env"].begin(); it != body["env"].end(); ++it) {
          if (it.value().is_string()) b->env[it.key()] = it.value().get<std::string>();
        }
      }
      if (body.contains("labels")) {
        for (auto it = body["labels"].begin(); it != body["labels"].end(); ++it) {
          if (it.value().is_string()) b->labels[it.key()] = it.value().get<std::string>();
        }
      }
      if (body.contains("networkBlockAll")) {
        if (!body["networkBlockAll"].is_boolean()) {
          return ApiError(res, 400, "networkBlockAll must be a boolean");
        }
        b->network_block_all = body["networkBlockAll"].get<bool>();
      }
      for (auto [key, field] :
           {std::pair<const char*, std::string*>{"networkAllowList", &b->network_allow_list},
            {"domainAllowList", &b->domain_allow_list}}) {
        if (!body.contains(key)) continue;
        if (!body[key].is_string())
          return ApiError(res, 400, absl::StrCat(key, " must be a string"));
        *field = body[key].get<std::string>();
      }
      // Daytona takes CIDRs only in networkAllowList.
      for (absl::string_view cidr : absl::StrSplit(b->network_allow_list, ',', absl::SkipEmpty())) {
        const size_t slash = cidr.find('/');
        if (slash == absl::string_view::npos || !IpAddress::Parse(cidr.substr(0, slash))) {
          return ApiError(res, 400, absl::StrCat("networkAllowList: \"", cidr, "\" is not a CIDR"));
        }
      }
      if (body.contains("autoStopInterval") && body["autoStopInterval"].is_number_integer()) {
        b->auto_stop = body["autoStopInterval"].get<int64_t>();
        if (b->auto_stop < 0) return ApiError(res, 400, "autoStopInterval must not be negative");
      }
      for (auto [key, field] : {std::pair<const char*, int64_t*>{"cpu", &b->cpu},
                                {"memory", &b->memory},
                                {"disk", &b->disk}}) {
        if (!body.contains(key)) continue;
        if (!body[key].is_number_integer() || body[key].get<int64_t>() <= 0) {
          return ApiError(res, 400, absl::StrCat(key, " must be a positive integer"));
        }
        *field = body[key].get<int64_t>();
      }
      if (body.contains("autoDeleteInterval") && body["autoDeleteInterval"].is_number_integer()) {
        b->auto_delete = body["autoDeleteInterval"].get<int64_t>();
      }
      if (Find(b->name))
        return ApiError(res, 409, absl::StrCat("Sandbox with name ", b->name, " already exists"));
      SandboxSpec spec;
      spec.env = b->env;
      auto sb = local_->Create(spec);
      if (!sb.ok()) return ApiError(res, 500, "An unexpected error occurred.");
      b->sandbox = std::move(*sb);
      b->created_wall = options_.clock->Now();
      b->last_activity = options_.clock->Monotonic();
      b->state = stuck_starting_.load() ? "starting" : "started";
      {
        absl::MutexLock l(&mu_);
        boxes_[b->id] = b;
      }
      ++faults_.creates;
      faults_.CreateLatency();
      Reply(res, 200, Dto(*b));
    });
    server_.Get("/api/sandbox", [this](const Request& req, Response& res) {
      if (Fault(res, true) || !Auth(req, res)) return;
      std::map<std::string, std::string> want;
      if (req.has_param("labels")) {
        json l = json::parse(req.get_param_value("labels"), nullptr, false);
        if (l.is_object()) {
          for (auto it = l.begin(); it != l.end(); ++it) {
            if (it.value().is_string()) want[it.key()] = it.value().get<std::string>();
          }
        }
      }
      ojson items = ojson::array();
      absl::MutexLock lock(&mu_);
      for (auto& [id, b] : boxes_) {
        bool match = true;
        for (auto& [k, v] : want) {
          auto it = b->labels.find(k);
          match = match && it != b->labels.end() && it->second == v;
        }
        if (!match) continue;
        ojson item = DtoLocked(*b);
        item.erase("env");
        item.erase("volumes");
        item["toolboxProxyUrl"] = "";  // as the real list endpoint
        items.push_back(item);
      }
      Reply(res, 200, {{"items", items}, {"nextCursor", nullptr}});
    });
    server_.Get(R"(/api/sandbox/([^/]+))", [this](const Request& req, Response& res) {
      if (Fault(res, true) || !Auth(req, res)) return;
      auto b = Find(req.matches[1]);
      if (!b)
        return ApiError(
            res, 404,
            absl::StrCat("Sandbox with ID or name ", std::string(req.matches[1]), " not found"));
      Reply(res, 200, Dto(*b));
    });
    server_.Get(R"(/api/sandbox/([^/]+)/toolbox-proxy-url)",
                [this](const Request& req, Response& res) {
                  if (Fault(res, true) || !Auth(req, res)) return;
                  if (!Find(req.matches[1])) return ApiError(res, 404, "Sandbox not found");
                  Reply(res, 200, {{"url", ToolboxUrl()}});
                });
    server_.Delete(R"(/api/sandbox/([^/]+))", [this](const Request& req, Response& res) {
      if (Fault(res, true) || !Auth(req, res)) return;
      Faults::DeleteScope in_flight(&faults_);
      auto b = Find(req.matches[1]);
      if (!b)
        return ApiError(
            res, 404,
            absl::StrCat("Sandbox with ID or name ", std::string(req.matches[1]), " not found"));
      ojson dto = Dto(*b);
      dto["desiredState"] = "destroyed";
      Vanish(b->id);
      ++faults_.deletes;
      Reply(res, 200, dto);
    });
    auto interval = [this](const char* which) {
      return [this, which](const Request& req, Response& res) {
        if (Fault(res, true) || !Auth(req, res)) return;
        auto b = Find(req.matches[1]);
        if (!b) return ApiError(res, 404, "Sandbox not found");
        int64_t n = std::stoll(req.matches[2]);
        {
          absl::MutexLock l(&mu_);
          (std::string(which) == "autostop" ? b->auto_stop : b->auto_delete) = n;
        }
        Reply(res, 200, Dto(*b));
      };
    };
    // Replace labels (the SDK's setLabels): the whole set, answered as
    // SandboxLabelsDto.
    server_.Put(R"(/api/sandbox/([^/]+)/labels)", [this](const Request& req, Response& res) {
      if (Fault(res, true) || !Auth(req, res)) return;
      json body = json::parse(req.body, nullptr, false);
      if (body.is_discarded() || !body.is_object() || !body.contains("labels") ||
          !body["labels"].is_object()) {
        return ApiError(res, 400, "labels must be an object");
      }
      std::map<std::string, std::string> labels;
      for (auto it = body["labels"].begin(); it != body["labels"].end(); ++it) {
        if (!it.value().is_string()) return ApiError(res, 400, "label values must be strings");
        labels[it.key()] = it.value().get<std::string>();
      }
      auto b = Find(req.matches[1]);
      if (!b) return ApiError(res, 404, "Sandbox not found");
      {
        absl::MutexLock l(&mu_);
        b->labels = labels;
      }
      Reply(res, 200, {{"labels", labels}});
    });
    server_.Post(R"(/api/sandbox/([^/]+)/autostop/(-?\d+))", interval("autostop"));
    server_.Post(R"(/api/sandbox/([^/]+)/autodelete/(-?\d+))", interval("autodelete"));
    server_.Post(R"(/api/sandbox/([^/]+)/last-activity)",
                 [this](const Request& req, Response& res) {
                   if (Fault(res, true) || !Auth(req, res)) return;
                   auto b = Find(req.matches[1]);
                   if (!b) return ApiError(res, 404, "Sandbox not found");
                   absl::MutexLock l(&mu_);
                   b->last_activity = options_.clock->Monotonic();
                   res.status = 201;
                 });
    server_.Post(R"(/api/sandbox/([^/]+)/(start|stop))", [this](const Request& req, Response& res) {
      if (Fault(res, true) || !Auth(req, res)) return;
      auto b = Find(req.matches[1]);
      if (!b) return ApiError(res, 404, "Sandbox not found");
      {
        absl::MutexLock l(&mu_);
        b->state = req.matches[2] == "start" ? "started" : "stopped";
        b->last_activity = b->stopped_at = options_.clock->Monotonic();
      }
      Reply(res, 200, Dto(*b));
    });

    // ---- toolbox ----
    server_.Post(R"(/toolbox/([^/]+)/process/(execute|code-run))", [this](const Request& req,
                                                                          Response& res) {
      if (Fault(res, false) || !Auth(req, res)) return;
      auto b = Find(req.matches[1]);
      const std::string path = absl::StrCat("/process/", std::string(req.matches[2]));
      if (!b || b->state != "started") {
        return DaemonError(res, 404, "NOT_FOUND", "not found: sandbox is not running", path);
      }
      json body = json::parse(req.body, nullptr, false);
      if (body.is_discarded() || !body.is_object()) {
        return DaemonError(res, 400, "INVALID_REQUEST_BODY", "bad request: invalid request body",
                           path);
      }
      ExecRequest er;
      er.argv = {"bash"};
      if (req.matches[2] == "execute") {
        std::string command = body.value("command", "");
        if (command.find_first_not_of(" \t\r\n") == std::string::npos) {
          return DaemonError(res, 400, "BAD_REQUEST", "bad request: command is required", path);
        }
        er.code = command + "\n";  // piped on stdin into the shell
        er.cwd = body.value("cwd", "");
      } else {
        const std::string code = body.value("code", "");
        const std::string lang = body.value("language", "");
        std::string argv;
        if (body.contains("argv") && body["argv"].is_array()) {
          std::vector<std::string> a;
          for (const auto& x : body["argv"]) {
            if (x.is_string()) a.push_back(x.get<std::string>());
          }
          argv = absl::StrJoin(a, " ");  // joined, not quoted, like the daemon
        }
        if (lang == "python") {
          er.code = absl::StrCat("printf '%s' '", absl::Base64Escape(code),
                                 "' | base64 -d | python3 -u - ", argv, "\n");
        } else if (lang == "javascript" || lang == "typescript") {
          // TypeScript runs through node too: no ts-node offline (a documented deviation).
          er.code =
              absl::StrCat("printf '%s' '",
                           absl::Base64Escape(absl::StrCat("process.argv.splice(1, 1);\n", code)),
                           "' | base64 -d | node - ", argv, "\n");
        } else {
          return DaemonError(res, 400, "BAD_REQUEST", absl::StrCat("unsupported language: ", lang),
                             path);
        }
      }
      if (body.contains("envs") && body["envs"].is_object()) {
        for (auto it = body["envs"].begin(); it != body["envs"].end(); ++it) {
          if (!ValidEnvKey(it.key())) {
            return DaemonError(res, 400, "BAD_REQUEST",
                               absl::StrCat("bad request: invalid env key: ", it.key()), path);
          }
          if (it.value().is_string()) er.env[it.key()] = it.value().get<std::string>();
        }
      }
      int64_t timeout = 0;
      if (body.contains("timeout") && body["timeout"].is_number_integer()) {
        timeout = body["timeout"].get<int64_t>();
      }
      er.timeout = timeout > 0 ? absl::Seconds(timeout) : absl::Hours(24 * 365);
      er.max_output_bytes = size_t{1} << 30;
      {
        absl::MutexLock l(&mu_);
        b->last_activity = options_.clock->Monotonic();
      }
      auto r = b->sandbox->Exec(er);
      if (!r.ok()) {
        if (r.status().code() == absl::StatusCode::kInvalidArgument) {
          return DaemonError(res, 400, "BAD_REQUEST",
                             absl::StrCat("bad request: ", r.status().message()), path);
        }
        return DaemonError(res, 500, "INTERNAL_SERVER_ERROR", std::string(r.status().message()),
                           path);
      }
      if (r->timed_out) {
        return DaemonError(res, 408, "REQUEST_TIMEOUT",
                           "request timeout: command execution timeout", path);
      }
      const int exit_code = r->exit_code >= 128 ? -1 : r->exit_code;  // signal: -1
      Reply(res, 200, {{"exitCode", exit_code}, {"result", r->output}});
    });
    server_.Post(R"(/toolbox/([^/]+)/files/bulk-upload)", [this](const Request& req,
                                                                 Response& res) {
      if (Fault(res, false) || !Auth(req, res)) return;
      Faults::FileScope in_flight(&faults_);
      auto b = Find(req.matches[1]);
      const std::string path = "/files/bulk-upload";
      if (!b || b->state != "started") {
        return DaemonError(res, 404, "NOT_FOUND", "not found: sandbox is not running", path);
      }
      if (!req.is_multipart_form_data()) {
        return DaemonError(res, 400, "BAD_REQUEST", "bad request: expected multipart/form-data",
                           path);
      }
      // files[i].path fields pair with files[i].file parts by index.
      std::map<std::string, std::string> paths, datas;
      static const std::regex re(R"(^files\[(\d+)\]\.(path|file)$)");
      for (const auto& [field, part] : req.files) {
        std::smatch m;
        if (!std::regex_match(field, m, re)) continue;
        (m[2] == "path" ? paths : datas)[m[1]] = part.content;
      }
      json files = json::array(), errors = json::array();
      for (const auto& [idx, data] : datas) {
        auto p = paths.find(idx);
        if (p == paths.end()) {
          errors.push_back({{"index", idx}, {"error", "missing path"}});
          continue;
        }
        std::string dest = AbsPath(std::string(absl::StripAsciiWhitespace(p->second)));
        absl::Status s = b->sandbox->WriteFile(dest, data);
        if (!s.ok()) {
          errors.push_back({{"path", dest}, {"error", std::string(s.message())}});
        } else {
          files.push_back({{"path", dest}, {"bytes", data.size()}});
        }
      }
      if (!errors.empty() || files.empty()) {
        res.status = 400;
        res.set_content(json({{"errors", errors}, {"files", files}}).dump(), "application/json");
        return;
      }
      Reply(res, 200, {{"files", files}});
    });
    server_.Post(R"(/toolbox/([^/]+)/files/bulk-download)", [this](const Request& req,
                                                                   Response& res) {
      if (Fault(res, false) || !Auth(req, res)) return;
      Faults::FileScope in_flight(&faults_);
      auto b = Find(req.matches[1]);
      const std::string path = "/files/bulk-download";
      if (!b || b->state != "started") {
        return DaemonError(res, 404, "NOT_FOUND", "not found: sandbox is not running", path);
      }
      json body = json::parse(req.body, nullptr, false);
      if (body.is_discarded() || !body.is_object() || !body.contains("paths") ||
          !body["paths"].is_array() || body["paths"].empty()) {
        res.status = 400;
        res.set_content(R"({"error":"request body must be {\"paths\": [ ... ]} and non-empty"})",
                        "application/json");
        return;
      }
      std::string out;
      for (const auto& pj : body["paths"]) {
        const std::string requested = pj.is_string() ? pj.get<std::string>() : "";
        absl::StrAppend(&out, "--", kBoundary, "\r\n");
        auto r = requested.empty() ? absl::StatusOr<std::optional<std::string>>(
                                         absl::InvalidArgumentError("empty path"))
                                   : b->sandbox->ReadFile(AbsPath(requested));
        if (r.ok() && r->has_value()) {
          absl::StrAppend(
              &out, "Content-Disposition: form-data; name=\"file\"; filename=\"", requested,
              "\"\r\nContent-Type: application/octet-stream\r\nContent-Length: ", (*r)->size(),
              "\r\n\r\n");
          out.append(**r);
        } else {
          json err = !r.ok() ? DaemonErrorJson(
                                   400, "INVALID_FILE_PATH",
                                   absl::StrCat("invalid file path: ", r.status().message()), path)
                             : DaemonErrorJson(404, "FILE_NOT_FOUND",
                                               absl::StrCat("file not found: ", requested), path);
          std::string e = err.dump();
          absl::StrAppend(
              &out, "Content-Disposition: form-data; name=\"error\"; filename=\"", requested,
              "\"\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: ", e.size(),
              "\r\n\r\n", e);
        }
        out.append("\r\n");
      }
      absl::StrAppend(&out, "--", kBoundary, "--\r\n");
      res.status = 200;
      res.set_content(out, absl::StrCat("multipart/form-data; boundary=", kBoundary));
    });
    server_.Get(R"(/toolbox/([^/]+)/(user-home-dir|work-dir))",
                [this](const Request& req, Response& res) {
                  if (Fault(res, false) || !Auth(req, res)) return;
                  if (!Find(req.matches[1]))
                    return DaemonError(res, 404, "NOT_FOUND", "not found", "/");
                  Reply(res, 200, {{"dir", kHome}});
                });
  }

  Options options_;
  bool own_root_ = false;
  std::unique_ptr<LocalProvider> local_;
  httplib::Server server_;
  int port_ = 0;
  std::thread listen_thread_;
  std::thread timer_thread_;
  absl::Notification stop_;
  Faults faults_;
  std::atomic<bool> stuck_starting_{false};
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Box>> boxes_ ABSL_GUARDED_BY(mu_);
};

FakeDaytona::FakeDaytona(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FakeDaytona::~FakeDaytona() = default;

absl::StatusOr<std::unique_ptr<FakeDaytona>> FakeDaytona::Start(Options options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  absl::Status s = impl->Init();
  if (!s.ok()) return s;
  return std::unique_ptr<FakeDaytona>(new FakeDaytona(std::move(impl)));
}

int FakeDaytona::port() const { return impl_->port(); }
std::string FakeDaytona::api_url() const {
  return absl::StrCat("http://127.0.0.1:", impl_->port(), "/api");
}
Faults& FakeDaytona::faults() { return impl_->faults(); }
void FakeDaytona::set_stuck_starting(bool stuck) { impl_->set_stuck(stuck); }
int FakeDaytona::ApplyTimersNow() { return impl_->ApplyTimers(); }
bool FakeDaytona::Vanish(const std::string& id) { return impl_->Vanish(id); }
int FakeDaytona::live_sandboxes() const { return impl_->live(); }
std::string FakeDaytona::network(const std::string& id) const { return impl_->Network(id); }
std::map<std::string, std::string> FakeDaytona::labels(const std::string& id) const {
  return impl_->Labels(id);
}
std::string FakeDaytona::state(const std::string& id) const { return impl_->State(id); }
int64_t FakeDaytona::auto_stop_minutes(const std::string& id) const { return impl_->AutoStop(id); }
std::map<std::string, int64_t> FakeDaytona::resources(const std::string& id) const {
  return impl_->Resources(id);
}

}  // namespace sandbox
