// fusekit: the number of worker threads the CPU kernels use.
#ifndef FUSEKIT_THREADING_H_
#define FUSEKIT_THREADING_H_

#include "fusekit/export.h"

namespace fusekit {

// Sets the thread count for every later call from any thread. n <= 0 restores the default, which
// is OMP_NUM_THREADS if set (read as OpenMP reads it; the library itself does not use OpenMP), else
// the number of CPUs this process may run on. Results never depend on
// the thread count: every output element is computed by one thread in a fixed order.
FUSEKIT_API void set_num_threads(int n);
// The thread count a call made now would use.
FUSEKIT_API int num_threads();

}  // namespace fusekit

#endif  // FUSEKIT_THREADING_H_
