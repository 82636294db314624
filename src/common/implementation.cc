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

Status check_bound_tensors(const char *op, std::span<const TensorRole> roles,
                           std::span<const TensorView *const> planned,
                           std::span<const TensorView *const> bound) {
  for (size_t i = 0; i < roles.size(); ++i) {
    FUSEKIT_RETURN_IF_ERROR(check_binding(op, roles[i].name, *planned[i], *bound[i]));
    // (An optional role left out, an empty view, has no data to check: its layout matched the
    // plan's, which was made without it.)
    if (roles[i].optional && bound[i]->empty_view()) continue;
    if (bound[i]->data == nullptr && (bound[i]->numel() > 0 || roles[i].read_when_empty)) {
      return Status::NullPointer(str_cat(op, ": ", roles[i].name, " has no data"));
    }
  }
  // Each written tensor (in role order) against the written ones after it, then against every
  // input (in role order). Nothing is allocated: phase two runs this on every step.
  const auto refuse = [&](size_t a, size_t b) {
    return Status::Invalid(
        str_cat(op, ": ", roles[a].name, " and ", roles[b].name, " overlap in memory"));
  };
  for (size_t a = 0; a < roles.size(); ++a) {
    if (!roles[a].written) continue;
    for (size_t b = a + 1; b < roles.size(); ++b) {
      if (roles[b].written && bound[a]->overlaps(*bound[b])) return refuse(a, b);
    }
    for (size_t b = 0; b < roles.size(); ++b) {
      if (!roles[b].written && bound[a]->overlaps(*bound[b])) return refuse(a, b);
    }
  }
  return Status::Ok();
}

}  // namespace fusekit
