// fusekit internal: the one way operators split work over threads.
//
// parallel_chunks(chunks, threads, fn) calls fn(chunk, worker) once for every chunk in
// [0, chunks), on the calling thread and up to threads - 1 helper threads. Chunks are claimed one
// at a time from a shared counter, so a thread that the OS deschedules leaves the chunks it has not
// claimed to the others, and the call returns as soon as every chunk is done: it never waits for a
// helper that has not started (only for a chunk that a preempted helper is in the middle of).
// `worker` is in [0, threads) and is unique among the threads running at once: the index of
// per-thread scratch. Which thread runs a chunk must never change what the chunk computes, so that
// results are bitwise identical for every thread count.
//
// The helpers belong to the calling thread (each thread that calls gets its own, created on first
// use): two threads may run operators at the same time. A call from inside a chunk runs inline.
// Helpers spin for a short while after a job (FUSEKIT_SPIN_US, default 50 microseconds), then sleep
// on a futex; see docs/architecture.md, "Threads".
#ifndef FUSEKIT_COMMON_PARALLEL_H_
#define FUSEKIT_COMMON_PARALLEL_H_

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace fusekit {

using ChunkFn = void (*)(void *ctx, int64_t chunk, int worker);

// The type-erased entry point.
void parallel_chunks_raw(int64_t chunks, int threads, ChunkFn fn, void *ctx);

template <typename Fn>
void parallel_chunks(int64_t chunks, int threads, Fn &&fn) {
  if (chunks <= 0) return;
  using F = std::remove_reference_t<Fn>;
  parallel_chunks_raw(
      chunks, threads,
      [](void *ctx, int64_t chunk, int worker) { (*static_cast<F *>(ctx))(chunk, worker); },
      const_cast<void *>(static_cast<const void *>(&fn)));
}

// Chunks of at least `grain` items over [0, n): about 4 per thread so that a slow thread's share
// is taken over, never smaller than grain. fn(begin, end, worker).
inline int64_t chunk_size_for(int64_t n, int threads, int64_t grain) {
  grain = std::max<int64_t>(grain, 1);
  const int64_t per =
      (n + int64_t{4} * std::max(threads, 1) - 1) / (int64_t{4} * std::max(threads, 1));
  return std::max(grain, per);
}

template <typename Fn>
void parallel_for(int64_t n, int threads, int64_t grain, Fn &&fn) {
  if (n <= 0) return;
  const int64_t size = chunk_size_for(n, threads, grain);
  const int64_t chunks = (n + size - 1) / size;
  parallel_chunks(chunks, threads, [&](int64_t c, int worker) {
    const int64_t b = c * size;
    if constexpr (std::is_invocable_v<Fn &, int64_t, int64_t, int>) {
      fn(b, std::min(n, b + size), worker);
    } else {
      fn(b, std::min(n, b + size));
    }
  });
}

// The number of helper threads started by this thread so far (tests).
int parallel_helpers_started();

}  // namespace fusekit

#endif  // FUSEKIT_COMMON_PARALLEL_H_
