#pragma once

// The warm-pool settings of a remote provider (providers.<name>.pool and
// providers.<name>.max_concurrent_creates); see server/warm_pool.h.

#include <cstdint>
#include <string>

#include "common/config_reader.h"

namespace sandbox {

struct PoolConfig {
  int64_t size = 0;           // ready members kept; 0 = no pool
  std::string template_name;  // empty = the provider's default template
  int64_t max_age_seconds = 3600;
  // Pool creates in flight at once (session creates are not counted).
  int64_t max_concurrent_creates = 4;
};

// Reads "pool" ({size, template, max_age_seconds}) and
// "max_concurrent_creates" from a provider's section `r`. Errors in `pool`
// are returned (INVALID_ARGUMENT naming the key); the others stick in `r`.
inline absl::Status ReadPoolConfig(ConfigReader& r, PoolConfig* c) {
  c->max_concurrent_creates = r.Int("max_concurrent_creates", c->max_concurrent_creates, 1, 64);
  ConfigReader p(r.Object("pool"), r.KeyPath("pool"));
  c->size = p.Int("size", 0, 0, 1000);
  c->template_name = p.String("template", "");
  c->max_age_seconds = p.Int("max_age_seconds", c->max_age_seconds, 10, 7 * 86400);
  return p.Finish();
}

}  // namespace sandbox
