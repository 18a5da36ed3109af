// fake_load: N concurrent process starts against a fake provider server,
// with no broker in between, to check the fakes take heavy concurrency.
//
//   fake_load e2b     [--url URL] [--calls 500] [--sandboxes 10] [--command 'sleep 3']
//   fake_load daytona [--url URL] [--calls 500] [--sandboxes 10] [--command 'sleep 3']
//
// Without --url the fake runs in this process; with it, a running fake-e2b
// or fake-daytona (default API keys unless --api-key). The tool creates
// --sandboxes sandboxes (not timed), opens one connection per call, then
// releases all calls at once and times each from the release to its last
// byte. Calls spread round-robin over the sandboxes (a sandbox has its own
// uid and process limit, 256 by default).
//
// E2B: POST /process.Process/Start on envd, the Connect server stream the
// adapter (adapters/e2b/e2b_provider.cc) sends: /bin/bash -l -c COMMAND.
// Daytona: POST /toolbox/ID/process/execute, as adapters/daytona does.
// A call counts as an error unless it ends with exit code 0.
//
// Prints errors, p50, p99, max and the batch's wall time; exit status 1 on
// any error.

#include <httplib.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "adapters/daytona/daytona_wire.h"
#include "adapters/e2b/e2b_wire.h"
#include "common/log.h"
#include "nlohmann/json.hpp"
#include "tests/fakes/fake_daytona.h"
#include "tests/fakes/fake_e2b.h"

namespace sandbox {
namespace {

using nlohmann::json;

struct Flags {
  std::string kind;  // e2b | daytona
  std::string url;   // http://127.0.0.1:PORT; empty = in-process fake
  std::string api_key;
  int calls = 500;
  int sandboxes = 10;
  std::string command = "sleep 3";
};

struct Target {
  std::string host = "127.0.0.1";
  int port = 0;
};

Target ParseUrl(const std::string& url) {
  Target t;
  std::string rest = url;
  if (absl::StartsWith(rest, "http://")) rest = rest.substr(7);
  const size_t colon = rest.rfind(':');
  if (colon != std::string::npos) {
    t.host = rest.substr(0, colon);
    t.port = atoi(rest.c_str() + colon + 1);
  }
  return t;
}

std::unique_ptr<httplib::Client> NewClient(const Target& t) {
  auto c = std::make_unique<httplib::Client>(t.host, t.port);
  c->set_connection_timeout(std::chrono::seconds(120));
  c->set_read_timeout(std::chrono::seconds(300));
  c->set_write_timeout(std::chrono::seconds(120));
  c->set_keep_alive(false);
  return c;
}

// One sandbox as the calls address it.
struct Box {
  std::string id;
  std::string token;  // E2B envd access token
};

// ---- E2B -------------------------------------------------------------------

std::vector<Box> CreateE2B(const Target& t, const Flags& f, std::string* err) {
  std::vector<Box> boxes;
  auto c = NewClient(t);
  for (int i = 0; i < f.sandboxes; ++i) {
    auto r = c->Post("/v2/sandboxes", {{"X-API-KEY", f.api_key}},
                     e2b::CreateSandboxBody("base", 600, {}, {}), "application/json");
    if (!r || r->status / 100 != 2) {
      *err = r ? absl::StrCat("create: HTTP ", r->status, " ", r->body)
               : absl::StrCat("create: ", httplib::to_string(r.error()));
      return boxes;
    }
    auto info = e2b::ParseSandbox(r->body);
    if (!info.ok()) {
      *err = std::string(info.status().message());
      return boxes;
    }
    boxes.push_back({info->sandbox_id, info->envd_access_token});
  }
  return boxes;
}

void DeleteE2B(const Target& t, const Flags& f, const std::vector<Box>& boxes) {
  auto c = NewClient(t);
  for (const Box& b : boxes)
    (void)c->Delete(absl::StrCat("/sandboxes/", b.id), {{"X-API-KEY", f.api_key}});
}

// "" on success, else what went wrong.
std::string CallE2B(httplib::Client& c, const Box& b, const Flags& f) {
  httplib::Headers h = {
      {"E2b-Sandbox-Id", b.id},         {"E2b-Sandbox-Port", absl::StrCat(e2b::kEnvdPort)},
      {"X-Access-Token", b.token},      {"Connect-Protocol-Version", "1"},
      {"Connect-Timeout-Ms", "120000"}, {"Keepalive-Ping-Interval", "50"}};
  const std::string body =
      e2b::EncodeEnvelope(0, e2b::StartRequestJson("/bin/bash", {"-l", "-c", f.command}, {}, ""));
  auto r = c.Post("/process.Process/Start", h, body, "application/connect+json");
  if (!r) return absl::StrCat("transport: ", httplib::to_string(r.error()));
  if (r->status != 200) return absl::StrCat("HTTP ", r->status, ": ", r->body.substr(0, 200));
  e2b::EnvelopeReader reader;
  reader.Feed(r->body);
  bool ended = false, end_stream = false;
  int exit_code = -1;
  while (true) {
    auto e = reader.Next();
    if (!e.ok()) return std::string(e.status().message());
    if (!e->has_value()) break;
    if ((*e)->flags & e2b::kFlagEndStream) {
      end_stream = true;
      absl::Status s = e2b::ParseEndStream((*e)->payload);
      if (!s.ok()) return absl::StrCat("end-stream: ", s.message());
      continue;
    }
    auto ev = e2b::ParseProcessEvent((*e)->payload);
    if (!ev.ok()) return std::string(ev.status().message());
    if (ev->kind == e2b::ProcessEvent::kEnd) {
      ended = true;
      exit_code = ev->exited ? ev->exit_code : -1;
    }
  }
  if (!ended || !end_stream) return "stream ended without end event / end-stream";
  if (exit_code != 0) return absl::StrCat("exit code ", exit_code);
  return "";
}

// ---- Daytona ---------------------------------------------------------------

std::vector<Box> CreateDaytona(const Target& t, const Flags& f, std::string* err) {
  std::vector<Box> boxes;
  auto c = NewClient(t);
  const httplib::Headers h = {{"Authorization", absl::StrCat("Bearer ", f.api_key)}};
  for (int i = 0; i < f.sandboxes; ++i) {
    auto r = c->Post("/api/sandbox", h, "{}", "application/json");
    if (!r || r->status / 100 != 2) {
      *err = r ? absl::StrCat("create: HTTP ", r->status, " ", r->body)
               : absl::StrCat("create: ", httplib::to_string(r.error()));
      return boxes;
    }
    json j = json::parse(r->body, nullptr, false);
    if (!j.is_object() || !j.contains("id") || !j["id"].is_string()) {
      *err = absl::StrCat("create: bad body ", r->body);
      return boxes;
    }
    boxes.push_back({j["id"].get<std::string>(), ""});
  }
  return boxes;
}

void DeleteDaytona(const Target& t, const Flags& f, const std::vector<Box>& boxes) {
  auto c = NewClient(t);
  const httplib::Headers h = {{"Authorization", absl::StrCat("Bearer ", f.api_key)}};
  for (const Box& b : boxes) (void)c->Delete(absl::StrCat("/api/sandbox/", b.id), h);
}

std::string CallDaytona(httplib::Client& c, const Box& b, const Flags& f) {
  const httplib::Headers h = {{"Authorization", absl::StrCat("Bearer ", f.api_key)}};
  auto r = c.Post(absl::StrCat("/toolbox/", b.id, "/process/execute"), h,
                  daytona::ExecuteBody(f.command, "", {}, 120), "application/json");
  if (!r) return absl::StrCat("transport: ", httplib::to_string(r.error()));
  if (r->status != 200) return absl::StrCat("HTTP ", r->status, ": ", r->body.substr(0, 200));
  json j = json::parse(r->body, nullptr, false);
  if (!j.is_object() || !j.contains("exitCode") || !j["exitCode"].is_number_integer()) {
    return absl::StrCat("bad body: ", r->body.substr(0, 200));
  }
  if (j["exitCode"].get<int>() != 0) return absl::StrCat("exit code ", j["exitCode"].get<int>());
  return "";
}

// ---- the batch -------------------------------------------------------------

double Pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

int Run(const Flags& f) {
  std::unique_ptr<FakeE2B> e2b_fake;
  std::unique_ptr<FakeDaytona> daytona_fake;
  std::string url = f.url;
  if (url.empty()) {
    if (f.kind == "e2b") {
      FakeE2B::Options o;
      o.uid_base = 710000;
      auto s = FakeE2B::Start(o);
      if (!s.ok())
        return fprintf(stderr, "fake-e2b: %s\n", std::string(s.status().message()).c_str()), 2;
      e2b_fake = std::move(*s);
      url = e2b_fake->url();
    } else {
      FakeDaytona::Options o;
      o.uid_base = 720000;
      auto s = FakeDaytona::Start(o);
      if (!s.ok())
        return fprintf(stderr, "fake-daytona: %s\n", std::string(s.status().message()).c_str()), 2;
      daytona_fake = std::move(*s);
      url = absl::StrCat("http://127.0.0.1:", daytona_fake->port());
    }
  }
  const Target t = ParseUrl(url);
  const bool is_e2b = f.kind == "e2b";
  std::string err;
  std::vector<Box> boxes = is_e2b ? CreateE2B(t, f, &err) : CreateDaytona(t, f, &err);
  if (!err.empty() || boxes.empty()) {
    fprintf(stderr, "fake_load: %s\n", err.c_str());
    return 2;
  }

  // Every call on its own thread and connection, all released at once.
  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  int ready = 0;
  absl::Time start;
  std::vector<double> seconds(static_cast<size_t>(f.calls), -1);
  std::vector<std::string> errors(static_cast<size_t>(f.calls));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(f.calls));
  for (int i = 0; i < f.calls; ++i) {
    threads.emplace_back([&, i] {
      auto c = NewClient(t);
      const Box& b = boxes[static_cast<size_t>(i) % boxes.size()];
      {
        std::unique_lock<std::mutex> l(mu);
        ++ready;
        cv.notify_all();
        cv.wait(l, [&] { return go; });
      }
      std::string e = is_e2b ? CallE2B(*c, b, f) : CallDaytona(*c, b, f);
      const absl::Time done = absl::Now();
      std::lock_guard<std::mutex> l(mu);
      seconds[static_cast<size_t>(i)] = absl::ToDoubleSeconds(done - start);
      errors[static_cast<size_t>(i)] = std::move(e);
    });
  }
  {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return ready == f.calls; });
    start = absl::Now();
    go = true;
    cv.notify_all();
  }
  for (auto& th : threads) th.join();
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);

  std::vector<double> ok;
  std::map<std::string, int> kinds;
  for (int i = 0; i < f.calls; ++i) {
    if (errors[static_cast<size_t>(i)].empty()) {
      ok.push_back(seconds[static_cast<size_t>(i)]);
    } else {
      ++kinds[errors[static_cast<size_t>(i)].substr(0, 120)];
    }
  }
  std::vector<double> all(seconds.begin(), seconds.end());
  printf(
      "fake-%s: %d concurrent '%s' over %zu sandboxes: errors %d, p50 %.2f s, p99 %.2f s, "
      "max %.2f s (all calls, errors included), wall %.2f s\n",
      f.kind.c_str(), f.calls, f.command.c_str(), boxes.size(),
      f.calls - static_cast<int>(ok.size()), Pct(all, 0.5), Pct(all, 0.99), Pct(all, 1.0), wall);
  for (const auto& [what, n] : kinds) printf("  %4d x %s\n", n, what.c_str());
  if (is_e2b) {
    DeleteE2B(t, f, boxes);
  } else {
    DeleteDaytona(t, f, boxes);
  }
  return ok.size() == static_cast<size_t>(f.calls) ? 0 : 1;
}

}  // namespace
}  // namespace sandbox

int main(int argc, char** argv) {
  sandbox::Flags f;
  if (argc < 2 || (std::string(argv[1]) != "e2b" && std::string(argv[1]) != "daytona")) {
    fprintf(stderr,
            "usage: %s e2b|daytona [--url URL] [--api-key K] [--calls N] [--sandboxes N] "
            "[--command CMD]\n",
            argv[0]);
    return 2;
  }
  f.kind = argv[1];
  f.api_key = f.kind == "e2b" ? "e2b_test_key" : "dtn_test_key";
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--url") {
      f.url = argv[i + 1];
    } else if (a == "--api-key") {
      f.api_key = argv[i + 1];
    } else if (a == "--calls") {
      f.calls = atoi(argv[i + 1]);
    } else if (a == "--sandboxes") {
      f.sandboxes = atoi(argv[i + 1]);
    } else if (a == "--command") {
      f.command = argv[i + 1];
    } else {
      fprintf(stderr, "fake_load: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (f.calls < 1 || f.sandboxes < 1) return 2;
  signal(SIGPIPE, SIG_IGN);
  sandbox::SetLogLevel(sandbox::LogLevel::kWarning);
  return sandbox::Run(f);
}
