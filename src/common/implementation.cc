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
  if (same_layout(planned, bound)) return Status::Ok();
  return Status::Invalid(str_cat(op, ": ", name, " is ", layout_string(bound),
                                 " but the plan was made for ", layout_string(planned),
                                 "; make a new plan for a new layout"));
}

}  // namespace fusekit
