#include "runtime/acl_tensor.h"

#include <limits>
#include <utility>

#include "common/c_entry.h"
#include "common/last_message.h"
#include "common/str_cat.h"
#include "runtime/device_query.h"

namespace fusekit {

DType dtype_from_acl(int t) {
  constexpr std::pair<int, DType> kDTypes[] = {
      {ACL_FLOAT, DType::kFloat32}, {ACL_FLOAT16, DType::kFloat16}, {ACL_BF16, DType::kBFloat16},
      {ACL_INT32, DType::kInt32},   {ACL_INT64, DType::kInt64},     {ACL_UINT8, DType::kUInt8}};
  for (const auto &[acl, dtype] : kDTypes) {
    if (acl == t) return dtype;
  }
  return DType::kOther;
}

Status view_of(const aclTensor *t, const char *op, const char *arg, TensorView *out,
               bool optional) {
  *out = TensorView();
  if (t == nullptr) {
    if (optional) return Status::Ok();
    return Status::NullPointer(str_cat(op, ": ", arg, " is null"));
  }
  if (t->magic != aclTensor::kMagic) {
    return Status::Invalid(str_cat(op, ": ", arg, " is not a live aclTensor"));
  }
  if (t->format != ACL_FORMAT_ND && t->format != ACL_FORMAT_NCHW && t->format != ACL_FORMAT_NHWC) {
    return Status::Invalid(
        str_cat(op, ": ", arg, " has format ", t->format, "; only ND (2) is supported"));
  }
  *out = t->view;
  return Status::Ok();
}

}  // namespace fusekit

extern "C" size_t aclDataTypeSize(aclDataType dataType) {
  switch (dataType) {
    case ACL_FLOAT:
    case ACL_INT32:
    case ACL_UINT32:
      return 4;
    case ACL_FLOAT16:
    case ACL_BF16:
    case ACL_INT16:
    case ACL_UINT16:
      return 2;
    case ACL_INT64:
    case ACL_UINT64:
    case ACL_DOUBLE:
      return 8;
    case ACL_INT8:
    case ACL_UINT8:
    case ACL_BOOL:
      return 1;
    default:
      return 0;
  }
}

using fusekit::set_last_message;
using fusekit::str_cat;

extern "C" aclTensor *aclCreateTensor(const int64_t *viewDims, uint64_t viewDimsNum,
                                      aclDataType dataType, const int64_t *stride, int64_t offset,
                                      aclFormat format, const int64_t *storageDims,
                                      uint64_t storageDimsNum, void *tensorData) {
  return fusekit::guard_c_entry(
      "aclCreateTensor", static_cast<aclTensor *>(nullptr), [&]() -> aclTensor * {
        constexpr int kMax = fusekit::TensorView::kMaxDims;
        if (viewDimsNum > static_cast<uint64_t>(kMax) ||
            storageDimsNum > static_cast<uint64_t>(kMax)) {
          set_last_message(str_cat("aclCreateTensor: viewDimsNum = ", viewDimsNum,
                                   ", storageDimsNum = ", storageDimsNum, " (at most ", kMax, ")"));
          return nullptr;
        }
        if (viewDimsNum > 0 && viewDims == nullptr) {
          set_last_message("aclCreateTensor: viewDims is null");
          return nullptr;
        }
        if (offset < 0) {
          set_last_message(str_cat("aclCreateTensor: offset = ", offset, " is negative"));
          return nullptr;
        }
        const int dtype_bits = fusekit::enum_bits(dataType);
        const fusekit::DType dt = fusekit::dtype_from_acl(dtype_bits);
        auto *t = new aclTensor();
        t->acl_dtype = dtype_bits;
        t->format = fusekit::enum_bits(format);
        t->offset = offset;
        t->storage = tensorData;
        t->storage_ndim = static_cast<int>(storageDimsNum);
        int64_t storage_elems = 1;
        bool overflow = false;
        for (uint64_t i = 0; i < storageDimsNum && storageDims != nullptr; ++i) {
          t->storage_shape[i] = storageDims[i];
          if (storageDims[i] < 0 ||
              __builtin_mul_overflow(storage_elems, storageDims[i], &storage_elems)) {
            overflow = true;
          }
        }
        fusekit::TensorView &v = t->view;
        v.dtype = dt;
        v.ndim = static_cast<int>(viewDimsNum);
        int64_t contiguous_stride = 1;
        int64_t max_reach = 0, last_element = 0;
        bool empty = false;
        for (int i = v.ndim - 1; i >= 0; --i) {
          if (viewDims[i] < 0) overflow = true;
          v.shape[i] = viewDims[i];
          v.strides[i] = stride != nullptr ? stride[i] : contiguous_stride;
          if (v.strides[i] < 0) overflow = true;  // negative strides are not part of this API
          if (viewDims[i] == 0) empty = true;
          int64_t reach = 0;
          if (viewDims[i] > 0 && (__builtin_mul_overflow(viewDims[i] - 1, v.strides[i], &reach) ||
                                  __builtin_add_overflow(max_reach, reach, &max_reach))) {
            overflow = true;
          }
          if (__builtin_mul_overflow(contiguous_stride, viewDims[i] > 0 ? viewDims[i] : 1,
                                     &contiguous_stride)) {
            overflow = true;
          }
        }
        if (overflow) {
          set_last_message("aclCreateTensor: negative or overflowing sizes or strides");
          delete t;
          return nullptr;
        }
        if (storageDims != nullptr && storageDimsNum > 0 && !empty &&
            (__builtin_add_overflow(offset, max_reach, &last_element) ||
             last_element >= storage_elems)) {
          set_last_message(str_cat(
              "aclCreateTensor: the view (offset ", offset, ", farthest element ", max_reach,
              " past it) reaches past its storage of ", storage_elems, " elements"));
          delete t;
          return nullptr;
        }
        const size_t esize = fusekit::dtype_size(dt) != 0 ? fusekit::dtype_size(dt) : 1;
        int64_t offset_bytes = 0;
        if (__builtin_mul_overflow(offset, static_cast<int64_t>(esize), &offset_bytes)) {
          set_last_message(str_cat("aclCreateTensor: offset = ", offset, " elements of ", esize,
                                   " bytes overflows 64-bit sizes"));
          delete t;
          return nullptr;
        }
        v.data = tensorData == nullptr ? nullptr : static_cast<char *>(tensorData) + offset_bytes;
        v.device = fusekit::device_of_pointer(tensorData);
        return t;
      });
}

extern "C" aclnnStatus aclDestroyTensor(const aclTensor *tensor) {
  if (tensor == nullptr) return ACLNN_SUCCESS;
  if (tensor->magic != aclTensor::kMagic) {
    set_last_message("aclDestroyTensor: not a live aclTensor");
    return ACLNN_ERR_PARAM_INVALID;
  }
  const_cast<aclTensor *>(tensor)->magic = 0;
  delete tensor;
  return ACLNN_SUCCESS;
}
