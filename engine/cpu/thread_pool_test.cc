#include "engine/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::cpu {
namespace {

// Every index in [0, n) is visited exactly once, for many sizes and repeated calls.
TEST(ThreadPoolTest, CoversEveryIndexOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool({.num_threads = threads});
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 2, 7, 64, 1000, 12345}) {
      for (int64_t grain : {1, 16}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        pool.ParallelFor(
            n,
            [&](int64_t begin, int64_t end) {
              ASSERT_LE(0, begin);
              ASSERT_LT(begin, end);
              ASSERT_LE(end, n);
              for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
            },
            grain);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
      }
    }
  }
}

// Claims take a share of what is left: none is larger than the first (1 / (2 * threads) of the
// work), all but the last are at least min_grain, and the last is no larger than min_grain, so
// the threads finish close together.
TEST(ThreadPoolTest, RangesShrinkTowardTheEnd) {
  for (int threads : {2, 3}) {
    ThreadPool pool({.num_threads = threads});
    for (int64_t n : {1000, 12345}) {
      for (int64_t grain : {1, 16}) {
        std::mutex mu;
        std::vector<std::pair<int64_t, int64_t>> ranges;
        pool.ParallelFor(
            n,
            [&](int64_t begin, int64_t end) {
              std::lock_guard<std::mutex> lock(mu);
              ranges.emplace_back(begin, end);
            },
            grain);
        const int64_t first = std::max(grain, (n + 2 * threads - 1) / (2 * threads));
        int64_t covered = 0;
        for (const auto& [begin, end] : ranges) {
          covered += end - begin;
          EXPECT_LE(end - begin, first);
          if (end == n) {
            EXPECT_LE(end - begin, grain);
          } else {
            EXPECT_GE(end - begin, grain);
          }
        }
        EXPECT_EQ(covered, n);
        // Each claim leaves (2t - 1) / 2t of the rest until a claim is min_grain: at most
        // log(n) / log(2t / (2t - 1)) claims, then at most 2t of min_grain.
        const double shrink = 2.0 * threads / (2.0 * threads - 1.0);
        const int64_t bound =
            static_cast<int64_t>(std::ceil(std::log(static_cast<double>(n)) / std::log(shrink))) +
            2 * threads + 1;
        EXPECT_LE(static_cast<int64_t>(ranges.size()), bound)
            << "threads=" << threads << " n=" << n << " grain=" << grain;
      }
    }
  }
}

TEST(ThreadPoolTest, SizeOneRunsInline) {
  ThreadPool pool({.num_threads = 1});
  const std::thread::id caller = std::this_thread::get_id();
  int calls = 0;
  pool.ParallelFor(100, [&](int64_t begin, int64_t end) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    EXPECT_EQ(begin, 0);
    EXPECT_EQ(end, 100);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
}

// Many short calls back to back (the decode pattern), with spinning disabled so that workers
// also go through the blocking path, and concurrent callers.
TEST(ThreadPoolTest, StressManyCallsAndConcurrentCallers) {
  for (int spin : {0, 1 << 14}) {
    ThreadPool pool({.num_threads = 4, .spin_iterations = spin});
    std::atomic<int64_t> total{0};
    auto caller = [&] {
      for (int iter = 0; iter < 2000; ++iter) {
        pool.ParallelFor(37, [&](int64_t begin, int64_t end) { total.fetch_add(end - begin); });
      }
    };
    std::thread other(caller);
    caller();
    other.join();
    EXPECT_EQ(total.load(), 2 * 2000 * 37);
  }
}

TEST(ThreadPoolTest, NestedCallRunsInline) {
  ThreadPool pool({.num_threads = 3});
  std::atomic<int64_t> total{0};
  pool.ParallelFor(12, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      pool.ParallelFor(10, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
    }
  });
  EXPECT_EQ(total.load(), 120);
}

TEST(ThreadPoolTest, DestroyRightAfterConstructionAndAfterWork) {
  for (int i = 0; i < 50; ++i) {
    ThreadPool idle({.num_threads = 4});
  }
  for (int i = 0; i < 50; ++i) {
    ThreadPool pool({.num_threads = 4, .spin_iterations = i % 2 == 0 ? 0 : 1000});
    std::atomic<int> n{0};
    pool.ParallelFor(100, [&](int64_t b, int64_t e) { n.fetch_add(static_cast<int>(e - b)); });
    EXPECT_EQ(n.load(), 100);
  }
}

TEST(ThreadPoolTest, DefaultSizeIsHardwareConcurrency) {
  ThreadPool pool({});
  EXPECT_GE(pool.num_threads(), 1);
}

}  // namespace
}  // namespace tandem::cpu
