#pragma once

#include <string>
#include <utility>

namespace sandbox {

// The request id of the call running on this thread, for logs and audit
// records made deep in the call (a session created by it). The transport
// installs it once; work handed to a WorkPool or an EventLoop carries the
// id of the code that handed it over, and WithRequestId carries it into
// callbacks that a provider runs on a thread of its own. Nothing re-installs
// it by hand.
class RequestIdScope {
 public:
  // An empty id keeps the current one.
  explicit RequestIdScope(const std::string& id);
  ~RequestIdScope();
  RequestIdScope(const RequestIdScope&) = delete;
  RequestIdScope& operator=(const RequestIdScope&) = delete;

 private:
  std::string saved_;
  bool set_ = false;
};

// "" when no call is running on this thread (the reaper, a signal).
const std::string& CurrentRequestId();

// `fn`, to be run later on any thread with this thread's current request id.
template <typename F>
auto WithRequestId(F fn) {
  return [id = CurrentRequestId(), fn = std::move(fn)](auto&&... args) mutable {
    RequestIdScope scope(id);
    return fn(std::forward<decltype(args)>(args)...);
  };
}

}  // namespace sandbox
