#include "common/timer_queue.h"

#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(TimerQueueTest, RunsDueTimersInTimeOrderAndTiesInOrderAdded) {
  FakeClock clock;
  TimerQueue timers({.clock = &clock, .start_thread = false});
  std::vector<int> ran;
  const absl::Time t0 = clock.Now();
  timers.At(t0 + absl::Seconds(3), [&] { ran.push_back(3); });
  timers.At(t0 + absl::Seconds(1), [&] { ran.push_back(1); });
  timers.At(t0 + absl::Seconds(2), [&] { ran.push_back(20); });
  timers.At(t0 + absl::Seconds(2), [&] { ran.push_back(21); });
  EXPECT_EQ(timers.RunDue(), 0);
  EXPECT_THAT(ran, IsEmpty());
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(timers.RunDue(), 3);
  EXPECT_THAT(ran, ElementsAre(1, 20, 21));
  EXPECT_EQ(timers.size(), 1u);
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(timers.RunDue(), 1);
  EXPECT_THAT(ran, ElementsAre(1, 20, 21, 3));
  EXPECT_EQ(timers.RunDue(), 0);
}

TEST(TimerQueueTest, ACancelledTimerNeverRuns) {
  FakeClock clock;
  TimerQueue timers({.clock = &clock, .start_thread = false});
  int ran = 0;
  const TimerQueue::Id a = timers.At(clock.Now() + absl::Seconds(1), [&] { ran += 1; });
  const TimerQueue::Id b = timers.At(clock.Now() + absl::Seconds(1), [&] { ran += 10; });
  EXPECT_NE(a, b);
  EXPECT_TRUE(timers.Cancel(a));
  EXPECT_FALSE(timers.Cancel(a));
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(timers.RunDue(), 1);
  EXPECT_EQ(ran, 10);
  EXPECT_FALSE(timers.Cancel(b));  // already ran
}

TEST(TimerQueueTest, ACallbackMayAddAndCancelTimers) {
  FakeClock clock;
  TimerQueue timers({.clock = &clock, .start_thread = false});
  std::vector<int> ran;
  TimerQueue::Id later = 0;
  timers.At(clock.Now(), [&] {
    ran.push_back(1);
    timers.At(clock.Now(), [&] { ran.push_back(2); });  // due at once: this RunDue runs it
    EXPECT_TRUE(timers.Cancel(later));
  });
  later = timers.At(clock.Now() + absl::Seconds(1), [&] { ran.push_back(99); });
  EXPECT_EQ(timers.RunDue(), 2);
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(timers.RunDue(), 0);
  EXPECT_THAT(ran, ElementsAre(1, 2));
}

TEST(TimerQueueTest, ItsThreadRunsATimerAddedWhileItWaitsForALaterOne) {
  TimerQueue timers;  // real clock and thread
  absl::Notification late_ran, soon_ran;
  timers.At(absl::InfiniteFuture(), [&] { late_ran.Notify(); });
  timers.At(RealClock()->Now(), [&] { soon_ran.Notify(); });
  soon_ran.WaitForNotification();
  EXPECT_FALSE(late_ran.HasBeenNotified());
  EXPECT_EQ(timers.size(), 1u);
}

TEST(TimerQueueTest, TimersLeftAtDestructionNeverRun) {
  bool ran = false;
  {
    TimerQueue timers;
    timers.At(RealClock()->Now() + absl::Hours(1), [&] { ran = true; });
  }
  EXPECT_FALSE(ran);
}

}  // namespace
}  // namespace tandem
