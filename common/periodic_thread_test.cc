#include "common/periodic_thread.h"

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

class Counter {
 public:
  void Increment() {
    absl::MutexLock lock(&mu_);
    ++n_;
  }
  int value() {
    absl::MutexLock lock(&mu_);
    return n_;
  }
  void AwaitAtLeast(int n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return n_ >= n; };
    mu_.Await(absl::Condition(&enough));
  }

 private:
  absl::Mutex mu_;
  int n_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(PeriodicThreadTest, CallsAtStartWhenAskedAndStopsAtDestruction) {
  Counter calls;
  {
    PeriodicThread thread({.period = absl::InfiniteDuration(), .call_at_start = true},
                          [&] { calls.Increment(); });
    calls.AwaitAtLeast(1);
  }  // returns though the period never ends
  EXPECT_EQ(calls.value(), 1);
}

TEST(PeriodicThreadTest, CallsAgainEveryPeriod) {
  Counter calls;
  PeriodicThread thread({.period = absl::Milliseconds(1)}, [&] { calls.Increment(); });
  calls.AwaitAtLeast(3);
}

TEST(PeriodicThreadTest, WithoutCallAtStartTheFirstCallWaitsForAPeriod) {
  Counter calls;
  { PeriodicThread thread({.period = absl::InfiniteDuration()}, [&] { calls.Increment(); }); }
  EXPECT_EQ(calls.value(), 0);
}

}  // namespace
}  // namespace tandem
