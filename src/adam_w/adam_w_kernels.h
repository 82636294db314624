// fusekit internal: AdamW's kernels. A kernel is a pure function: it neither allocates nor reports
// errors; the run has checked everything before it runs. The Adam update itself is
// common/adam_update.h (shared with ApplyAdamWQuant).
#ifndef FUSEKIT_ADAM_W_ADAM_W_KERNELS_H_
#define FUSEKIT_ADAM_W_ADAM_W_KERNELS_H_

#include <cstdint>

#include "common/adam_update.h"
#include "fusekit/dtype.h"

namespace fusekit {

// Elements [begin, end) of contiguous var, grad (dtype), m and v (float32).
struct AdamWArgs : AdamScalars {
  void *var;         // float, float16_t or bfloat16_t (dtype)
  const void *grad;  // same type
  float *m;
  float *v;
  DType dtype;
};

// Returns the number of elements skipped: left unchanged because their new m, v or var (as stored)
// would be NaN or Inf (common/adam_update.h; a NaN or Inf gradient is one case).
using AdamWElementsFn = int64_t (*)(const AdamWArgs &args, int64_t begin, int64_t end);

// The plain scalar kernel (adam_w_reference.cc).
int64_t adam_w_elements_reference(const AdamWArgs &args, int64_t begin, int64_t end);
// The Highway kernel (adam_w_hwy.cc), dispatched to the best target Highway built that this CPU
// runs; looked up on each call so that tests can switch targets.
AdamWElementsFn adam_w_elements_hwy();

}  // namespace fusekit

#endif  // FUSEKIT_ADAM_W_ADAM_W_KERNELS_H_
