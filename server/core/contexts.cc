// Code contexts (docs/api.md#code-contexts): CreateContext, ListContexts,
// RestartContext, DeleteContext and RunCode. Each turns its request into one
// CodeOp and takes the one path, ContextsAsync (files.cc): admission, the
// request's own checks, the session's lease (its sandbox created lazily),
// the provider's CodeAsync, the answer.

#include "absl/strings/str_cat.h"
#include "server/core/broker_core.h"

namespace sandbox {
namespace {

absl::StatusOr<Language> ContextLanguage(pb::Language l) {
  switch (l) {
    case pb::LANGUAGE_UNSPECIFIED:
    case pb::LANGUAGE_PYTHON:
      return Language::kPython;
    case pb::LANGUAGE_NODE:
      return Language::kNode;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("language ", static_cast<int>(l),
                       " has no contexts (use LANGUAGE_PYTHON or LANGUAGE_NODE)"));
  }
}

void ToProto(const CodeContext& c, pb::Context* out) {
  out->set_context_id(c.id);
  out->set_language(FromLanguage(c.language));
  out->set_cwd(c.cwd);
  SetTime(c.created_at, out->mutable_created_at());
}

pb::Execution ToProto(const Execution& x) {
  pb::Execution out;
  for (const CodeResult& r : x.results) {
    pb::Result* pr = out.add_results();
    for (const auto& [mime, value] : r.data) (*pr->mutable_data())[mime] = value;
    pr->set_is_main_result(r.is_main_result);
  }
  out.set_stdout(x.stdout_text);
  out.set_stderr(x.stderr_text);
  if (x.error) {
    pb::ExecutionError* e = out.mutable_error();
    e->set_name(x.error->name);
    e->set_value(x.error->value);
    for (const std::string& line : x.error->traceback) e->add_traceback(line);
  }
  out.set_execution_count(x.execution_count);
  out.set_timed_out(x.timed_out);
  out.set_duration_ms(x.duration_ms);
  out.set_context_died(x.context_died);
  out.set_oom_killed(x.oom_killed);
  out.set_context_restarted(x.context_restarted);
  ToProto(x.context, out.mutable_context());
  return out;
}

absl::Status Required(const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError("context_id is empty");
  return absl::OkStatus();
}

// The one context an answer is about (CreateContext, RestartContext).
void AnswerContext(absl::StatusOr<CodeOpResult> r,
                   const std::function<void(absl::StatusOr<pb::Context>)>& done) {
  if (!r.ok()) return done(r.status());
  if (r->contexts.empty()) return done(absl::InternalError("the provider named no context"));
  pb::Context c;
  ToProto(r->contexts.front(), &c);
  done(std::move(c));
}

}  // namespace

void BrokerCore::CreateContextAsync(const CallContext& ctx, const pb::CreateContextRequest& req,
                                    Done<pb::Context> done) {
  CodeOp op;
  op.kind = CodeOp::Kind::kCreate;
  absl::StatusOr<Language> lang = ContextLanguage(req.language());
  op.language = lang.value_or(Language::kPython);
  op.cwd = req.cwd();
  op.env.insert(req.env().begin(), req.env().end());
  auto check = [&req, lang] {
    if (!lang.ok()) return lang.status();
    return CheckEnv(req.env());
  };
  ContextsAsync(ctx, req.session_id(), req.spec(), std::move(op), check,
                [done](absl::StatusOr<CodeOpResult> r) { AnswerContext(std::move(r), done); });
}

void BrokerCore::ListContextsAsync(const CallContext& ctx, const pb::ListContextsRequest& req,
                                   Done<pb::ListContextsResponse> done) {
  CodeOp op;
  op.kind = CodeOp::Kind::kList;
  ContextsAsync(
      ctx, req.session_id(), req.spec(), std::move(op), [] { return absl::OkStatus(); },
      [done](absl::StatusOr<CodeOpResult> r) {
        if (!r.ok()) return done(r.status());
        pb::ListContextsResponse resp;
        for (const CodeContext& c : r->contexts) ToProto(c, resp.add_contexts());
        done(std::move(resp));
      });
}

void BrokerCore::RestartContextAsync(const CallContext& ctx, const pb::RestartContextRequest& req,
                                     Done<pb::Context> done) {
  CodeOp op;
  op.kind = CodeOp::Kind::kRestart;
  op.context_id = req.context_id();
  ContextsAsync(
      ctx, req.session_id(), req.spec(), std::move(op),
      [&req] { return Required(req.context_id()); },
      [done](absl::StatusOr<CodeOpResult> r) { AnswerContext(std::move(r), done); });
}

void BrokerCore::DeleteContextAsync(const CallContext& ctx, const pb::DeleteContextRequest& req,
                                    Done<pb::DeleteContextResponse> done) {
  CodeOp op;
  op.kind = CodeOp::Kind::kDelete;
  op.context_id = req.context_id();
  ContextsAsync(
      ctx, req.session_id(), req.spec(), std::move(op),
      [&req] { return Required(req.context_id()); },
      [done](absl::StatusOr<CodeOpResult> r) {
        if (!r.ok()) return done(r.status());
        pb::DeleteContextResponse resp;
        resp.set_existed(r->existed);
        done(std::move(resp));
      });
}

void BrokerCore::RunCodeAsync(const CallContext& ctx, const pb::RunCodeRequest& req,
                              Done<pb::Execution> done) {
  CodeOp op;
  op.kind = CodeOp::Kind::kRun;
  op.context_id = req.context_id();
  absl::StatusOr<Language> lang = ContextLanguage(req.language());
  op.language = lang.value_or(Language::kPython);
  op.code = req.code();
  op.env.insert(req.env().begin(), req.env().end());
  // The tenant's limits, as Run's.
  absl::StatusOr<Admission> adm = Admit(ctx);
  if (!adm.ok()) return done(adm.status());
  absl::StatusOr<RunLimits> limits = RunLimitsFor(ctx, *adm, req.timeout_seconds());
  if (limits.ok()) {
    op.timeout = absl::Seconds(limits->timeout_seconds);
    op.max_output_bytes = static_cast<size_t>(limits->max_output_bytes);
  }
  auto check = [&req, lang, limits] {
    if (!lang.ok()) return lang.status();
    if (!limits.ok()) return limits.status();
    if (req.code().empty()) return absl::InvalidArgumentError("code is empty");
    return CheckEnv(req.env());
  };
  ContextsAsync(ctx, req.session_id(), req.spec(), std::move(op), check,
                [done](absl::StatusOr<CodeOpResult> r) {
                  if (!r.ok()) return done(r.status());
                  done(ToProto(r->execution));
                });
}

}  // namespace sandbox
