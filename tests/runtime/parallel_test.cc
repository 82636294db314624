// The work-sharing layer (src/common/parallel.h): every chunk runs exactly once, worker indices
// are in range and never shared by two chunks running at once, nested calls run inline, several
// calling threads work at once, and a helper that is slow (or never starts) does not hold the
// others up: its unclaimed chunks are taken over.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "common/parallel.h"

namespace {

using fusekit::parallel_chunks;
using fusekit::parallel_for;

TEST(Parallel, EveryChunkOnceWorkersInRangeAndExclusive) {
  for (int threads : {1, 2, 3, 4, 8}) {
    for (int64_t chunks : {0, 1, 2, 3, 7, 64, 1000}) {
      SCOPED_TRACE(testing::Message() << "threads=" << threads << " chunks=" << chunks);
      std::vector<std::atomic<int>> runs(static_cast<size_t>(chunks));
      std::vector<std::atomic<int>> busy(static_cast<size_t>(threads));
      std::atomic<int> bad_worker{0}, shared_worker{0};
      parallel_chunks(chunks, threads, [&](int64_t c, int worker) {
        if (worker < 0 || worker >= threads) {
          bad_worker.fetch_add(1);
          return;
        }
        if (busy[static_cast<size_t>(worker)].fetch_add(1) != 0) shared_worker.fetch_add(1);
        runs[static_cast<size_t>(c)].fetch_add(1);
        busy[static_cast<size_t>(worker)].fetch_sub(1);
      });
      EXPECT_EQ(bad_worker.load(), 0);
      EXPECT_EQ(shared_worker.load(), 0);
      for (int64_t c = 0; c < chunks; ++c) ASSERT_EQ(runs[static_cast<size_t>(c)].load(), 1) << c;
    }
  }
}

TEST(Parallel, ParallelForCoversTheRangeInDisjointPieces) {
  for (int64_t n : {1, 5, 100, 4097}) {
    for (int64_t grain : {1, 7, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      parallel_for(n, 3, grain, [&](int64_t b, int64_t e) {
        EXPECT_LT(b, e);
        EXPECT_TRUE(e - b >= grain || e == n);
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1);
    }
  }
}

TEST(Parallel, NestedCallsRunInline) {
  std::atomic<int> inner{0};
  parallel_chunks(8, 2, [&](int64_t, int outer_worker) {
    parallel_chunks(4, 2, [&](int64_t, int worker) {
      EXPECT_EQ(worker, 0);  // inline: the nested call has no helpers of its own
      (void)outer_worker;
      inner.fetch_add(1);
    });
  });
  EXPECT_EQ(inner.load(), 32);
}

TEST(Parallel, SeveralCallingThreadsAtOnce) {
  std::vector<std::thread> callers;
  std::atomic<int64_t> total{0};
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 200; ++rep) {
        parallel_chunks(16, 2, [&](int64_t c, int) { total.fetch_add(c + 1); });
      }
    });
  }
  for (auto &t : callers) t.join();
  EXPECT_EQ(total.load(), int64_t{4} * 200 * (16 * 17 / 2));
}

TEST(Parallel, ASlowChunkDoesNotStopTheOthersBeingTaken) {
  // A helper that stalls for 20 ms in its first chunk (as if preempted) holds only that chunk: the
  // caller, at 0.2 ms a chunk, takes the others meanwhile instead of waiting for a static share.
  std::atomic<int> by_caller{0}, by_helper{0};
  const std::thread::id caller = std::this_thread::get_id();
  parallel_chunks(40, 2, [&](int64_t, int) {
    if (std::this_thread::get_id() == caller) {
      by_caller.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    } else if (by_helper.fetch_add(1) == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  EXPECT_EQ(by_caller.load() + by_helper.load(), 40);
  // 39 in the usual case; a wide margin for a loaded machine.
  EXPECT_GE(by_caller.load(), 30);
  // Many rounds, with helpers that start late or not at all: always every chunk exactly once.
  for (int rep = 0; rep < 2000; ++rep) {
    std::atomic<int> count{0};
    parallel_chunks(3, 4, [&](int64_t, int) { count.fetch_add(1); });
    ASSERT_EQ(count.load(), 3);
  }
}

}  // namespace
