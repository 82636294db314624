// fusekit: host memory for the tables and optimizer states the operators step.
//
// An operator that reads rows at random (LazyAdam, AddLora's gathers) misses the TLB on almost
// every row when its tables sit on 4 KiB pages: at the seed shape LazyAdam runs about twice as
// fast on 2 MiB pages. allocate_host(bytes, /*huge_pages=*/true) gives memory aligned to 2 MiB,
// rounded up to whole 2 MiB pages and advised with MADV_HUGEPAGE, so that with
// /sys/kernel/mm/transparent_hugepage/enabled set to "always" or "madvise" the kernel backs it
// with huge pages when it is first touched (with "never" it stays on 4 KiB pages). Allocations
// below 2 MiB, and huge_pages=false, are 64-byte aligned.
#ifndef FUSEKIT_MEMORY_H_
#define FUSEKIT_MEMORY_H_

#include <cstddef>
#include <cstdint>

#include "fusekit/export.h"

namespace fusekit {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// Null when the memory cannot be had (or bytes == 0). Release with free_host.
FUSEKIT_API void *allocate_host(size_t bytes, bool huge_pages);
FUSEKIT_API void free_host(void *p);

// Asks the kernel to back the whole 2 MiB pages inside [p, p + bytes) with huge pages where the
// memory already is: MADV_HUGEPAGE, then MADV_COLLAPSE (Linux 6.1+), which replaces the small
// pages by huge ones in place. The addresses and the contents stay: memory that other code holds
// pointers to (a parameter FSDP or DeepSpeed keeps references to) can be advised safely. Returns
// the bytes of the range that are whole huge pages (advised); 0 when none is inside it, or madvise
// is refused (not Linux, or "never" in transparent_hugepage/enabled for MADV_HUGEPAGE). Where
// MADV_COLLAPSE is missing (kernels before 6.1) only the advice is given: khugepaged collapses the
// pages later, at its own pace.
FUSEKIT_API size_t advise_huge_pages_in_place(void *p, size_t bytes);

// How many bytes of [p, p + bytes) the kernel backs with huge pages right now (the AnonHugePages
// of /proc/self/smaps over the mappings the range touches, clipped to the range); -1 when that
// cannot be read (not Linux, no /proc).
FUSEKIT_API int64_t huge_page_backed_bytes(const void *p, size_t bytes);

}  // namespace fusekit

#endif  // FUSEKIT_MEMORY_H_
