#include "common/clock.h"

#include <thread>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(RealClockTest, IsNearWallClockAndMonotonic) {
  Clock* clock = RealClock();
  const absl::Time a = clock->Now();
  EXPECT_LT(absl::AbsDuration(a - absl::Now()), absl::Seconds(5));
  absl::Time previous = a;
  for (int i = 0; i < 1000; ++i) {
    const absl::Time t = clock->Now();
    ASSERT_GE(t, previous);
    previous = t;
  }
  clock->SleepFor(absl::Milliseconds(2));
  EXPECT_GE(clock->Now() - a, absl::Milliseconds(2));
}

TEST(FakeClockTest, MovesOnlyWhenAdvanced) {
  FakeClock clock(absl::FromUnixSeconds(100));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(100));
  clock.Advance(absl::Milliseconds(1500));
  EXPECT_EQ(clock.Now(), absl::FromUnixMillis(101500));
  clock.Advance(-absl::Seconds(10));  // ignored: time never goes back
  EXPECT_EQ(clock.Now(), absl::FromUnixMillis(101500));
  clock.SleepFor(absl::ZeroDuration());  // returns at once
  clock.SleepFor(-absl::Seconds(1));
}

TEST(FakeClockTest, SleeperWakesExactlyWhenTimeComes) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  absl::Time woke_at;
  std::thread sleeper([&] {
    clock.SleepFor(absl::Seconds(10));
    woke_at = clock.Now();
  });
  clock.AwaitSleepers(1);
  clock.Advance(absl::Seconds(9));
  EXPECT_EQ(clock.num_sleepers(), 1);  // still asleep: its time has not come
  clock.Advance(absl::Seconds(1));
  sleeper.join();
  EXPECT_EQ(clock.num_sleepers(), 0);
  EXPECT_EQ(woke_at, start + absl::Seconds(10));
}

TEST(FakeClockTest, SleepUntilPastDeadlineReturnsAtOnce) {
  FakeClock clock;
  clock.SleepUntil(clock.Now() - absl::Seconds(1));
  clock.SleepUntil(clock.Now());
  EXPECT_EQ(clock.num_sleepers(), 0);
}

}  // namespace
}  // namespace tandem
