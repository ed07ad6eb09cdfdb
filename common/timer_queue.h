// Callbacks to run at given times of a Clock, for code that must act on a deadline without a
// thread waiting for it (gRPC callback handlers, transfer completions).
//
//   TimerQueue timers;  // RealClock; its thread runs the callbacks
//   TimerQueue::Id id = timers.At(deadline, [call] { call->GiveUp(); });
//   ...
//   timers.Cancel(id);  // the call ended first
//
// Tests pass a FakeClock with `start_thread = false` and call RunDue() after Advance().
#ifndef TANDEM_COMMON_TIMER_QUEUE_H_
#define TANDEM_COMMON_TIMER_QUEUE_H_

#include <cstdint>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace tandem {

// Thread-safe. Callbacks run one at a time, in time order (ties in the order they were added),
// without the queue's lock held, so they may add and cancel timers. They must not block long:
// the next timers wait for them.
class TimerQueue {
 public:
  using Id = uint64_t;

  struct Options {
    Clock* clock = RealClock();
    // Run due timers on a thread of the queue's own, which waits on the real time to the next
    // one (so meant for RealClock). Off: only RunDue runs them.
    bool start_thread = true;
  };

  TimerQueue() : TimerQueue(Options{}) {}
  explicit TimerQueue(Options options);
  // Stops the thread; timers not run yet never run. A callback running now is waited for.
  ~TimerQueue();
  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  // Runs `fn` once, at or after `when` of the clock (soon, for a time already past). Never 0.
  Id At(absl::Time when, absl::AnyInvocable<void() &&> fn);
  // Removes a timer that has not started. False when it ran, runs now, or was cancelled.
  bool Cancel(Id id);
  // Runs every timer whose time has come by the clock; returns how many ran.
  int RunDue();
  // Timers waiting to run.
  size_t size();

  Clock* clock() const { return clock_; }

 private:
  void Loop();

  Clock* const clock_;
  absl::Mutex mu_;
  // (time, id) -> callback; ids grow, so ties run in the order they were added.
  std::map<std::pair<absl::Time, Id>, absl::AnyInvocable<void() &&>> timers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Id, absl::Time> when_ ABSL_GUARDED_BY(mu_);  // of each waiting timer
  Id next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex run_mu_;  // held while callbacks run: RunDue calls never overlap
  std::thread thread_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_TIMER_QUEUE_H_
