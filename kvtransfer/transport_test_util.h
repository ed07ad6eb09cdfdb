// What the transport tests share: seeded pools, byte comparison of block layers, and a callback
// that records how an operation ended.
#ifndef TANDEM_KVTRANSFER_TRANSPORT_TEST_UTIL_H_
#define TANDEM_KVTRANSFER_TRANSPORT_TEST_UTIL_H_

#include <cstring>
#include <memory>
#include <random>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "kvtransfer/kv_transport.h"

namespace tandem::kvtransfer::testing {

inline constexpr absl::Duration kWait = absl::Seconds(10);  // bounds every wait; never reached when OK

// A pool of `layout` filled with values drawn from `seed`.
inline std::unique_ptr<KvStorage> RandomPool(const KvLayout& layout, uint32_t seed) {
  auto pool = *KvStorage::Create(layout);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (int64_t i = 0; i < layout.total_elements(); ++i) pool->data()[i] = dist(rng);
  return pool;
}

// Whether layers [first, first + n) of `src` in `from` equal those of `dst` in `to`.
inline bool SameLayers(KvStorage& from, int32_t src, KvStorage& to, int32_t dst, int64_t first,
                       int64_t n) {
  const size_t bytes = static_cast<size_t>(n * from.layout().layer_stride()) * sizeof(float);
  return std::memcmp(from.KeyBlock(src, first), to.KeyBlock(dst, first), bytes) == 0;
}

// The status an operation ended with, when, and how often its callback ran.
class Done {
 public:
  DoneCallback Callback() {
    return [this](absl::Status s) {
      absl::MutexLock lock(&mu_);
      ++calls_;
      status_ = std::move(s);
      when_ = absl::Now();
    };
  }
  // The status, after waiting (bounded) for the callback.
  absl::Status Wait(absl::Duration timeout = kWait) {
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout(absl::Condition(+[](int* calls) { return *calls > 0; }, &calls_),
                              timeout)) {
      return absl::InternalError("the operation did not end within the test's wait");
    }
    return status_;
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  absl::Time when() {
    absl::MutexLock lock(&mu_);
    return when_;
  }

 private:
  absl::Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  absl::Time when_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::kvtransfer::testing

#endif  // TANDEM_KVTRANSFER_TRANSPORT_TEST_UTIL_H_
