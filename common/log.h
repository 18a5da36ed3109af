#pragma once

#include <functional>
#include <initializer_list>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace sandbox {

// Structured logging: an event name plus key/value fields, written as one
// line to stderr, either `key=value` text or a JSON object per line.
//
// Never pass code, commands, file contents, run output, env values, tokens
// or API keys as a field: the log is read by operators, not by tenants.
//
// Thread-safe.
enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

struct LogField {
  template <typename T>
  LogField(absl::string_view k, const T& v) : key(k), value(absl::StrCat(v)) {}
  LogField(absl::string_view k, absl::string_view v) : key(k), value(v) {}
  LogField(absl::string_view k, const std::string& v) : key(k), value(v) {}
  LogField(absl::string_view k, const char* v) : key(k), value(v) {}
  LogField(absl::string_view k, bool v) : key(k), value(v ? "true" : "false") {}
  std::string key;
  std::string value;
};

void Log(LogLevel level, absl::string_view event, std::initializer_list<LogField> fields = {});

// Whether a line at `level` would be written (skip building costly fields).
bool LogEnabled(LogLevel level);

// Configuration, normally set once in main.
void SetLogJson(bool json);
void SetLogLevel(LogLevel min_level);
// Replaces the output (default: stderr). For tests; nullptr restores stderr.
void SetLogSink(std::function<void(absl::string_view line)> sink);
// Writes the buffered lines now. The per-call `rpc` lines at info and debug
// are buffered (written within 100 ms, at 64 KiB, before any other line, and
// at exit) so they cost no write of their own; every other line is written
// at once.
void FlushLogs();

}  // namespace sandbox
