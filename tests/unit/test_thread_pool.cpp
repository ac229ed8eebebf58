// The fast kernels' worker pool (kernels/cpu/thread_pool.h): every item exactly once for any
// (n, threads, chunk), guided runs that shrink to one granule, split runs that stream each
// thread's share and steal at the end, one call per thread, nested
// regions inline, exceptions reach the caller, concurrent callers, and regions after the
// workers went to sleep.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cpu/thread_pool.h"

namespace ft::cpu {
namespace {

TEST(ThreadPool, ParallelForCoversEveryItemOnce) {
  for (const int nt : {1, 2, 3, 5})
    for (const int64_t n : {0, 1, 2, 7, 64, 1001})
      for (const int64_t chunk : {1, 3, 64}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        parallel_for(n, nt, chunk, [&](int64_t i) { hits[size_t(i)].fetch_add(1); });
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(hits[size_t(i)].load(), 1) << "n=" << n << " nt=" << nt << " chunk=" << chunk << " i=" << i;
        std::vector<std::atomic<int>> shits(static_cast<size_t>(n));
        parallel_for_static(n, nt, [&](int64_t i) { shits[size_t(i)].fetch_add(1); });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(shits[size_t(i)].load(), 1) << "static n=" << n << " nt=" << nt;
      }
}

TEST(ThreadPool, GuidedRunLength) {
  EXPECT_EQ(guided_run(1000, 2, 64, 1), 64);  // capped at the chunk
  EXPECT_EQ(guided_run(100, 2, 64, 1), 25);   // left / (2 threads)
  EXPECT_EQ(guided_run(101, 2, 64, 1), 26);
  EXPECT_EQ(guided_run(3, 2, 64, 1), 1);
  EXPECT_EQ(guided_run(5, 2, 64, 2), 2);      // rounded up to the granule
  EXPECT_EQ(guided_run(13, 2, 64, 2), 4);
  EXPECT_EQ(guided_run(1, 4, 8, 2), 2);
}

// Guided runs: every item once, in ascending runs that tile [0, n), each at most the chunk and
// a multiple of the granule (but the one that ends at n), never longer than the one before, the
// last one a single granule (with two or more threads).
TEST(ThreadPool, GuidedRunsCoverEveryItemOnceAndShrinkToAGranule) {
  for (const int nt : {1, 2, 3})
    for (const int64_t n : {0, 1, 2, 7, 64, 1001})
      for (const int64_t chunk : {1, 3, 64})
        for (const int64_t granule : {1, 2}) {
          std::mutex mu;
          std::vector<std::pair<int64_t, int64_t>> runs;
          std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
          parallel_for_guided_runs_in<NoScope>(0, n, nt, chunk, granule, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) hits[size_t(i)].fetch_add(1);
            std::lock_guard lock(mu);
            runs.emplace_back(b, e);
          });
          const std::string at = "n=" + std::to_string(n) + " nt=" + std::to_string(nt) + " chunk=" +
                                 std::to_string(chunk) + " granule=" + std::to_string(granule);
          for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << at << " i=" << i;
          std::sort(runs.begin(), runs.end());
          const int64_t cap = (std::max(chunk, granule) + granule - 1) / granule * granule;
          int64_t end = 0, prev = cap;
          for (const auto& [b, e] : runs) {
            ASSERT_EQ(b, end) << at;
            ASSERT_GT(e, b) << at;
            ASSERT_LE(e - b, prev) << at << " run at " << b;
            if (e != n) {
              ASSERT_EQ((e - b) % granule, 0) << at << " run at " << b;
            }
            prev = e - b;
            end = e;
          }
          ASSERT_EQ(end, n) << at;
          if (nt > 1 && n > granule) {
            EXPECT_LE(runs.back().second - runs.back().first, granule) << at;
          }
        }
}

// Split runs: every item once, each run on a granule (its end too, but at n), and each
// thread's own runs one ascending stream: a run that follows another of the same thread starts
// where it ended, or else was taken from the back of another range.
TEST(ThreadPool, SplitRunsCoverEveryItemOnceAsOneStreamPerThread) {
  for (const int nt : {1, 2, 3, 5})
    for (const int64_t n : {0, 1, 2, 7, 64, 1001})
      for (const int64_t granule : {1, 2})
        for (const int64_t max_run : {int64_t(3), std::numeric_limits<int64_t>::max()}) {
        std::mutex mu;
        std::vector<std::tuple<std::thread::id, int64_t, int64_t>> runs;  // (in call order)
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        parallel_for_split_runs_in<NoScope>(
            0, n, nt, granule,
            [&](int64_t b, int64_t e) {
              for (int64_t i = b; i < e; ++i) hits[size_t(i)].fetch_add(1);
              std::lock_guard lock(mu);
              runs.emplace_back(std::this_thread::get_id(), b, e);
            },
            max_run);
        const std::string at = "n=" + std::to_string(n) + " nt=" + std::to_string(nt) + " granule=" + std::to_string(granule) +
                               " max_run=" + std::to_string(max_run);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << at << " i=" << i;
        std::set<std::thread::id> threads;
        for (const auto& [id, b, e] : runs) {
          threads.insert(id);
          ASSERT_GT(e, b) << at;
          ASSERT_EQ(b % granule, 0) << at << " run at " << b;
          if (max_run < n) {
            ASSERT_LE(e - b, (max_run + granule - 1) / granule * granule) << at << " run at " << b;
          }
          if (e != n) {
            ASSERT_EQ(e % granule, 0) << at << " run at " << b;
          }
        }
        EXPECT_LE(int64_t(threads.size()), std::max<int64_t>(1, std::min<int64_t>(nt, n / granule))) << at;
      }
}

// A thread slowed down on its range: the others, their ranges done, take its items from the
// back, and its own runs stay one ascending stream from the range's front.
TEST(ThreadPool, SplitRunsStealFromTheBackOfASlowThreadsRange) {
  const int64_t n = 40;
  std::mutex mu;
  std::vector<std::tuple<std::thread::id, int64_t, int64_t>> runs;
  parallel_for_split_runs_in<NoScope>(0, n, 2, 1, [&](int64_t b, int64_t e) {
    {
      std::lock_guard lock(mu);
      runs.emplace_back(std::this_thread::get_id(), b, e);  // (in the order the runs start)
    }
    if (b < n / 2) std::this_thread::sleep_for(std::chrono::milliseconds(3 * (e - b)));  // (range 0 is slow)
  });
  std::set<std::thread::id> in_range0;
  std::thread::id owner;  // (the thread that took item 0)
  for (const auto& [id, b, e] : runs)
    if (b == 0) owner = id;
  int64_t owner_end = -1;
  for (const auto& [id, b, e] : runs) {
    if (b >= n / 2) continue;
    in_range0.insert(id);
    if (id != owner) continue;
    EXPECT_EQ(b, std::max<int64_t>(0, owner_end)) << "the owner's runs: one ascending stream from 0";
    owner_end = e;
  }
  EXPECT_EQ(in_range0.size(), 2u) << "the other thread took some of range 0";
  for (const auto& [id, b, e] : runs)
    if (b < n / 2 && id != owner) {
      EXPECT_GE(b, owner_end) << "stolen runs lie behind the owner's";
    }
}

TEST(ThreadPool, ParallelRunsOncePerThreadOnDistinctThreads) {
  for (const int nt : {1, 2, 4}) {
    std::vector<std::atomic<int>> calls(static_cast<size_t>(nt));
    std::vector<std::thread::id> ids(static_cast<size_t>(nt));
    std::atomic<int> bad_nt{0};
    parallel(nt, [&](int t, int n) {
      if (n != nt) bad_nt.fetch_add(1);
      calls[size_t(t)].fetch_add(1);
      ids[size_t(t)] = std::this_thread::get_id();
    });
    EXPECT_EQ(bad_nt.load(), 0);
    for (int t = 0; t < nt; ++t) EXPECT_EQ(calls[size_t(t)].load(), 1) << "t=" << t;
    EXPECT_EQ(ids[0], std::this_thread::get_id());  // t = 0 is the caller
    EXPECT_EQ(std::set<std::thread::id>(ids.begin(), ids.end()).size(), size_t(nt));
  }
}

TEST(ThreadPool, NestedRegionRunsInline) {
  std::atomic<int64_t> sum{0};
  parallel_for(8, 2, 1, [&](int64_t i) {
    parallel_for(10, 2, 1, [&](int64_t j) { sum.fetch_add(i * 10 + j); });
  });
  EXPECT_EQ(sum.load(), 79 * 80 / 2);
}

TEST(ThreadPool, ExceptionReachesTheCallerAndThePoolGoesOn) {
  EXPECT_THROW(parallel_for(100, 2, 1,
                            [&](int64_t i) {
                              if (i == 77) throw std::runtime_error("item 77");
                            }),
               std::runtime_error);
  std::atomic<int> n{0};
  parallel_for(100, 2, 1, [&](int64_t) { n.fetch_add(1); });
  EXPECT_EQ(n.load(), 100);
}

TEST(ThreadPool, ConcurrentCallersEachGetTheirOwnRegion) {
  std::atomic<int> errors{0};
  auto caller = [&](int seed) {
    for (int r = 0; r < 200; ++r) {
      const int64_t n = 1 + (seed * 31 + r * 17) % 300;
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      parallel_for(n, 2 + r % 2, 1 + r % 5, [&](int64_t i) { hits[size_t(i)].fetch_add(1); });
      for (auto& h : hits) errors += h.load() != 1;
    }
  };
  std::thread a(caller, 1), b(caller, 2);
  a.join();
  b.join();
  EXPECT_EQ(errors.load(), 0);
}

TEST(ThreadPool, RegionsAfterTheWorkersSlept) {
  for (int r = 0; r < 5; ++r) {
    std::this_thread::sleep_for(std::chrono::microseconds(kSpinUs * 3));
    std::atomic<int> n{0};
    parallel(3, [&](int, int) { n.fetch_add(1); });
    EXPECT_EQ(n.load(), 3);
  }
}

}  // namespace
}  // namespace ft::cpu
