// Finds relayed streams whose decode worker has gone silent: neither a token nor a heartbeat
// (DecodeResponse.heartbeat, sent by a decode worker every --stream_heartbeat_ms while a stream
// waits) for longer than a timeout. A worker whose link was cut, or whose process hangs, keeps
// its streams open without a word; the router then treats such a stream as failed (it moves to
// another decode worker, or ends with UNAVAILABLE) instead of holding the client forever.
//
//   StallWatch watch({.timeout = absl::Seconds(6)});
//   watch.Add(stream);              // a std::weak_ptr<StallWatch::Stream>
//   stream->Touch(clock->Now());    // on every message from the worker
//   ...
//   watch.Check();                  // from a timer (Start), or a test with a FakeClock
//
// Thread-safe.
#ifndef TANDEM_ROUTER_SERVER_STALL_WATCH_H_
#define TANDEM_ROUTER_SERVER_STALL_WATCH_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/periodic_thread.h"

namespace tandem::router {

class StallWatch {
 public:
  // A watched stream. Touch on every message; OnStalled is called at most once, from Check, on
  // the watch's thread, without the watch's lock held. Thread-safe.
  class Stream {
   public:
    explicit Stream(absl::Time now) { Touch(now); }
    virtual ~Stream() = default;
    void Touch(absl::Time now) {
      last_progress_ns_.store(absl::ToUnixNanos(now), std::memory_order_relaxed);
    }
    absl::Time last_progress() const {
      return absl::FromUnixNanos(last_progress_ns_.load(std::memory_order_relaxed));
    }
    // The stream ended: no longer watched.
    void Done() { done_.store(true, std::memory_order_relaxed); }
    bool done() const { return done_.load(std::memory_order_relaxed); }
    // `silent_for`: how long the worker had sent nothing when the watch saw it.
    virtual void OnStalled(absl::Duration silent_for) = 0;

   private:
    std::atomic<int64_t> last_progress_ns_{0};
    std::atomic<bool> done_{false};
  };

  struct Options {
    // Silence after which a stream is stalled. > 0; InfiniteDuration: never.
    absl::Duration timeout = absl::Seconds(6);
    // How often Start's thread checks; stalls are found within timeout + period.
    absl::Duration period = absl::Milliseconds(250);
    // Must outlive the watch.
    Clock* clock = RealClock();
  };

  explicit StallWatch(Options options) : options_(options) {}
  // Stops the thread Start began.
  ~StallWatch();

  // Checks every `period` on a thread of its own until destruction (real time; a FakeClock's
  // tests call Check themselves).
  void Start();

  // Watches `stream` until it is Done, stalled, or destroyed.
  void Add(std::weak_ptr<Stream> stream);

  // Calls OnStalled for every watched stream silent for longer than the timeout, and stops
  // watching it; forgets the streams that ended. Returns how many stalled.
  int Check();

  // Streams watched now (those that ended are forgotten at the next Check).
  int64_t watched();

  absl::Duration timeout() const { return options_.timeout; }

 private:
  const Options options_;
  absl::Mutex mu_;
  std::vector<std::weak_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<PeriodicThread> thread_;
};

}  // namespace tandem::router

#endif  // TANDEM_ROUTER_SERVER_STALL_WATCH_H_
