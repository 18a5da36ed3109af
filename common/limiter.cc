#include "common/limiter.h"

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

namespace sandbox {

Limiter::Limiter(std::string name, int64_t limit, int64_t max_queued, absl::Duration queue_timeout,
                 EventLoop* loop)
    : name_(std::move(name)),
      limit_(limit),
      max_queued_(max_queued < 0 ? 0 : max_queued),
      queue_timeout_(queue_timeout),
      loop_(loop) {}

Limiter::~Limiter() {
  absl::MutexLock l(&mu_);
  for (auto& w : queue_) {
    if (w->timer) loop_->Cancel(w->timer);
  }
}

absl::Status Limiter::Refusal(bool queue_full) const {
  return absl::ResourceExhaustedError(
      queue_full ? absl::StrCat(name_, " (", limit_, ") reached and ", max_queued_,
                                " calls are already queued; retry later")
                 : absl::StrCat(name_, " (", limit_, ") reached; waited ",
                                absl::ToInt64Milliseconds(queue_timeout_),
                                " ms (queue_timeout_ms) for a slot; retry later"));
}

void Limiter::Acquire(std::function<void(absl::Status)> done) {
  if (limit_ <= 0) {
    done(absl::OkStatus());
    return;
  }
  {
    absl::MutexLock l(&mu_);
    if (in_use_ < limit_ && queue_.empty()) {
      ++in_use_;
    } else if (static_cast<int64_t>(queue_.size()) >= max_queued_ ||
               queue_timeout_ <= absl::ZeroDuration()) {
      ++refused_;
      done = [done = std::move(done), refusal = Refusal(queue_timeout_ > absl::ZeroDuration())](
                 absl::Status) { done(refusal); };
    } else {
      auto w = std::make_shared<Waiter>();
      w->done = std::move(done);
      queue_.push_back(w);
      std::weak_ptr<Waiter> weak = w;
      w->timer = loop_->After(queue_timeout_, [this, weak] {
        std::shared_ptr<Waiter> waiter = weak.lock();
        if (!waiter) return;
        {
          absl::MutexLock l(&mu_);
          if (waiter->settled) return;
          waiter->settled = true;
          for (auto it = queue_.begin(); it != queue_.end(); ++it) {
            if (*it == waiter) {
              queue_.erase(it);
              break;
            }
          }
          ++refused_;
        }
        waiter->done(Refusal(false));
      });
      return;
    }
  }
  done(absl::OkStatus());
}

absl::Status Limiter::AcquireBlocking() {
  absl::Notification n;
  absl::Status result;
  Acquire([&](absl::Status s) {
    result = std::move(s);
    n.Notify();
  });
  n.WaitForNotification();
  return result;
}

void Limiter::Release() {
  if (limit_ <= 0) return;
  std::shared_ptr<Waiter> next;
  {
    absl::MutexLock l(&mu_);
    while (!queue_.empty()) {
      std::shared_ptr<Waiter> w = queue_.front();
      queue_.pop_front();
      if (w->settled) continue;
      w->settled = true;
      next = std::move(w);
      break;
    }
    if (!next) {
      --in_use_;
      return;
    }
    // The slot passes to the waiter: in_use_ stays.
  }
  loop_->Cancel(next->timer);
  next->done(absl::OkStatus());
}

Limiter::Stats Limiter::stats() const {
  absl::MutexLock l(&mu_);
  Stats s;
  s.in_use = in_use_;
  s.queued = static_cast<int64_t>(queue_.size());
  s.refused = refused_;
  return s;
}

}  // namespace sandbox
