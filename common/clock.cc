#include "common/clock.h"

#include <chrono>
#include <thread>
#include <utility>

namespace tandem {
namespace {

class MonotonicWallClock final : public Clock {
 public:
  MonotonicWallClock() : wall_start_(absl::Now()), steady_start_(std::chrono::steady_clock::now()) {}

  absl::Time Now() override {
    return wall_start_ + absl::FromChrono(std::chrono::steady_clock::now() - steady_start_);
  }

  void SleepFor(absl::Duration duration) override {
    if (duration > absl::ZeroDuration()) std::this_thread::sleep_for(absl::ToChronoNanoseconds(duration));
  }

 private:
  const absl::Time wall_start_;
  const std::chrono::steady_clock::time_point steady_start_;
};

}  // namespace

Clock* RealClock() {
  static Clock* clock = new MonotonicWallClock();
  return clock;
}

FakeClock::FakeClock(absl::Time start) : now_(start) {}

absl::Time FakeClock::Now() {
  absl::MutexLock lock(&mu_);
  return now_;
}

void FakeClock::SleepFor(absl::Duration duration) {
  absl::MutexLock lock(&mu_);
  const absl::Time wake = now_ + duration;
  ++num_sleepers_;
  std::pair<const absl::Time*, const absl::Time*> args(&now_, &wake);
  mu_.Await(absl::Condition(
      +[](std::pair<const absl::Time*, const absl::Time*>* p) { return *p->first >= *p->second; },
      &args));
  --num_sleepers_;
}

void FakeClock::Advance(absl::Duration delta) {
  absl::MutexLock lock(&mu_);
  if (delta > absl::ZeroDuration()) now_ += delta;
}

int FakeClock::num_sleepers() {
  absl::MutexLock lock(&mu_);
  return num_sleepers_;
}

void FakeClock::AwaitSleepers(int n) {
  absl::MutexLock lock(&mu_);
  std::pair<const int*, int> args(&num_sleepers_, n);
  mu_.Await(absl::Condition(+[](std::pair<const int*, int>* p) { return *p->first >= p->second; },
                            &args));
}

}  // namespace tandem
