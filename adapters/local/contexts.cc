#include "adapters/local/contexts.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base64.h"

namespace sandbox {
namespace {

using json = nlohmann::json;

// Typed reads of sandbox input: a missing or mistyped field is the default.
std::string Str(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}
bool Bool(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}
int64_t Int(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

absl::StatusCode CodeNamed(const std::string& name) {
  if (name == "NOT_FOUND") return absl::StatusCode::kNotFound;
  if (name == "RESOURCE_EXHAUSTED") return absl::StatusCode::kResourceExhausted;
  if (name == "INVALID_ARGUMENT") return absl::StatusCode::kInvalidArgument;
  if (name == "UNIMPLEMENTED") return absl::StatusCode::kFailedPrecondition;
  if (name == "UNAVAILABLE") return absl::StatusCode::kUnavailable;
  return absl::StatusCode::kInternal;
}

CodeContext ToContext(const json& j) {
  CodeContext c;
  if (!j.is_object()) return c;
  c.id = Str(j, "id");
  c.language = Str(j, "language") == "node" ? Language::kNode : Language::kPython;
  c.cwd = Str(j, "cwd");
  c.created_at = absl::FromUnixMillis(Int(j, "created_at_ms"));
  return c;
}

// image/png and image/jpeg travel as base64 text (Jupyter's form): bytes
// here. Anything else stays text.
std::string MimeValue(const std::string& mime, const std::string& text) {
  if (mime != "image/png" && mime != "image/jpeg") return text;
  std::string compact;
  for (char c : text) {
    if (c != '\n' && c != '\r' && c != ' ') compact.push_back(c);
  }
  absl::StatusOr<std::string> bytes = DecodeBase64Strict(compact);
  return bytes.ok() ? *bytes : std::string();
}

void AppendCapped(std::string* out, const std::string& text, size_t cap) {
  if (cap == 0 || out->size() + text.size() <= cap) {
    out->append(text);
  } else if (out->size() < cap) {
    out->append(text, 0, cap - out->size());
  }
}

CodeError ToError(const json& j) {
  CodeError e;
  e.name = Str(j, "name");
  e.value = Str(j, "value");
  auto tb = j.find("traceback");
  if (tb != j.end() && tb->is_array()) {
    for (const json& line : *tb) {
      if (line.is_string()) e.traceback.push_back(line.get<std::string>());
    }
  }
  return e;
}

}  // namespace

std::string ContextRequest(const CodeOp& op) {
  json req;
  switch (op.kind) {
    case CodeOp::Kind::kCreate:
      req = {{"op", "create"},
             {"language", std::string(LanguageName(op.language))},
             {"cwd", op.cwd},
             {"env", op.env}};
      break;
    case CodeOp::Kind::kList:
      req = {{"op", "list"}};
      break;
    case CodeOp::Kind::kRestart:
      req = {{"op", "restart"}, {"id", op.context_id}};
      break;
    case CodeOp::Kind::kDelete:
      req = {{"op", "delete"}, {"id", op.context_id}};
      break;
    case CodeOp::Kind::kRun:
      req = {{"op", "run"},
             {"id", op.context_id},
             {"language", std::string(LanguageName(op.language))},
             {"cwd", op.cwd},
             {"code", op.code},
             {"timeout", absl::ToDoubleSeconds(op.timeout)},
             {"max_output", op.max_output_bytes},
             {"env", op.env}};
      break;
  }
  return req.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}

absl::StatusOr<CodeOpResult> ParseContextAnswer(const CodeOp& op, absl::string_view answer) {
  CodeOpResult out;
  Execution& x = out.execution;
  for (absl::string_view line : absl::StrSplit(answer, '\n', absl::SkipEmpty())) {
    json j = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      return absl::UnavailableError("local: the context supervisor sent a malformed answer");
    }
    const std::string event = Str(j, "event");
    if (event == "stdout") {
      AppendCapped(&x.stdout_text, Str(j, "text"), op.max_output_bytes);
    } else if (event == "stderr") {
      AppendCapped(&x.stderr_text, Str(j, "text"), op.max_output_bytes);
    } else if (event == "result") {
      CodeResult r;
      r.is_main_result = Bool(j, "main");
      auto data = j.find("data");
      if (data != j.end() && data->is_object()) {
        for (auto it = data->begin(); it != data->end(); ++it) {
          if (it.value().is_string()) r.data[it.key()] = MimeValue(it.key(), it.value());
        }
      }
      x.results.push_back(std::move(r));
    } else if (event == "done") {
      if (!Bool(j, "ok")) {
        return absl::Status(CodeNamed(Str(j, "code")), absl::StrCat("local: ", Str(j, "message")));
      }
      auto ctx = j.find("context");
      if (ctx != j.end()) out.contexts.push_back(ToContext(*ctx));
      auto all = j.find("contexts");
      if (all != j.end() && all->is_array()) {
        for (const json& c : *all) out.contexts.push_back(ToContext(c));
      }
      out.existed = Bool(j, "existed");
      if (!out.contexts.empty()) x.context = out.contexts.front();
      auto err = j.find("error");
      if (err != j.end() && err->is_object()) x.error = ToError(*err);
      x.execution_count = static_cast<int>(Int(j, "execution_count"));
      x.timed_out = Bool(j, "timed_out");
      x.duration_ms = Int(j, "duration_ms");
      x.context_died = Bool(j, "died");
      x.context_restarted = Bool(j, "restarted");
      return out;
    }
  }
  return absl::UnavailableError("local: the context supervisor ended without an answer");
}

absl::StatusOr<int> ConnectContextSupervisor(int parent_fd, const char* dir_name, uid_t uid) {
  int dir = openat(parent_fd, dir_name, O_PATH | O_NOFOLLOW | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) {
    if (errno == ENOENT) return absl::NotFoundError("no context supervisor yet");
    return absl::UnavailableError(
        absl::StrCat("local: the contexts' directory cannot be opened: ", strerror(errno)));
  }
  int sock = openat(dir, "ctl.sock", O_PATH | O_NOFOLLOW | O_CLOEXEC);
  close(dir);
  if (sock < 0) return absl::NotFoundError("no context supervisor yet");
  struct stat st;
  if (fstat(sock, &st) != 0 || !S_ISSOCK(st.st_mode) || st.st_uid != uid) {
    close(sock);
    return absl::UnavailableError("local: the contexts' socket is not the sandbox's own socket");
  }
  // Connected through the descriptor: the checked inode, whatever the name
  // points at by now.
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof(addr.sun_path), "/proc/self/fd/%d", sock);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    close(sock);
    return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  }
  const int rc = connect(fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr));
  const int err = errno;
  close(sock);
  if (rc != 0) {
    close(fd);
    if (err == ECONNREFUSED || err == ENOENT) return absl::NotFoundError("no context supervisor");
    return absl::UnavailableError(
        absl::StrCat("local: cannot reach the context supervisor: ", strerror(err)));
  }
  return fd;
}

absl::StatusOr<std::string> ExchangeWithSupervisor(int fd, const std::string& request,
                                                   absl::Time deadline, size_t max_bytes,
                                                   bool* answered) {
  *answered = false;
  std::string answer;
  size_t sent = 0;
  auto ended = [&answer] {
    return answer.size() >= 2 && answer.compare(answer.size() - 2, 2, "\n\n") == 0;
  };
  while (!ended()) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError("local: the context supervisor did not answer");
    }
    struct pollfd p = {fd, static_cast<short>(sent < request.size() ? POLLOUT : POLLIN), 0};
    const int wait_ms =
        static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1000));
    const int pr = poll(&p, 1, wait_ms);
    if (pr < 0 && errno != EINTR) return absl::InternalError("poll failed");
    if (pr <= 0) continue;
    if (sent < request.size()) {
      ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno != EINTR && errno != EAGAIN) {
        return absl::UnavailableError("local: the context supervisor went away");
      }
      if (n > 0) sent += static_cast<size_t>(n);
      continue;
    }
    char buf[64 * 1024];
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n == 0) return absl::UnavailableError("local: the context supervisor went away");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return absl::UnavailableError("local: the context supervisor went away");
    }
    if (answer.size() + static_cast<size_t>(n) > max_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("local: an execution's answer is over ",
                                                       max_bytes >> 20, " MiB (its results)"));
    }
    answer.append(buf, static_cast<size_t>(n));
    *answered = true;
  }
  return answer;
}

bool SupervisorConnectionOpen(int fd) {
  char c;
  const ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  // Nothing to read is an idle, open connection; EOF, an error or bytes
  // nobody asked for are not.
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

absl::Duration ContextCallBudget(const CodeOp& op) {
  absl::Duration d = absl::Seconds(90);  // a kernel's start, the interrupt's grace
  if (op.kind == CodeOp::Kind::kRun) d += op.timeout;
  return d;
}

}  // namespace sandbox
