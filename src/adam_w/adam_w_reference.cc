// AdamW, the plain scalar kernel (cpu_reference): one element at a time, the same float32
// operations in the same order as the SIMD kernel (bitwise equal). An element whose new m, v or
// var would be NaN or Inf (a non-finite gradient is one case) is left unchanged and counted.
#include "adam_w/adam_w_kernels.h"
#include "common/float_types.h"
#include "fusekit/float16.h"

namespace fusekit {
namespace {

template <typename T>
int64_t adam_w_elements(const AdamWArgs &a, int64_t begin, int64_t end) {
  auto *var = static_cast<T *>(a.var);
  const auto *grad = static_cast<const T *>(a.grad);
  int64_t skipped = 0;
  for (int64_t i = begin; i < end; ++i) {
    float m = a.m[i], v = a.v[i];
    const float w = adam_update(a, to_float(grad[i]), &m, &v, to_float(var[i]));
    if (!adam_produced_finite<T>(m, v, w)) {
      ++skipped;
      continue;
    }
    a.m[i] = m;
    a.v[i] = v;
    var[i] = from_float<T>(w);
  }
  return skipped;
}

}  // namespace

int64_t adam_w_elements_reference(const AdamWArgs &a, int64_t begin, int64_t end) {
  return with_float_type(a.dtype, [&]<class T>() { return adam_w_elements<T>(a, begin, end); });
}

}  // namespace fusekit
