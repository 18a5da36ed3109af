#include <atomic>
#include <memory>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/event_loop.h"
#include "gtest/gtest.h"

namespace sandbox {
namespace {

// What a task captured is destroyed before Quiesce counts the task as done.
struct Tail {
  explicit Tail(std::atomic<int>* d) : destroyed(d) {}
  ~Tail() { ++*destroyed; }
  std::atomic<int>* destroyed;
};

TEST(WorkPool, QuiesceWaitsForEarlierTasksAndTheirCapturesOnly) {
  WorkPool pool("test-pool", 4);
  absl::Notification release, started;
  std::atomic<int> destroyed{0};
  auto tail = std::make_shared<Tail>(&destroyed);
  pool.Submit([&release, &started, tail] {
    started.Notify();
    release.WaitForNotification();
  });
  tail.reset();  // the task now holds the only reference
  started.WaitForNotification();
  // A queued task behind it counts too.
  std::atomic<bool> second_ran{false};
  pool.Submit([&second_ran] { second_ran = true; });
  EXPECT_FALSE(pool.Quiesce(absl::Milliseconds(50)));
  EXPECT_EQ(destroyed.load(), 0);

  release.Notify();
  EXPECT_TRUE(pool.Quiesce(absl::Seconds(30)));
  EXPECT_EQ(destroyed.load(), 1);
  EXPECT_TRUE(second_ran.load());

  // A task submitted after the call is not waited for.
  absl::Notification late_release, late_started;
  pool.Submit([&] {
    late_started.Notify();
    late_release.WaitForNotification();
  });
  late_started.WaitForNotification();
  EXPECT_FALSE(pool.Quiesce(absl::Milliseconds(20)));  // it is earlier than this call
  std::atomic<bool> quiesced{false};
  absl::Notification checked;
  // From inside one of the pool's own tasks: that task is left out.
  pool.Submit([&] {
    late_release.Notify();
    quiesced = pool.Quiesce(absl::Seconds(30));
    checked.Notify();
  });
  checked.WaitForNotification();
  EXPECT_TRUE(quiesced.load());
  EXPECT_TRUE(pool.Quiesce(absl::Seconds(30)));
}

}  // namespace
}  // namespace sandbox
