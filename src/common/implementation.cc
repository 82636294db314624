#include "common/implementation.h"

namespace fusekit {
namespace {

std::string layout_string(const TensorView &t) {
  std::string s = str_cat(dtype_name(t.dtype), " ", t.shape_string(), " strides [");
  for (int i = 0; i < t.ndim; ++i) s += (i ? ", " : "") + std::to_string(t.strides[i]);
  return s + "] on " + device_name(t.device);
}

}  // namespace

bool same_layout(const TensorView &a, const TensorView &b) {
  if (a.dtype != b.dtype || a.ndim != b.ndim || a.device != b.device) return false;
  for (int i = 0; i < a.ndim; ++i) {
    if (a.shape[i] != b.shape[i] || (a.shape[i] > 1 && a.strides[i] != b.strides[i])) return false;
  }
  return true;
}

Status check_binding(const char *op, const char *name, const TensorView &planned,
                     const TensorView &bound) {
  if (!same_layout(planned, bound)) {
    return Status::Invalid(str_cat(op, ": ", name, " is ", layout_string(bound),
                                   " but the plan was made for ", layout_string(planned),
                                   "; make a new plan for a new layout"));
  }
  // Kernels load whole elements: a pointer that is not a multiple of the element size is refused
  // (it would be undefined behaviour, and slow where it is not).
  const size_t es = dtype_size(bound.dtype);
  const auto address = reinterpret_cast<uintptr_t>(bound.data);
  if (bound.data != nullptr && es > 1 && address % es != 0) {
    return Status::Invalid(str_cat(op, ": ", name, "'s data pointer 0x", std::hex, address,
                                   std::dec, " is not aligned to its ", es, "-byte ",
                                   dtype_name(bound.dtype), " elements"));
  }
  return Status::Ok();
}

}  // namespace fusekit
