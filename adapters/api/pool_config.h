#pragma once

// The warm-pool settings of a remote provider (providers.<name>.pool); see
// server/sessions/warm_pool.h.

#include <cstdint>
#include <string>

#include "common/config_reader.h"

namespace sandbox {

struct PoolConfig {
  int64_t size = 0;           // ready members kept; 0 = no pool
  std::string template_name;  // empty = the provider's default template
  int64_t max_age_seconds = 3600;
  // Pool creates in flight at once (session creates are not counted):
  // providers.<name>.max_concurrent_creates when set, else 4.
  int64_t max_concurrent_creates = 4;
};

// Reads "pool" ({size, template, max_age_seconds}) from a provider's
// section `r`. Errors in `pool` are returned (INVALID_ARGUMENT naming the
// key). max_concurrent_creates is the broker's key, read once in
// server/config/config.cc and taken out before a provider reads its section; the
// server sets it here when the operator did (provider_setup.cc).
inline absl::Status ReadPoolConfig(ConfigReader& r, PoolConfig* c) {
  ConfigReader p(r.Object("pool"), r.KeyPath("pool"));
  c->size = p.Int("size", 0, 0, 1000);
  c->template_name = p.String("template", "");
  c->max_age_seconds = p.Int("max_age_seconds", c->max_age_seconds, 10, 7 * 86400);
  return p.Finish();
}

}  // namespace sandbox
