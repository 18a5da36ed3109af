#include "common/request_id.h"

namespace sandbox {
namespace {
thread_local std::string tls_request_id;
}  // namespace

RequestIdScope::RequestIdScope(const std::string& id) {
  if (id.empty()) return;
  saved_ = std::move(tls_request_id);
  tls_request_id = id;
  set_ = true;
}

RequestIdScope::~RequestIdScope() {
  if (set_) tls_request_id = std::move(saved_);
}

const std::string& CurrentRequestId() { return tls_request_id; }

}  // namespace sandbox
