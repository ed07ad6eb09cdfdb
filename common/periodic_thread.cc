#include "common/periodic_thread.h"

#include <utility>

namespace tandem {

PeriodicThread::PeriodicThread(Options options, absl::AnyInvocable<void()> call)
    : call_(std::move(call)) {
  thread_ = std::thread([this, options] {
    if (options.call_at_start) call_();
    absl::MutexLock lock(&mu_);
    while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), options.period)) {
      mu_.Unlock();
      call_();
      mu_.Lock();
    }
  });
}

PeriodicThread::~PeriodicThread() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

}  // namespace tandem
