#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace sandbox {

// Reads one JSON object of configuration strictly: typed getters with
// defaults and bounds, and Finish() rejects keys nobody asked for. Errors
// name the full key path ("providers.local.memory_bytes: ..."). The first
// error sticks; later getters return their defaults.
//
// Example:
//   ConfigReader r(json, "providers.local");
//   int64_t mem = r.Int("memory_bytes", 1 << 30, 1);
//   RETURN_IF_ERROR(r.Finish());
//
// Not thread-safe.
class ConfigReader {
 public:
  // `json` must outlive the reader. A null `json` reads as an empty object.
  ConfigReader(const nlohmann::json& json, std::string path);

  int64_t Int(const std::string& key, int64_t def, int64_t min = 0, int64_t max = INT64_MAX);
  // Any JSON number (integer or not) in [min, max].
  double Number(const std::string& key, double def, double min, double max);
  std::string String(const std::string& key, const std::string& def, bool allow_empty = true);
  bool Bool(const std::string& key, bool def);
  // One of `choices`.
  std::string Enum(const std::string& key, const std::string& def,
                   const std::vector<std::string>& choices);
  // secret_keys: the keys are secrets (tokens): an error names an entry by
  // its place, not its key.
  std::map<std::string, std::string> StringMap(const std::string& key, bool secret_keys = false);
  std::vector<std::string> StringList(const std::string& key);
  // The raw object at `key` (null when absent); its own keys are checked by
  // whoever reads it.
  const nlohmann::json& Object(const std::string& key);
  bool Has(const std::string& key) const;

  // The first error, or UNKNOWN-key errors; OK when everything was valid.
  absl::Status Finish();
  // The first error so far, without checking for unknown keys.
  const absl::Status& status() const { return status_; }

  // Tests: every key path any reader reads or asks about from now on is
  // added to `*into` (nullptr stops). docs/config.md is checked against it.
  // Not thread-safe: set it while no other thread reads configuration.
  static void RecordReadKeys(std::set<std::string>* into);
  const std::string& path() const { return path_; }
  std::string KeyPath(const std::string& key) const;
  void Fail(const std::string& key, const std::string& problem);

 private:
  const nlohmann::json* Get(const std::string& key);

  const nlohmann::json& json_;
  const std::string path_;
  std::set<std::string> seen_;
  absl::Status status_;
};

}  // namespace sandbox
