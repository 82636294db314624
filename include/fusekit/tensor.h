// fusekit: a non-owning view of a tensor in memory: element type, shape and strides in elements.
// The C++ API takes these; the aclnn layer builds them from aclTensor.
#ifndef FUSEKIT_TENSOR_H_
#define FUSEKIT_TENSOR_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "fusekit/device.h"
#include "fusekit/dtype.h"
#include "fusekit/export.h"

namespace fusekit {

struct TensorView {
  static constexpr int kMaxDims = 8;

  void *data = nullptr;  // the view's first element (any storage offset already applied)
  DType dtype = DType::kOther;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};  // in elements
  Device device = Device::kCpu;    // where data lives

  // A row-major contiguous view.
  FUSEKIT_API static TensorView contiguous(void *data, DType dtype,
                                           std::initializer_list<int64_t> shape);
  FUSEKIT_API static TensorView contiguous(void *data, DType dtype, const int64_t *shape, int ndim);
  // A view with explicit strides (elements).
  FUSEKIT_API static TensorView strided(void *data, DType dtype,
                                        std::initializer_list<int64_t> shape,
                                        std::initializer_list<int64_t> strides);

  template <typename T>
  static TensorView of(T *data, std::initializer_list<int64_t> shape) {
    return contiguous(const_cast<std::remove_const_t<T> *>(data),
                      dtype_of<std::remove_const_t<T>>(), shape);
  }

  bool empty_view() const { return data == nullptr && ndim == 0; }
  FUSEKIT_API int64_t numel() const;
  FUSEKIT_API bool is_contiguous() const;
  // True when the innermost dimension is contiguous (stride 1, or size <= 1): the layout the fast
  // kernels take, with any stride on the outer dimensions.
  FUSEKIT_API bool inner_contiguous() const;
  // For a 2-D view: the distance between rows, in elements.
  int64_t row_stride() const { return ndim >= 2 ? strides[ndim - 2] : shape[0]; }
  // "[2000000, 32]" for messages; the strides the same way.
  FUSEKIT_API std::string shape_string() const;
  FUSEKIT_API std::string strides_string() const;
  // The [first, last) bytes the view can touch; {0, 0} for an empty view.
  FUSEKIT_API void byte_range(uintptr_t *first, uintptr_t *last) const;
  // True when the byte ranges of two views intersect.
  FUSEKIT_API bool overlaps(const TensorView &other) const;

  template <typename T>
  T *as() const {
    return static_cast<T *>(data);
  }
};

}  // namespace fusekit

#endif  // FUSEKIT_TENSOR_H_
