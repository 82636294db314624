// fusekit: host allocations for tables and states (fusekit/memory.h).
#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "fusekit/memory.h"

namespace fusekit {

void *allocate_host(size_t bytes, bool huge_pages) {
  if (bytes == 0) return nullptr;
  void *p = nullptr;
  if (huge_pages && bytes >= kHugePageBytes) {
    if (bytes > SIZE_MAX - kHugePageBytes) return nullptr;
    // Whole huge pages, aligned to one, advised before the first touch: the faults then take
    // huge pages (advisory: where madvise fails the memory is still good, on small pages).
    const size_t rounded = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    if (posix_memalign(&p, kHugePageBytes, rounded) != 0) return nullptr;
#ifdef MADV_HUGEPAGE
    madvise(p, rounded, MADV_HUGEPAGE);
#endif
    return p;
  }
  if (bytes > SIZE_MAX - 64) return nullptr;
  const size_t rounded = (bytes + 63) / 64 * 64;
  if (posix_memalign(&p, 64, rounded) != 0) return nullptr;
  return p;
}

void free_host(void *p) {
  std::free(p);
}

size_t advise_huge_pages_in_place(void *p, size_t bytes) {
  const auto begin = reinterpret_cast<uintptr_t>(p);
  if (p == nullptr || bytes < kHugePageBytes || begin > UINTPTR_MAX - bytes) return 0;
  const uintptr_t first = (begin + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  const uintptr_t last = (begin + bytes) / kHugePageBytes * kHugePageBytes;
  if (last <= first) return 0;
  const size_t len = last - first;
#ifdef MADV_HUGEPAGE
  if (madvise(reinterpret_cast<void *>(first), len, MADV_HUGEPAGE) != 0) return 0;
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1; older kernels refuse it (EINVAL): the advice stays
#endif
  madvise(reinterpret_cast<void *>(first), len, MADV_COLLAPSE);
  return len;
#else
  return 0;
#endif
}

int64_t huge_page_backed_bytes(const void *p, size_t bytes) {
  std::ifstream smaps("/proc/self/smaps");
  if (!smaps) return -1;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p), hi = lo + bytes;
  int64_t total = 0;
  bool in_range = false;
  uintptr_t map_lo = 0, map_hi = 0;
  std::string line;
  while (std::getline(smaps, line)) {
    unsigned long a = 0, b = 0;
    // A mapping's header line: "start-end perms offset dev inode path".
    if (std::sscanf(line.c_str(), "%lx-%lx ", &a, &b) == 2 && line.find('-') < line.find(' ')) {
      map_lo = a;
      map_hi = b;
      in_range = map_lo < hi && lo < map_hi;
      continue;
    }
    if (!in_range || line.rfind("AnonHugePages:", 0) != 0) continue;
    long long kb = 0;
    if (std::sscanf(line.c_str() + std::strlen("AnonHugePages:"), "%lld", &kb) != 1) continue;
    // The count is per mapping: clip it to the part of the mapping the range covers.
    const uintptr_t clip_lo = map_lo > lo ? map_lo : lo, clip_hi = map_hi < hi ? map_hi : hi;
    const auto huge = static_cast<int64_t>(kb) * 1024;
    const auto covered = static_cast<int64_t>(clip_hi - clip_lo);
    total += huge < covered ? huge : covered;
  }
  return total;
}

}  // namespace fusekit
