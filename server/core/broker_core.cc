#include "server/core/broker_core.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/log.h"
#include "common/refusal.h"
#include "common/status_macros.h"
#include "common/text.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace sandbox {
namespace {

constexpr int kDefaultPageSize = 100;
constexpr int kMaxPageSize = 1000;

absl::StatusOr<Language> ToLanguage(pb::Language l) {
  switch (l) {
    case pb::LANGUAGE_UNSPECIFIED:
    case pb::LANGUAGE_PYTHON:
      return Language::kPython;
    case pb::LANGUAGE_NODE:
      return Language::kNode;
    case pb::LANGUAGE_SHELL:
      return Language::kShell;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown language ", static_cast<int>(l),
                       " (use LANGUAGE_PYTHON, LANGUAGE_NODE or LANGUAGE_SHELL)"));
  }
}

template <typename Map>
absl::Status ValidateEnv(const Map& env, absl::string_view where) {
  for (const auto& [k, v] : env) {
    if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": invalid variable name \"", RepairUtf8(k), "\""));
    }
    if (v.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": value of ", k, " contains a NUL byte"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Decode(const std::string& contents, pb::Encoding enc,
                                   absl::string_view what) {
  switch (enc) {
    case pb::ENCODING_UTF8:
      return contents;
    case pb::ENCODING_BASE64: {
      auto d = DecodeBase64Strict(contents);
      if (!d.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": ", d.status().message()));
      }
      return d;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": unknown encoding ", static_cast<int>(enc)));
  }
}

}  // namespace

absl::Status ValidateSessionId(const std::string& id) {
  if (id.empty() || id.size() > 128) {
    return absl::InvalidArgumentError("session_id must be 1-128 characters of [A-Za-z0-9._:-]");
  }
  for (char c : id) {
    if (!(isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' || c == '-')) {
      return absl::InvalidArgumentError("session_id must be 1-128 characters of [A-Za-z0-9._:-]");
    }
  }
  return absl::OkStatus();
}

absl::Status BrokerCore::DropIfGone(const CallContext& ctx, const std::string& session_id,
                                    Lease lease, absl::Status status) {
  metrics_->ProviderError(lease.provider(), absl::StatusCodeToString(status.code()));
  if (IsSandboxGone(status)) {
    // The provider lost the sandbox: forget the session so the next call
    // creates a new one. Our own lease must go first (Close waits for it).
    lease.Release();
    (void)sessions_->Close(ctx.tenant, session_id, CloseReason::kGone);
  }
  return status;
}

BrokerCore::BrokerCore(const BrokerConfig& config, const ProviderRegistry* providers,
                       SessionManager* sessions, Clock* clock, Metrics* metrics)
    : config_(config),
      providers_(providers),
      sessions_(sessions),
      clock_(clock),
      metrics_(metrics != nullptr ? metrics : Metrics::Discard()) {}

absl::StatusOr<CreateOptions> BrokerCore::ToCreateOptions(const pb::SessionSpec& spec) const {
  CreateOptions o;
  o.provider = spec.provider();
  o.template_name = spec.template_();
  ASSIGN_OR_RETURN(o.language, ToLanguage(spec.language()));
  o.language_set = spec.language() != pb::LANGUAGE_UNSPECIFIED;
  RETURN_IF_ERROR(ValidateEnv(spec.env(), "spec.env"));
  o.env.insert(spec.env().begin(), spec.env().end());
  o.labels.insert(spec.labels().begin(), spec.labels().end());
  if (spec.has_resources()) {
    const pb::Resources& r = spec.resources();
    // Each provider checks its own maximum; negative is wrong everywhere.
    if (r.memory_bytes() < 0 || r.cpus() < 0 || r.pids() < 0 || r.disk_bytes() < 0 ||
        !std::isfinite(r.cpus())) {
      return absl::InvalidArgumentError(
          "spec.resources: memory_bytes, cpus, pids and disk_bytes must be >= 0 (0 = default)");
    }
    o.resources.memory_bytes = r.memory_bytes();
    o.resources.cpus = r.cpus();
    o.resources.pids = r.pids();
    o.resources.disk_bytes = r.disk_bytes();
  }
  for (const pb::File& f : spec.files()) {
    ASSIGN_OR_RETURN(std::string data, Decode(f.contents(), f.encoding(),
                                              absl::StrCat("spec.files[", f.path(), "]")));
    if (f.path().empty()) return absl::InvalidArgumentError("spec.files: path is empty");
    o.files.emplace_back(f.path(), std::move(data));
  }
  return o;
}

void BrokerCore::ToInfo(const SessionView& v, pb::SessionInfo* info) const {
  info->set_session_id(v.session_id);
  info->set_provider(v.provider);
  info->set_sandbox_id(v.sandbox_id);
  switch (v.state) {
    case SessionStateKind::kCreating:
      info->set_state(pb::SESSION_STATE_CREATING);
      break;
    case SessionStateKind::kReady:
      info->set_state(pb::SESSION_STATE_READY);
      break;
    case SessionStateKind::kClosing:
      info->set_state(pb::SESSION_STATE_CLOSING);
      break;
  }
  SetTime(v.created_at, info->mutable_created_at());
  SetTime(v.last_active_at, info->mutable_last_active_at());
  if (v.idle_expires_at) SetTime(*v.idle_expires_at, info->mutable_idle_expires_at());
  if (v.expires_at) SetTime(*v.expires_at, info->mutable_expires_at());
  info->set_language(FromLanguage(v.language));
  info->set_template_(v.template_name);
  info->mutable_labels()->insert(v.labels.begin(), v.labels.end());
  info->set_calls_in_flight(v.calls_in_flight);
  if (v.resources) {
    info->mutable_resources()->set_memory_bytes(v.resources->memory_bytes);
    info->mutable_resources()->set_cpus(v.resources->cpus);
    info->mutable_resources()->set_pids(v.resources->pids);
    info->mutable_resources()->set_disk_bytes(v.resources->disk_bytes);
  }
  if (v.usage) {
    info->mutable_usage()->set_memory_bytes(v.usage->memory_bytes);
    info->mutable_usage()->set_disk_bytes(v.usage->disk_bytes);
    info->mutable_usage()->set_cpu_seconds(v.usage->cpu_seconds);
  }
  info->set_generation(v.generation);
  NetworkToProto(v.network, info->mutable_network());
  if (cluster_ != nullptr) info->set_owner(cluster_->member_id());
}

std::string BrokerCore::ProviderFor(const CallContext& ctx, const std::string& requested) const {
  if (!requested.empty()) return requested;
  if (ops_.policy != nullptr) {
    std::shared_ptr<const OperatorSnapshot> snap =
        ctx.snapshot ? ctx.snapshot : ops_.policy->Current();
    const TenantRules& r = snap->For(ctx.tenant);
    if (!r.default_provider.empty()) return r.default_provider;
  }
  return config_.default_provider;
}

absl::StatusOr<pb::SessionInfo> BrokerCore::StartSession(const CallContext& ctx,
                                                         const pb::StartSessionRequest& req) {
  ASSIGN_OR_RETURN(Admission adm, Admit(ctx));
  RETURN_IF_ERROR(ValidateSessionId(req.session_id()));
  ASSIGN_OR_RETURN(CreateOptions o, CreateOptionsFor(ctx, adm, req.spec()));
  { ASSIGN_OR_RETURN(Lease lease, AcquireFor(ctx, req.session_id(), &o)); }
  ASSIGN_OR_RETURN(SessionView v, sessions_->Get(ctx.tenant, req.session_id()));
  pb::SessionInfo info;
  ToInfo(v, &info);
  return info;
}

absl::StatusOr<pb::CloseSessionResponse> BrokerCore::CloseSession(
    const CallContext& ctx, const pb::CloseSessionRequest& req) {
  ASSIGN_OR_RETURN(Admission adm, Admit(ctx));
  RETURN_IF_ERROR(ValidateSessionId(req.session_id()));
  ASSIGN_OR_RETURN(bool existed, sessions_->Close(ctx.tenant, req.session_id()));
  if (runs_ != nullptr) runs_->ForgetSession(ctx.tenant, req.session_id());
  pb::CloseSessionResponse resp;
  resp.set_existed(existed);
  return resp;
}

void BrokerCore::CloseSessionAsync(const CallContext& ctx, const pb::CloseSessionRequest& req,
                                   Done<pb::CloseSessionResponse> done) {
  absl::StatusOr<Admission> adm = Admit(ctx);
  if (!adm.ok()) return done(adm.status());
  if (absl::Status s = ValidateSessionId(req.session_id()); !s.ok()) return done(s);
  // Close's waits and the store's rows block: from the pool; the destroy
  // holds no thread.
  blocking_->Submit([this, ctx, session_id = req.session_id(), done] {
    sessions_->CloseAsync(ctx.tenant, session_id, CloseReason::kClient,
                          [this, ctx, session_id, done](absl::StatusOr<bool> existed) {
                            if (!existed.ok()) return done(existed.status());
                            if (runs_ != nullptr) runs_->ForgetSession(ctx.tenant, session_id);
                            pb::CloseSessionResponse resp;
                            resp.set_existed(*existed);
                            done(std::move(resp));
                          });
  });
}

absl::StatusOr<pb::SessionInfo> BrokerCore::GetSession(const CallContext& ctx,
                                                       const pb::GetSessionRequest& req) {
  ASSIGN_OR_RETURN(Admission adm, Admit(ctx));
  RETURN_IF_ERROR(ValidateSessionId(req.session_id()));
  ASSIGN_OR_RETURN(SessionView v, sessions_->Get(ctx.tenant, req.session_id()));
  pb::SessionInfo info;
  ToInfo(v, &info);
  return info;
}

absl::StatusOr<pb::ListSessionsResponse> BrokerCore::ListSessions(
    const CallContext& ctx, const pb::ListSessionsRequest& req) {
  ASSIGN_OR_RETURN(Admission adm, Admit(ctx));
  if (req.page_size() < 0) return absl::InvalidArgumentError("page_size must be >= 0");
  const int size =
      req.page_size() == 0 ? kDefaultPageSize : std::min(req.page_size(), kMaxPageSize);
  std::string after;
  if (!req.page_token().empty()) {
    if (!absl::WebSafeBase64Unescape(req.page_token(), &after) || !ValidateSessionId(after).ok()) {
      return absl::InvalidArgumentError("invalid page_token");
    }
  }
  bool more = false;
  pb::ListSessionsResponse resp;
  std::vector<SessionView> views;
  if (cluster_ != nullptr) {
    // Every replica's rows (one etcd read), with this replica's own
    // sessions as it sees them now.
    ASSIGN_OR_RETURN(std::vector<ClusterSession> rows, cluster_->ListTenant(ctx.tenant));
    for (const ClusterSession& row : rows) {
      if (row.record.session_id <= after) continue;
      if (static_cast<int>(views.size()) == size) {
        more = true;
        break;
      }
      absl::StatusOr<SessionView> mine = row.owner == cluster_->member_id()
                                             ? sessions_->Get(ctx.tenant, row.record.session_id)
                                             : absl::NotFoundError("");
      views.push_back(mine.ok() ? *mine : SessionManager::ViewOfRecord(row.record));
      pb::SessionInfo* info = resp.add_sessions();
      ToInfo(views.back(), info);
      info->set_owner(mine.ok() ? cluster_->member_id() : row.owner);
    }
  } else {
    views = sessions_->List(ctx.tenant, after, size, &more);
    for (const auto& v : views) ToInfo(v, resp.add_sessions());
  }
  if (more && !views.empty()) {
    resp.set_next_page_token(absl::WebSafeBase64Escape(views.back().session_id));
  }
  return resp;
}

// One run from admission to result: what Prepare sets up and Finish reads.
struct BrokerCore::ExecPlan {
  CallContext ctx;
  std::string session_id;
  pb::SessionSpec spec;
  Language language = Language::kPython;
  bool language_given = false;
  std::string code;
  int64_t timeout = 0;
  int64_t max_output = 0;
  std::map<std::string, std::string> env;
  std::function<void(OutputStream, absl::string_view)> on_output;
  std::function<bool(std::function<void()>)> output_ready;
  CreateOptions create;
  std::shared_ptr<const OperatorSnapshot> snapshot;  // keeps rules alive
  PolicyEngine::RunSlot policy_slot;
  LimitSlot tenant_slot;
  Lease lease;
  // Told the lease's sandbox generation once it is held (the run ledger).
  RunLedger::Started on_lease;
  ExecRequest request;
  absl::Time start;
};

absl::StatusOr<BrokerCore::RunLimits> BrokerCore::RunLimitsFor(const CallContext& ctx,
                                                               const Admission& adm,
                                                               int32_t timeout_seconds) {
  if (timeout_seconds < 0) {
    return absl::InvalidArgumentError("timeout_seconds must be >= 0 (0 = default)");
  }
  if (timeout_seconds > config_.max_timeout_seconds) {
    return absl::InvalidArgumentError(absl::StrCat("timeout_seconds ", timeout_seconds,
                                                   " exceeds max_timeout_seconds (",
                                                   config_.max_timeout_seconds, ")"));
  }
  RunLimits l;
  l.timeout_seconds = timeout_seconds == 0 ? config_.default_timeout_seconds : timeout_seconds;
  l.max_output_bytes = config_.max_output_bytes;
  if (adm.rules != nullptr) {
    if (absl::Status s = PolicyEngine::CheckTimeout(*adm.rules, ctx.tenant, timeout_seconds);
        !s.ok()) {
      return Refused(ctx, s, "max_timeout_seconds");
    }
    l.timeout_seconds = std::min(l.timeout_seconds, adm.rules->max_timeout_seconds);
    l.max_output_bytes = std::min(l.max_output_bytes, adm.rules->max_output_bytes);
  }
  return l;
}

absl::Status BrokerCore::CheckEnv(const google::protobuf::Map<std::string, std::string>& env) {
  return ValidateEnv(env, "env");
}

absl::StatusOr<std::unique_ptr<BrokerCore::ExecPlan>> BrokerCore::AdmitRun(
    const CallContext& ctx, const std::string& session_id, const pb::SessionSpec& spec,
    Language language, bool language_given, const std::string& code, int32_t timeout_seconds,
    const google::protobuf::Map<std::string, std::string>& env) {
  ASSIGN_OR_RETURN(Admission adm, Admit(ctx));
  RETURN_IF_ERROR(ValidateSessionId(session_id));
  if (code.empty()) return absl::InvalidArgumentError("code/command is empty");
  ASSIGN_OR_RETURN(RunLimits limits, RunLimitsFor(ctx, adm, timeout_seconds));
  auto plan = std::make_unique<ExecPlan>();
  plan->timeout = limits.timeout_seconds;
  plan->max_output = limits.max_output_bytes;
  RETURN_IF_ERROR(ValidateEnv(env, "env"));
  ASSIGN_OR_RETURN(plan->create, CreateOptionsFor(ctx, adm, spec));
  // Admitted before anything is created; held until the run ends.
  if (adm.rules != nullptr) {
    absl::StatusOr<PolicyEngine::RunSlot> admitted = ops_.policy->BeginRun(*adm.rules, ctx.tenant);
    if (!admitted.ok()) {
      return Refused(ctx, admitted.status(),
                     RefusingRule(admitted.status()).value_or("max_concurrent_runs"));
    }
    plan->policy_slot = std::move(*admitted);
  }
  plan->ctx = ctx;
  plan->session_id = session_id;
  plan->language = language;
  plan->language_given = language_given;
  plan->code = code;
  plan->env.insert(env.begin(), env.end());
  plan->snapshot = std::move(adm.snapshot);
  return plan;
}

Limiter* BrokerCore::TenantRunLimiter(const std::string& tenant) {
  if (config_.limits.max_concurrent_runs_per_tenant <= 0) return nullptr;
  absl::MutexLock l(&limiters_mu_);
  std::unique_ptr<Limiter>& lim = tenant_runs_[tenant];
  if (!lim) {
    lim = std::make_unique<Limiter>(
        "max_concurrent_runs_per_tenant", config_.limits.max_concurrent_runs_per_tenant,
        config_.limits.max_queued_calls, absl::Milliseconds(config_.limits.queue_timeout_ms));
  }
  return lim.get();
}

void BrokerCore::PublishLimits() {
  int64_t in_use = 0, queued = 0;
  {
    absl::MutexLock l(&limiters_mu_);
    for (const auto& [tenant, lim] : tenant_runs_) {
      Limiter::Stats st = lim->stats();
      in_use += st.in_use;
      queued += st.queued;
      metrics_->TenantRunLimit(tenant, st.in_use, st.queued);
    }
  }
  metrics_->LimitState("max_concurrent_runs_per_tenant", in_use, queued);
}

absl::Status BrokerCore::AcquireLease(ExecPlan& plan) {
  ASSIGN_OR_RETURN(plan.lease, AcquireFor(plan.ctx, plan.session_id, &plan.create));
  return Ready(plan);
}

absl::Status BrokerCore::Ready(ExecPlan& plan) {
  if (plan.ctx.provider) *plan.ctx.provider = plan.lease.provider();
  if (plan.on_lease) plan.on_lease(plan.lease.generation());
  ExecRequest& er = plan.request;
  er.language = plan.language_given ? plan.language : plan.lease.language();
  er.code = std::move(plan.code);
  er.timeout = absl::Seconds(plan.timeout);
  er.env = std::move(plan.env);
  er.max_output_bytes = static_cast<size_t>(plan.max_output);
  er.cancelled = plan.ctx.cancelled;
  er.on_output = std::move(plan.on_output);
  er.output_ready = std::move(plan.output_ready);
  plan.start = clock_->Monotonic();
  return absl::OkStatus();
}

absl::StatusOr<pb::RunResult> BrokerCore::Finish(ExecPlan& plan, absl::StatusOr<ExecResult> exec) {
  if (!exec.ok())
    return DropIfGone(plan.ctx, plan.session_id, std::move(plan.lease), exec.status());
  ExecResult& r = *exec;
  const std::string& provider = plan.lease.provider();
  metrics_->RunFinished(provider, r.output.size(), r.timed_out);
  if (r.oom_killed) metrics_->OomKilled(provider);
  if (!r.quota_exhausted.empty()) metrics_->QuotaHit(provider, r.quota_exhausted);
  pb::RunResult out;
  out.set_output(RepairUtf8(r.output));
  out.set_exit_code(r.exit_code);
  out.set_timed_out(r.timed_out);
  out.set_truncated(r.truncated);
  out.set_oom_killed(r.oom_killed);
  const absl::Duration took = clock_->Monotonic() - plan.start;
  out.set_duration_ms(absl::ToInt64Milliseconds(took));
  {
    UsageCounters d;
    d.runs = 1;
    d.run_seconds = absl::ToDoubleSeconds(took);
    d.output_bytes = static_cast<int64_t>(r.output.size());
    d.oom_kills = r.oom_killed ? 1 : 0;
    RecordUsage(plan.ctx, provider, d);
  }
  if (r.cancelled) return absl::CancelledError("the call was cancelled; the run was killed");
  return out;
}

absl::StatusOr<pb::RunResult> BrokerCore::Exec(
    const CallContext& ctx, const std::string& session_id, const pb::SessionSpec& spec,
    Language language, bool language_given, const std::string& code, int32_t timeout_seconds,
    const google::protobuf::Map<std::string, std::string>& env,
    std::function<void(OutputStream, absl::string_view)> on_output, RunLedger::Started on_lease) {
  ASSIGN_OR_RETURN(
      std::unique_ptr<ExecPlan> plan,
      AdmitRun(ctx, session_id, spec, language, language_given, code, timeout_seconds, env));
  plan->on_output = std::move(on_output);
  plan->on_lease = std::move(on_lease);
  if (Limiter* lim = TenantRunLimiter(ctx.tenant)) {
    if (absl::Status s = lim->AcquireBlocking(); !s.ok()) {
      metrics_->LimitRefused(lim->name());
      metrics_->TenantRunRefused(ctx.tenant);
      return Refused(ctx, s, lim->name());
    }
    plan->tenant_slot = LimitSlot(lim);
  }
  RETURN_IF_ERROR(AcquireLease(*plan));
  absl::StatusOr<ExecResult> exec = plan->lease.sandbox()->Exec(plan->request);
  return Finish(*plan, std::move(exec));
}

void BrokerCore::ExecAsync(std::unique_ptr<ExecPlan> plan, RunDone done) {
  auto shared = std::shared_ptr<ExecPlan>(std::move(plan));
  auto after_slot = [this, shared, done](absl::Status slot) mutable {
    if (!slot.ok()) {
      metrics_->LimitRefused("max_concurrent_runs_per_tenant");
      metrics_->TenantRunRefused(shared->ctx.tenant);
      done(Refused(shared->ctx, slot, "max_concurrent_runs_per_tenant"));
      return;
    }
    AcquireAsync(shared, std::move(done));
  };
  Limiter* lim = TenantRunLimiter(shared->ctx.tenant);
  if (lim == nullptr) {
    after_slot(absl::OkStatus());
    return;
  }
  lim->Acquire([shared, lim, after_slot](absl::Status s) mutable {
    if (s.ok()) shared->tenant_slot = LimitSlot(lim);
    after_slot(std::move(s));
  });
}

void BrokerCore::AcquireAsync(std::shared_ptr<ExecPlan> shared, RunDone done) {
  // The common case first, with nothing allocated: the sandbox is there.
  bool would_block = false;
  absl::StatusOr<Lease> ready =
      sessions_->TryAcquire(shared->ctx.tenant, shared->session_id, &shared->create, &would_block);
  auto start = [this](const std::shared_ptr<ExecPlan>& plan, absl::StatusOr<Lease> lease,
                      RunDone done) {
    if (!lease.ok()) return done(lease.status());
    plan->lease = std::move(*lease);
    if (absl::Status s = Ready(*plan); !s.ok()) return done(s);
    Start(plan, std::move(done));
  };
  if (!would_block) return start(shared, std::move(ready), std::move(done));
  // The plan owns its create options: an aliasing pointer keeps both alive.
  std::shared_ptr<const CreateOptions> create(shared, &shared->create);
  LeaseAsync(shared->ctx, shared->session_id, std::move(create),
             [shared, done, start](absl::StatusOr<Lease> lease) {
               start(shared, std::move(lease), done);
             });
}

void BrokerCore::LeaseAsync(const CallContext& ctx, const std::string& session_id,
                            std::shared_ptr<const CreateOptions> create, LeaseDone then) {
  bool would_block = false;
  absl::StatusOr<Lease> lease =
      sessions_->TryAcquire(ctx.tenant, session_id, create.get(), &would_block);
  if (!would_block) return then(std::move(lease));
  // Another call is creating the sandbox: wait for it without a thread
  // (single-flight); its failure is this call's answer too.
  if (sessions_->WaitForCreation(ctx.tenant, session_id,
                                 [this, ctx, session_id, create, then](absl::Status settled) {
                                   if (!settled.ok()) return then(settled);
                                   LeaseAsync(ctx, session_id, create, then);
                                 })) {
    return;
  }
  // A create or attach of our own. Its short blocking steps (store rows)
  // run on a thread that may block; a create waits for its slot
  // (max_concurrent_creates) and for the provider holding no thread. Calls
  // that arrive before that task has begun the create wait for it here, so
  // a burst of first calls on a new session is one task, not one per call
  // (each would take a thread of the pool for a moment).
  auto key = std::make_pair(ctx.tenant, session_id);
  {
    absl::MutexLock l(&acquiring_mu_);
    auto it = acquiring_.find(key);
    if (it != acquiring_.end()) {
      it->second.push_back(
          [this, ctx, session_id, create, then] { LeaseAsync(ctx, session_id, create, then); });
      return;
    }
    acquiring_[key];
  }
  blocking_->Submit([this, ctx, session_id, create, then, key] {
    {
      sessions_->AcquireAsync(ctx.tenant, session_id, create.get(),
                              WithRequestId([this, ctx, create, then](absl::StatusOr<Lease> lease) {
                                then(RefusedIfMaxSessions(ctx, create.get(), std::move(lease)));
                              }));
    }
    // The create has begun (or is done, or failed): the calls that waited
    // look again, and find it ready or wait for it as callbacks.
    std::vector<std::function<void()>> waiting;
    {
      absl::MutexLock l(&acquiring_mu_);
      auto it = acquiring_.find(key);
      waiting = std::move(it->second);
      acquiring_.erase(it);
    }
    for (auto& retry : waiting) retry();
  });
}

void BrokerCore::FailAsync(const CallContext& ctx, const std::string& session_id,
                           std::shared_ptr<Lease> lease, absl::Status status,
                           std::function<void(absl::Status)> done) {
  if (!IsSandboxGone(status)) {
    metrics_->ProviderError(lease->provider(), absl::StatusCodeToString(status.code()));
    lease->Release();
    return done(status);
  }
  // Closing the session destroys its sandbox: not on a provider's thread.
  blocking_->Submit([this, ctx, session_id, lease, status, done] {
    done(DropIfGone(ctx, session_id, std::move(*lease), status));
  });
}

void BrokerCore::EnsureSessionAsync(const CallContext& ctx, const std::string& session_id,
                                    const pb::SessionSpec& spec, const std::function<bool()>& valid,
                                    std::function<void(absl::Status)> then) {
  if (!ValidateSessionId(session_id).ok()) return then(absl::OkStatus());
  {
    // The common case: the sandbox is there.
    bool busy = false;
    if (sessions_->TryAcquire(ctx.tenant, session_id, nullptr, &busy).ok()) {
      return then(absl::OkStatus());
    }
  }
  // The method's checks, in its order. Admission and the create options
  // have no side effects when they pass; a refusal is audited once, here,
  // and is the answer.
  absl::StatusOr<Admission> adm = Admit(ctx);
  if (!adm.ok()) return then(adm.status());
  if (!valid()) return then(absl::OkStatus());
  auto create = std::make_shared<CreateOptions>();
  {
    absl::StatusOr<CreateOptions> o = CreateOptionsFor(ctx, *adm, spec);
    if (!o.ok()) return then(o.status());
    *create = std::move(*o);
  }
  bool would_block = false;
  {
    absl::StatusOr<Lease> lease =
        sessions_->TryAcquire(ctx.tenant, session_id, create.get(), &would_block);
    // Ready (or a conflict the method reports itself): nothing to create.
    if (!would_block) return then(absl::OkStatus());
  }
  LeaseAsync(ctx, session_id, std::move(create), [then](absl::StatusOr<Lease> lease) {
    absl::Status s = lease.status();
    if (lease.ok()) lease->Release();
    then(s);
  });
}

void BrokerCore::Start(std::shared_ptr<ExecPlan> plan, RunDone done) {
  Sandbox* sb = plan->lease.sandbox();
  ExecRequest request = plan->request;
  sb->ExecAsync(std::move(request),
                WithRequestId([this, plan, done](absl::StatusOr<ExecResult> exec) mutable {
                  if (!exec.ok() && IsSandboxGone(exec.status())) {
                    // Closing the session destroys its sandbox: not on the loop's thread.
                    blocking_->Submit([this, plan, done, exec = std::move(exec)]() mutable {
                      done(Finish(*plan, std::move(exec)));
                    });
                    return;
                  }
                  absl::StatusOr<pb::RunResult> r = Finish(*plan, std::move(exec));
                  // Release the session and slots before answering.
                  plan->lease.Release();
                  plan->tenant_slot.Release();
                  plan->policy_slot = PolicyEngine::RunSlot();
                  done(std::move(r));
                }));
}

void BrokerCore::RunAsync(const CallContext& ctx, const pb::RunRequest& req, RunDone done) {
  if (!req.run_id().empty() && runs_ != nullptr) {
    // Retry-safe runs go through the ledger, which waits: on the pool.
    blocking_->Submit([this, ctx, &req, done] { done(Run(ctx, req)); });
    return;
  }
  absl::StatusOr<Language> lang = ToLanguage(req.language());
  if (!lang.ok()) return done(lang.status());
  auto plan =
      AdmitRun(ctx, req.session_id(), req.spec(), *lang, req.language() != pb::LANGUAGE_UNSPECIFIED,
               req.code(), req.timeout_seconds(), req.env());
  if (!plan.ok()) return done(plan.status());
  ExecAsync(std::move(*plan), std::move(done));
}

void BrokerCore::ShellAsync(const CallContext& ctx, const pb::ShellRequest& req, RunDone done) {
  if (!req.run_id().empty() && runs_ != nullptr) {
    blocking_->Submit([this, ctx, &req, done] { done(Shell(ctx, req)); });
    return;
  }
  auto plan = AdmitRun(ctx, req.session_id(), req.spec(), Language::kShell, true, req.command(),
                       req.timeout_seconds(), req.env());
  if (!plan.ok()) return done(plan.status());
  ExecAsync(std::move(*plan), std::move(done));
}

void BrokerCore::RunStreamAsync(const CallContext& ctx, const pb::RunRequest& req,
                                std::function<void(OutputStream, absl::string_view)> on_chunk,
                                std::function<bool(std::function<void()>)> output_ready,
                                RunDone done) {
  if (!req.run_id().empty() && runs_ != nullptr) {
    blocking_->Submit([this, ctx, &req, on_chunk, done] { done(RunStream(ctx, req, on_chunk)); });
    return;
  }
  absl::StatusOr<Language> lang = ToLanguage(req.language());
  if (!lang.ok()) return done(lang.status());
  auto plan =
      AdmitRun(ctx, req.session_id(), req.spec(), *lang, req.language() != pb::LANGUAGE_UNSPECIFIED,
               req.code(), req.timeout_seconds(), req.env());
  if (!plan.ok()) return done(plan.status());
  (*plan)->on_output = std::move(on_chunk);
  (*plan)->output_ready = std::move(output_ready);
  ExecAsync(std::move(*plan), [done](absl::StatusOr<pb::RunResult> r) {
    if (r.ok()) r->clear_output();
    done(std::move(r));
  });
}

absl::StatusOr<pb::RunResult> BrokerCore::Once(
    const CallContext& ctx, const std::string& session_id, const std::string& run_id,
    const google::protobuf::Message& req,
    const std::function<absl::StatusOr<pb::RunResult>(const RunLedger::Started& started)>& fn) {
  if (run_id.empty() || runs_ == nullptr) return fn(nullptr);
  RETURN_IF_ERROR(ValidateRunId(run_id, "run_id"));
  RETURN_IF_ERROR(ValidateSessionId(session_id));
  {
    // Policy first: a retry answered from the ledger is admitted like the
    // first attempt (a disabled tenant gets no stored results either).
    ASSIGN_OR_RETURN(Admission adm, Admit(ctx));
  }
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream out(&bytes);
    google::protobuf::io::CodedOutputStream coded(&out);
    coded.SetSerializationDeterministic(true);
    req.SerializeToCodedStream(&coded);
  }
  ASSIGN_OR_RETURN(std::string stored,
                   runs_->Do(ctx.tenant, session_id, run_id,
                             absl::StrCat(req.GetDescriptor()->name(), ":", StableHash(bytes)),
                             [&](const RunLedger::Started& started) -> absl::StatusOr<std::string> {
                               ASSIGN_OR_RETURN(pb::RunResult r, fn(started));
                               return r.SerializeAsString();
                             }));
  pb::RunResult r;
  if (!r.ParseFromString(stored)) return absl::InternalError("run_id: stored result unreadable");
  return r;
}

absl::StatusOr<pb::RunResult> BrokerCore::Run(const CallContext& ctx, const pb::RunRequest& req) {
  ASSIGN_OR_RETURN(Language lang, ToLanguage(req.language()));
  return Once(ctx, req.session_id(), req.run_id(), req, [&](const RunLedger::Started& started) {
    return Exec(ctx, req.session_id(), req.spec(), lang, req.language() != pb::LANGUAGE_UNSPECIFIED,
                req.code(), req.timeout_seconds(), req.env(), nullptr, started);
  });
}

absl::StatusOr<pb::RunResult> BrokerCore::Shell(const CallContext& ctx,
                                                const pb::ShellRequest& req) {
  return Once(ctx, req.session_id(), req.run_id(), req, [&](const RunLedger::Started& started) {
    return Exec(ctx, req.session_id(), req.spec(), Language::kShell, true, req.command(),
                req.timeout_seconds(), req.env(), nullptr, started);
  });
}

namespace {

// Waits on this thread for an asynchronous call's answer (the caller's own
// thread, never one of the pools the call itself may need).
template <typename T, typename Start>
absl::StatusOr<T> AwaitAnswer(Start start) {
  absl::Notification settled;
  absl::StatusOr<T> answer = absl::UnknownError("no answer");
  start([&](absl::StatusOr<T> r) {
    answer = std::move(r);
    settled.Notify();
  });
  settled.WaitForNotification();
  return answer;
}

}  // namespace

absl::StatusOr<pb::WriteFileResponse> BrokerCore::WriteFile(const CallContext& ctx,
                                                            const pb::WriteFileRequest& req) {
  return AwaitAnswer<pb::WriteFileResponse>(
      [&](Done<pb::WriteFileResponse> done) { WriteFileAsync(ctx, req, std::move(done)); });
}

absl::StatusOr<pb::ReadFileResponse> BrokerCore::ReadFile(const CallContext& ctx,
                                                          const pb::ReadFileRequest& req) {
  return AwaitAnswer<pb::ReadFileResponse>(
      [&](Done<pb::ReadFileResponse> done) { ReadFileAsync(ctx, req, std::move(done)); });
}

void BrokerCore::FileLeaseAsync(const CallContext& ctx, const std::string& session_id,
                                const pb::SessionSpec& spec,
                                const std::function<absl::Status()>& check, FileLeaseDone then) {
  absl::StatusOr<Admission> adm = Admit(ctx);
  if (!adm.ok()) return then(adm.status());
  if (absl::Status s = ValidateSessionId(session_id); !s.ok()) return then(s);
  if (absl::Status s = check(); !s.ok()) return then(s);
  absl::StatusOr<CreateOptions> o = CreateOptionsFor(ctx, *adm, spec);
  if (!o.ok()) return then(o.status());
  LeaseAsync(ctx, session_id, std::make_shared<const CreateOptions>(std::move(*o)),
             [ctx, then](absl::StatusOr<Lease> lease) {
               if (!lease.ok()) return then(lease.status());
               if (ctx.provider) *ctx.provider = lease->provider();
               then(std::make_shared<Lease>(std::move(*lease)));
             });
}

void BrokerCore::WriteFileAsync(const CallContext& ctx, const pb::WriteFileRequest& req,
                                Done<pb::WriteFileResponse> done) {
  auto bytes = std::make_shared<std::string>();
  auto decode = [&req, bytes] {
    if (req.path().empty()) return absl::InvalidArgumentError("path is empty");
    absl::StatusOr<std::string> data = Decode(req.contents(), req.encoding(), "contents");
    if (!data.ok()) return data.status();
    *bytes = std::move(*data);
    return absl::OkStatus();
  };
  FileLeaseAsync(ctx, req.session_id(), req.spec(), decode,
                 [this, ctx, session_id = req.session_id(), path = req.path(), bytes,
                  done](absl::StatusOr<std::shared_ptr<Lease>> lease) {
                   if (!lease.ok()) return done(lease.status());
                   std::shared_ptr<Lease> held = std::move(*lease);
                   const int64_t n = static_cast<int64_t>(bytes->size());
                   held->sandbox()->WriteFileAsync(
                       path, std::move(*bytes),
                       WithRequestId([this, ctx, session_id, held, n, done](absl::Status s) {
                         if (!s.ok()) {
                           if (s.code() == absl::StatusCode::kResourceExhausted) {
                             metrics_->QuotaHit(held->provider(), "disk");
                           }
                           return FailAsync(ctx, session_id, held, s,
                                            [done](absl::Status e) { done(e); });
                         }
                         UsageCounters d;
                         d.file_transfer_bytes = n;
                         RecordUsage(ctx, held->provider(), d);
                         held->Release();
                         pb::WriteFileResponse resp;
                         resp.set_bytes_written(n);
                         done(std::move(resp));
                       }));
                 });
}

void BrokerCore::ReadFileAsync(const CallContext& ctx, const pb::ReadFileRequest& req,
                               Done<pb::ReadFileResponse> done) {
  const pb::Encoding encoding = req.encoding();
  auto checks = [&req, encoding] {
    if (req.path().empty()) return absl::InvalidArgumentError("path is empty");
    if (encoding == pb::ENCODING_UTF8 || encoding == pb::ENCODING_BASE64) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("unknown encoding ", static_cast<int>(encoding)));
  };
  FileLeaseAsync(ctx, req.session_id(), req.spec(), checks,
                 [this, ctx, session_id = req.session_id(), path = req.path(),
                  base64 = encoding == pb::ENCODING_BASE64,
                  done](absl::StatusOr<std::shared_ptr<Lease>> lease) {
                   if (!lease.ok()) return done(lease.status());
                   std::shared_ptr<Lease> held = std::move(*lease);
                   held->sandbox()->ReadFileAsync(
                       path, WithRequestId([this, ctx, session_id, held, base64,
                                            done](absl::StatusOr<std::optional<std::string>> read) {
                         if (!read.ok()) {
                           return FailAsync(ctx, session_id, held, read.status(),
                                            [done](absl::Status e) { done(e); });
                         }
                         pb::ReadFileResponse resp;
                         if (read->has_value()) {
                           const std::string& data = **read;
                           UsageCounters d;
                           d.file_transfer_bytes = static_cast<int64_t>(data.size());
                           RecordUsage(ctx, held->provider(), d);
                           resp.set_found(true);
                           resp.set_contents(base64 ? absl::Base64Escape(data) : RepairUtf8(data));
                         }
                         held->Release();
                         done(std::move(resp));
                       }));
                 });
}

void BrokerCore::KeepAliveAsync(const CallContext& ctx, const pb::KeepAliveRequest& req,
                                Done<pb::KeepAliveResponse> done) {
  absl::StatusOr<Admission> adm = Admit(ctx);
  if (!adm.ok()) return done(adm.status());
  if (absl::Status s = ValidateSessionId(req.session_id()); !s.ok()) return done(s);
  // Never creates; tells the provider too (for provider-side timers).
  LeaseAsync(ctx, req.session_id(), nullptr,
             [this, ctx, session_id = req.session_id(), done](absl::StatusOr<Lease> lease) {
               if (!lease.ok()) return done(lease.status());
               auto held = std::make_shared<Lease>(std::move(*lease));
               held->sandbox()->KeepAliveAsync([this, ctx, session_id, held, done](absl::Status s) {
                 held->Release();
                 if (!s.ok()) return done(s);
                 absl::StatusOr<absl::Time> deadline = sessions_->KeepAlive(ctx.tenant, session_id);
                 if (!deadline.ok()) return done(deadline.status());
                 pb::KeepAliveResponse resp;
                 SetTime(*deadline, resp.mutable_idle_expires_at());
                 done(std::move(resp));
               });
             });
}

}  // namespace sandbox

namespace sandbox {

absl::StatusOr<pb::RunResult> BrokerCore::RunStream(
    const CallContext& ctx, const pb::RunRequest& req,
    const std::function<void(OutputStream, absl::string_view)>& on_chunk) {
  ASSIGN_OR_RETURN(Language lang, ToLanguage(req.language()));
  if (req.run_id().empty() || runs_ == nullptr) {
    ASSIGN_OR_RETURN(pb::RunResult r, Exec(ctx, req.session_id(), req.spec(), lang,
                                           req.language() != pb::LANGUAGE_UNSPECIFIED, req.code(),
                                           req.timeout_seconds(), req.env(), on_chunk));
    r.clear_output();
    return r;
  }
  // With a run_id the first attempt streams live and its output is kept; a
  // retry gets the kept output as one stdout chunk.
  bool live = false;
  ASSIGN_OR_RETURN(
      pb::RunResult r,
      Once(ctx, req.session_id(), req.run_id(), req, [&](const RunLedger::Started& started) {
        live = true;
        return Exec(ctx, req.session_id(), req.spec(), lang,
                    req.language() != pb::LANGUAGE_UNSPECIFIED, req.code(), req.timeout_seconds(),
                    req.env(), on_chunk, started);
      }));
  if (!live && !r.output().empty()) on_chunk(OutputStream::kStdout, r.output());
  r.clear_output();
  return r;
}

ToolLimits BrokerCore::Limits(const TenantRules* rules) const {
  ToolLimits l;
  l.default_timeout_seconds = config_.default_timeout_seconds;
  l.max_timeout_seconds = config_.max_timeout_seconds;
  l.max_output_bytes = config_.max_output_bytes;
  if (rules != nullptr) {
    l.max_timeout_seconds = std::min<int64_t>(l.max_timeout_seconds, rules->max_timeout_seconds);
    l.default_timeout_seconds = std::min<int64_t>(l.default_timeout_seconds, l.max_timeout_seconds);
    l.max_output_bytes = std::min<int64_t>(l.max_output_bytes, rules->max_output_bytes);
  }
  return l;
}

absl::StatusOr<pb::ListToolsResponse> BrokerCore::ListTools(const CallContext& ctx,
                                                            const pb::ListToolsRequest& req) {
  ASSIGN_OR_RETURN(Admission adm, Admit(ctx));
  std::vector<std::string> names;
  if (req.provider().empty()) {
    names = providers_->Names();
    // Only the tools of providers the tenant may use.
    if (adm.rules != nullptr) {
      names.erase(
          std::remove_if(names.begin(), names.end(),
                         [&](const std::string& n) { return !adm.rules->AllowsProvider(n); }),
          names.end());
    }
  } else {
    const std::vector<std::string>* configured =
        adm.rules != nullptr ? &adm.snapshot->maxima.providers : nullptr;
    if (configured != nullptr && !adm.rules->AllowsProvider(req.provider()) &&
        std::find(configured->begin(), configured->end(), req.provider()) != configured->end()) {
      return Refused(ctx, PolicyEngine::CheckSpec(*adm.rules, ctx.tenant, req.provider(), "", {}),
                     "providers", req.provider());
    }
    RETURN_IF_ERROR(providers_->Find(req.provider()).status());
    names.push_back(req.provider());
  }
  ASSIGN_OR_RETURN(std::vector<pb::Tool> tools,
                   BuildTools(names, req.dialect(), Limits(adm.rules)));
  pb::ListToolsResponse resp;
  for (auto& t : tools) *resp.add_tools() = std::move(t);
  return resp;
}

absl::StatusOr<pb::CallToolResponse> BrokerCore::CallTool(const CallContext& ctx,
                                                          const pb::CallToolRequest& req) {
  return CallTool(ctx, req, CallToolExtras{});
}

namespace {

pb::CallToolResponse ToolError(const absl::Status& s) {
  pb::CallToolResponse resp;
  resp.set_is_error(true);
  resp.set_content(ToolErrorText(s));
  return resp;
}

}  // namespace

// The checks and parsing every tool call starts with. An error is the RPC's
// answer; a response is the answer now (the model's mistake, as a tool
// error); else `call` is ready to run.
absl::StatusOr<std::optional<pb::CallToolResponse>> BrokerCore::PrepareTool(
    const CallContext& ctx, const pb::CallToolRequest& req, ToolCall* call) {
  // The platform's mistakes are RPC errors; the model's are tool errors.
  ASSIGN_OR_RETURN(Admission adm, Admit(ctx));
  // The nested call reads the same snapshot.
  call->inner = ctx;
  call->inner.snapshot = adm.snapshot;
  RETURN_IF_ERROR(ValidateSessionId(req.session_id()));
  absl::StatusOr<ToolName> name = ParseToolName(req.name());
  if (!name.ok()) return ToolError(name.status());
  if (!req.spec().provider().empty() && req.spec().provider() != name->provider) {
    return absl::InvalidArgumentError(absl::StrCat("spec.provider \"", req.spec().provider(),
                                                   "\" does not match tool ", req.name()));
  }
  if (absl::Status s = providers_->Find(name->provider).status(); !s.ok()) return ToolError(s);
  absl::StatusOr<ToolArgs> args = ParseToolArgs(name->op, req.arguments_json(), Limits(adm.rules));
  if (!args.ok()) return ToolError(args.status());
  call->op = name->op;
  pb::SessionSpec spec = req.spec();
  spec.set_provider(name->provider);
  switch (name->op) {
    case ToolOp::kRun:
    case ToolOp::kShell: {
      pb::RunRequest& run = call->run;
      run.set_session_id(req.session_id());
      run.set_code(args->code);
      run.set_language(name->op == ToolOp::kShell ? pb::LANGUAGE_SHELL : args->language);
      run.set_timeout_seconds(args->timeout_seconds);
      *run.mutable_spec() = spec;
      if (!req.call_id().empty()) {
        // The model's tool-call id: a retried tool call runs once.
        RETURN_IF_ERROR(ValidateRunId(req.call_id(), "call_id"));
        run.set_run_id(absl::StrCat("call:", req.call_id()).substr(0, 128));
      }
      break;
    }
    case ToolOp::kWriteFile: {
      pb::WriteFileRequest& w = call->write;
      w.set_session_id(req.session_id());
      w.set_path(args->path);
      w.set_contents(args->contents);
      w.set_encoding(args->encoding);
      *w.mutable_spec() = spec;
      break;
    }
    case ToolOp::kReadFile: {
      pb::ReadFileRequest& rd = call->read;
      rd.set_session_id(req.session_id());
      rd.set_path(args->path);
      rd.set_encoding(args->encoding);
      *rd.mutable_spec() = spec;
      break;
    }
  }
  return std::nullopt;
}

absl::StatusOr<pb::CallToolResponse> BrokerCore::ToolAnswer(const pb::CallToolRequest& req,
                                                            absl::StatusOr<pb::RunResult> r,
                                                            pb::RunResult* run_out) {
  if (!r.ok() && !req.call_id().empty() &&
      (r.status().code() == absl::StatusCode::kAborted ||
       r.status().code() == absl::StatusCode::kAlreadyExists)) {
    return r.status();  // the platform's retry, not the model's mistake
  }
  if (!r.ok()) return ToolError(r.status());
  if (run_out) *run_out = *r;
  pb::CallToolResponse resp;
  resp.set_content(FormatRunResult(*r));
  return resp;
}

pb::CallToolResponse BrokerCore::ToolAnswer(absl::StatusOr<pb::WriteFileResponse> r) {
  if (!r.ok()) return ToolError(r.status());
  pb::CallToolResponse resp;
  resp.set_content("ok");
  return resp;
}

pb::CallToolResponse BrokerCore::ToolAnswer(absl::StatusOr<pb::ReadFileResponse> r, bool* found) {
  if (!r.ok()) return ToolError(r.status());
  if (found) *found = r->found();
  pb::CallToolResponse resp;
  resp.set_content(r->found() ? r->contents() : kFileNotFound);
  resp.set_found(r->found());
  return resp;
}

absl::StatusOr<pb::CallToolResponse> BrokerCore::CallTool(const CallContext& ctx,
                                                          const pb::CallToolRequest& req,
                                                          const CallToolExtras& extras) {
  ToolCall call;
  ASSIGN_OR_RETURN(std::optional<pb::CallToolResponse> early, PrepareTool(ctx, req, &call));
  if (early.has_value()) return *std::move(early);
  const CallContext& inner = call.inner;
  switch (call.op) {
    case ToolOp::kRun:
    case ToolOp::kShell: {
      const pb::RunRequest& run = call.run;
      absl::StatusOr<pb::RunResult> r =
          extras.on_output == nullptr
              ? Run(inner, run)
              : Once(inner, run.session_id(), run.run_id(), run,
                     [&](const RunLedger::Started& started) {
                       return Exec(inner, run.session_id(), run.spec(),
                                   ToLanguage(run.language()).value_or(Language::kPython), true,
                                   run.code(), run.timeout_seconds(), run.env(), extras.on_output,
                                   started);
                     });
      return ToolAnswer(req, std::move(r), extras.run);
    }
    case ToolOp::kWriteFile:
      return ToolAnswer(WriteFile(inner, call.write));
    case ToolOp::kReadFile:
      return ToolAnswer(ReadFile(inner, call.read), extras.found);
  }
  return pb::CallToolResponse();
}

void BrokerCore::CallToolAsync(const CallContext& ctx, const pb::CallToolRequest& req,
                               Done<pb::CallToolResponse> done) {
  auto call = std::make_shared<ToolCall>();
  absl::StatusOr<std::optional<pb::CallToolResponse>> early = PrepareTool(ctx, req, call.get());
  if (!early.ok()) return done(early.status());
  if (early->has_value()) return done(**std::move(early));
  switch (call->op) {
    case ToolOp::kRun:
    case ToolOp::kShell:
      // `call` holds the request until `done`.
      return RunAsync(call->inner, call->run,
                      [this, call, req, done](absl::StatusOr<pb::RunResult> r) {
                        done(ToolAnswer(req, std::move(r), nullptr));
                      });
    case ToolOp::kWriteFile:
      return WriteFileAsync(
          call->inner, call->write,
          [done](absl::StatusOr<pb::WriteFileResponse> r) { done(ToolAnswer(std::move(r))); });
    case ToolOp::kReadFile:
      return ReadFileAsync(call->inner, call->read, [done](absl::StatusOr<pb::ReadFileResponse> r) {
        done(ToolAnswer(std::move(r), nullptr));
      });
  }
  done(pb::CallToolResponse());
}

void BrokerCore::CallToolAsync(const CallContext& ctx, const pb::CallToolRequest& req,
                               std::function<void(OutputStream, absl::string_view)> on_output,
                               std::function<bool(std::function<void()>)> output_ready,
                               Done<ToolOutcome> done) {
  auto call = std::make_shared<ToolCall>();
  absl::StatusOr<std::optional<pb::CallToolResponse>> early = PrepareTool(ctx, req, call.get());
  if (!early.ok()) return done(early.status());
  if (early->has_value()) {
    ToolOutcome o;
    o.response = **std::move(early);
    return done(std::move(o));
  }
  switch (call->op) {
    case ToolOp::kRun:
    case ToolOp::kShell: {
      // `call` holds the request until `finish`.
      auto finish = [call, req, done](absl::StatusOr<pb::RunResult> r) {
        pb::RunResult run;
        const bool ran = r.ok();
        absl::StatusOr<pb::CallToolResponse> a = ToolAnswer(req, std::move(r), &run);
        if (!a.ok()) return done(a.status());
        ToolOutcome o;
        o.response = *std::move(a);
        if (ran) o.run = std::move(run);
        done(std::move(o));
      };
      if (on_output == nullptr) return RunAsync(call->inner, call->run, finish);
      const pb::RunRequest& run = call->run;
      const Language lang = ToLanguage(run.language()).value_or(Language::kPython);
      if (!run.run_id().empty() && runs_ != nullptr) {
        // A retried tool call runs once: the ledger's steps block.
        blocking_->Submit([this, call, lang, on_output, finish] {
          const pb::RunRequest& run = call->run;
          finish(Once(call->inner, run.session_id(), run.run_id(), run,
                      [&](const RunLedger::Started& started) {
                        return Exec(call->inner, run.session_id(), run.spec(), lang, true,
                                    run.code(), run.timeout_seconds(), run.env(), on_output,
                                    started);
                      }));
        });
        return;
      }
      auto plan = AdmitRun(call->inner, run.session_id(), run.spec(), lang, true, run.code(),
                           run.timeout_seconds(), run.env());
      if (!plan.ok()) return finish(plan.status());
      (*plan)->on_output = std::move(on_output);
      (*plan)->output_ready = std::move(output_ready);
      return ExecAsync(std::move(*plan), finish);
    }
    case ToolOp::kWriteFile:
      return WriteFileAsync(call->inner, call->write,
                            [done](absl::StatusOr<pb::WriteFileResponse> r) {
                              ToolOutcome o;
                              o.response = ToolAnswer(std::move(r));
                              done(std::move(o));
                            });
    case ToolOp::kReadFile:
      return ReadFileAsync(call->inner, call->read, [done](absl::StatusOr<pb::ReadFileResponse> r) {
        ToolOutcome o;
        bool found = false;
        o.response = ToolAnswer(std::move(r), &found);
        o.found = found;
        done(std::move(o));
      });
  }
  done(ToolOutcome());
}

}  // namespace sandbox

namespace sandbox {

absl::StatusOr<BrokerCore::Admission> BrokerCore::Admit(const CallContext& ctx) {
  Admission a;
  if (ops_.policy == nullptr) return a;
  a.snapshot = ctx.snapshot ? ctx.snapshot : ops_.policy->Current();
  a.rules = &a.snapshot->For(ctx.tenant);
  if (absl::Status s = ops_.policy->CheckEnabled(*a.rules, ctx.tenant); !s.ok()) {
    return Refused(ctx, s, "disabled");
  }
  return a;
}

absl::Status BrokerCore::Refused(const CallContext& ctx, absl::Status status,
                                 absl::string_view rule, const std::string& provider) {
  if (status.code() == absl::StatusCode::kResourceExhausted) {
    UsageCounters d;
    d.quota_refusals = 1;
    RecordUsage(ctx, provider, d);
  }
  if (ops_.audit != nullptr) {
    AuditEvent e;
    e.event = "policy.refused";
    e.tenant = ctx.tenant;
    e.session_id = ctx.session_id;
    e.provider = provider;
    e.request_id = ctx.request_id;
    e.fields["rule"] = std::string(rule);
    e.fields["code"] = absl::StatusCodeToString(status.code());
    e.fields["message"] = std::string(status.message());
    ops_.audit->Record(e);
  }
  return status;
}

void BrokerCore::RecordUsage(const CallContext& ctx, const std::string& provider,
                             const UsageCounters& d) {
  if (ops_.usage != nullptr) ops_.usage->Record(ctx.tenant, provider, d);
}

absl::StatusOr<CreateOptions> BrokerCore::CreateOptionsFor(const CallContext& ctx,
                                                           const Admission& a,
                                                           const pb::SessionSpec& spec) {
  ASSIGN_OR_RETURN(CreateOptions o, ToCreateOptions(spec));
  const std::string provider = !o.provider.empty()  ? o.provider
                               : a.rules != nullptr ? a.rules->default_provider
                                                    : config_.default_provider;
  absl::StatusOr<NetworkPolicy> network = SessionNetwork(spec, a.rules, config_, provider);
  if (!network.ok()) {
    if (network.status().code() != absl::StatusCode::kPermissionDenied) return network.status();
    return Refused(ctx, network.status(), "network", provider);
  }
  o.network = *std::move(network);
  if (a.rules == nullptr) return o;
  const TenantRules& r = *a.rules;
  ResourceLimits asked;
  asked.memory_bytes = spec.resources().memory_bytes();
  asked.cpus = spec.resources().cpus();
  asked.pids = spec.resources().pids();
  asked.disk_bytes = spec.resources().disk_bytes();
  const auto& configured = a.snapshot->maxima.providers;
  const bool known = std::find(configured.begin(), configured.end(), provider) != configured.end();
  if (absl::Status s =
          PolicyEngine::CheckSpec(r, ctx.tenant, provider, o.template_name, asked, known);
      !s.ok()) {
    return Refused(ctx, s, RefusingRule(s).value_or("providers"), provider);
  }
  o.default_provider = r.default_provider;
  // A session asking for the default (0) still gets at most the tenant's cap.
  o.resources_ceiling.memory_bytes = r.resources.memory_bytes;
  o.resources_ceiling.cpus = r.resources.cpus;
  o.resources_ceiling.pids = r.resources.pids;
  o.resources_ceiling.disk_bytes = r.resources.disk_bytes;
  if (r.max_sessions < config_.max_sessions_per_tenant) o.max_sessions = r.max_sessions;
  if (r.idle_timeout_seconds < config_.idle_timeout_seconds) {
    o.idle_timeout = absl::Seconds(r.idle_timeout_seconds);
  }
  if (r.max_lifetime_seconds > 0 && (config_.max_lifetime_seconds == 0 ||
                                     r.max_lifetime_seconds < config_.max_lifetime_seconds)) {
    o.max_lifetime = absl::Seconds(r.max_lifetime_seconds);
  }
  return o;
}

absl::StatusOr<Lease> BrokerCore::AcquireFor(const CallContext& ctx, const std::string& session_id,
                                             const CreateOptions* o) {
  return RefusedIfMaxSessions(ctx, o, sessions_->Acquire(ctx.tenant, session_id, o));
}

absl::StatusOr<Lease> BrokerCore::RefusedIfMaxSessions(const CallContext& ctx,
                                                       const CreateOptions* o,
                                                       absl::StatusOr<Lease> lease) {
  if (!lease.ok() && RefusingRule(lease.status()) == "max_sessions") {
    const std::string provider = o == nullptr                   ? ""
                                 : !o->provider.empty()         ? o->provider
                                 : !o->default_provider.empty() ? o->default_provider
                                                                : config_.default_provider;
    return Refused(ctx, lease.status(), "max_sessions", provider);
  }
  return lease;
}

pb::Language FromLanguage(Language l) {
  switch (l) {
    case Language::kPython:
      return pb::LANGUAGE_PYTHON;
    case Language::kNode:
      return pb::LANGUAGE_NODE;
    case Language::kShell:
      return pb::LANGUAGE_SHELL;
  }
  return pb::LANGUAGE_PYTHON;
}

void SetTime(absl::Time t, google::protobuf::Timestamp* ts) {
  const int64_t ns = absl::ToUnixNanos(t);
  ts->set_seconds(ns / 1000000000);
  ts->set_nanos(static_cast<int32_t>(ns % 1000000000));
}

}  // namespace sandbox
