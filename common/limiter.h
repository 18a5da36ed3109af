#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/event_loop.h"

namespace sandbox {

// A named limit on how many things run at once, with a bounded queue in
// front of it. Past the limit a caller waits (holding no thread when it
// uses Acquire) up to the queue timeout, then gets RESOURCE_EXHAUSTED
// naming the limit and its value. A full queue refuses at once.
//
// Thread-safe.
class Limiter {
 public:
  struct Stats {
    int64_t in_use = 0;
    int64_t queued = 0;
    int64_t refused = 0;  // total
  };
  // `name` is the config key the error names ("max_calls_in_flight");
  // `limit` <= 0 means unlimited. `loop` runs the queue timeouts.
  Limiter(std::string name, int64_t limit, int64_t max_queued, absl::Duration queue_timeout,
          EventLoop* loop = EventLoop::Shared());
  ~Limiter();

  // Calls `done(OkStatus())` once a slot is held (at once, on this thread,
  // when one is free; else on the thread that frees one), or
  // `done(RESOURCE_EXHAUSTED)` when the queue is full (at once) or the
  // wait times out (on the loop's thread). The holder calls Release().
  void Acquire(std::function<void(absl::Status)> done);
  // The same, blocking the calling thread.
  absl::Status AcquireBlocking();
  void Release();

  Stats stats() const;
  const std::string& name() const { return name_; }
  int64_t limit() const { return limit_; }

 private:
  struct Waiter {
    std::function<void(absl::Status)> done;
    EventLoop::TimerId timer = 0;
    bool settled = false;
  };
  absl::Status Refusal(bool queue_full) const;

  const std::string name_;
  const int64_t limit_;
  const int64_t max_queued_;
  const absl::Duration queue_timeout_;
  EventLoop* const loop_;
  mutable absl::Mutex mu_;
  int64_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::shared_ptr<Waiter>> queue_ ABSL_GUARDED_BY(mu_);
};

// Holds one slot of a Limiter until destroyed (or Release()). Movable.
class LimitSlot {
 public:
  LimitSlot() = default;
  explicit LimitSlot(Limiter* l) : limiter_(l) {}
  LimitSlot(LimitSlot&& o) noexcept : limiter_(o.limiter_) { o.limiter_ = nullptr; }
  LimitSlot& operator=(LimitSlot&& o) noexcept {
    if (this != &o) {
      Release();
      limiter_ = o.limiter_;
      o.limiter_ = nullptr;
    }
    return *this;
  }
  ~LimitSlot() { Release(); }
  void Release() {
    if (limiter_) limiter_->Release();
    limiter_ = nullptr;
  }

 private:
  Limiter* limiter_ = nullptr;
};

}  // namespace sandbox
