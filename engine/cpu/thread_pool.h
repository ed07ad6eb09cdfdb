// A fixed-size pool of worker threads for data-parallel kernels.
//
//   ThreadPool pool(ThreadPool::Options{.num_threads = 8});
//   pool.ParallelFor(n, [&](int64_t begin, int64_t end) { for (i = begin; i < end; ++i) ... });
//
// The calling thread takes part in the work, so `num_threads` counts it: a pool of size 1 starts no
// thread and runs everything inline. Workers are started once; between calls they spin for a short
// while (so back-to-back kernels of a forward pass do not pay a wake-up) and then block on a
// condition variable. A call never waits for a worker that has not joined it: when the caller has
// claimed every range itself (a worker still asleep, or descheduled on a busy machine), it only
// waits for the workers that are running a range of this call, so a late worker costs nothing.
//
// Thread-safe: ParallelFor may be called from several threads; the calls are serialized. A call
// made from inside a ParallelFor body (nested) runs inline on the calling worker. The destructor
// joins the workers; REQUIRES: no ParallelFor in flight when it runs.
#ifndef TANDEM_ENGINE_CPU_THREAD_POOL_H_
#define TANDEM_ENGINE_CPU_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"

namespace tandem::cpu {

class ThreadPool {
 public:
  struct Options {
    // Threads that run work, the caller included. 0: std::thread::hardware_concurrency().
    int num_threads = 0;
    // Iterations a idle worker polls for new work before it blocks (each iteration is a `pause`).
    int spin_iterations = 1 << 14;
  };

  explicit ThreadPool(const Options& options);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) over disjoint ranges that cover [0, n), possibly concurrently, and
  // returns when all calls have returned. Ranges are contiguous and handed out in order, each
  // claim taking 1 / (2 * num_threads) of what is left (at least `min_grain`; the last range may
  // be shorter): few claims while much is left, small ones at the end so that the threads finish
  // together. n <= 0 does nothing.
  void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t begin, int64_t end)> fn,
                   int64_t min_grain = 1);

 private:
  struct Job {
    absl::FunctionRef<void(int64_t, int64_t)>* fn = nullptr;
    int64_t n = 0;
    int64_t min_grain = 1;
    int64_t divisor = 2;  // a claim takes the remaining work / divisor
    std::atomic<int64_t> next{0};
  };

  void WorkerLoop();
  static void RunChunks(Job& job);

  const int num_threads_;
  const int spin_iterations_;
  std::vector<std::thread> workers_;

  std::mutex call_mu_;  // serializes ParallelFor calls

  std::mutex mu_;  // guards the blocking side of generation_ / stop_, and sleeping_workers_
  std::condition_variable cv_;
  int sleeping_workers_ = 0;             // workers blocked on cv_; guarded by mu_
  std::atomic<uint64_t> generation_{0};  // bumped once per ParallelFor (publishes job_)
  std::atomic<bool> stop_{false};
  // The generation whose job workers may still join; 0 once its caller has claimed every range.
  std::atomic<uint64_t> open_generation_{0};
  std::atomic<int> active_workers_{0};  // workers inside (or checking whether to join) a job
  Job job_;
};

}  // namespace tandem::cpu

#endif  // TANDEM_ENGINE_CPU_THREAD_POOL_H_
