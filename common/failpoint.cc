#include "common/failpoint.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/log.h"

namespace sandbox {
namespace {

struct Action {
  enum Kind { kSleep, kKill } kind = kSleep;
  int64_t ms = 0;
};

absl::Mutex mu;
std::map<std::string, Action, std::less<>>* armed ABSL_GUARDED_BY(mu) = nullptr;
bool loaded ABSL_GUARDED_BY(mu) = false;

absl::StatusOr<std::map<std::string, Action, std::less<>>> Parse(absl::string_view spec) {
  std::map<std::string, Action, std::less<>> out;
  for (absl::string_view entry : absl::StrSplit(spec, ';', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(entry, '=');
    absl::string_view name = absl::StripAsciiWhitespace(kv.first);
    absl::string_view act = absl::StripAsciiWhitespace(kv.second);
    if (name.empty() || name.size() > 64) {
      return absl::InvalidArgumentError(
          absl::StrCat("SANDBOX_BROKER_FAILPOINTS: entry \"", entry, "\" has no point name"));
    }
    Action a;
    int64_t ms = 0;
    if (act == "kill") {
      a.kind = Action::kKill;
    } else if (absl::ConsumePrefix(&act, "sleep(") && absl::ConsumeSuffix(&act, ")") &&
               absl::SimpleAtoi(act, &ms) && ms >= 0 && ms <= 600000) {
      a.ms = ms;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("SANDBOX_BROKER_FAILPOINTS: entry \"", entry,
                       "\": the action must be sleep(MS) with MS in 0..600000, or kill"));
    }
    out[std::string(name)] = a;
  }
  return out;
}

absl::Status ArmLocked(absl::string_view spec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  auto parsed = Parse(spec);
  if (!parsed.ok()) return parsed.status();
  delete armed;
  armed = parsed->empty() ? nullptr : new std::map<std::string, Action, std::less<>>(*parsed);
  loaded = true;
  return absl::OkStatus();
}

void LoadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  if (loaded) return;
  const char* env = std::getenv("SANDBOX_BROKER_FAILPOINTS");
  if (!ArmLocked(env == nullptr ? "" : env).ok()) loaded = true;  // main reports it
}

}  // namespace

void Failpoint(absl::string_view name) {
  Action a;
  {
    absl::MutexLock l(&mu);
    LoadLocked();
    if (armed == nullptr) return;
    auto it = armed->find(name);
    if (it == armed->end()) return;
    a = it->second;
  }
  Log(LogLevel::kWarning, "failpoint.hit",
      {{"name", name},
       {"action", a.kind == Action::kKill ? "kill" : absl::StrCat("sleep(", a.ms, ")")}});
  if (a.kind == Action::kKill) {
    FlushLogs();
    ::kill(::getpid(), SIGKILL);
  }
  absl::SleepFor(absl::Milliseconds(a.ms));
}

absl::StatusOr<std::string> FailpointsFromEnvironment() {
  const char* env = std::getenv("SANDBOX_BROKER_FAILPOINTS");
  absl::MutexLock l(&mu);
  if (absl::Status s = ArmLocked(env == nullptr ? "" : env); !s.ok()) return s;
  if (armed == nullptr) return std::string();
  std::vector<std::string> names;
  for (const auto& [n, a] : *armed) names.push_back(n);
  return absl::StrJoin(names, ",");
}

absl::Status SetFailpoints(absl::string_view spec) {
  absl::MutexLock l(&mu);
  return ArmLocked(spec);
}

}  // namespace sandbox
