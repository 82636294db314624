// fusekit internal: splitting work over threads. The split only decides which thread computes an
// element, never how, so results do not depend on the thread count.
#ifndef FUSEKIT_COMMON_PARALLEL_H_
#define FUSEKIT_COMMON_PARALLEL_H_

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace fusekit {

// Calls fn(begin, end) on contiguous, disjoint chunks covering [0, n), on up to `threads`
// threads, with at least `grain` items per chunk. Runs inline when one chunk is enough.
template <typename Fn>
void parallel_for(int64_t n, int threads, int64_t grain, Fn &&fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t max_chunks = (n + grain - 1) / grain;
  const int nt = static_cast<int>(std::clamp<int64_t>(threads, 1, max_chunks));
  if (nt == 1) {
    fn(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    const int64_t t = omp_get_thread_num();
    const int64_t team = omp_get_num_threads();
    const int64_t begin = n * t / team;
    const int64_t end = n * (t + 1) / team;
    if (begin < end) fn(begin, end);
  }
}

}  // namespace fusekit

#endif  // FUSEKIT_COMMON_PARALLEL_H_
