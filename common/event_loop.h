#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace sandbox {

// One thread waiting on many things: file descriptors (epoll) and timers.
// What waits on it holds no thread of its own: a run of a sandboxed process
// is a watch on its pipes and socket, a held echo call is a timer. Callbacks
// run on the loop's thread, one at a time, and must not block.
//
// Thread-safe: every method may be called from any thread, including from
// inside a callback.
class EventLoop {
 public:
  using Callback = std::function<void()>;
  using FdCallback = std::function<void(uint32_t events)>;  // EPOLLIN, ...
  using TimerId = uint64_t;

  // `name` names the thread (for debuggers and /proc).
  explicit EventLoop(const char* name = "event-loop");
  // Stops the thread; pending timers and watches are dropped uncalled.
  ~EventLoop();

  // The process-wide loop, started on first use and never destroyed.
  static EventLoop* Shared();

  // Calls `cb(events)` each time `fd` is ready for `events` (level
  // triggered) until Unwatch. One watch per fd. False on an epoll error.
  bool Watch(int fd, uint32_t events, FdCallback cb);
  // Changes the events a watched fd waits for.
  bool Modify(int fd, uint32_t events);
  // Removes the watch. Called on the loop thread, the callback is not called
  // again; from another thread, one already being dispatched may still run.
  // Does not close the fd.
  void Unwatch(int fd);

  // Calls `cb` once, `delay` from now (real monotonic time). Returns an id
  // for Cancel.
  TimerId After(absl::Duration delay, Callback cb);
  // The time from now to the next multiple of `period` on the loops' clock.
  // Periodic checks that wait this long instead of `period` fire together
  // (one wakeup for all of them, not one per check).
  static absl::Duration UntilNextTick(absl::Duration period);
  // False if the timer already ran or was cancelled.
  bool Cancel(TimerId id);
  // Calls `cb` on the loop thread as soon as possible.
  void Post(Callback cb);

  bool InLoopThread() const { return std::this_thread::get_id() == thread_.get_id(); }
  // Watches and timers now registered (for tests and metrics).
  size_t pending() const;

 private:
  void Loop();
  void Wake();

  int epfd_ = -1;
  int wake_fd_ = -1;
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // fd -> (generation, callback); the generation guards against a callback
  // for an fd that was unwatched and re-watched in between.
  struct Watcher {
    uint64_t gen = 0;
    std::shared_ptr<FdCallback> cb;
  };
  absl::flat_hash_map<int, Watcher> watches_ ABSL_GUARDED_BY(mu_);
  uint64_t next_gen_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::pair<int64_t, TimerId>, Callback> timers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<TimerId, int64_t> timer_due_ ABSL_GUARDED_BY(mu_);
  TimerId next_timer_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Callback> posted_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// A bounded set of threads for work that has to block (a provider without
// an asynchronous API, a file write). Threads start on demand up to
// `max_threads` and then stay; work past that waits in a
// FIFO queue.
//
// Thread-safe.
class WorkPool {
 public:
  WorkPool(const char* name, int max_threads);
  // Runs what is queued, then joins the threads.
  ~WorkPool();
  // The process-wide pool for blocking provider calls (64 threads).
  static WorkPool* Shared();
  void Submit(std::function<void()> fn);
  // Waits until every task submitted before this call has returned and its
  // captures are destroyed (tasks submitted later are not waited for); false
  // at the timeout. A server's shutdown calls it on the shared pool: the
  // tail of a task (what it captured) never outlives the parts it points to.
  bool Quiesce(absl::Duration timeout);
  int threads() const;
  int queued() const;

 private:
  void Worker();
  // The oldest task not yet finished (queued or running), leaving out the
  // running task `except`; ~0 when none.
  uint64_t OldestUnfinishedLocked(uint64_t except) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const char* const name_;
  const int max_threads_;
  mutable absl::Mutex mu_;
  // FIFO; each task with its submission number.
  std::deque<std::pair<uint64_t, std::function<void()>>> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t submitted_ ABSL_GUARDED_BY(mu_) = 0;
  std::multiset<uint64_t> running_ ABSL_GUARDED_BY(mu_);  // submission numbers
  int threads_ ABSL_GUARDED_BY(mu_) = 0;
  int idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> all_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sandbox
