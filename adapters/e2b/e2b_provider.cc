#include "adapters/e2b/e2b_provider.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "adapters/api/output.h"
#include "adapters/api/remote_util.h"
#include "adapters/e2b/e2b_wire.h"
#include "common/clock.h"
#include "common/config_reader.h"
#include "common/event_loop.h"
#include "common/status_macros.h"
#include "common/text.h"

namespace sandbox {
namespace {

constexpr char kUserAgent[] = "sandbox-broker/0.1 (e2b)";
// Programs up to this size travel inside the start request (base64 stays well
// under Linux's 128 KiB limit for one argument); larger ones are uploaded.
constexpr size_t kInlineCodeBytes = 64 * 1024;

class E2BSandbox final : public Sandbox {
 public:
  E2BSandbox(E2BProvider* provider, e2b::SandboxInfo info, const SandboxSpec& spec,
             int64_t ttl_seconds)
      : provider_(provider),
        info_(std::move(info)),
        envd_(provider->EnvdUrl(info_.sandbox_id, info_.domain)),
        env_(spec.env),
        ttl_(absl::Seconds(ttl_seconds)),
        ttl_deadline_(Clock::Real()->Monotonic() + ttl_) {}

  ~E2BSandbox() override { (void)Destroy(); }

  const std::string& id() const override { return info_.sandbox_id; }
  const e2b::SandboxInfo& info() const { return info_; }
  // A claimed pool member's timeout becomes a session's.
  absl::Status SetTimeout(int64_t seconds) { return SetTtl(seconds); }

  // One run's state, shared by the transfer's callbacks.
  struct RunState {
    explicit RunState(const ExecRequest& r)
        : request(r), collector(r.max_output_bytes, r.on_output) {}
    ExecRequest request;
    OutputCollector collector;
    e2b::EnvelopeReader reader;
    absl::Status stream_status;
    std::optional<e2b::ProcessEvent> end;
    uint32_t pid = 0;
    bool saw_end_stream = false, timed_out = false, cancelled = false;
    absl::Time deadline;
    // A large program already uploaded here (the asynchronous path uploads
    // it before the start request is built).
    std::string uploaded_file;
  };

  absl::StatusOr<ExecResult> Exec(const ExecRequest& request) override {
    RETURN_IF_ERROR(CheckOpen());
    // The run must not outlive the sandbox's own E2B timeout.
    RETURN_IF_ERROR(EnsureTtl(request.timeout + ttl_));
    auto st = std::make_shared<RunState>(request);
    ASSIGN_OR_RETURN(HttpRequest http, StartRequest(st, /*may_block=*/true));
    absl::StatusOr<HttpResponse> resp = provider_->http()->Send(http);
    return FinishRun(*st, std::move(resp), /*may_block=*/true);
  }

  // The process stream on the HTTP client's multi handle: no thread waits.
  // The steps a run may need first (its TTL extended, a large program
  // uploaded) are requests on the multi handle too.
  void ExecAsync(ExecRequest request, ExecDone done) override {
    if (absl::Status open = CheckOpen(); !open.ok()) return done(open);
    // The run must not outlive the sandbox's own E2B timeout: extended
    // first when it would (a session's first run, mostly).
    auto st = std::make_shared<RunState>(request);
    EnsureTtlAsync(request.timeout + ttl_, [this, st, done](absl::Status s) {
      if (!s.ok()) return done(s);
      const ExecRequest& r = st->request;
      if (!r.argv.empty() || r.language == Language::kShell || r.code.size() <= kInlineCodeBytes) {
        return StartAsync(st, done);
      }
      const std::string file = ProgramFile(r.language);
      provider_->http()->SendAsync(
          UploadRequest(file, r.code), [this, st, file, done](absl::StatusOr<HttpResponse> resp) {
            if (absl::Status up = UploadAnswer(std::move(resp), "run"); !up.ok()) {
              return done(up);
            }
            st->uploaded_file = file;
            StartAsync(st, done);
          });
    });
  }

  // Where a large program goes: a fresh name in /tmp.
  static std::string ProgramFile(Language language) {
    const std::string ext = language == Language::kPython ? "py"
                            : language == Language::kNode ? "js"
                                                          : "sh";
    return absl::StrCat("/tmp/.sandbox-broker-", RandomHex(8), ".", ext);
  }

  // The run's Process/Start stream on the multi handle.
  void StartAsync(const std::shared_ptr<RunState>& st, ExecDone done) {
    absl::StatusOr<HttpRequest> http = StartRequest(st, /*may_block=*/false);
    if (!http.ok()) return done(http.status());
    provider_->http()->SendAsync(std::move(*http),
                                 [this, st, done](absl::StatusOr<HttpResponse> resp) {
                                   if ((st->timed_out || st->cancelled) && st->pid != 0) {
                                     // The kill is a request of its own: sent without waiting.
                                     KillAsync(st->pid);
                                   }
                                   done(FinishRun(*st, std::move(resp), /*may_block=*/false));
                                 });
  }

  // The Process/Start request whose stream feeds `st`.
  absl::StatusOr<HttpRequest> StartRequest(const std::shared_ptr<RunState>& st, bool may_block) {
    const ExecRequest& request = st->request;
    std::string command;
    if (!request.argv.empty()) {
      command = ShellJoin(request.argv);
    } else if (request.language == Language::kShell &&
               request.code.find('\0') == std::string::npos) {
      command = request.code;  // a shell command, as the SDK's commands.run sends it
    } else if (request.language != Language::kShell && request.code.size() <= kInlineCodeBytes) {
      // The program reaches the interpreter on stdin, base64-decoded, so any
      // bytes run exactly and the shell never parses it; `exec` makes the
      // interpreter the process envd (and our SIGKILL) targets. One request.
      command =
          absl::StrCat("exec ", request.language == Language::kPython ? "python3 -u -" : "node -",
                       " < <(printf '%s' '", absl::Base64Escape(request.code), "' | base64 -d)");
    } else {
      // Large programs go in a file (a command line has a size limit). The
      // file is unlinked before the interpreter starts.
      std::string file = st->uploaded_file;
      if (file.empty()) {
        if (!may_block) return absl::InternalError("e2b: upload on the async path");
        file = ProgramFile(request.language);
        RETURN_IF_ERROR(Upload(file, request.code, "run"));
      }
      switch (request.language) {
        case Language::kPython:
          command = absl::StrCat("exec 0<", file, "; rm -f ", file, "; exec python3 -u -");
          break;
        case Language::kNode:
          command = absl::StrCat("exec 0<", file, "; rm -f ", file, "; exec node -");
          break;
        case Language::kShell:
          command =
              absl::StrCat("exec 3<", file, " 0</dev/null; rm -f ", file, "; exec bash /dev/fd/3");
          break;
      }
    }
    std::map<std::string, std::string> envs = env_;
    for (const auto& [k, v] : request.env) envs[k] = v;
    const std::string body = e2b::EncodeEnvelope(
        0, e2b::StartRequestJson("/bin/bash", {"-l", "-c", command}, envs, request.cwd));

    st->deadline = Clock::Real()->Monotonic() + request.timeout;
    HttpRequest http;
    http.method = "POST";
    http.url = absl::StrCat(envd_, "/process.Process/Start");
    http.headers = EnvdHeaders();
    http.headers.push_back({"Content-Type", "application/connect+json"});
    http.headers.push_back({"Connect-Protocol-Version", "1"});
    http.headers.push_back(
        {"Connect-Timeout-Ms", absl::StrCat(absl::ToInt64Milliseconds(request.timeout))});
    http.headers.push_back({"Keepalive-Ping-Interval", "50"});
    http.body = body;
    http.timeout = request.timeout + absl::Seconds(provider_->config().request_timeout_seconds);
    RunState* s = st.get();  // the request lives no longer than the state
    http.on_body = [s](absl::string_view chunk) {
      s->reader.Feed(chunk);
      while (true) {
        auto env = s->reader.Next();
        if (!env.ok()) {
          // envd's framing is broken: a provider fault, not the caller's.
          s->stream_status = absl::UnavailableError(
              absl::StrCat("malformed process stream: ", env.status().message()));
          return false;
        }
        if (!env->has_value()) return true;
        const e2b::Envelope& e = **env;
        if (e.flags & e2b::kFlagEndStream) {
          s->saw_end_stream = true;
          s->stream_status = e2b::ParseEndStream(e.payload);
          continue;
        }
        auto ev = e2b::ParseProcessEvent(e.payload);
        if (!ev.ok()) {
          s->stream_status = ev.status();
          return false;
        }
        switch (ev->kind) {
          case e2b::ProcessEvent::kStart:
            s->pid = ev->pid;
            break;
          case e2b::ProcessEvent::kStdout:
          case e2b::ProcessEvent::kPty:
            s->collector.Append(OutputStream::kStdout, ev->data);
            break;
          case e2b::ProcessEvent::kStderr:
            s->collector.Append(OutputStream::kStderr, ev->data);
            break;
          case e2b::ProcessEvent::kEnd:
            s->end = *ev;
            break;
          default:
            break;
        }
      }
    };
    http.cancelled = [s] {
      if (s->request.cancelled && s->request.cancelled()) {
        s->cancelled = true;
        return true;
      }
      if (Clock::Real()->Monotonic() >= s->deadline) {
        s->timed_out = true;
        return true;
      }
      return false;
    };
    return http;
  }

  absl::StatusOr<ExecResult> FinishRun(RunState& st, absl::StatusOr<HttpResponse> resp,
                                       bool may_block) {
    if (resp.ok() && resp->status != 200) {
      if (e2b::IsSandboxGone(resp->status, resp->body)) {
        return SandboxGoneError(absl::StrCat("e2b: sandbox ", id(),
                                             " no longer exists (expired or killed); the next "
                                             "call creates a new one"));
      }
      return e2b::HttpError("run", resp->status, resp->body);
    }
    if (!resp.ok() && resp.status().code() != absl::StatusCode::kCancelled) {
      return absl::UnavailableError(absl::StrCat("e2b: run: ", resp.status().message()));
    }
    bool timed_out = st.timed_out;
    if (st.timed_out || st.cancelled) {
      // envd kills at Connect-Timeout-Ms too; a cancel needs the signal.
      if (st.pid != 0 && may_block) Kill(st.pid);
    } else if (!st.stream_status.ok()) {
      if (st.stream_status.code() == absl::StatusCode::kDeadlineExceeded) {
        timed_out = true;
      } else {
        return absl::Status(st.stream_status.code(),
                            absl::StrCat("e2b: run: ", st.stream_status.message()));
      }
    } else if (!st.end.has_value() || !st.saw_end_stream) {
      return absl::UnavailableError("e2b: run: the process stream ended without a result");
    }
    ExecResult r;
    r.truncated = st.collector.truncated();
    r.output = st.collector.Take();
    r.timed_out = timed_out;
    r.cancelled = st.cancelled;
    if (timed_out) {
      r.exit_code = 124;
    } else if (st.end.has_value()) {
      const e2b::ProcessEvent& end = *st.end;
      r.exit_code =
          (end.exit_code < 0 || (!end.exited && !end.status.empty())) ? 128 + 9 : end.exit_code;
    }
    return r;
  }

  absl::Status WriteFile(absl::string_view path, absl::string_view data) override {
    RETURN_IF_ERROR(CheckOpen());
    RETURN_IF_ERROR(CheckRemotePath(path));
    RETURN_IF_ERROR(EnsureTtl(ttl_ / 2));
    return Upload(std::string(path), std::string(data), "write file");
  }

  absl::StatusOr<std::optional<std::string>> ReadFile(absl::string_view path) override {
    RETURN_IF_ERROR(CheckOpen());
    RETURN_IF_ERROR(CheckRemotePath(path));
    RETURN_IF_ERROR(EnsureTtl(ttl_ / 2));
    return ReadAnswer(provider_->http()->Send(ReadRequest(path)));
  }

  absl::Status KeepAlive() override {
    RETURN_IF_ERROR(CheckOpen());
    return EnsureTtl(ttl_);
  }

  // E2B's network update, as the SDK's updateNetwork sends it: the whole
  // rule set replaced.
  absl::Status UpdateNetwork(const NetworkPolicy& policy) override {
    RETURN_IF_ERROR(CheckOpen());
    ASSIGN_OR_RETURN(e2b::Network n, e2b::MapNetwork(policy));
    absl::StatusOr<HttpResponse> resp = provider_->ControlRequest(
        "PUT", absl::StrCat("/sandboxes/", id(), "/network"), e2b::NetworkUpdateBody(n));
    if (!resp.ok()) return resp.status();
    if (resp->status == 404) {
      return SandboxGoneError(absl::StrCat("e2b: sandbox ", id(), " no longer exists"));
    }
    if (resp->status / 100 != 2) return e2b::HttpError("update network", resp->status, resp->body);
    return absl::OkStatus();
  }

  // The same three on the HTTP client's multi handle: the timeout
  // extension (when due), then the transfer, no thread waiting for either.
  void WriteFileAsync(std::string path, std::string data, StatusDone done) override {
    if (absl::Status s = CheckOpen(); !s.ok()) return done(s);
    if (absl::Status s = CheckRemotePath(path); !s.ok()) return done(s);
    EnsureTtlAsync(ttl_ / 2, [this, path = std::move(path), data = std::move(data),
                              done = std::move(done)](absl::Status ttl) mutable {
      if (!ttl.ok()) return done(ttl);
      provider_->http()->SendAsync(UploadRequest(path, data),
                                   [this, done](absl::StatusOr<HttpResponse> resp) {
                                     done(UploadAnswer(std::move(resp), "write file"));
                                   });
    });
  }

  void ReadFileAsync(std::string path, ReadDone done) override {
    if (absl::Status s = CheckOpen(); !s.ok()) return done(s);
    if (absl::Status s = CheckRemotePath(path); !s.ok()) return done(s);
    EnsureTtlAsync(
        ttl_ / 2, [this, path = std::move(path), done = std::move(done)](absl::Status ttl) mutable {
          if (!ttl.ok()) return done(ttl);
          provider_->http()->SendAsync(ReadRequest(path),
                                       [this, done](absl::StatusOr<HttpResponse> resp) {
                                         done(ReadAnswer(std::move(resp)));
                                       });
        });
  }

  void KeepAliveAsync(StatusDone done) override {
    if (absl::Status s = CheckOpen(); !s.ok()) return done(s);
    EnsureTtlAsync(ttl_, std::move(done));
  }

  // Graceful restart: the sandbox lives on (its E2B timeout still runs).
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
    return Destroyed(provider_->ControlRequest("DELETE", absl::StrCat("/sandboxes/", id()), ""));
  }

  void DestroyAsync(StatusDone done) override {
    {
      absl::MutexLock l(&mu_);
      if (destroyed_) return done(absl::OkStatus());
      destroyed_ = true;
    }
    provider_->ControlRequestAsync(
        "DELETE", absl::StrCat("/sandboxes/", id()), "",
        [done](absl::StatusOr<HttpResponse> resp) { done(Destroyed(std::move(resp))); });
  }

  static absl::Status Destroyed(absl::StatusOr<HttpResponse> resp) {
    if (!resp.ok()) return resp.status();
    if (resp->status / 100 == 2 || resp->status == 404) return absl::OkStatus();  // 404: gone
    return e2b::HttpError("kill sandbox", resp->status, resp->body);
  }

 private:
  std::vector<std::pair<std::string, std::string>> EnvdHeaders() const {
    return {{"E2b-Sandbox-Id", info_.sandbox_id},
            {"E2b-Sandbox-Port", absl::StrCat(e2b::kEnvdPort)},
            {"X-Access-Token", info_.envd_access_token}};
  }

  absl::Status CheckOpen() {
    absl::MutexLock l(&mu_);
    if (destroyed_) return absl::FailedPreconditionError("e2b: sandbox is closed");
    return absl::OkStatus();
  }

  // Whether the sandbox's E2B timeout already covers `needed` (then
  // EnsureTtl makes no call).
  bool TtlCovers(absl::Duration needed) {
    absl::MutexLock l(&mu_);
    return ttl_deadline_ - Clock::Real()->Monotonic() >= needed;
  }

  // Sets E2B's timeout for this sandbox to `seconds` from now.
  absl::Status SetTtl(int64_t seconds) {
    const absl::Time now = Clock::Real()->Monotonic();
    return TtlSet(now, seconds,
                  provider_->ControlRequest("POST", absl::StrCat("/sandboxes/", id(), "/timeout"),
                                            absl::StrCat("{\"timeout\":", seconds, "}")));
  }
  // The same as a request on the multi handle; `done` runs on its thread.
  void SetTtlAsync(int64_t seconds, std::function<void(absl::Status)> done) {
    const absl::Time now = Clock::Real()->Monotonic();
    provider_->ControlRequestAsync("POST", absl::StrCat("/sandboxes/", id(), "/timeout"),
                                   absl::StrCat("{\"timeout\":", seconds, "}"),
                                   [this, now, seconds, done](absl::StatusOr<HttpResponse> resp) {
                                     done(TtlSet(now, seconds, std::move(resp)));
                                   });
  }
  // A timeout request's answer: the new deadline, or why not.
  absl::Status TtlSet(absl::Time now, int64_t seconds, absl::StatusOr<HttpResponse> resp) {
    if (!resp.ok()) return resp.status();
    if (resp->status == 404) {
      return SandboxGoneError(absl::StrCat("e2b: sandbox ", id(), " no longer exists"));
    }
    if (resp->status / 100 != 2) return e2b::HttpError("set timeout", resp->status, resp->body);
    absl::MutexLock l(&mu_);
    ttl_deadline_ = now + absl::Seconds(seconds);
    return absl::OkStatus();
  }

  // Makes E2B's timeout for this sandbox at least `needed` from now.
  absl::Status EnsureTtl(absl::Duration needed) {
    const absl::Time now = Clock::Real()->Monotonic();
    {
      absl::MutexLock l(&mu_);
      if (ttl_deadline_ - now >= needed) return absl::OkStatus();
    }
    return SetTtl(absl::ToInt64Seconds(needed + absl::Seconds(59)));
  }

  // EnsureTtl on the multi handle: `done` at once when the timeout covers
  // `needed`, else on the HTTP thread when E2B answered.
  void EnsureTtlAsync(absl::Duration needed, StatusDone done) {
    if (TtlCovers(needed)) return done(absl::OkStatus());
    SetTtlAsync(absl::ToInt64Seconds(needed + absl::Seconds(59)), std::move(done));
  }

  HttpRequest ReadRequest(absl::string_view path) const {
    HttpRequest http;
    http.url = absl::StrCat(envd_, "/files?path=", HttpClient::UrlEncode(path));
    http.headers = EnvdHeaders();
    http.timeout = absl::Seconds(provider_->config().request_timeout_seconds);
    return http;
  }

  absl::StatusOr<std::optional<std::string>> ReadAnswer(absl::StatusOr<HttpResponse> resp) const {
    if (!resp.ok())
      return absl::UnavailableError(absl::StrCat("e2b: read file: ", resp.status().message()));
    if (resp->status == 200) return std::optional<std::string>(std::move(resp->body));
    if (resp->status == 404) return std::optional<std::string>();
    if (e2b::IsSandboxGone(resp->status, resp->body)) {
      return SandboxGoneError(absl::StrCat("e2b: sandbox ", id(), " no longer exists"));
    }
    return e2b::HttpError("read file", resp->status, resp->body);
  }

  HttpRequest UploadRequest(const std::string& path, const std::string& data) const {
    MultipartBody m = BuildMultipart({{path, data}}, "file");
    HttpRequest http;
    http.method = "POST";
    http.url = absl::StrCat(envd_, "/files?path=", HttpClient::UrlEncode(path));
    http.headers = EnvdHeaders();
    http.headers.push_back({"Content-Type", m.content_type});
    http.body = std::move(m.body);
    http.timeout = absl::Seconds(provider_->config().request_timeout_seconds);
    return http;
  }

  absl::Status Upload(const std::string& path, const std::string& data, absl::string_view op) {
    return UploadAnswer(provider_->http()->Send(UploadRequest(path, data)), op);
  }

  absl::Status UploadAnswer(absl::StatusOr<HttpResponse> resp, absl::string_view op) const {
    if (!resp.ok())
      return absl::UnavailableError(absl::StrCat("e2b: ", op, ": ", resp.status().message()));
    if (resp->status == 200) return absl::OkStatus();
    if (e2b::IsSandboxGone(resp->status, resp->body)) {
      return SandboxGoneError(absl::StrCat("e2b: sandbox ", id(), " no longer exists"));
    }
    return e2b::HttpError(op, resp->status, resp->body);
  }

  // Best effort: SIGKILL the process (timeouts are also enforced by envd).
  void Kill(uint32_t pid) { (void)provider_->http()->Send(KillRequest(pid)); }
  void KillAsync(uint32_t pid) {
    provider_->http()->SendAsync(KillRequest(pid), [](absl::StatusOr<HttpResponse>) {});
  }
  HttpRequest KillRequest(uint32_t pid) {
    HttpRequest http;
    http.method = "POST";
    http.url = absl::StrCat(envd_, "/process.Process/SendSignal");
    http.headers = EnvdHeaders();
    http.headers.push_back({"Content-Type", "application/json"});
    http.headers.push_back({"Connect-Protocol-Version", "1"});
    http.body = absl::StrCat("{\"process\":{\"pid\":", pid, "},\"signal\":\"SIGNAL_SIGKILL\"}");
    http.timeout = absl::Seconds(10);
    return http;
  }

  E2BProvider* const provider_;
  const e2b::SandboxInfo info_;
  const std::string envd_;
  const std::map<std::string, std::string> env_;
  const absl::Duration ttl_;

  absl::Mutex mu_;
  bool destroyed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time ttl_deadline_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<E2BConfig> ParseE2BConfig(const nlohmann::json& json,
                                         int64_t broker_idle_timeout_seconds) {
  E2BConfig c;
  ConfigReader r(json, "providers.e2b");
  const char* env_key = getenv("E2B_API_KEY");
  c.api_key = r.String("api_key", env_key ? env_key : "");
  c.template_id = r.String("template", c.template_id, false);
  c.domain = r.String("domain", c.domain, false);
  c.api_url = r.String("api_url", "");
  c.sandbox_url = r.String("sandbox_url", "");
  c.request_timeout_seconds = r.Int("request_timeout_seconds", 60, 1, 3600);
  c.sandbox_timeout_seconds =
      r.Int("sandbox_timeout_seconds", broker_idle_timeout_seconds + 60, 10, 86400);
  c.retries = static_cast<int>(r.Int("retries", 3, 0, 10));
  const absl::Status pool = ReadPoolConfig(r, &c.pool);
  RETURN_IF_ERROR(r.Finish());
  RETURN_IF_ERROR(pool);
  if (c.api_url.empty()) c.api_url = absl::StrCat("https://api.", c.domain);
  while (!c.api_url.empty() && c.api_url.back() == '/') c.api_url.pop_back();
  while (!c.sandbox_url.empty() && c.sandbox_url.back() == '/') c.sandbox_url.pop_back();
  if (c.api_key.empty()) {
    return absl::FailedPreconditionError(
        "e2b: missing API key (set providers.e2b.api_key or E2B_API_KEY)");
  }
  return c;
}

E2BProvider::E2BProvider(E2BConfig config)
    : config_(std::move(config)), http_(std::make_shared<HttpClient>(kUserAgent)) {}

absl::StatusOr<std::unique_ptr<E2BProvider>> E2BProvider::Create(E2BConfig config) {
  if (config.api_key.empty()) return absl::FailedPreconditionError("e2b: missing API key");
  return std::unique_ptr<E2BProvider>(new E2BProvider(std::move(config)));
}

std::string E2BProvider::EnvdUrl(const std::string& sandbox_id, const std::string& domain) const {
  if (!config_.sandbox_url.empty()) return config_.sandbox_url;
  const std::string d = domain.empty() ? config_.domain : domain;
  if (d == "e2b.app" || d == "e2b.dev" || d == "e2b.pro" || d == "e2b-staging.dev") {
    return absl::StrCat("https://sandbox.", d);
  }
  return absl::StrCat("https://", e2b::kEnvdPort, "-", sandbox_id, ".", d);
}

absl::Status E2BProvider::CheckHealth() {
  auto resp = ControlRequest("GET", "/sandboxes", "");
  if (!resp.ok()) return resp.status();
  if (resp->status / 100 == 2 || resp->status == 429) return absl::OkStatus();
  return e2b::HttpError("health probe (list sandboxes)", resp->status, resp->body);
}

absl::StatusOr<HttpResponse> E2BProvider::ControlRequest(const std::string& method,
                                                         const std::string& path,
                                                         const std::string& body) {
  HttpRequest http;
  http.method = method;
  http.url = absl::StrCat(config_.api_url, path);
  http.headers = {{"X-API-KEY", config_.api_key}};
  if (!body.empty()) http.headers.push_back({"Content-Type", "application/json"});
  http.body = body;
  const absl::Duration budget = absl::Seconds(config_.request_timeout_seconds);
  Clock* clock = Clock::Real();
  const absl::Time start = clock->Monotonic();
  for (int attempt = 0;; ++attempt) {
    http.timeout = budget - (clock->Monotonic() - start);
    if (http.timeout <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError("e2b: request timed out");
    }
    absl::StatusOr<HttpResponse> resp = http_->Send(http);
    if (!resp.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "e2b: ", method, " ", path.substr(0, path.find('/', 1)), ": ", resp.status().message()));
    }
    // Like the SDK: retry only 429 with an integer Retry-After, within budget.
    int64_t retry_after = -1;
    if (resp->status != 429 || attempt >= config_.retries ||
        !absl::SimpleAtoi(resp->Header("retry-after"), &retry_after) || retry_after < 0 ||
        clock->Monotonic() - start + absl::Seconds(retry_after) >= budget) {
      return resp;
    }
    absl::SleepFor(absl::Seconds(retry_after));
  }
}

void E2BProvider::ControlRequestAsync(const std::string& method, const std::string& path,
                                      const std::string& body, HttpClient::Done done) {
  auto http = std::make_shared<HttpRequest>();
  http->method = method;
  http->url = absl::StrCat(config_.api_url, path);
  http->headers = {{"X-API-KEY", config_.api_key}};
  if (!body.empty()) http->headers.push_back({"Content-Type", "application/json"});
  http->body = body;
  const absl::Duration budget = absl::Seconds(config_.request_timeout_seconds);
  const absl::Time start = Clock::Real()->Monotonic();
  // One attempt; a 429 with Retry-After within budget tries again from a
  // timer (no thread sleeps), as ControlRequest does.
  auto attempt = std::make_shared<std::function<void(int)>>();
  std::weak_ptr<std::function<void(int)>> weak = attempt;
  *attempt = [this, http, method, path, budget, start, done, weak](int n) {
    http->timeout = budget - (Clock::Real()->Monotonic() - start);
    if (http->timeout <= absl::ZeroDuration()) {
      return done(absl::DeadlineExceededError("e2b: request timed out"));
    }
    auto self = weak.lock();
    http_->SendAsync(*http, [this, method, path, budget, start, done, self,
                             n](absl::StatusOr<HttpResponse> resp) {
      if (!resp.ok()) {
        return done(absl::UnavailableError(absl::StrCat("e2b: ", method, " ",
                                                        path.substr(0, path.find('/', 1)), ": ",
                                                        resp.status().message())));
      }
      int64_t retry_after = -1;
      if (resp->status != 429 || n >= config_.retries ||
          !absl::SimpleAtoi(resp->Header("retry-after"), &retry_after) || retry_after < 0 ||
          Clock::Real()->Monotonic() - start + absl::Seconds(retry_after) >= budget) {
        return done(std::move(resp));
      }
      EventLoop::Shared()->After(absl::Seconds(retry_after), [self, n] { (*self)(n + 1); });
    });
  };
  (*attempt)(0);
}

absl::StatusOr<std::string> E2BProvider::CreateBody(const SandboxSpec& spec,
                                                    int64_t* timeout_out) const {
  if (!spec.resources.empty()) {
    return absl::FailedPreconditionError(
        "e2b: spec.resources cannot be set: an E2B sandbox's CPU, memory and disk are decided "
        "by its template (build a template with the size you need and pass it as spec.template)");
  }
  if (spec.ceiling.pids > 0) {
    return absl::FailedPreconditionError(
        "e2b: the tenant's resources.pids ceiling cannot be applied: E2B has no process limit");
  }
  std::map<std::string, std::string> metadata = spec.labels;
  int64_t timeout = config_.sandbox_timeout_seconds;
  if (spec.pool.empty()) {
    metadata["sandbox-broker.tenant"] = spec.tenant;
    metadata["sandbox-broker.session-id"] = spec.session_id;
  } else {
    // A pool member: alive unused until it is claimed or replaced.
    metadata[kPoolTag] = spec.pool;
    timeout = std::max(timeout, absl::ToInt64Seconds(spec.keep_unclaimed) + 60);
  }
  metadata["sandbox-broker.instance-id"] = spec.broker_instance_id;
  if (!spec.deployment_id.empty()) {
    metadata[kDeploymentTag] = spec.deployment_id;
    metadata[kAttemptTag] = spec.attempt_id;
  }
  const std::string template_id =
      spec.template_name.empty() ? config_.template_id : spec.template_name;
  *timeout_out = timeout;
  // No rules: E2B's own default (internet access), as before rules existed.
  std::optional<e2b::Network> network;
  if (!spec.network.IsDefault()) {
    ASSIGN_OR_RETURN(network, e2b::MapNetwork(spec.network));
  }
  return e2b::CreateSandboxBody(template_id, timeout, metadata, spec.env, network);
}

absl::StatusOr<std::unique_ptr<Sandbox>> E2BProvider::Created(const SandboxSpec& spec,
                                                              int64_t timeout,
                                                              absl::StatusOr<HttpResponse> resp) {
  if (!resp.ok()) return resp.status();
  if (resp->status / 100 != 2) return e2b::HttpError("create sandbox", resp->status, resp->body);
  ASSIGN_OR_RETURN(e2b::SandboxInfo info, e2b::ParseSandbox(resp->body));
  return std::unique_ptr<Sandbox>(new E2BSandbox(this, std::move(info), spec, timeout));
}

absl::StatusOr<std::unique_ptr<Sandbox>> E2BProvider::Create(const SandboxSpec& spec) {
  // One path: the asynchronous one, waited for (a blocking caller's thread
  // is never the HTTP thread its steps run on).
  absl::Notification answered;
  absl::StatusOr<std::unique_ptr<Sandbox>> out = absl::UnknownError("e2b: no answer");
  CreateAsync(spec, [&](absl::StatusOr<std::unique_ptr<Sandbox>> r) {
    out = std::move(r);
    answered.Notify();
  });
  answered.WaitForNotification();
  return out;
}

void E2BProvider::CreateAsync(SandboxSpec spec, SandboxDone done) {
  int64_t timeout = 0;
  absl::StatusOr<std::string> body = CreateBody(spec, &timeout);
  if (!body.ok()) return done(body.status());
  ControlRequestAsync("POST", "/v2/sandboxes", *body,
                      [this, spec = std::move(spec), timeout,
                       done = std::move(done)](absl::StatusOr<HttpResponse> resp) mutable {
                        absl::StatusOr<std::unique_ptr<Sandbox>> sb =
                            Created(spec, timeout, std::move(resp));
                        const SandboxResources& c = spec.ceiling;
                        if (!sb.ok() || (c.cpus <= 0 && c.memory_bytes <= 0 && c.disk_bytes <= 0)) {
                          return done(std::move(sb));
                        }
                        CheckSizeAsync(*std::move(sb), spec, std::move(done));
                      });
}

namespace {

// Whether E2B's answer to GET /sandboxes/{id} shows a size within `ceiling`.
absl::Status SizeWithin(const absl::StatusOr<HttpResponse>& resp, const SandboxResources& ceiling,
                        const std::string& template_id) {
  if (!resp.ok()) return resp.status();
  if (resp->status / 100 != 2) return e2b::HttpError("get sandbox", resp->status, resp->body);
  ASSIGN_OR_RETURN(e2b::SandboxSize size, e2b::ParseSandboxSize(resp->body));
  auto check = [&](const char* key, const char* field, double has, double limit, const char* unit,
                   double per_unit) -> absl::Status {
    if (limit <= 0) return absl::OkStatus();
    if (has < 0) {
      return absl::FailedPreconditionError(absl::StrCat("e2b: the tenant's resources.", key,
                                                        " ceiling cannot be checked: E2B did "
                                                        "not report the sandbox's ",
                                                        field));
    }
    if (has <= limit) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "e2b: template \"", template_id, "\" gives ", has / per_unit, " ", unit,
        ", over the tenant's resources.", key, " ceiling (", limit / per_unit, " ", unit,
        "); an E2B sandbox's size is its template's: use a template within the ceiling"));
  };
  constexpr double kMiB = 1 << 20;
  RETURN_IF_ERROR(check("cpus", "cpuCount", size.cpus, ceiling.cpus, "CPUs", 1));
  RETURN_IF_ERROR(check("memory_bytes", "memoryMB", static_cast<double>(size.memory_bytes),
                        static_cast<double>(ceiling.memory_bytes), "MiB", kMiB));
  return check("disk_bytes", "diskSizeMB", static_cast<double>(size.disk_bytes),
               static_cast<double>(ceiling.disk_bytes), "MiB", kMiB);
}

}  // namespace

void E2BProvider::CheckSizeAsync(std::unique_ptr<Sandbox> sandbox, const SandboxSpec& spec,
                                 SandboxDone done) {
  auto held = std::make_shared<std::unique_ptr<Sandbox>>(std::move(sandbox));
  const std::string path = absl::StrCat("/sandboxes/", (*held)->id());
  const std::string template_id =
      spec.template_name.empty() ? config_.template_id : spec.template_name;
  ControlRequestAsync("GET", path, "",
                      [held, ceiling = spec.ceiling, template_id,
                       done = std::move(done)](absl::StatusOr<HttpResponse> resp) {
                        absl::Status within = SizeWithin(resp, ceiling, template_id);
                        if (within.ok()) return done(std::move(*held));
                        // Not within (or not known to be): killed, never handed on.
                        Sandbox* sandbox = held->get();
                        sandbox->DestroyAsync([held, within, done](absl::Status) { done(within); });
                      });
}

// ---- warm pools --------------------------------------------------------------

bool E2BProvider::CanClaim(const SandboxSpec& member, const SandboxSpec& session) const {
  auto template_of = [this](const SandboxSpec& s) {
    return s.template_name.empty() ? config_.template_id : s.template_name;
  };
  return session.pool.empty() && session.resources.empty() && session.ceiling.empty() &&
         session.network.IsDefault() && template_of(member) == template_of(session);
}

absl::StatusOr<std::unique_ptr<Sandbox>> E2BProvider::Claim(Sandbox* member,
                                                            const SandboxSpec& session) {
  auto* m = dynamic_cast<E2BSandbox*>(member);
  if (m == nullptr) return absl::InvalidArgumentError("e2b: not an e2b sandbox");
  // The session's dead-man's switch instead of the pool's longer one. The
  // metadata stays (E2B has no call to change it after create).
  RETURN_IF_ERROR(m->SetTimeout(config_.sandbox_timeout_seconds));
  auto claimed =
      std::make_unique<E2BSandbox>(this, m->info(), session, config_.sandbox_timeout_seconds);
  m->Detach();
  return std::unique_ptr<Sandbox>(std::move(claimed));
}

// ---- durable sessions ------------------------------------------------------

absl::StatusOr<std::unique_ptr<Sandbox>> E2BProvider::Attach(const std::string& sandbox_id,
                                                             const SandboxSpec& spec) {
  RETURN_IF_ERROR(CheckSandboxId(sandbox_id));
  // Connect resumes a paused sandbox and extends a running one's timeout.
  return Attached(sandbox_id, spec,
                  ControlRequest("POST", absl::StrCat("/v2/sandboxes/", sandbox_id, "/connect"),
                                 ConnectBody()));
}

void E2BProvider::AttachAsync(std::string sandbox_id, SandboxSpec spec, SandboxDone done) {
  if (absl::Status s = CheckSandboxId(sandbox_id); !s.ok()) return done(s);
  const std::string path = absl::StrCat("/v2/sandboxes/", sandbox_id, "/connect");
  ControlRequestAsync("POST", path, ConnectBody(),
                      [this, sandbox_id = std::move(sandbox_id), spec = std::move(spec),
                       done = std::move(done)](absl::StatusOr<HttpResponse> resp) {
                        done(Attached(sandbox_id, spec, std::move(resp)));
                      });
}

absl::Status E2BProvider::CheckSandboxId(const std::string& sandbox_id) {
  if (sandbox_id.empty() || sandbox_id.find_first_of("/?#% ") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("e2b: \"", sandbox_id, "\" is not a sandbox id"));
  }
  return absl::OkStatus();
}

std::string E2BProvider::ConnectBody() const {
  return absl::StrCat("{\"timeout\":", config_.sandbox_timeout_seconds, "}");
}

absl::StatusOr<std::unique_ptr<Sandbox>> E2BProvider::Attached(const std::string& sandbox_id,
                                                               const SandboxSpec& spec,
                                                               absl::StatusOr<HttpResponse> resp) {
  if (!resp.ok()) return resp.status();
  if (resp->status == 404) {
    return SandboxGoneError(absl::StrCat("e2b: sandbox ", sandbox_id, " no longer exists"));
  }
  if (resp->status / 100 != 2) return e2b::HttpError("connect sandbox", resp->status, resp->body);
  ASSIGN_OR_RETURN(e2b::SandboxInfo info, e2b::ParseSandbox(resp->body));
  if (info.sandbox_id.empty()) info.sandbox_id = sandbox_id;
  return std::unique_ptr<Sandbox>(
      new E2BSandbox(this, std::move(info), spec, config_.sandbox_timeout_seconds));
}

absl::StatusOr<std::vector<OwnedSandbox>> E2BProvider::ListOwned(const std::string& deployment_id) {
  // As the SDK encodes a metadata query (see the protocol notes): each key
  // and value encoded, joined as a query string, encoded once more.
  const std::string query =
      absl::StrCat(HttpClient::UrlEncode(HttpClient::UrlEncode(kDeploymentTag)), "=",
                   HttpClient::UrlEncode(HttpClient::UrlEncode(deployment_id)));
  std::vector<OwnedSandbox> out;
  std::string next;
  for (int page = 0; page < 10000; ++page) {
    std::string path = absl::StrCat("/v2/sandboxes?metadata=", HttpClient::UrlEncode(query),
                                    "&state=running,paused&limit=100");
    if (!next.empty()) absl::StrAppend(&path, "&nextToken=", HttpClient::UrlEncode(next));
    ASSIGN_OR_RETURN(HttpResponse resp, ControlRequest("GET", path, ""));
    if (resp.status != 200) return e2b::HttpError("list sandboxes", resp.status, resp.body);
    nlohmann::json j = nlohmann::json::parse(resp.body, nullptr, false);
    if (!j.is_array()) return absl::UnavailableError("e2b: list sandboxes: not a JSON array");
    for (const auto& item : j) {
      if (!item.is_object() || !item.contains("sandboxID") || !item["sandboxID"].is_string()) {
        continue;
      }
      std::map<std::string, std::string> md;
      if (item.contains("metadata") && item["metadata"].is_object()) {
        for (auto it = item["metadata"].begin(); it != item["metadata"].end(); ++it) {
          if (it.value().is_string()) md[it.key()] = it.value().get<std::string>();
        }
      }
      if (md[kDeploymentTag] != deployment_id) continue;  // never another deployment's
      const std::string started =
          item.contains("startedAt") && item["startedAt"].is_string() ? item["startedAt"] : "";
      OwnedSandbox o = OwnedFromTags(item["sandboxID"].get<std::string>(), md, started);
      out.push_back(std::move(o));
    }
    next = resp.Header("x-next-token");
    if (next.empty()) break;
  }
  return out;
}

}  // namespace sandbox
