// fusekit internal: what an aclTensor is on a CPU.
#ifndef FUSEKIT_RUNTIME_ACL_TENSOR_H_
#define FUSEKIT_RUNTIME_ACL_TENSOR_H_

#include <cstdint>

#include <cstring>
#include "aclnn/acl_meta.h"

#include "fusekit/status.h"
#include "fusekit/tensor.h"

struct aclTensor {
  static constexpr uint32_t kMagic = 0x7e4507a1u;
  uint32_t magic = kMagic;
  // The caller's dtype and format as integers: a C caller may pass any value, and loading an enum
  // outside its values is undefined in C++.
  int acl_dtype = ACL_DT_UNDEFINED;
  int format = ACL_FORMAT_ND;
  int64_t offset = 0;
  int storage_ndim = 0;
  int64_t storage_shape[fusekit::TensorView::kMaxDims] = {};
  void *storage = nullptr;
  fusekit::TensorView view;  // data = storage + offset (in elements)
};

namespace fusekit {

DType dtype_from_acl(int acl_data_type);

// The bits of an enum argument as an int, without loading it as the enum type.
template <typename E>
int enum_bits(const E &e) {
  int v = 0;
  std::memcpy(&v, &e, sizeof(E) < sizeof v ? sizeof(E) : sizeof v);
  return v;
}

// The view of an aclTensor argument for operator `op`. A null tensor is refused with 161001 unless
// `optional`, in which case *out is left empty. Only ND-like formats are accepted.
Status view_of(const aclTensor *t, const char *op, const char *arg, TensorView *out,
               bool optional = false);

}  // namespace fusekit

#endif  // FUSEKIT_RUNTIME_ACL_TENSOR_H_
