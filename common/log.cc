#include "common/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace sandbox {
namespace {

std::atomic<int> g_min_level{static_cast<int>(LogLevel::kInfo)};

struct LogState {
  absl::Mutex mu;
  std::string buffer ABSL_GUARDED_BY(mu);  // lines not yet written
  bool flusher ABSL_GUARDED_BY(mu) = false;
  bool json ABSL_GUARDED_BY(mu) = false;
  LogLevel min_level ABSL_GUARDED_BY(mu) = LogLevel::kInfo;
  std::function<void(absl::string_view)> sink ABSL_GUARDED_BY(mu);
};

LogState& State() {
  static LogState* s = new LogState();
  return *s;
}

void WriteLocked(LogState& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
  if (s.buffer.empty()) return;
  fwrite(s.buffer.data(), 1, s.buffer.size(), stderr);
  fflush(stderr);
  s.buffer.clear();
}

// "2026-12-01T11:33:10.683Z" for now; the seconds part is formatted once a
// second per thread.
std::string Timestamp() {
  thread_local int64_t cached_second = -1;
  thread_local std::string cached;
  const int64_t ms = absl::ToUnixMillis(absl::Now());
  const int64_t sec = ms / 1000;
  if (sec != cached_second) {
    cached_second = sec;
    cached = absl::FormatTime("%Y-%m-%dT%H:%M:%S", absl::FromUnixSeconds(sec), absl::UTCTimeZone());
  }
  char frac[8];
  snprintf(frac, sizeof(frac), ".%03dZ", static_cast<int>(ms % 1000));
  return cached + frac;
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
  bool json;
  {
    absl::MutexLock lock(&s.mu);
    json = s.json;
  }
  // The log's own timestamp is wall time by nature; it is not used for logic.
  const std::string ts = Timestamp();
  std::string line;
  if (json) {
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
  absl::MutexLock lock(&s.mu);
  if (level < s.min_level) return;
  if (s.sink) {
    s.sink(line);
    return;
  }
  line.push_back('\n');
  s.buffer.append(line);
  // Only the per-call line waits; lifecycle lines (and anything at warning
  // or above) are written at once, after what is buffered.
  if (event != "rpc" || level >= LogLevel::kWarning || s.buffer.size() >= 64 * 1024) {
    WriteLocked(s);
    return;
  }
  if (!s.flusher) {
    s.flusher = true;
    std::atexit([] { FlushLogs(); });
    std::thread([] {
      LogState& st = State();
      for (;;) {
        absl::SleepFor(absl::Milliseconds(100));
        absl::MutexLock l(&st.mu);
        WriteLocked(st);
      }
    }).detach();
  }
}

void FlushLogs() {
  LogState& s = State();
  absl::MutexLock lock(&s.mu);
  WriteLocked(s);
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
  WriteLocked(State());
  State().sink = std::move(sink);
}

}  // namespace sandbox
