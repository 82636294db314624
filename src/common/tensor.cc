#include "fusekit/tensor.h"

#include <algorithm>

namespace fusekit {

TensorView TensorView::contiguous(void *data, DType dtype, const int64_t *shape, int ndim) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.ndim = std::clamp(ndim, 0, kMaxDims);
  int64_t s = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.strides[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return t;
}

TensorView TensorView::contiguous(void *data, DType dtype, std::initializer_list<int64_t> shape) {
  return contiguous(data, dtype, shape.begin(), static_cast<int>(shape.size()));
}

TensorView TensorView::strided(void *data, DType dtype, std::initializer_list<int64_t> shape,
                               std::initializer_list<int64_t> strides) {
  TensorView t = contiguous(data, dtype, shape);
  int i = 0;
  for (int64_t s : strides) {
    if (i < t.ndim) t.strides[i++] = s;
  }
  return t;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

bool TensorView::is_contiguous() const {
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != s) return false;
    s *= shape[i];
  }
  return true;
}

bool TensorView::inner_contiguous() const {
  return ndim == 0 || shape[ndim - 1] <= 1 || strides[ndim - 1] == 1;
}

namespace {
std::string list_string(const int64_t *v, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  return s + "]";
}
}  // namespace

std::string TensorView::shape_string() const {
  return list_string(shape, ndim);
}

std::string TensorView::strides_string() const {
  return list_string(strides, ndim);
}

void TensorView::byte_range(uintptr_t *first, uintptr_t *last) const {
  const int64_t n = numel();
  if (n == 0 || data == nullptr) {
    *first = *last = 0;
    return;
  }
  int64_t lo = 0, hi = 0;  // element offsets reachable from data
  for (int i = 0; i < ndim; ++i) {
    const int64_t span = (shape[i] - 1) * strides[i];
    if (span < 0)
      lo += span;
    else
      hi += span;
  }
  const auto base = reinterpret_cast<uintptr_t>(data);
  const auto esize = static_cast<int64_t>(dtype_size(dtype));
  *first = base + static_cast<uintptr_t>(lo * esize);
  *last = base + static_cast<uintptr_t>((hi + 1) * esize);
}

bool TensorView::overlaps(const TensorView &other) const {
  uintptr_t a0, a1, b0, b1;
  byte_range(&a0, &a1);
  other.byte_range(&b0, &b1);
  if (a0 == a1 || b0 == b1) return false;
  if (!(a0 < b1 && b0 < a1)) return false;
  // Interleaved tables: two 2-D views with the same row stride and contiguous rows share an
  // element only if their column ranges meet modulo the row stride.
  const auto es = static_cast<int64_t>(dtype_size(dtype));
  if (ndim == 2 && other.ndim == 2 && es != 0 &&
      es == static_cast<int64_t>(dtype_size(other.dtype)) && inner_contiguous() &&
      other.inner_contiguous() && strides[0] == other.strides[0] && strides[0] >= shape[1] &&
      strides[0] >= other.shape[1] && strides[0] > 0) {
    // A row stride whose bytes overflow 64 bits belongs to a view of a single row (no storage
    // reaches a second one: aclCreateTensor and the operators' checks refuse it); for two single
    // rows, contiguous, the byte ranges above already tell.
    int64_t row_bytes = 0;
    if (__builtin_mul_overflow(strides[0], es, &row_bytes)) return true;
    const int64_t diff = static_cast<int64_t>(reinterpret_cast<uintptr_t>(other.data) -
                                              reinterpret_cast<uintptr_t>(data));
    const int64_t delta = ((diff % row_bytes) + row_bytes) % row_bytes;
    return delta < shape[1] * es || delta + other.shape[1] * es > row_bytes;
  }
  return true;
}

}  // namespace fusekit
