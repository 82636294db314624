// fusekit internal: one switch over the float dtypes a kernel stores (float32, bfloat16, float16),
// for kernels written as a template over the storage type.
#ifndef FUSEKIT_COMMON_FLOAT_TYPES_H_
#define FUSEKIT_COMMON_FLOAT_TYPES_H_

#include "fusekit/float16.h"
#include "fusekit/tensor.h"

namespace fusekit {

// f.template operator()<T>() with T the storage type of `dtype`: float16_t, bfloat16_t, or float
// (any other dtype; the problem has checked it). Write f as [&]<class T>() { ... }.
template <class F>
decltype(auto) with_float_type(DType dtype, F &&f) {
  switch (dtype) {
    case DType::kFloat16:
      return f.template operator()<float16_t>();
    case DType::kBFloat16:
      return f.template operator()<bfloat16_t>();
    default:
      return f.template operator()<float>();
  }
}

}  // namespace fusekit

#endif  // FUSEKIT_COMMON_FLOAT_TYPES_H_
