// aclnnAddLora: the aclnn face over fusekit::AddLora.
#include "aclnnop/aclnn_add_lora.h"

#include <memory>

#include "add_lora/add_lora_impl.h"
#include "common/c_entry.h"
#include "common/str_cat.h"
#include "fusekit/add_lora.h"
#include "runtime/acl_tensor.h"
#include "runtime/executor.h"

namespace fusekit {
namespace {

constexpr const char *kOp = "aclnnAddLora";

}  // namespace
}  // namespace fusekit

using namespace fusekit;

extern "C" aclnnStatus aclnnAddLoraGetWorkspaceSize(
    const aclTensor *y, const aclTensor *x, const aclTensor *weightB, const aclTensor *indices,
    const aclTensor *weightAOptional, int64_t layerIdx, double scale, int64_t yOffset,
    int64_t ySliceSize, const aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor) {
  return aclnn_phase_one<AddLoraOp>(
      kOp, {y, x, weightB, indices, weightAOptional, out}, nullptr, nullptr, workspaceSize,
      executor, [&](const TensorView &, AddLoraOptions &options, NoScalars &) {
        // CANN's indices are int32; the C++ API also takes int64.
        // (the views are made: indices is not null here)
        if (indices->view.dtype != DType::kInt32) {
          return Status::Invalid(str_cat(kOp, ": indices has dtype ",
                                         dtype_name(indices->view.dtype), "; int32 is required"));
        }
        options.layer_idx = layerIdx;
        options.scale = scale;
        options.y_offset = yOffset;
        options.y_slice_size = ySliceSize;
        return Status::Ok();
      });
}

extern "C" aclnnStatus aclnnAddLora(void *workspace, uint64_t workspaceSize,
                                    aclOpExecutor *executor, aclrtStream stream) {
  return run_phase_two(kOp, workspace, workspaceSize, executor, stream);
}
