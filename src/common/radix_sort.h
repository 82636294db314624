// fusekit internal: a stable LSD radix sort of 64-bit keys on a bit field, for grouping rows
// (LazyAdam's duplicate indices, AddLora's rows by adapter). Pure: all memory is the caller's.
#ifndef FUSEKIT_COMMON_RADIX_SORT_H_
#define FUSEKIT_COMMON_RADIX_SORT_H_

#include <cstddef>
#include <cstdint>

namespace fusekit {

constexpr int kRadixBits = 11;
constexpr int64_t kRadixBuckets = int64_t{1} << kRadixBits;

// The keys are cut into this many slices per thread, each one chunk of the work-sharing layer.
constexpr int kRadixSlicesPerThread = 4;

// Bytes of histogram scratch radix_sort_u64 needs for `threads` threads.
inline size_t radix_sort_scratch_bytes(int threads) {
  return static_cast<size_t>(threads < 1 ? 1 : threads) * kRadixSlicesPerThread * kRadixBuckets *
         sizeof(uint64_t);
}

// Sorts keys[0, n) stably by the field (key >> shift) & ((1 << bits) - 1), using tmp[0, n) and
// `hist` (radix_sort_scratch_bytes(threads) bytes). Returns the array that holds the result (keys
// or tmp). The output does not depend on `threads`.
// Threads are used only from `min_parallel` keys on (see radix_sort.cc for why).
uint64_t *radix_sort_u64(uint64_t *keys, uint64_t *tmp, int64_t n, int shift, int bits,
                         uint64_t *hist, int threads, int64_t min_parallel = int64_t{1} << 16);

// The number of bits needed to represent values in [0, max_value].
inline int bits_for(uint64_t max_value) {
  int b = 0;
  while (b < 64 && (max_value >> b) != 0) ++b;
  return b;
}

}  // namespace fusekit

#endif  // FUSEKIT_COMMON_RADIX_SORT_H_
