// Calls a function every period of real time on a thread of its own, until destruction: the
// background checks (the router's admission queue, stall watch, discovery, worker liveness).
// What they check reads an injected Clock; their tests call the check themselves after moving a
// FakeClock, without a thread.
//
//   PeriodicThread thread({.period = absl::Milliseconds(250)}, [this] { Check(); });
//
// Thread-safe.
#ifndef TANDEM_COMMON_PERIODIC_THREAD_H_
#define TANDEM_COMMON_PERIODIC_THREAD_H_

#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem {

class PeriodicThread {
 public:
  struct Options {
    // Between the end of one call and the start of the next. > 0.
    absl::Duration period;
    // Call once at once, before the first period.
    bool call_at_start = false;
  };
  PeriodicThread(Options options, absl::AnyInvocable<void()> call);
  // Waits for a call in progress; none starts after.
  ~PeriodicThread();
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

 private:
  absl::AnyInvocable<void()> call_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_PERIODIC_THREAD_H_
