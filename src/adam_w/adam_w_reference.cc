// AdamW, the plain scalar kernel (cpu_reference): one element at a time, the same float32
// operations in the same order as the SIMD kernel (bitwise equal).
#include <cmath>

#include "adam_w/adam_w_kernels.h"
#include "fusekit/float16.h"

namespace fusekit {
namespace {

template <typename T>
int64_t adam_w_elements(const AdamWArgs &a, int64_t begin, int64_t end) {
  auto *var = static_cast<T *>(a.var);
  const auto *grad = static_cast<const T *>(a.grad);
  int64_t skipped = 0;
  for (int64_t i = begin; i < end; ++i) {
    const float gr = to_float(grad[i]);
    if (!std::isfinite(gr)) {
      ++skipped;
      continue;
    }
    var[i] = from_float<T>(adam_update(a, gr, &a.m[i], &a.v[i], to_float(var[i])));
  }
  return skipped;
}

}  // namespace

int64_t adam_w_elements_reference(const AdamWArgs &a, int64_t begin, int64_t end) {
  switch (a.dtype) {
    case DType::kFloat16:
      return adam_w_elements<float16_t>(a, begin, end);
    case DType::kBFloat16:
      return adam_w_elements<bfloat16_t>(a, begin, end);
    default:
      return adam_w_elements<float>(a, begin, end);
  }
}

}  // namespace fusekit
