// sandboxctl: a command-line client for the sandbox broker.
//
// Exit codes: run/shell exit with the sandbox program's exit code (124 on
// timeout); otherwise 0 = ok, 64 = usage error, 66 = `read` of a missing
// file, 69 = the broker returned an error (printed as "CODE: message"),
// 74 = local I/O error.

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/mcp_grpc_backend.h"
#include "client/remote_admin.h"
#include "client/remote_sandbox.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/channel.h"
#include "protocol/mcp_server.h"

namespace {

using sandbox::pb::Encoding;
using sandbox::pb::Language;

constexpr int kExitUsage = 64;
constexpr int kExitNotFound = 66;
constexpr int kExitRpc = 69;
constexpr int kExitIo = 74;

constexpr char kUsage[] = R"(usage: sandboxctl [flags] COMMAND [ARGS]

commands:
  run CODE|-            run code (python by default; see --lang)
  shell COMMAND|-       run a bash command
  code CODE|-           run python in a live context: variables persist between calls
                        (--context ID, default the session's own); prints output and
                        results; --save-images DIR writes charts as PNG/JPEG files
  contexts              list the session's code contexts
  write PATH DATA|-     write a file (DATA, or stdin with -; binary-safe)
  read PATH             print a file's bytes (exit 66 if missing)
  ls [PATH]             list a directory (default: the workspace; --depth N, --json)
  stat PATH             describe a file without following symlinks (exit 66 if missing)
  mkdir PATH            make a directory (-p: with its parents, and fine if it exists)
  rm PATH               remove a file or empty directory (-r: and what is in it; exit 66
                        if missing)
  mv SOURCE DEST        move or rename (-f: replace DEST)
  upload LOCAL REMOTE   stream a local file (or - for stdin) into the sandbox, of any size
  download REMOTE LOCAL stream a file out (LOCAL - for stdout; exit 66 if missing); both
                        show progress on a terminal, and a summary line otherwise
  close                 close the session (destroys its sandbox)
  sessions              list your sessions
  info                  show the session
  keepalive             mark the session active (holds off idle reaping)
  tools                 list LLM tool definitions (see --dialect, --provider)
  call-tool NAME JSON|- execute a tool call; prints its content (exit 1 if is_error)
  health [SERVICE]      grpc.health.v1 check (no token); exit 0 only when SERVING
  mcp                   serve MCP over stdio (both 2025-11-25 and 2026-07-28), forwarding
                        tool calls to the broker (see docs/mcp.md)

admin commands (the Admin API; --admin-token or $SANDBOX_BROKER_ADMIN_TOKEN):
  admin sessions        every tenant's sessions (filters: --tenant, --provider,
                        --state creating|ready|closing, --label K=V...)
  admin close [ID]      close sessions by --tenant, --tenant and ID, or --label K=V...
  admin disable TENANT  refuse the tenant's new calls (--close-sessions: and close them)
  admin enable TENANT   admit the tenant again
  admin usage           usage per tenant and provider (--tenant T for one)
  admin reload          reload tokens, admin tokens and tenant policy (as SIGHUP)
  tables by default; --json prints JSON

flags:
  --version             print the version and exit
  --addr HOST:PORT      broker address ($SANDBOX_BROKER_ADDR, default 127.0.0.1:50051)
  --token TOKEN         bearer token ($SANDBOX_BROKER_TOKEN)
  --session ID          session id ($SANDBOX_SESSION, default "cli")
  --lang python|node|shell
  --timeout SECONDS     run timeout (0 = broker default)
  --provider NAME       provider for a new session (default: broker's)
  --env K=V             environment for run/shell (repeatable)
  --stream              run: print output as it is produced
  --dialect D           tools: "" (plain JSON Schema), openai or anthropic
  --tls                 use TLS (system roots unless --tls-ca)
  --tls-ca FILE         PEM roots to verify the broker (implies --tls)
  --tls-cert FILE       client certificate (PEM), with --tls-key, for brokers that verify clients
  --tls-key FILE
  --admin-token TOKEN   admin token ($SANDBOX_BROKER_ADMIN_TOKEN)
  --json                admin, ls, stat: JSON instead of a table
  --context ID          code: the context to run in
  --save-images DIR     code: write image results to DIR (created if missing)
  --depth N             ls: levels to list (1-10, default 1)
  -p, -r, -f            mkdir: parents; rm: recursive; mv: overwrite
  --tenant T, --state S, --label K=V, --close-sessions   admin filters and options

exit codes: run/shell exit with the program's code (124 = timed out); code exits 1
  when the code raised, 124 when it timed out;
  64 usage, 66 file not found, 69 broker error, 74 local I/O error.
)";

int Usage(const std::string& why) {
  std::cerr << "sandboxctl: " << why << "\n\n" << kUsage;
  return kExitUsage;
}

int RpcError(const absl::Status& s) {
  std::cerr << "sandboxctl: " << absl::StatusCodeToString(s.code()) << ": " << s.message() << "\n";
  return kExitRpc;
}

const char* EnvOr(const char* name, const char* def) {
  const char* v = getenv(name);
  return v && *v ? v : def;
}

std::string ReadStdin() {
  std::string data((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  return data;
}

std::string TextOf(const google::protobuf::Timestamp& ts) {
  if (ts.seconds() == 0 && ts.nanos() == 0) return "-";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixSeconds(ts.seconds()),
                          absl::UTCTimeZone());
}

void PrintInfo(const sandbox::pb::SessionInfo& i) {
  std::cout << i.session_id() << "\tprovider=" << i.provider() << "\tsandbox=" << i.sandbox_id()
            << "\tstate=" << sandbox::pb::SessionState_Name(i.state())
            << "\tcreated=" << TextOf(i.created_at())
            << "\tidle_expires=" << TextOf(i.idle_expires_at()) << "\n";
}

// Columns padded to their widest cell.
void PrintTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& r : rows) {
    if (width.size() < r.size()) width.resize(r.size(), 0);
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(width[i] - r[i].size() + 2, ' ');
    }
    std::cout << line << "\n";
  }
}

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

std::string Num(double v) {
  std::ostringstream ss;
  ss.setf(std::ios::fixed);
  ss.precision(1);
  ss << v;
  return ss.str();
}

struct FileFlags {
  int depth = 1;
  bool parents = false;    // mkdir -p
  bool recursive = false;  // rm -r
  bool overwrite = false;  // mv -f
  bool json = false;
};

std::vector<std::string> FileRow(const sandbox::pb::FileEntry& e) {
  const char* type = e.type() == sandbox::pb::FILE_TYPE_DIR       ? "d"
                     : e.type() == sandbox::pb::FILE_TYPE_SYMLINK ? "l"
                     : e.type() == sandbox::pb::FILE_TYPE_FILE    ? "-"
                                                                  : "?";
  std::string path = e.path();
  if (e.type() == sandbox::pb::FILE_TYPE_SYMLINK) path += " -> " + e.symlink_target();
  char mode[8];
  snprintf(mode, sizeof(mode), "%04o", e.mode() & 07777);
  return {std::string(type) + mode, std::to_string(e.size()), TextOf(e.mtime()), path};
}

// A transfer's progress on stderr: a bar redrawn at most 10 times a second
// on a terminal (bytes, rate, ETA), else one line at the end.
class Progress {
 public:
  Progress(std::string what, int64_t total) : what_(std::move(what)), total_(total) {
    tty_ = isatty(STDERR_FILENO) == 1;
  }
  void Update(int64_t done) {
    const absl::Time now = absl::Now();
    if (!tty_ || now - last_ < absl::Milliseconds(100)) return;
    last_ = now;
    std::string line = absl::StrCat("\r", what_, " ", Mib(done));
    if (total_ > 0) absl::StrAppend(&line, " / ", Mib(total_));
    const double secs = absl::ToDoubleSeconds(now - start_);
    const double rate = secs > 0 ? done / secs : 0;
    absl::StrAppend(&line, "  ", Mib(static_cast<int64_t>(rate)), "/s");
    if (total_ > 0 && rate > 0) {
      absl::StrAppend(&line, "  ETA ", static_cast<int64_t>((total_ - done) / rate), " s");
    }
    std::cerr << line << "   " << std::flush;
  }
  void Done(int64_t done) {
    const double secs = std::max(absl::ToDoubleSeconds(absl::Now() - start_), 1e-6);
    if (tty_) std::cerr << "\n";
    std::cerr << what_ << ": " << done << " bytes in " << Num(secs) << " s ("
              << Mib(static_cast<int64_t>(done / secs)) << "/s)\n";
  }

 private:
  static std::string Mib(int64_t bytes) { return Num(bytes / 1048576.0) + " MiB"; }
  const std::string what_;
  const int64_t total_;
  bool tty_ = false;
  const absl::Time start_ = absl::Now();
  absl::Time last_ = absl::InfinitePast();
};

int Upload(sandbox::RemoteSandbox& sb, const std::string& local, const std::string& remote) {
  std::ifstream file;
  std::istream* in = &std::cin;
  sandbox::RemoteSandbox::TransferOptions o;
  if (local != "-") {
    file.open(local, std::ios::binary);
    if (!file) {
      std::cerr << "sandboxctl: cannot open " << local << "\n";
      return kExitIo;
    }
    file.seekg(0, std::ios::end);
    o.size = static_cast<int64_t>(file.tellg());
    file.seekg(0);
    in = &file;
  }
  Progress progress("upload " + remote, o.size.value_or(0));
  o.progress = [&progress](int64_t n) { progress.Update(n); };
  auto r = sb.UploadFile(remote, *in, o);
  if (!r.ok()) return RpcError(r.status());
  progress.Done(*r);
  return 0;
}

int Download(sandbox::RemoteSandbox& sb, const std::string& remote, const std::string& local) {
  std::ofstream file;
  std::ostream* out = &std::cout;
  const std::string partial = local + ".partial";
  if (local != "-") {
    file.open(partial, std::ios::binary | std::ios::trunc);
    if (!file) {
      std::cerr << "sandboxctl: cannot write " << partial << "\n";
      return kExitIo;
    }
    out = &file;
  }
  Progress progress("download " + remote, 0);
  sandbox::RemoteSandbox::TransferOptions o;
  int64_t got = 0;
  o.progress = [&](int64_t n) {
    got = n;
    progress.Update(n);
  };
  auto r = sb.DownloadFile(remote, *out, o);
  if (local != "-") file.close();
  if (!r.ok() || !r->has_value()) {
    if (local != "-") std::remove(partial.c_str());
    if (!r.ok()) return RpcError(r.status());
    std::cerr << "sandboxctl: " << remote << ": file not found\n";
    return kExitNotFound;
  }
  if (local != "-" && std::rename(partial.c_str(), local.c_str()) != 0) {
    std::cerr << "sandboxctl: cannot rename " << partial << " to " << local << "\n";
    return kExitIo;
  }
  std::cout << std::flush;
  if (local != "-") progress.Done(got);
  return 0;
}

// ls, stat, mkdir, rm, mv, upload, download; -1 when `cmd` is none of them.
int FilesMain(sandbox::RemoteSandbox& sb, const std::vector<std::string>& args,
              const FileFlags& f) {
  const std::string& cmd = args[0];
  if (cmd == "ls") {
    if (args.size() > 2) return Usage("ls takes at most a PATH");
    const std::string path = args.size() == 2 ? args[1] : "";
    auto r = sb.ListFiles(path, f.depth);
    if (!r.ok()) return RpcError(r.status());
    if (!r->has_value()) {
      std::cerr << "sandboxctl: " << path << ": no such directory\n";
      return kExitNotFound;
    }
    if (f.json) {
      std::cout << "[";
      for (size_t i = 0; i < (*r)->size(); ++i) std::cout << (i ? "," : "") << Json((**r)[i]);
      std::cout << "]\n";
      return 0;
    }
    std::vector<std::vector<std::string>> rows;
    for (const auto& e : **r) rows.push_back(FileRow(e));
    PrintTable(rows);
    return 0;
  }
  if (cmd == "stat") {
    if (args.size() != 2) return Usage("stat takes PATH");
    auto r = sb.StatFile(args[1]);
    if (!r.ok()) return RpcError(r.status());
    if (!r->has_value()) {
      std::cerr << "sandboxctl: " << args[1] << ": not found\n";
      return kExitNotFound;
    }
    if (f.json) {
      std::cout << Json(**r) << "\n";
    } else {
      PrintTable({FileRow(**r)});
    }
    return 0;
  }
  if (cmd == "mkdir") {
    if (args.size() != 2) return Usage("mkdir takes PATH");
    absl::Status s = sb.MakeDir(args[1], f.parents);
    return s.ok() ? 0 : RpcError(s);
  }
  if (cmd == "rm") {
    if (args.size() != 2) return Usage("rm takes PATH");
    auto r = sb.RemoveFile(args[1], f.recursive);
    if (!r.ok()) return RpcError(r.status());
    if (!*r) {
      std::cerr << "sandboxctl: " << args[1] << ": not found\n";
      return kExitNotFound;
    }
    return 0;
  }
  if (cmd == "upload") {
    if (args.size() != 3) return Usage("upload takes LOCAL (or -) and REMOTE");
    return Upload(sb, args[1], args[2]);
  }
  if (cmd == "download") {
    if (args.size() != 3) return Usage("download takes REMOTE and LOCAL (or -)");
    return Download(sb, args[1], args[2]);
  }
  if (cmd == "mv") {
    if (args.size() != 3) return Usage("mv takes SOURCE and DEST");
    absl::Status s = sb.MoveFile(args[1], args[2], f.overwrite);
    return s.ok() ? 0 : RpcError(s);
  }
  return -1;
}

struct CodeFlags {
  std::string context;
  std::string save_images;
};

// One result of `code`: its text, or where its image went.
void PrintResult(const sandbox::pb::Result& r, const CodeFlags& f, int count, int index) {
  for (const char* mime : {"image/png", "image/jpeg"}) {
    auto it = r.data().find(mime);
    if (it == r.data().end()) continue;
    if (f.save_images.empty()) {
      std::cout << "[" << mime << ", " << it->second.size() << " bytes]\n";
      return;
    }
    const std::string path = absl::StrCat(f.save_images, "/out-", count, "-", index,
                                          std::string(mime) == "image/png" ? ".png" : ".jpg");
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << it->second;
    std::cout << "[" << mime << " saved to " << path << "]\n";
    return;
  }
  auto text = r.data().find("text/plain");
  if (text != r.data().end()) std::cout << text->second << "\n";
}

int CodeMain(sandbox::RemoteSandbox& sb, const std::string& code, int timeout, const CodeFlags& f) {
  if (!f.save_images.empty()) std::filesystem::create_directories(f.save_images);
  auto x = sb.RunCode(code, f.context, timeout);
  if (!x.ok()) return RpcError(x.status());
  std::cout << x->stdout();
  std::cerr << x->stderr();
  for (int i = 0; i < x->results_size(); ++i) {
    PrintResult(x->results(i), f, x->execution_count(), i);
  }
  std::cout << std::flush;
  if (x->context_restarted()) std::cerr << "sandboxctl: the context had died: started afresh\n";
  if (x->context_died()) {
    std::cerr << "sandboxctl: the context died" << (x->oom_killed() ? " (memory limit)" : "")
              << "\n";
    return 1;
  }
  if (x->timed_out()) {
    std::cerr << "sandboxctl: timed out (interrupted; the context's state is kept)\n";
    return 124;
  }
  if (x->has_error()) {
    for (const std::string& line : x->error().traceback()) std::cerr << line << "\n";
    return 1;
  }
  return 0;
}

struct AdminFlags {
  std::string token, tenant, provider, state;
  std::map<std::string, std::string> labels;
  bool json = false;
  bool close_sessions = false;
};

int AdminMain(const std::shared_ptr<grpc::Channel>& channel, const AdminFlags& f,
              const std::vector<std::string>& args) {
  if (args.size() < 2)
    return Usage("admin needs a command: sessions, close, disable, enable, usage, reload");
  auto admin = sandbox::RemoteAdmin::Connect(channel, f.token);
  const std::string& sub = args[1];
  if (sub == "sessions") {
    if (args.size() != 2) return Usage("admin sessions takes no arguments (use filters)");
    sandbox::pb::ListAllSessionsRequest req;
    req.set_tenant(f.tenant);
    req.set_provider(f.provider);
    if (f.state == "creating")
      req.set_state(sandbox::pb::SESSION_STATE_CREATING);
    else if (f.state == "ready")
      req.set_state(sandbox::pb::SESSION_STATE_READY);
    else if (f.state == "closing")
      req.set_state(sandbox::pb::SESSION_STATE_CLOSING);
    else if (!f.state.empty())
      return Usage("--state must be creating, ready or closing");
    req.mutable_labels()->insert(f.labels.begin(), f.labels.end());
    auto r = admin->ListAllSessions(req);
    if (!r.ok()) return RpcError(r.status());
    if (f.json) {
      std::cout << "[";
      for (size_t i = 0; i < r->size(); ++i) std::cout << (i ? "," : "") << Json((*r)[i]);
      std::cout << "]\n";
      return 0;
    }
    std::vector<std::vector<std::string>> rows{
        {"TENANT", "SESSION", "PROVIDER", "STATE", "SANDBOX", "CREATED", "LAST_ACTIVE", "LABELS"}};
    for (const auto& i : *r) {
      std::string labels;
      for (const auto& [k, v] : i.labels()) labels += (labels.empty() ? "" : ",") + k + "=" + v;
      std::string state = sandbox::pb::SessionState_Name(i.state());
      state = state.substr(std::string("SESSION_STATE_").size());
      for (auto& c : state) c = static_cast<char>(tolower(c));
      rows.push_back({i.tenant(), i.session_id(), i.provider(), state, i.sandbox_id(),
                      TextOf(i.created_at()), TextOf(i.last_active_at()),
                      labels.empty() ? "-" : labels});
    }
    PrintTable(rows);
    return 0;
  }
  if (sub == "close") {
    if (args.size() > 3) return Usage("admin close takes at most a session ID");
    sandbox::pb::CloseSessionsRequest req;
    req.set_tenant(f.tenant);
    if (args.size() == 3) req.set_session_id(args[2]);
    req.mutable_labels()->insert(f.labels.begin(), f.labels.end());
    auto r = admin->CloseSessions(req);
    if (!r.ok()) return RpcError(r.status());
    if (f.json) {
      std::cout << "{\"closed\":" << *r << "}\n";
    } else {
      std::cout << "closed " << *r << " session" << (*r == 1 ? "" : "s") << "\n";
    }
    return 0;
  }
  if (sub == "disable" || sub == "enable") {
    if (args.size() != 3) return Usage("admin " + sub + " takes a TENANT");
    const bool disable = sub == "disable";
    auto r = admin->SetTenantDisabled(args[2], disable, disable && f.close_sessions);
    if (!r.ok()) return RpcError(r.status());
    if (f.json) {
      std::cout << "{\"tenant\":\"" << args[2] << "\",\"disabled\":" << (disable ? "true" : "false")
                << ",\"sessions_closed\":" << *r << "}\n";
    } else {
      std::cout << "tenant " << args[2] << " " << (disable ? "disabled" : "enabled");
      if (disable && f.close_sessions) std::cout << "; closed " << *r << " sessions";
      std::cout << "\n";
    }
    return 0;
  }
  if (sub == "usage") {
    if (args.size() != 2) return Usage("admin usage takes no arguments (use --tenant)");
    auto r = admin->GetUsage(f.tenant);
    if (!r.ok()) return RpcError(r.status());
    if (f.json) {
      std::cout << Json(*r) << "\n";
      return 0;
    }
    auto table = [](const google::protobuf::RepeatedPtrField<sandbox::pb::TenantUsage>& list) {
      std::vector<std::vector<std::string>> rows{{"TENANT", "PROVIDER", "SESSIONS", "RUNS", "RUN_S",
                                                  "SANDBOX_S", "CPU_S", "OUTPUT_B", "FILE_B", "OOM",
                                                  "REFUSED", "EGRESS_B"}};
      for (const auto& u : list) {
        rows.push_back({u.tenant(), u.provider(), std::to_string(u.sessions_created()),
                        std::to_string(u.runs()), Num(u.run_seconds()), Num(u.sandbox_seconds()),
                        Num(u.cpu_seconds()), std::to_string(u.output_bytes()),
                        std::to_string(u.file_transfer_bytes()), std::to_string(u.oom_kills()),
                        std::to_string(u.quota_refusals()), std::to_string(u.egress_bytes())});
      }
      PrintTable(rows);
    };
    table(r->usage());
    if (r->has_store_created()) {
      std::cout << "\nsince the store was created (" << TextOf(r->store_created()) << "):\n";
      table(r->since_store());
    }
    return 0;
  }
  if (sub == "reload") {
    if (args.size() != 2) return Usage("admin reload takes no arguments");
    auto r = admin->ReloadConfig();
    if (!r.ok()) return RpcError(r.status());
    if (f.json) {
      std::cout << Json(*r) << "\n";
      return 0;
    }
    std::cout << "reloaded: generation " << r->generation() << "\n";
    for (const auto& k : r->needs_restart())
      std::cout << "needs a restart (ignored): " << k << "\n";
    return 0;
  }
  return Usage("unknown admin command " + sub);
}

// MCP over stdio: one JSON-RPC message per line on stdin/stdout; logs and
// errors go to stderr only.
int ServeMcp(const std::string& addr, const std::string& token,
             const sandbox::RemoteSandbox::Tls& tls) {
  sandbox::McpGrpcBackend backend(
      sandbox::pb::SandboxBroker::NewStub(sandbox::RemoteSandbox::MakeChannel(addr, tls)), token);
  sandbox::McpServer server(&backend, sandbox::Clock::Real(), {});
  sandbox::McpStdio stdio(&server, "", [](const std::string& line) {
    fwrite(line.data(), 1, line.size(), stdout);
    fputc('\n', stdout);
    fflush(stdout);
  });
  std::string line;
  while (std::getline(std::cin, line)) stdio.HandleLine(line);
  stdio.Finish();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string addr = EnvOr("SANDBOX_BROKER_ADDR", "127.0.0.1:50051");
  std::string token = EnvOr("SANDBOX_BROKER_TOKEN", "");
  std::string session = EnvOr("SANDBOX_SESSION", "cli");
  std::string provider;
  Language lang = sandbox::pb::LANGUAGE_UNSPECIFIED;
  int timeout = 0;
  std::map<std::string, std::string> env;
  std::vector<std::string> args;
  bool stream = false;
  std::string dialect;
  sandbox::RemoteSandbox::Tls tls;
  std::string tls_ca, tls_cert, tls_key;
  AdminFlags admin;
  FileFlags files;
  CodeFlags code_flags;
  admin.token = EnvOr("SANDBOX_BROKER_ADMIN_TOKEN", "");

  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&](std::string* out) {
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    std::string v;
    if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    } else if (a == "--version") {
      std::cout << "sandboxctl " << SANDBOX_BROKER_VERSION << "\n";
      return 0;
    } else if (a == "--addr") {
      if (!next(&addr)) return Usage("--addr needs a value");
    } else if (a == "--token") {
      if (!next(&token)) return Usage("--token needs a value");
    } else if (a == "--session") {
      if (!next(&session)) return Usage("--session needs a value");
    } else if (a == "--provider") {
      if (!next(&provider)) return Usage("--provider needs a value");
    } else if (a == "--lang") {
      if (!next(&v)) return Usage("--lang needs a value");
      if (v == "python")
        lang = sandbox::pb::LANGUAGE_PYTHON;
      else if (v == "node")
        lang = sandbox::pb::LANGUAGE_NODE;
      else if (v == "shell")
        lang = sandbox::pb::LANGUAGE_SHELL;
      else
        return Usage("--lang must be python, node or shell");
    } else if (a == "--timeout") {
      if (!next(&v) || !absl::SimpleAtoi(v, &timeout) || timeout < 0)
        return Usage("--timeout needs a number of seconds");
    } else if (a == "--env") {
      if (!next(&v) || v.find('=') == std::string::npos || v.front() == '=')
        return Usage("--env needs K=V");
      env[v.substr(0, v.find('='))] = v.substr(v.find('=') + 1);
    } else if (a == "--tls") {
      tls.enabled = true;
    } else if (a == "--tls-ca") {
      if (!next(&tls_ca)) return Usage("--tls-ca needs a file");
      tls.enabled = true;
    } else if (a == "--tls-cert") {
      if (!next(&tls_cert)) return Usage("--tls-cert needs a file");
      tls.enabled = true;
    } else if (a == "--tls-key") {
      if (!next(&tls_key)) return Usage("--tls-key needs a file");
    } else if (a == "--admin-token") {
      if (!next(&admin.token)) return Usage("--admin-token needs a value");
    } else if (a == "--json") {
      admin.json = files.json = true;
    } else if (a == "--context") {
      if (!next(&code_flags.context)) return Usage("--context needs an ID");
    } else if (a == "--save-images") {
      if (!next(&code_flags.save_images)) return Usage("--save-images needs a directory");
    } else if (a == "--depth") {
      if (!next(&v) || !absl::SimpleAtoi(v, &files.depth)) return Usage("--depth needs a number");
    } else if (a == "-p" || a == "--parents") {
      files.parents = true;
    } else if (a == "-r" || a == "--recursive") {
      files.recursive = true;
    } else if (a == "-f" || a == "--overwrite") {
      files.overwrite = true;
    } else if (a == "--tenant") {
      if (!next(&admin.tenant)) return Usage("--tenant needs a value");
    } else if (a == "--state") {
      if (!next(&admin.state)) return Usage("--state needs a value");
    } else if (a == "--label") {
      if (!next(&v) || v.find('=') == std::string::npos || v.front() == '=')
        return Usage("--label needs K=V");
      admin.labels[v.substr(0, v.find('='))] = v.substr(v.find('=') + 1);
    } else if (a == "--close-sessions") {
      admin.close_sessions = true;
    } else if (a == "--stream") {
      stream = true;
    } else if (a == "--dialect") {
      if (!next(&dialect)) return Usage("--dialect needs a value");
    } else if (a.size() > 1 && a[0] == '-' && a != "-") {
      return Usage("unknown flag " + a);
    } else {
      args.push_back(a);
    }
  }
  if (args.empty()) return Usage("missing command");
  const std::string cmd = args[0];
  auto arg = [&](size_t k) -> std::string {
    if (args[k] == "-") return ReadStdin();
    return args[k];
  };

  auto slurp = [](const std::string& path, std::string* out) {
    if (path.empty()) return true;
    std::ifstream in(path, std::ios::binary);
    if (!in) return false;
    std::stringstream ss;
    ss << in.rdbuf();
    *out = ss.str();
    return true;
  };
  if (!slurp(tls_ca, &tls.root_certs_pem) || !slurp(tls_cert, &tls.client_cert_pem) ||
      !slurp(tls_key, &tls.client_key_pem)) {
    std::cerr << "sandboxctl: cannot read a --tls-* file\n";
    return kExitIo;
  }
  if (cmd == "health") {
    if (args.size() > 2) return Usage("health takes at most a SERVICE");
    auto r = sandbox::RemoteSandbox::Health(sandbox::RemoteSandbox::MakeChannel(addr, tls),
                                            args.size() == 2 ? args[1] : "");
    if (!r.ok()) return RpcError(r.status());
    std::cout << *r << "\n";
    return *r == "SERVING" ? 0 : 1;
  }
  if (cmd == "admin") {
    admin.provider = provider;
    return AdminMain(sandbox::RemoteSandbox::MakeChannel(addr, tls), admin, args);
  }
  if (cmd == "mcp") {
    if (args.size() != 1) return Usage("mcp takes no arguments");
    return ServeMcp(addr, token, tls);
  }
  sandbox::pb::SessionSpec spec;
  spec.set_provider(provider);
  auto sb = sandbox::RemoteSandbox::Connect(addr, token, session, spec, tls);

  if (cmd == "run" || cmd == "shell") {
    if (args.size() != 2) return Usage(cmd + " takes one argument (or - for stdin)");
    absl::StatusOr<sandbox::pb::RunResult> r;
    if (cmd == "run") {
      sandbox::RemoteRunOptions o;
      o.language = lang;
      o.timeout_seconds = timeout;
      o.env = env;
      if (stream) {
        r = sb->RunStream(arg(1), o, [](sandbox::pb::OutputStream s, const std::string& data) {
          FILE* f = s == sandbox::pb::OUTPUT_STREAM_STDERR ? stderr : stdout;
          fwrite(data.data(), 1, data.size(), f);
          fflush(f);
        });
      } else {
        r = sb->Run(arg(1), o);
      }
    } else {
      r = sb->Shell(arg(1), timeout, env);
    }
    if (!r.ok()) return RpcError(r.status());
    std::cout << r->output() << std::flush;  // empty when streamed
    if (r->truncated()) std::cerr << "sandboxctl: output truncated\n";
    if (r->timed_out()) std::cerr << "sandboxctl: timed out\n";
    return r->exit_code() & 0xff;
  }
  if (cmd == "write") {
    if (args.size() != 3) return Usage("write takes PATH and DATA (or - for stdin)");
    std::string data = arg(2);
    absl::Status s = sb->WriteFile(args[1], absl::Base64Escape(data), sandbox::pb::ENCODING_BASE64);
    if (!s.ok()) return RpcError(s);
    return 0;
  }
  if (cmd == "read") {
    if (args.size() != 2) return Usage("read takes PATH");
    auto r = sb->ReadFile(args[1], sandbox::pb::ENCODING_BASE64);
    if (!r.ok()) return RpcError(r.status());
    if (!r->has_value()) {
      std::cerr << "sandboxctl: " << args[1] << ": file not found\n";
      return kExitNotFound;
    }
    std::string bytes;
    if (!absl::Base64Unescape(**r, &bytes)) {
      std::cerr << "sandboxctl: broker sent invalid base64\n";
      return kExitIo;
    }
    if (fwrite(bytes.data(), 1, bytes.size(), stdout) != bytes.size()) return kExitIo;
    return 0;
  }
  if (int rc = FilesMain(*sb, args, files); rc >= 0) return rc;
  if (cmd == "code") {
    if (args.size() != 2) return Usage("code takes one argument (or - for stdin)");
    return CodeMain(*sb, arg(1), timeout, code_flags);
  }
  if (cmd == "contexts") {
    if (args.size() != 1) return Usage("contexts takes no arguments");
    auto r = sb->ListContexts();
    if (!r.ok()) return RpcError(r.status());
    for (const auto& c : *r) std::cout << c.context_id() << "\t" << c.cwd() << "\n";
    return 0;
  }
  if (cmd == "close") {
    auto r = sb->Close();
    if (!r.ok()) return RpcError(r.status());
    std::cout << (*r ? "closed\n" : "no such session\n");
    return 0;
  }
  if (cmd == "sessions") {
    auto r = sb->ListSessions();
    if (!r.ok()) return RpcError(r.status());
    for (const auto& i : *r) PrintInfo(i);
    return 0;
  }
  if (cmd == "info") {
    auto r = sb->Info();
    if (!r.ok()) return RpcError(r.status());
    PrintInfo(*r);
    return 0;
  }
  if (cmd == "keepalive") {
    auto r = sb->KeepAlive();
    if (!r.ok()) return RpcError(r.status());
    std::cout << "idle_expires="
              << absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixSeconds(*r),
                                  absl::UTCTimeZone())
              << "\n";
    return 0;
  }
  if (cmd == "tools") {
    auto r = sb->ListTools(provider, dialect);
    if (!r.ok()) return RpcError(r.status());
    for (const auto& t : *r) std::cout << t.definition_json() << "\n";
    return 0;
  }
  if (cmd == "call-tool") {
    if (args.size() != 3) return Usage("call-tool takes NAME and JSON arguments (or -)");
    auto r = sb->CallTool(args[1], arg(2));
    if (!r.ok()) return RpcError(r.status());
    std::cout << r->content() << "\n";
    return r->is_error() ? 1 : 0;
  }
  return Usage("unknown command " + cmd);
}
