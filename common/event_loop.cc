#include "common/event_loop.h"

#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

#include "common/request_id.h"

namespace sandbox {
namespace {

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

EventLoop::EventLoop(const char* name) {
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  struct epoll_event ev = {};
  ev.events = EPOLLIN;
  ev.data.u64 = ~uint64_t{0};
  epoll_ctl(epfd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  thread_ = std::thread([this] { Loop(); });
  pthread_setname_np(thread_.native_handle(), std::string(name).substr(0, 15).c_str());
}

EventLoop::~EventLoop() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  Wake();
  thread_.join();
  close(wake_fd_);
  close(epfd_);
}

EventLoop* EventLoop::Shared() {
  static EventLoop* loop = new EventLoop("sb-event-loop");
  return loop;
}

void EventLoop::Wake() {
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

bool EventLoop::Watch(int fd, uint32_t events, FdCallback cb) {
  absl::MutexLock l(&mu_);
  Watcher w;
  w.gen = ++next_gen_;
  w.cb = std::make_shared<FdCallback>(std::move(cb));
  struct epoll_event ev = {};
  ev.events = events;
  ev.data.u64 = (w.gen << 32) | static_cast<uint32_t>(fd);
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) return false;
  watches_[fd] = std::move(w);
  return true;
}

bool EventLoop::Modify(int fd, uint32_t events) {
  absl::MutexLock l(&mu_);
  auto it = watches_.find(fd);
  if (it == watches_.end()) return false;
  struct epoll_event ev = {};
  ev.events = events;
  ev.data.u64 = (it->second.gen << 32) | static_cast<uint32_t>(fd);
  return epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &ev) == 0;
}

void EventLoop::Unwatch(int fd) {
  absl::MutexLock l(&mu_);
  if (watches_.erase(fd) > 0) epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
}

EventLoop::TimerId EventLoop::After(absl::Duration delay, Callback cb) {
  const int64_t due = NowNanos() + absl::ToInt64Nanoseconds(std::max(delay, absl::ZeroDuration()));
  bool first;
  TimerId id;
  {
    absl::MutexLock l(&mu_);
    id = ++next_timer_;
    first = timers_.empty() || due < timers_.begin()->first.first;
    timers_.emplace(std::make_pair(due, id), std::move(cb));
    timer_due_[id] = due;
  }
  if (first && !InLoopThread()) Wake();
  return id;
}

absl::Duration EventLoop::UntilNextTick(absl::Duration period) {
  const int64_t p = std::max<int64_t>(1, absl::ToInt64Nanoseconds(period));
  return absl::Nanoseconds(p - NowNanos() % p);
}

bool EventLoop::Cancel(TimerId id) {
  absl::MutexLock l(&mu_);
  auto it = timer_due_.find(id);
  if (it == timer_due_.end()) return false;
  timers_.erase(std::make_pair(it->second, id));
  timer_due_.erase(it);
  return true;
}

void EventLoop::Post(Callback cb) {
  // The poster's request id goes with the work (common/request_id.h).
  if (!CurrentRequestId().empty()) cb = WithRequestId(std::move(cb));
  {
    absl::MutexLock l(&mu_);
    posted_.push_back(std::move(cb));
  }
  if (!InLoopThread()) Wake();
}

size_t EventLoop::pending() const {
  absl::MutexLock l(&mu_);
  return watches_.size() + timers_.size() + posted_.size();
}

void EventLoop::Loop() {
  constexpr int kMaxEvents = 256;
  struct epoll_event events[kMaxEvents];
  std::vector<Callback> run;
  for (;;) {
    int timeout_ms = -1;
    {
      absl::MutexLock l(&mu_);
      if (stop_) return;
      if (!posted_.empty()) {
        timeout_ms = 0;
      } else if (!timers_.empty()) {
        const int64_t wait = timers_.begin()->first.first - NowNanos();
        timeout_ms = wait <= 0 ? 0 : static_cast<int>((wait + 999999) / 1000000);
      }
    }
    int n = epoll_wait(epfd_, events, kMaxEvents, timeout_ms);
    if (n < 0 && errno != EINTR) n = 0;
    for (int i = 0; i < n; ++i) {
      const uint64_t key = events[i].data.u64;
      if (key == ~uint64_t{0}) {
        uint64_t v;
        (void)!read(wake_fd_, &v, sizeof(v));
        continue;
      }
      const int fd = static_cast<int>(key & 0xffffffffu);
      const uint64_t gen = key >> 32;
      std::shared_ptr<FdCallback> cb;
      {
        absl::MutexLock l(&mu_);
        auto it = watches_.find(fd);
        if (it == watches_.end() || (it->second.gen & 0xffffffffu) != gen) continue;
        cb = it->second.cb;
      }
      (*cb)(events[i].events);
    }
    {
      absl::MutexLock l(&mu_);
      const int64_t now = NowNanos();
      while (!timers_.empty() && timers_.begin()->first.first <= now) {
        auto it = timers_.begin();
        timer_due_.erase(it->first.second);
        run.push_back(std::move(it->second));
        timers_.erase(it);
      }
      for (auto& p : posted_) run.push_back(std::move(p));
      posted_.clear();
    }
    for (auto& cb : run) cb();
    run.clear();
  }
}

// ---- WorkPool ----

namespace {
// The task this thread is running, when it is one of a pool's workers.
thread_local const WorkPool* tls_pool = nullptr;
thread_local uint64_t tls_task = 0;
}  // namespace

WorkPool::WorkPool(const char* name, int max_threads)
    : name_(name), max_threads_(max_threads < 1 ? 1 : max_threads) {}

WorkPool::~WorkPool() {
  std::vector<std::thread> all;
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    all.swap(all_);
  }
  for (auto& t : all) t.join();
}

WorkPool* WorkPool::Shared() {
  static WorkPool* pool = new WorkPool("sb-blocking", 64);
  return pool;
}

void WorkPool::Submit(std::function<void()> fn) {
  // The submitter's request id goes with the work (common/request_id.h).
  if (!CurrentRequestId().empty()) fn = WithRequestId(std::move(fn));
  absl::MutexLock l(&mu_);
  queue_.emplace_back(++submitted_, std::move(fn));
  // Idle threads not yet woken still count as idle: start one more when the
  // queue outgrows them.
  if (static_cast<int>(queue_.size()) > idle_ && threads_ < max_threads_) {
    ++threads_;
    all_.emplace_back([this] { Worker(); });
    pthread_setname_np(all_.back().native_handle(), std::string(name_).substr(0, 15).c_str());
  }
}

int WorkPool::threads() const {
  absl::MutexLock l(&mu_);
  return threads_;
}

int WorkPool::queued() const {
  absl::MutexLock l(&mu_);
  return static_cast<int>(queue_.size());
}

void WorkPool::Worker() {
  absl::MutexLock l(&mu_);
  for (;;) {
    ++idle_;
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
    mu_.Await(absl::Condition(&ready));
    --idle_;
    if (queue_.empty()) return;  // stopping, nothing left
    const uint64_t seq = queue_.front().first;
    std::function<void()> fn = std::move(queue_.front().second);
    queue_.pop_front();
    auto mine = running_.insert(seq);
    mu_.Unlock();
    tls_pool = this;
    tls_task = seq;
    fn();
    // Its captures go before the task counts as finished, and outside the
    // lock: a capture's destructor may submit.
    fn = nullptr;
    tls_pool = nullptr;
    mu_.Lock();
    running_.erase(mine);
  }
}

uint64_t WorkPool::OldestUnfinishedLocked(uint64_t except) const {
  uint64_t oldest = ~uint64_t{0};
  for (uint64_t seq : running_) {
    if (seq == except) continue;
    oldest = seq;
    break;
  }
  if (!queue_.empty()) oldest = std::min(oldest, queue_.front().first);
  return oldest;
}

bool WorkPool::Quiesce(absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  const uint64_t last = submitted_;
  // Called from one of this pool's tasks: that task is not waited for.
  const uint64_t self = tls_pool == this ? tls_task : 0;
  auto done = [this, last, self]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return OldestUnfinishedLocked(self) > last;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
}

}  // namespace sandbox
