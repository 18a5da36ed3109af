#include "common/config_reader.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace sandbox {
namespace {
std::set<std::string>* g_read_keys = nullptr;

const nlohmann::json& NullJson() {
  static const nlohmann::json* j = new nlohmann::json();
  return *j;
}
}  // namespace

ConfigReader::ConfigReader(const nlohmann::json& json, std::string path)
    : json_(json), path_(std::move(path)) {
  if (!json_.is_null() && !json_.is_object()) {
    status_ = absl::InvalidArgumentError(
        absl::StrCat(path_.empty() ? "config" : path_, ": must be a JSON object"));
  }
}

std::string ConfigReader::KeyPath(const std::string& key) const {
  return path_.empty() ? key : absl::StrCat(path_, ".", key);
}

void ConfigReader::Fail(const std::string& key, const std::string& problem) {
  if (status_.ok()) {
    status_ = absl::InvalidArgumentError(absl::StrCat(KeyPath(key), ": ", problem));
  }
}

void ConfigReader::RecordReadKeys(std::set<std::string>* into) { g_read_keys = into; }

bool ConfigReader::Has(const std::string& key) const {
  if (g_read_keys != nullptr) g_read_keys->insert(KeyPath(key));
  return json_.is_object() && json_.contains(key);
}

const nlohmann::json* ConfigReader::Get(const std::string& key) {
  seen_.insert(key);
  if (g_read_keys != nullptr) g_read_keys->insert(KeyPath(key));
  if (!status_.ok() || !json_.is_object()) return nullptr;
  auto it = json_.find(key);
  if (it == json_.end() || it->is_null()) return nullptr;
  return &*it;
}

int64_t ConfigReader::Int(const std::string& key, int64_t def, int64_t min, int64_t max) {
  const nlohmann::json* v = Get(key);
  if (v == nullptr) return def;
  if (!v->is_number_integer()) {
    Fail(key, "must be an integer");
    return def;
  }
  // Unsigned values above INT64_MAX are out of range too.
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    Fail(key, absl::StrCat("must be at most ", max));
    return def;
  }
  int64_t n = v->get<int64_t>();
  if (n < min || n > max) {
    Fail(key, max == INT64_MAX ? absl::StrCat("must be at least ", min)
                               : absl::StrCat("must be between ", min, " and ", max));
    return def;
  }
  return n;
}

double ConfigReader::Number(const std::string& key, double def, double min, double max) {
  const nlohmann::json* v = Get(key);
  if (v == nullptr) return def;
  if (!v->is_number()) {
    Fail(key, "must be a number");
    return def;
  }
  double n = v->get<double>();
  if (!(n >= min && n <= max)) {
    Fail(key, absl::StrCat("must be between ", min, " and ", max));
    return def;
  }
  return n;
}

std::string ConfigReader::String(const std::string& key, const std::string& def, bool allow_empty) {
  const nlohmann::json* v = Get(key);
  if (v == nullptr) return def;
  if (!v->is_string()) {
    Fail(key, "must be a string");
    return def;
  }
  std::string s = v->get<std::string>();
  if (!allow_empty && s.empty()) {
    Fail(key, "must not be empty");
    return def;
  }
  return s;
}

bool ConfigReader::Bool(const std::string& key, bool def) {
  const nlohmann::json* v = Get(key);
  if (v == nullptr) return def;
  if (!v->is_boolean()) {
    Fail(key, "must be true or false");
    return def;
  }
  return v->get<bool>();
}

std::string ConfigReader::Enum(const std::string& key, const std::string& def,
                               const std::vector<std::string>& choices) {
  std::string s = String(key, def);
  for (const auto& c : choices) {
    if (c == s) return s;
  }
  Fail(key, absl::StrCat("must be one of: ", absl::StrJoin(choices, ", ")));
  return def;
}

std::map<std::string, std::string> ConfigReader::StringMap(const std::string& key,
                                                           bool secret_keys) {
  std::map<std::string, std::string> out;
  const nlohmann::json* v = Get(key);
  if (v == nullptr) return out;
  if (!v->is_object()) {
    Fail(key, "must be an object of strings");
    return out;
  }
  int n = 0;
  for (auto it = v->begin(); it != v->end(); ++it) {
    ++n;
    if (!it.value().is_string()) {
      // A token as key is named by its place, never shown.
      Fail(key, secret_keys ? absl::StrCat("the value of entry ", n,
                                           " (in sorted key order; the key is a secret, not "
                                           "shown) must be a string")
                            : absl::StrCat("value of \"", it.key(), "\" must be a string"));
      return {};
    }
    out[it.key()] = it.value().get<std::string>();
  }
  return out;
}

std::vector<std::string> ConfigReader::StringList(const std::string& key) {
  std::vector<std::string> out;
  const nlohmann::json* v = Get(key);
  if (v == nullptr) return out;
  if (!v->is_array()) {
    Fail(key, "must be an array of strings");
    return out;
  }
  for (const auto& e : *v) {
    if (!e.is_string()) {
      Fail(key, "must be an array of strings");
      return {};
    }
    out.push_back(e.get<std::string>());
  }
  return out;
}

const nlohmann::json& ConfigReader::Object(const std::string& key) {
  const nlohmann::json* v = Get(key);
  if (v == nullptr) return NullJson();
  if (!v->is_object()) {
    Fail(key, "must be a JSON object");
    return NullJson();
  }
  return *v;
}

absl::Status ConfigReader::Finish() {
  if (!status_.ok()) return status_;
  if (!json_.is_object()) return absl::OkStatus();
  for (auto it = json_.begin(); it != json_.end(); ++it) {
    if (seen_.count(it.key()) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(KeyPath(it.key()), ": unknown key"));
    }
  }
  return absl::OkStatus();
}

}  // namespace sandbox
