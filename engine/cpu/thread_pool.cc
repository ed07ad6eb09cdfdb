#include "engine/cpu/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TANDEM_CPU_RELAX() _mm_pause()
#else
#define TANDEM_CPU_RELAX() std::this_thread::yield()
#endif

namespace tandem::cpu {
namespace {
thread_local bool tls_in_parallel_for = false;
}  // namespace

ThreadPool::ThreadPool(const Options& options)
    : num_threads_(options.num_threads > 0
                       ? options.num_threads
                       : std::max(1, static_cast<int>(std::thread::hardware_concurrency()))),
      spin_iterations_(std::max(0, options.spin_iterations)) {
  workers_.reserve(num_threads_ - 1);
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunChunks(Job& job) {
  int64_t begin = job.next.load(std::memory_order_relaxed);
  while (begin < job.n) {
    const int64_t size =
        std::max(job.min_grain, (job.n - begin + job.divisor - 1) / job.divisor);
    // On failure `begin` is reloaded with the current claim point.
    if (job.next.compare_exchange_weak(begin, begin + size, std::memory_order_relaxed)) {
      (*job.fn)(begin, std::min(job.n, begin + size));
      begin = job.next.load(std::memory_order_relaxed);
    }
  }
}

void ThreadPool::WorkerLoop() {
  tls_in_parallel_for = true;  // a ParallelFor from inside a body runs inline
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int i = 0; gen == seen && i < spin_iterations_; ++i) {
      TANDEM_CPU_RELAX();
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      ++sleeping_workers_;
      cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      --sleeping_workers_;
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load(std::memory_order_acquire)) return;
    // Join only while the caller has not closed the job: announce first, then check (the caller
    // closes, then waits for the announced workers; sequential consistency orders the two pairs).
    active_workers_.fetch_add(1, std::memory_order_seq_cst);
    if (open_generation_.load(std::memory_order_seq_cst) == gen) RunChunks(job_);
    active_workers_.fetch_sub(1, std::memory_order_release);
  }
}

void ThreadPool::ParallelFor(int64_t n, absl::FunctionRef<void(int64_t, int64_t)> fn,
                             int64_t min_grain) {
  if (n <= 0) return;
  min_grain = std::max<int64_t>(1, min_grain);
  if (num_threads_ == 1 || tls_in_parallel_for || n <= min_grain) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mu_);
  job_.fn = &fn;
  job_.n = n;
  job_.min_grain = min_grain;
  job_.divisor = 2 * static_cast<int64_t>(num_threads_);
  job_.next.store(0, std::memory_order_relaxed);
  const uint64_t gen = generation_.load(std::memory_order_relaxed) + 1;
  open_generation_.store(gen, std::memory_order_relaxed);
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.store(gen, std::memory_order_release);  // publishes job_ and open_generation_
    wake = sleeping_workers_ > 0;
  }
  if (wake) cv_.notify_all();
  tls_in_parallel_for = true;
  RunChunks(job_);
  tls_in_parallel_for = false;
  // Every range is claimed. Close the job so late workers stay out, then wait for those running a
  // range (fn and job_ must outlive them). The load that sees 0 reads the last of the workers'
  // release decrements (one release sequence), so their writes are visible after the loop.
  open_generation_.store(0, std::memory_order_seq_cst);
  for (int i = 0; active_workers_.load(std::memory_order_seq_cst) != 0; ++i) {
    if (i < spin_iterations_) {
      TANDEM_CPU_RELAX();
    } else {
      std::this_thread::yield();  // a worker running a range was preempted
    }
  }
}

}  // namespace tandem::cpu
