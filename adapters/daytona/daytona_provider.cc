#include "adapters/daytona/daytona_provider.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "adapters/api/output.h"
#include "adapters/api/remote_util.h"
#include "adapters/daytona/daytona_wire.h"
#include "common/clock.h"
#include "common/config_reader.h"
#include "common/event_loop.h"
#include "common/status_macros.h"
#include "common/text.h"
#include "nlohmann/json.hpp"

namespace sandbox {
namespace {

constexpr char kSdkVersion[] = "0.218.0";  // >= 0.167.0: the daemon demuxes output
constexpr char kSource[] = "sandbox-broker-cpp";
// How often activity is reported to Daytona while a session is in use.
constexpr absl::Duration kActivityEvery = absl::Seconds(30);

std::string LanguageLabel(Language l) { return l == Language::kNode ? "javascript" : "python"; }

class DaytonaSandbox final : public Sandbox {
 public:
  DaytonaSandbox(DaytonaProvider* provider, std::string id, std::string toolbox, Language language,
                 const SandboxSpec& spec)
      : provider_(provider),
        id_(std::move(id)),
        toolbox_(std::move(toolbox)),
        language_(language),
        env_(spec.env),
        last_activity_(Clock::Real()->Monotonic()) {}

  ~DaytonaSandbox() override { (void)Destroy(); }

  const std::string& id() const override { return id_; }
  const std::string& toolbox() const { return toolbox_; }

  absl::StatusOr<ExecResult> Exec(const ExecRequest& request) override {
    RETURN_IF_ERROR(CheckOpen());
    ASSIGN_OR_RETURN(HttpRequest http, RunRequest(request));
    // Best effort: the request that follows reports any other failure;
    // a sandbox Daytona no longer has is reported now.
    if (absl::Status s = RefreshActivity(false); IsSandboxGone(s)) return s;
    return RunResult(provider_->Send(std::move(http)), request.max_output_bytes, request.on_output);
  }

  // One toolbox request, answered once at the end: sent on the HTTP
  // client's multi handle, so no thread waits for it. The activity refresh
  // (when due) goes alongside, unawaited: a vanished sandbox is reported by
  // the run's own 404/410.
  void ExecAsync(ExecRequest request, ExecDone done) override {
    if (absl::Status s = CheckOpen(); !s.ok()) return done(s);
    absl::StatusOr<HttpRequest> http = RunRequest(request);
    if (!http.ok()) return done(http.status());
    RefreshActivityAsync(false, nullptr);
    const size_t max_output = request.max_output_bytes;
    auto on_output = request.on_output;
    provider_->SendAsync(std::move(*http),
                         [this, max_output, on_output, done](absl::StatusOr<HttpResponse> resp) {
                           done(RunResult(std::move(resp), max_output, on_output));
                         });
  }

  absl::StatusOr<HttpRequest> RunRequest(const ExecRequest& request) {
    std::map<std::string, std::string> envs = env_;
    for (const auto& [k, v] : request.env) envs[k] = v;
    const int64_t timeout_s = std::max<int64_t>(
        1, static_cast<int64_t>(std::ceil(absl::ToDoubleSeconds(request.timeout))));
    std::string path, body;
    if (!request.argv.empty() || request.language == Language::kShell) {
      std::string command = request.code;
      if (!request.argv.empty()) {
        command = ShellJoin(request.argv);
      }
      path = "/process/execute";
      body = daytona::ExecuteBody(command, request.cwd, envs, timeout_s);
    } else {
      if (request.language != language_) {
        return absl::FailedPreconditionError(absl::StrCat(
            "daytona: this session's sandbox runs ", LanguageName(language_),
            " code (a Daytona sandbox's language is fixed at creation); use another session "
            "(spec.language) for ",
            LanguageName(request.language)));
      }
      path = "/process/code-run";
      body = daytona::CodeRunBody(request.code, LanguageLabel(language_), envs, timeout_s);
    }
    HttpRequest http;
    http.method = "POST";
    http.url = absl::StrCat(toolbox_, path);
    http.headers = {{"Content-Type", "application/json"}};
    http.body = std::move(body);
    // The daemon enforces the timeout; the HTTP deadline allows for it.
    http.timeout = absl::Seconds(timeout_s + 5 + provider_->config().request_timeout_seconds);
    http.cancelled = request.cancelled;
    return http;
  }

  absl::StatusOr<ExecResult> RunResult(
      absl::StatusOr<HttpResponse> resp, size_t max_output,
      const std::function<void(OutputStream, absl::string_view)>& on_output) {
    ExecResult r;
    if (!resp.ok()) {
      if (resp.status().code() == absl::StatusCode::kCancelled) {
        r.cancelled = true;
        r.exit_code = 130;
        return r;
      }
      return absl::UnavailableError(absl::StrCat("daytona: run: ", resp.status().message()));
    }
    if (resp->status == 408) {
      // The daemon killed the process group; it discards partial output.
      r.timed_out = true;
      r.exit_code = 124;
      return r;
    }
    if (resp->status == 404 || resp->status == 410) return Gone();
    if (resp->status != 200) return daytona::HttpError("run", resp->status, resp->body);
    ASSIGN_OR_RETURN(daytona::ExecuteResult er, daytona::ParseExecuteResult(resp->body));
    // Daytona answers once, at the end: one chunk, then the result.
    OutputCollector collector(max_output, on_output);
    collector.Append(OutputStream::kStdout, er.result);
    r.truncated = collector.truncated();
    r.output = collector.Take();
    r.exit_code = er.exit_code;
    return r;
  }

  absl::Status WriteFile(absl::string_view path, absl::string_view data) override {
    RETURN_IF_ERROR(CheckOpen());
    RETURN_IF_ERROR(CheckRemotePath(path));
    HttpRequest http = UploadRequest(std::string(path), data);
    // Best effort: the request that follows reports any other failure;
    // a sandbox Daytona no longer has is reported now.
    if (absl::Status s = RefreshActivity(false); IsSandboxGone(s)) return s;
    return UploadAnswer(provider_->Send(std::move(http)));
  }

  absl::StatusOr<std::optional<std::string>> ReadFile(absl::string_view path) override {
    RETURN_IF_ERROR(CheckOpen());
    RETURN_IF_ERROR(CheckRemotePath(path));
    const std::string p(path);
    HttpRequest http = DownloadRequest(p);
    // Best effort: the request that follows reports any other failure;
    // a sandbox Daytona no longer has is reported now.
    if (absl::Status s = RefreshActivity(false); IsSandboxGone(s)) return s;
    return DownloadAnswer(provider_->Send(std::move(http)), p);
  }

  absl::Status KeepAlive() override {
    RETURN_IF_ERROR(CheckOpen());
    return RefreshActivity(true);
  }

  // The same three on the HTTP client's multi handle, as ExecAsync: the
  // activity refresh (when due) goes alongside, unawaited; a vanished
  // sandbox is reported by the transfer's own 404.
  void WriteFileAsync(std::string path, std::string data, StatusDone done) override {
    if (absl::Status s = CheckOpen(); !s.ok()) return done(s);
    if (absl::Status s = CheckRemotePath(path); !s.ok()) return done(s);
    RefreshActivityAsync(false, nullptr);
    provider_->SendAsync(UploadRequest(path, data), [this, done](absl::StatusOr<HttpResponse> r) {
      done(UploadAnswer(std::move(r)));
    });
  }

  void ReadFileAsync(std::string path, ReadDone done) override {
    if (absl::Status s = CheckOpen(); !s.ok()) return done(s);
    if (absl::Status s = CheckRemotePath(path); !s.ok()) return done(s);
    RefreshActivityAsync(false, nullptr);
    provider_->SendAsync(DownloadRequest(path), [this, path, done](absl::StatusOr<HttpResponse> r) {
      done(DownloadAnswer(std::move(r), path));
    });
  }

  void KeepAliveAsync(StatusDone done) override {
    if (absl::Status s = CheckOpen(); !s.ok()) return done(s);
    RefreshActivityAsync(true, std::move(done));
  }

  // Graceful restart: the sandbox lives on (its auto-stop timer still runs).
  void Detach() override {
    absl::MutexLock l(&mu_);
    destroyed_ = true;
  }

  absl::Status Destroy() override {
    {
      absl::MutexLock l(&mu_);
      if (destroyed_) return absl::OkStatus();
      destroyed_ = true;
    }
    return Deleted(provider_->Api("DELETE", absl::StrCat("/sandbox/", id_), ""));
  }

  void DestroyAsync(StatusDone done) override {
    {
      absl::MutexLock l(&mu_);
      if (destroyed_) return done(absl::OkStatus());
      destroyed_ = true;
    }
    provider_->ApiAsync(
        "DELETE", absl::StrCat("/sandbox/", id_), "",
        [done](absl::StatusOr<HttpResponse> resp) { done(Deleted(std::move(resp))); });
  }

  static absl::Status Deleted(absl::StatusOr<HttpResponse> resp) {
    if (!resp.ok()) return resp.status();
    if (resp->status / 100 == 2 || resp->status == 404) return absl::OkStatus();
    return daytona::HttpError("delete sandbox", resp->status, resp->body);
  }

 private:
  absl::Status CheckOpen() {
    absl::MutexLock l(&mu_);
    if (destroyed_) return absl::FailedPreconditionError("daytona: sandbox is closed");
    return absl::OkStatus();
  }

  absl::Status Gone() const {
    return SandboxGoneError(absl::StrCat("daytona: sandbox ", id_,
                                         " no longer exists (stopped or deleted); the next call "
                                         "creates a new one"));
  }

  // Tells Daytona the sandbox is in use (its auto-stop timer counts from
  // the last activity). At most every kActivityEvery unless forced.
  // Whether an activity refresh is due; if so, it counts as sent now.
  bool ActivityDue() {
    const absl::Time now = Clock::Real()->Monotonic();
    absl::MutexLock l(&mu_);
    if (now - last_activity_ < kActivityEvery) return false;
    last_activity_ = now;
    return true;
  }

  HttpRequest UploadRequest(const std::string& p, absl::string_view data) const {
    const std::string base = p.substr(p.rfind('/') + 1);
    MultipartBody m = BuildMultipart(std::vector<MultipartPart>{
        {"files[0].path", "", "", p},
        {"files[0].file", base.empty() ? "file" : base, "", std::string(data)}});
    HttpRequest http;
    http.method = "POST";
    http.url = absl::StrCat(toolbox_, "/files/bulk-upload");
    http.headers = {{"Content-Type", m.content_type}, {"Accept", "*/*"}};
    http.body = std::move(m.body);
    http.timeout = absl::Seconds(provider_->config().request_timeout_seconds);
    return http;
  }

  absl::Status UploadAnswer(absl::StatusOr<HttpResponse> resp) const {
    if (!resp.ok())
      return absl::UnavailableError(absl::StrCat("daytona: write file: ", resp.status().message()));
    if (resp->status / 100 == 2) return absl::OkStatus();
    if (resp->status == 404 && !absl::StrContains(resp->body, "DAYTONA_DAEMON")) return Gone();
    return daytona::HttpError("write file", resp->status, resp->body);
  }

  HttpRequest DownloadRequest(const std::string& p) const {
    HttpRequest http;
    http.method = "POST";
    http.url = absl::StrCat(toolbox_, "/files/bulk-download");
    http.headers = {{"Content-Type", "application/json"}, {"Accept", "multipart/form-data"}};
    http.body = nlohmann::json({{"paths", {p}}}).dump();
    http.timeout = absl::Seconds(provider_->config().request_timeout_seconds);
    return http;
  }

  absl::StatusOr<std::optional<std::string>> DownloadAnswer(absl::StatusOr<HttpResponse> resp,
                                                            const std::string& p) const {
    if (!resp.ok())
      return absl::UnavailableError(absl::StrCat("daytona: read file: ", resp.status().message()));
    if (resp->status != 200) {
      if (resp->status == 404) return Gone();
      return daytona::HttpError("read file", resp->status, resp->body);
    }
    ASSIGN_OR_RETURN(std::vector<daytona::Download> d,
                     daytona::ParseBulkDownload(resp->Header("content-type"), resp->body, {p}));
    if (d[0].found) return std::optional<std::string>(std::move(d[0].data));
    if (d[0].code == "FILE_NOT_FOUND" || d[0].status == 404) return std::optional<std::string>();
    return daytona::HttpError(
        "read file", d[0].status,
        nlohmann::json({{"message", d[0].message}, {"code", d[0].code}}).dump());
  }

  // RefreshActivity on the multi handle; `done` (may be null: unawaited)
  // gets its answer.
  void RefreshActivityAsync(bool force, StatusDone done) {
    if (!force && !ActivityDue()) {
      if (done) done(absl::OkStatus());
      return;
    }
    if (force) {
      absl::MutexLock l(&mu_);
      last_activity_ = Clock::Real()->Monotonic();
    }
    provider_->ApiAsync("POST", absl::StrCat("/sandbox/", id_, "/last-activity"), "{}",
                        [this, done](absl::StatusOr<HttpResponse> resp) {
                          if (!done) return;
                          done(ActivityAnswer(std::move(resp)));
                        });
  }

  absl::Status ActivityAnswer(absl::StatusOr<HttpResponse> resp) const {
    if (!resp.ok()) return resp.status();
    if (resp->status == 404) return Gone();
    if (resp->status / 100 != 2)
      return daytona::HttpError("refresh activity", resp->status, resp->body);
    return absl::OkStatus();
  }

  absl::Status RefreshActivity(bool force) {
    const absl::Time now = Clock::Real()->Monotonic();
    {
      absl::MutexLock l(&mu_);
      if (!force && now - last_activity_ < kActivityEvery) return absl::OkStatus();
      last_activity_ = now;
    }
    return ActivityAnswer(
        provider_->Api("POST", absl::StrCat("/sandbox/", id_, "/last-activity"), "{}"));
  }

  DaytonaProvider* const provider_;
  const std::string id_;
  const std::string toolbox_;  // toolboxProxyUrl + "/" + id
  const Language language_;
  const std::map<std::string, std::string> env_;

  absl::Mutex mu_;
  bool destroyed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_activity_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<DaytonaConfig> ParseDaytonaConfig(const nlohmann::json& json,
                                                 int64_t broker_idle_timeout_seconds) {
  DaytonaConfig c;
  ConfigReader r(json, "providers.daytona");
  const char* env_key = getenv("DAYTONA_API_KEY");
  c.api_key = r.String("api_key", env_key ? env_key : "");
  c.api_url = r.String("api_url", c.api_url, false);
  c.target = r.String("target", "");
  c.snapshot = r.String("snapshot", "");
  c.organization_id = r.String("organization_id", "");
  c.workspace = r.String("workspace", "");
  c.request_timeout_seconds = r.Int("request_timeout_seconds", 60, 1, 3600);
  c.create_timeout_seconds = r.Int("create_timeout_seconds", 60, 1, 3600);
  c.auto_stop_minutes =
      r.Int("auto_stop_minutes", (broker_idle_timeout_seconds + 60 + 59) / 60, 1, 100000);
  c.auto_delete_minutes = r.Int("auto_delete_minutes", 0, 0, 100000);
  const absl::Status pool = ReadPoolConfig(r, &c.pool);
  RETURN_IF_ERROR(r.Finish());
  RETURN_IF_ERROR(pool);
  while (!c.api_url.empty() && c.api_url.back() == '/') c.api_url.pop_back();
  if (c.api_key.empty()) {
    return absl::FailedPreconditionError(
        "daytona: missing API key (set providers.daytona.api_key or DAYTONA_API_KEY)");
  }
  return c;
}

DaytonaProvider::DaytonaProvider(DaytonaConfig config)
    : config_(std::move(config)),
      http_(std::make_shared<HttpClient>(absl::StrCat(kSource, "/", kSdkVersion))) {}

absl::StatusOr<std::unique_ptr<DaytonaProvider>> DaytonaProvider::Create(DaytonaConfig config) {
  if (config.api_key.empty()) return absl::FailedPreconditionError("daytona: missing API key");
  return std::unique_ptr<DaytonaProvider>(new DaytonaProvider(std::move(config)));
}

absl::StatusOr<HttpResponse> DaytonaProvider::Send(HttpRequest request) {
  request.headers.push_back({"Authorization", absl::StrCat("Bearer ", config_.api_key)});
  request.headers.push_back({"X-Daytona-Source", kSource});
  request.headers.push_back({"X-Daytona-SDK-Version", kSdkVersion});
  if (!config_.organization_id.empty()) {
    request.headers.push_back({"X-Daytona-Organization-ID", config_.organization_id});
  }
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<HttpResponse> r = http_->Send(request);
    // Like the SDK: only failures before the request reached the server are
    // retried, at most twice, 250 ms x attempt apart.
    if (r.ok() || !IsConnectFailure(r.status()) || attempt >= 2) return r;
    absl::SleepFor(absl::Milliseconds(250 * (attempt + 1)));
  }
}

absl::Status DaytonaProvider::CheckHealth() {
  auto resp = Api("GET", "/sandbox", "");
  if (!resp.ok()) {
    return absl::UnavailableError(absl::StrCat("daytona: health probe: ", resp.status().message()));
  }
  if (resp->status / 100 == 2 || resp->status == 429) return absl::OkStatus();
  return daytona::HttpError("health probe (list sandboxes)", resp->status, resp->body);
}

HttpRequest DaytonaProvider::ApiRequest(const std::string& method, const std::string& path,
                                        const std::string& body) const {
  HttpRequest http;
  http.method = method;
  http.url = absl::StrCat(config_.api_url, path);
  http.headers = {{"Accept", "application/json"}};
  if (!body.empty()) http.headers.push_back({"Content-Type", "application/json"});
  http.body = body;
  http.timeout = absl::Seconds(config_.request_timeout_seconds);
  return http;
}

void DaytonaProvider::SendAsync(HttpRequest request, HttpClient::Done done, int attempt) {
  if (attempt == 0) {
    request.headers.push_back({"Authorization", absl::StrCat("Bearer ", config_.api_key)});
    request.headers.push_back({"X-Daytona-Source", kSource});
    request.headers.push_back({"X-Daytona-SDK-Version", kSdkVersion});
    if (!config_.organization_id.empty()) {
      request.headers.push_back({"X-Daytona-Organization-ID", config_.organization_id});
    }
  }
  HttpRequest copy = request;
  http_->SendAsync(std::move(copy), [this, request = std::move(request), done,
                                     attempt](absl::StatusOr<HttpResponse> r) mutable {
    if (r.ok() || !IsConnectFailure(r.status()) || attempt >= 2) {
      done(std::move(r));
      return;
    }
    EventLoop::Shared()->After(absl::Milliseconds(250 * (attempt + 1)),
                               [this, request = std::move(request), done, attempt]() mutable {
                                 SendAsync(std::move(request), std::move(done), attempt + 1);
                               });
  });
}

absl::StatusOr<HttpResponse> DaytonaProvider::Api(const std::string& method,
                                                  const std::string& path,
                                                  const std::string& body) {
  absl::StatusOr<HttpResponse> r = Send(ApiRequest(method, path, body));
  if (!r.ok() && r.status().code() != absl::StatusCode::kCancelled) {
    // A transport failure or timeout names the provider and is UNAVAILABLE
    // (retryable), whatever the HTTP layer called it.
    absl::Status s = absl::UnavailableError(absl::StrCat(
        "daytona: ", method, " ", path.substr(0, path.find('/', 1)), ": ", r.status().message()));
    r.status().ForEachPayload(
        [&](absl::string_view url, const absl::Cord& payload) { s.SetPayload(url, payload); });
    return s;
  }
  return r;
}

void DaytonaProvider::ApiAsync(const std::string& method, const std::string& path,
                               const std::string& body, HttpClient::Done done) {
  SendAsync(ApiRequest(method, path, body), [method, path, done = std::move(done)](
                                                absl::StatusOr<HttpResponse> r) {
    if (!r.ok() && r.status().code() != absl::StatusCode::kCancelled) {
      absl::Status s = absl::UnavailableError(absl::StrCat(
          "daytona: ", method, " ", path.substr(0, path.find('/', 1)), ": ", r.status().message()));
      r.status().ForEachPayload(
          [&](absl::string_view url, const absl::Cord& payload) { s.SetPayload(url, payload); });
      return done(s);
    }
    done(std::move(r));
  });
}

void DaytonaProvider::DeleteAsync(const std::string& id) {
  ApiAsync("DELETE", absl::StrCat("/sandbox/", id), "", [](absl::StatusOr<HttpResponse>) {});
}

absl::Status DaytonaProvider::DeleteSandbox(const std::string& id) {
  auto resp = Api("DELETE", absl::StrCat("/sandbox/", id), "");
  if (!resp.ok()) return resp.status();
  if (resp->status / 100 == 2 || resp->status == 404) return absl::OkStatus();
  return daytona::HttpError("delete sandbox", resp->status, resp->body);
}

std::map<std::string, std::string> DaytonaProvider::LabelsOf(const SandboxSpec& spec) const {
  std::map<std::string, std::string> labels = spec.labels;
  if (spec.pool.empty()) {
    labels["sandbox-broker.tenant"] = spec.tenant;
    labels["sandbox-broker.session-id"] = spec.session_id;
  } else {
    labels[kPoolTag] = spec.pool;
  }
  labels["sandbox-broker.instance-id"] = spec.broker_instance_id;
  labels[daytona::kLanguageLabel] = LanguageLabel(spec.language);
  if (!spec.deployment_id.empty()) {
    labels[kDeploymentTag] = spec.deployment_id;
    labels[kAttemptTag] = spec.attempt_id;
  }
  return labels;
}

namespace {

// Daytona sizes sandboxes in whole CPUs and GiB. A size asked for rounds
// up and must stay within the tenant's ceiling; a session asking for the
// default gets the ceiling itself, rounded down. What cannot be given that
// way (a ceiling below one unit, a pids limit) is FAILED_PRECONDITION
// naming the key: the tenant's limit is never silently dropped.
absl::Status SizeWithin(const SandboxResources& asked, const SandboxResources& ceiling,
                        daytona::CreateParams* p) {
  if (asked.pids > 0 || ceiling.pids > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("daytona: resources.pids (", asked.pids > 0 ? "asked" : "the tenant's ceiling",
                     ") cannot be applied: Daytona's create API takes cpu, memory and disk only"));
  }
  // Whole CPUs as an integer Daytona can read: a count past int32 is no
  // request any server grants (and would not convert).
  constexpr double kMaxCpus = 1 << 20;
  if (asked.cpus > kMaxCpus) {
    return absl::InvalidArgumentError(
        absl::StrCat("daytona: resources.cpus ", asked.cpus, " is over ", kMaxCpus));
  }
  auto over = [](const char* key, double asked, int64_t units, const char* unit, double ceiling) {
    return absl::FailedPreconditionError(
        absl::StrCat("daytona: resources.", key, " ", asked, " rounds up to ", units, " ", unit,
                     ", over the tenant's ceiling (", ceiling, "); Daytona sizes in whole ", unit));
  };
  auto below = [](const char* key, double ceiling, const char* unit) {
    return absl::FailedPreconditionError(absl::StrCat("daytona: the tenant's resources.", key,
                                                      " ceiling (", ceiling, ") is below one ",
                                                      unit, ", the least Daytona gives"));
  };
  if (asked.cpus > 0) {
    p->cpu = static_cast<int64_t>(std::ceil(asked.cpus));
    if (ceiling.cpus > 0 && p->cpu > ceiling.cpus) {
      return over("cpus", asked.cpus, p->cpu, "CPUs", ceiling.cpus);
    }
  } else if (ceiling.cpus > 0) {
    p->cpu = static_cast<int64_t>(std::floor(std::min(ceiling.cpus, kMaxCpus)));
    if (p->cpu == 0) return below("cpus", ceiling.cpus, "CPU");
  }
  constexpr int64_t kGiB = int64_t{1} << 30;
  // Rounded up without the overflow of (bytes + kGiB - 1).
  const auto gib_up = [](int64_t bytes) { return bytes / kGiB + (bytes % kGiB != 0 ? 1 : 0); };
  for (auto [key, a, c, out] :
       {std::tuple<const char*, int64_t, int64_t, int64_t*>{"memory_bytes", asked.memory_bytes,
                                                            ceiling.memory_bytes, &p->memory_gib},
        {"disk_bytes", asked.disk_bytes, ceiling.disk_bytes, &p->disk_gib}}) {
    if (a > 0) {
      *out = gib_up(a);
      if (c > 0 && *out > c / kGiB) {
        return over(key, static_cast<double>(a), *out, "GiB", static_cast<double>(c));
      }
    } else if (c > 0) {
      *out = c / kGiB;
      if (*out == 0) return below(key, static_cast<double>(c), "GiB");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> DaytonaProvider::CreateBody(const SandboxSpec& spec) const {
  daytona::CreateParams p;
  RETURN_IF_ERROR(daytona::MapNetwork(spec.network, &p));
  p.snapshot = spec.template_name.empty() ? config_.snapshot : spec.template_name;
  p.target = config_.target;
  p.env = spec.env;
  p.labels = LabelsOf(spec);
  if (!config_.workspace.empty()) {
    p.name = absl::StrCat(config_.workspace, "-", spec.pool.empty() ? spec.session_id : "pool", "-",
                          RandomHex(3));
  }
  p.auto_stop_minutes = config_.auto_stop_minutes;
  if (!spec.pool.empty()) {
    // A pool member: not stopped while it waits unused to be claimed.
    p.auto_stop_minutes = std::max<int64_t>(
        p.auto_stop_minutes, (absl::ToInt64Seconds(spec.keep_unclaimed) + 59) / 60 + 1);
  }
  p.auto_delete_minutes = config_.auto_delete_minutes;
  RETURN_IF_ERROR(SizeWithin(spec.resources, spec.ceiling, &p));
  return daytona::CreateSandboxBody(p);
}

// One Create or Attach, step by step on the HTTP thread and timers: no
// thread waits while Daytona starts the sandbox.
struct DaytonaProvider::StartOp : std::enable_shared_from_this<DaytonaProvider::StartOp> {
  DaytonaProvider* provider;
  bool attach = false;  // else a create
  std::string id;       // the sandbox (a create learns it from the POST)
  SandboxSpec spec;
  SandboxDone done;
  absl::Time deadline;
  absl::Duration every = absl::Milliseconds(100);
  bool started = false;  // attach: a start was asked for
  daytona::SandboxDto dto;

  absl::Status Gone() const {
    return SandboxGoneError(absl::StrCat("daytona: sandbox ", id, " no longer exists"));
  }
  // A create that fails deletes what it made: nothing is left behind.
  void Fail(absl::Status s) {
    if (!attach && !id.empty()) provider->DeleteAsync(id);
    done(std::move(s));
  }

  // The sandbox's state is `dto`: done, or wait and look again.
  void Step() {
    auto self = shared_from_this();
    if (dto.state == "started") return Proxy();
    if (dto.state == "error" || dto.state == "build_failed") {
      if (attach) return Fail(Gone());
      return Fail(absl::FailedPreconditionError(
          absl::StrCat("daytona: sandbox ", id, " failed to start: ", dto.state,
                       dto.error_reason.empty() ? "" : absl::StrCat(": ", dto.error_reason))));
    }
    if (attach && (dto.state == "destroyed" || dto.state == "destroying")) return Fail(Gone());
    if (attach && (dto.state == "stopped" || dto.state == "archived") && !started) {
      // Stopped by its auto-stop timer while the broker was away: start it.
      started = true;
      provider->ApiAsync(
          "POST", absl::StrCat("/sandbox/", id, "/start"), "",
          [self](absl::StatusOr<HttpResponse> st) {
            if (!st.ok()) return self->Fail(st.status());
            if (st->status == 404) return self->Fail(self->Gone());
            if (st->status / 100 != 2) {
              return self->Fail(daytona::HttpError("start sandbox", st->status, st->body));
            }
            self->Get();
          });
      return;
    }
    if (Clock::Real()->Monotonic() + every > deadline) {
      return Fail(absl::DeadlineExceededError(
          attach ? absl::StrCat("daytona: sandbox ", id, " did not start (state ", dto.state, ")")
                 : absl::StrCat("daytona: sandbox ", id, " did not start within ",
                                provider->config_.create_timeout_seconds, " s (state ", dto.state,
                                ")")));
    }
    // Poll with backoff (100 ms, x1.1, at most 1 s).
    const absl::Duration wait = every;
    every = std::min(every * 1.1, absl::Seconds(1));
    EventLoop::Shared()->After(wait, [self] { self->Get(); });
  }

  void Get() {
    auto self = shared_from_this();
    provider->ApiAsync(
        "GET", absl::StrCat("/sandbox/", id), "", [self](absl::StatusOr<HttpResponse> got) {
          if (!got.ok()) {
            if (self->attach) return self->Fail(got.status());
            return self->Step();  // transient; the deadline bounds it
          }
          if (self->attach && got->status == 404) return self->Fail(self->Gone());
          if (got->status / 100 != 2) {
            return self->Fail(daytona::HttpError(self->attach ? "get sandbox" : "wait for sandbox",
                                                 got->status, got->body));
          }
          auto parsed = daytona::ParseSandbox(got->body);
          if (!parsed.ok()) {
            if (self->attach) return self->Fail(parsed.status());
          } else {
            self->dto = std::move(*parsed);
          }
          self->Step();
        });
  }

  void Proxy() {
    if (!dto.toolbox_proxy_url.empty()) return Finish(dto.toolbox_proxy_url);
    // SDK >= 0.199 falls back to this call.
    auto self = shared_from_this();
    provider->ApiAsync(
        "GET", absl::StrCat("/sandbox/", id, "/toolbox-proxy-url"), "",
        [self](absl::StatusOr<HttpResponse> r) {
          std::string proxy;
          if (r.ok() && r->status == 200) {
            nlohmann::json j = nlohmann::json::parse(r->body, nullptr, false);
            if (!j.is_discarded() && j.is_object() && j.contains("url") && j["url"].is_string()) {
              proxy = j["url"].get<std::string>();
            }
          }
          if (proxy.empty()) {
            return self->Fail(
                absl::UnavailableError("daytona: no toolbox proxy URL for the sandbox"));
          }
          self->Finish(proxy);
        });
  }

  void Finish(const std::string& proxy) {
    Language language = spec.language;
    if (attach) {
      // The language was fixed at creation: its label says which.
      auto lang = dto.labels.find(daytona::kLanguageLabel);
      if (lang != dto.labels.end()) {
        language = lang->second == "javascript" || lang->second == "typescript" ? Language::kNode
                                                                                : Language::kPython;
      }
    }
    std::string toolbox = absl::StrCat(proxy, absl::EndsWith(proxy, "/") ? "" : "/", dto.id);
    done(std::unique_ptr<Sandbox>(
        new DaytonaSandbox(provider, dto.id, std::move(toolbox), language, spec)));
  }
};

void DaytonaProvider::CreateAsync(SandboxSpec spec, SandboxDone done) {
  absl::StatusOr<std::string> body = CreateBody(spec);
  if (!body.ok()) return done(body.status());
  auto op = std::make_shared<StartOp>();
  op->provider = this;
  op->spec = std::move(spec);
  op->done = std::move(done);
  op->deadline = Clock::Real()->Monotonic() + absl::Seconds(config_.create_timeout_seconds);
  ApiAsync("POST", "/sandbox", *body, [op](absl::StatusOr<HttpResponse> resp) {
    if (!resp.ok()) return op->done(resp.status());
    if (resp->status / 100 != 2) {
      return op->done(daytona::HttpError("create sandbox", resp->status, resp->body));
    }
    absl::StatusOr<daytona::SandboxDto> dto = daytona::ParseSandbox(resp->body);
    if (!dto.ok()) return op->done(dto.status());
    op->dto = std::move(*dto);
    op->id = op->dto.id;
    op->Step();
  });
}

void DaytonaProvider::AttachAsync(std::string sandbox_id, SandboxSpec spec, SandboxDone done) {
  if (sandbox_id.empty() || sandbox_id.find_first_of("/?#% ") != std::string::npos) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("daytona: \"", sandbox_id, "\" is not a sandbox id")));
  }
  auto op = std::make_shared<StartOp>();
  op->provider = this;
  op->attach = true;
  op->id = std::move(sandbox_id);
  op->spec = std::move(spec);
  op->done = std::move(done);
  op->deadline = Clock::Real()->Monotonic() + absl::Seconds(config_.create_timeout_seconds);
  op->Get();
}

namespace {
// Waits for an asynchronous create or attach (never on the HTTP thread).
absl::StatusOr<std::unique_ptr<Sandbox>> Await(
    const std::function<void(Provider::SandboxDone)>& start) {
  absl::Notification settled;
  absl::StatusOr<std::unique_ptr<Sandbox>> out = absl::UnknownError("unset");
  start([&](absl::StatusOr<std::unique_ptr<Sandbox>> r) {
    out = std::move(r);
    settled.Notify();
  });
  settled.WaitForNotification();
  return out;
}
}  // namespace

absl::StatusOr<std::unique_ptr<Sandbox>> DaytonaProvider::Create(const SandboxSpec& spec) {
  return Await([&](SandboxDone done) { CreateAsync(spec, std::move(done)); });
}

absl::StatusOr<std::unique_ptr<Sandbox>> DaytonaProvider::Attach(const std::string& sandbox_id,
                                                                 const SandboxSpec& spec) {
  return Await([&](SandboxDone done) { AttachAsync(sandbox_id, spec, std::move(done)); });
}

// ---- warm pools --------------------------------------------------------------

bool DaytonaProvider::CanClaim(const SandboxSpec& member, const SandboxSpec& session) const {
  auto snapshot_of = [this](const SandboxSpec& s) {
    return s.template_name.empty() ? config_.snapshot : s.template_name;
  };
  return session.pool.empty() && session.resources.empty() && session.ceiling.empty() &&
         session.network.IsDefault() && snapshot_of(member) == snapshot_of(session) &&
         LanguageLabel(member.language) == LanguageLabel(session.language);
}

absl::StatusOr<std::unique_ptr<Sandbox>> DaytonaProvider::Claim(Sandbox* member,
                                                                const SandboxSpec& session) {
  auto* m = dynamic_cast<DaytonaSandbox*>(member);
  if (m == nullptr) return absl::InvalidArgumentError("daytona: not a daytona sandbox");
  // The session's labels replace the pool's (as the SDK's setLabels).
  ASSIGN_OR_RETURN(HttpResponse resp, Api("PUT", absl::StrCat("/sandbox/", m->id(), "/labels"),
                                          nlohmann::json({{"labels", LabelsOf(session)}}).dump()));
  if (resp.status == 404) {
    return SandboxGoneError(absl::StrCat("daytona: sandbox ", m->id(), " no longer exists"));
  }
  if (resp.status / 100 != 2) return daytona::HttpError("replace labels", resp.status, resp.body);
  // The session's dead-man's switch instead of the pool's longer one.
  ASSIGN_OR_RETURN(
      resp,
      Api("POST", absl::StrCat("/sandbox/", m->id(), "/autostop/", config_.auto_stop_minutes), ""));
  if (resp.status == 404) {
    return SandboxGoneError(absl::StrCat("daytona: sandbox ", m->id(), " no longer exists"));
  }
  if (resp.status / 100 != 2) return daytona::HttpError("set auto-stop", resp.status, resp.body);
  auto claimed =
      std::make_unique<DaytonaSandbox>(this, m->id(), m->toolbox(), session.language, session);
  m->Detach();
  return std::unique_ptr<Sandbox>(std::move(claimed));
}

// ---- durable sessions ------------------------------------------------------

absl::StatusOr<std::vector<OwnedSandbox>> DaytonaProvider::ListOwned(
    const std::string& deployment_id) {
  const std::string labels = nlohmann::json({{kDeploymentTag, deployment_id}}).dump();
  std::vector<OwnedSandbox> out;
  std::string cursor;
  for (int page = 0; page < 10000; ++page) {
    std::string path =
        absl::StrCat("/sandbox?labels=", HttpClient::UrlEncode(labels), "&limit=100");
    if (!cursor.empty()) absl::StrAppend(&path, "&cursor=", HttpClient::UrlEncode(cursor));
    ASSIGN_OR_RETURN(HttpResponse resp, Api("GET", path, ""));
    if (resp.status != 200) return daytona::HttpError("list sandboxes", resp.status, resp.body);
    nlohmann::json j = nlohmann::json::parse(resp.body, nullptr, false);
    const nlohmann::json* items = nullptr;
    if (j.is_object() && j.contains("items") && j["items"].is_array()) {
      items = &j["items"];
    } else if (j.is_array()) {
      items = &j;  // older servers: a bare array
    } else {
      return absl::UnavailableError("daytona: list sandboxes: unexpected reply");
    }
    for (const auto& item : *items) {
      if (!item.is_object() || !item.contains("id") || !item["id"].is_string()) continue;
      std::map<std::string, std::string> l;
      if (item.contains("labels") && item["labels"].is_object()) {
        for (auto it = item["labels"].begin(); it != item["labels"].end(); ++it) {
          if (it.value().is_string()) l[it.key()] = it.value().get<std::string>();
        }
      }
      if (l[kDeploymentTag] != deployment_id) continue;  // never another deployment's
      const auto st = item.find("state");
      const std::string state =
          st != item.end() && st->is_string() ? st->get<std::string>() : std::string();
      if (state == "destroyed" || state == "destroying") continue;
      const std::string created = item.contains("createdAt") && item["createdAt"].is_string()
                                      ? item["createdAt"].get<std::string>()
                                      : std::string();
      OwnedSandbox o = OwnedFromTags(item["id"].get<std::string>(), l, created);
      out.push_back(std::move(o));
    }
    cursor.clear();
    if (j.is_object() && j.contains("nextCursor") && j["nextCursor"].is_string()) {
      cursor = j["nextCursor"].get<std::string>();
    }
    if (cursor.empty()) break;
  }
  return out;
}

}  // namespace sandbox
