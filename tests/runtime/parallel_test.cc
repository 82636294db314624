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

// Spins (yielding) until pred() holds or the hang guard runs out; whether pred() held.
template <class Pred>
bool wait_until(Pred pred, std::chrono::seconds guard) {
  const auto give_up = std::chrono::steady_clock::now() + guard;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::yield();
  }
  return true;
}

TEST(Parallel, AChunkHeldByAHelperDoesNotHoldBackTheOthers) {
  // By construction, not by time: the helper's first chunk does not return until every other
  // chunk is done, so the call can only complete if the caller takes all the others (with a static
  // share, the helper's other chunks would wait behind it: the guard runs out and the counts show
  // it). The caller's first chunk waits for the helper to be in a chunk, so that a round has one;
  // a round in which the helper never came (the OS did not run it) proves nothing and is repeated.
  // The guards only bound a failing run; no outcome depends on how long anything takes.
  constexpr int kChunks = 40;
  const std::thread::id caller = std::this_thread::get_id();
  int rounds_with_helper = 0;
  for (int round = 0; round < 50 && rounds_with_helper < 3; ++round) {
    std::atomic<int> by_caller{0}, by_helper{0}, done{0};
    std::atomic<bool> helper_waited_out{false};
    parallel_chunks(kChunks, 2, [&](int64_t, int) {
      if (std::this_thread::get_id() == caller) {
        if (by_caller.fetch_add(1) == 0) {
          wait_until([&] { return by_helper.load() > 0; }, std::chrono::seconds(2));
        }
      } else if (by_helper.fetch_add(1) == 0) {
        if (!wait_until([&] { return done.load() == kChunks - 1; }, std::chrono::seconds(30))) {
          helper_waited_out = true;
        }
      }
      done.fetch_add(1);
    });
    SCOPED_TRACE(testing::Message() << "round " << round);
    ASSERT_EQ(done.load(), kChunks);
    ASSERT_EQ(by_caller.load() + by_helper.load(), kChunks);
    if (by_helper.load() == 0) continue;
    ++rounds_with_helper;
    EXPECT_FALSE(helper_waited_out.load());
    EXPECT_EQ(by_helper.load(), 1);  // it held its one chunk until the others were done
    EXPECT_EQ(by_caller.load(), kChunks - 1);
  }
  EXPECT_GE(rounds_with_helper, 1) << "the helper never took a chunk in 50 rounds";
}

TEST(Parallel, EveryChunkOnceWithHelpersThatStartLateOrNotAtAll) {
  // Many rounds, with helpers that start late or not at all: always every chunk exactly once.
  for (int rep = 0; rep < 2000; ++rep) {
    std::atomic<int> count{0};
    parallel_chunks(3, 4, [&](int64_t, int) { count.fetch_add(1); });
    ASSERT_EQ(count.load(), 3);
  }
}

}  // namespace
