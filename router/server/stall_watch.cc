#include "router/server/stall_watch.h"

#include <utility>

namespace tandem::router {

StallWatch::~StallWatch() { thread_.reset(); }

void StallWatch::Start() {
  thread_ = std::make_unique<PeriodicThread>(PeriodicThread::Options{.period = options_.period},
                                             [this] { Check(); });
}

void StallWatch::Add(std::weak_ptr<Stream> stream) {
  absl::MutexLock lock(&mu_);
  streams_.push_back(std::move(stream));
}

int StallWatch::Check() {
  if (options_.timeout == absl::InfiniteDuration()) return 0;
  const absl::Time now = options_.clock->Now();
  std::vector<std::pair<std::shared_ptr<Stream>, absl::Duration>> stalled;
  {
    absl::MutexLock lock(&mu_);
    size_t kept = 0;
    for (size_t i = 0; i < streams_.size(); ++i) {
      std::shared_ptr<Stream> s = streams_[i].lock();
      if (s == nullptr || s->done()) continue;
      const absl::Duration silent = now - s->last_progress();
      if (silent > options_.timeout) {
        stalled.emplace_back(std::move(s), silent);
        continue;
      }
      if (kept != i) streams_[kept] = std::move(streams_[i]);
      ++kept;
    }
    streams_.resize(kept);
  }
  for (auto& [stream, silent] : stalled) stream->OnStalled(silent);
  return static_cast<int>(stalled.size());
}

int64_t StallWatch::watched() {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(streams_.size());
}

}  // namespace tandem::router
