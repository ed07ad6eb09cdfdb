#include "common/timer_queue.h"

#include <vector>

namespace tandem {

TimerQueue::TimerQueue(Options options) : clock_(options.clock) {
  if (options.start_thread) thread_ = std::thread([this] { Loop(); });
}

TimerQueue::~TimerQueue() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  absl::MutexLock run(&run_mu_);  // a RunDue on another thread ends first
}

TimerQueue::Id TimerQueue::At(absl::Time when, absl::AnyInvocable<void() &&> fn) {
  absl::MutexLock lock(&mu_);
  const Id id = next_id_++;
  timers_.emplace(std::make_pair(when, id), std::move(fn));
  when_.emplace(id, when);
  return id;
}

bool TimerQueue::Cancel(Id id) {
  absl::MutexLock lock(&mu_);
  auto it = when_.find(id);
  if (it == when_.end()) return false;
  timers_.erase(std::make_pair(it->second, id));
  when_.erase(it);
  return true;
}

size_t TimerQueue::size() {
  absl::MutexLock lock(&mu_);
  return timers_.size();
}

int TimerQueue::RunDue() {
  absl::MutexLock run(&run_mu_);
  int ran = 0;
  while (true) {
    absl::AnyInvocable<void() &&> fn;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_ || timers_.empty() || timers_.begin()->first.first > clock_->Now()) break;
      fn = std::move(timers_.begin()->second);
      when_.erase(timers_.begin()->first.second);
      timers_.erase(timers_.begin());
    }
    std::move(fn)();
    ++ran;
  }
  return ran;
}

void TimerQueue::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // Wakes for the next timer's time, an earlier timer added meanwhile, or the end.
      const absl::Time next =
          timers_.empty() ? absl::InfiniteFuture() : timers_.begin()->first.first;
      const absl::Duration wait = next - clock_->Now();
      if (wait > absl::ZeroDuration()) {
        const size_t count = timers_.size();
        auto changed = [this, count, next]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || timers_.size() != count ||
                 (!timers_.empty() && timers_.begin()->first.first < next);
        };
        mu_.AwaitWithTimeout(absl::Condition(&changed), wait);
      }
      if (stopping_) return;
    }
    RunDue();
  }
}

}  // namespace tandem
