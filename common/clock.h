// Time as an injected dependency, so that code that waits or measures can be tested without
// sleeping.
//
// Production code takes a `Clock*` (default `RealClock()`); tests pass a `FakeClock` and move time
// with `Advance()`.
#ifndef TANDEM_COMMON_CLOCK_H_
#define TANDEM_COMMON_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem {

// Thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  // The current time. Never goes backwards for the same clock.
  virtual absl::Time Now() = 0;
  // Blocks the calling thread for `duration` of this clock's time.
  virtual void SleepFor(absl::Duration duration) = 0;
  // Blocks until `deadline` of this clock's time has passed.
  void SleepUntil(absl::Time deadline) { SleepFor(deadline - Now()); }
};

// The process's real clock: wall-clock time at start-up advanced by the monotonic clock, so it is
// comparable with timestamps from other processes yet never jumps when the system time is set.
// Never destroyed; safe to use from any thread at any time.
Clock* RealClock();

// A clock that moves only when told. Thread-safe. `SleepFor` blocks until other threads have
// advanced the clock past the sleeper's wake-up time.
class FakeClock final : public Clock {
 public:
  // Starts at `start` (default: 2026-01-01T00:00:00Z, far from the epoch so arithmetic is safe).
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1767225600));

  absl::Time Now() override;
  void SleepFor(absl::Duration duration) override;

  // Moves time forward (a negative `delta` is ignored) and wakes the sleepers whose time came.
  void Advance(absl::Duration delta);
  // Number of threads blocked in SleepFor; lets a test wait until a sleeper is parked.
  int num_sleepers();
  // Blocks until at least `n` threads sleep on this clock.
  void AwaitSleepers(int n);

 private:
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  int num_sleepers_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_CLOCK_H_
