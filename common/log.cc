#include "common/log.h"

#include <atomic>
#include <cstdio>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace sandbox {
namespace {

std::atomic<int> g_min_level{static_cast<int>(LogLevel::kInfo)};

struct LogState {
  absl::Mutex mu;
  bool json ABSL_GUARDED_BY(mu) = false;
  LogLevel min_level ABSL_GUARDED_BY(mu) = LogLevel::kInfo;
  std::function<void(absl::string_view)> sink ABSL_GUARDED_BY(mu);
};

LogState& State() {
  static LogState* s = new LogState();
  return *s;
}

const char* LevelName(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

bool NeedsQuotes(absl::string_view v) {
  if (v.empty()) return true;
  for (char c : v) {
    if (c == ' ' || c == '"' || c == '=' || c == '\\' || static_cast<unsigned char>(c) < 0x20)
      return true;
  }
  return false;
}

}  // namespace

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_min_level.load(); }

void Log(LogLevel level, absl::string_view event, std::initializer_list<LogField> fields) {
  if (!LogEnabled(level)) return;
  LogState& s = State();
  absl::MutexLock lock(&s.mu);
  if (level < s.min_level) return;
  // The log's own timestamp is wall time by nature; it is not used for logic.
  const std::string ts = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
  std::string line;
  if (s.json) {
    nlohmann::json j;
    j["ts"] = ts;
    j["level"] = LevelName(level);
    j["event"] = std::string(event);
    for (const auto& f : fields) j[f.key] = f.value;
    line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  } else {
    line = absl::StrCat(ts, " ", LevelName(level), " ", event);
    for (const auto& f : fields) {
      if (NeedsQuotes(f.value)) {
        nlohmann::json v = f.value;
        absl::StrAppend(&line, " ", f.key, "=",
                        v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      } else {
        absl::StrAppend(&line, " ", f.key, "=", f.value);
      }
    }
  }
  if (s.sink) {
    s.sink(line);
  } else {
    line.push_back('\n');
    fwrite(line.data(), 1, line.size(), stderr);
    fflush(stderr);
  }
}

void SetLogJson(bool json) {
  absl::MutexLock lock(&State().mu);
  State().json = json;
}

void SetLogLevel(LogLevel min_level) {
  absl::MutexLock lock(&State().mu);
  State().min_level = min_level;
  g_min_level = static_cast<int>(min_level);
}

void SetLogSink(std::function<void(absl::string_view)> sink) {
  absl::MutexLock lock(&State().mu);
  State().sink = std::move(sink);
}

}  // namespace sandbox
