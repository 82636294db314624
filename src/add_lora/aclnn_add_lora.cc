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
  return guard_c_entry(kOp, ACLNN_ERR_INNER, [&]() -> aclnnStatus {
    TensorView vy, vx, vb, vi, va, vo;
    Status st = phase_one_views(kOp,
                                {{y, "y", &vy},
                                 {x, "x", &vx},
                                 {weightB, "weightB", &vb},
                                 {indices, "indices", &vi},
                                 {weightAOptional, "weightAOptional", &va, true},
                                 {out, "out", &vo}},
                                workspaceSize, executor);
    PlanStateOf<AddLoraOp> plan;
    const AddLoraTensors tensors{vy, vx, vb, vi, va, vo};
    if (st.ok()) {
      AddLoraOptions options;
      options.layer_idx = layerIdx;
      options.scale = scale;
      options.y_offset = yOffset;
      options.y_slice_size = ySliceSize;
      st = plan_phase_one<AddLoraOp>(tensors, options, &plan);
    }
    std::unique_ptr<aclOpExecutor> ex;
    if (st.ok())
      ex = std::make_unique<PlanExecutor<AddLoraOp>>(kOp, plan, tensors, NoScalars{}, nullptr);
    return finish_phase_one(kOp, st, std::move(ex), workspaceSize, executor);
  });
}

extern "C" aclnnStatus aclnnAddLora(void *workspace, uint64_t workspaceSize,
                                    aclOpExecutor *executor, aclrtStream stream) {
  return guard_c_entry(kOp, ACLNN_ERR_INNER, [&]() -> aclnnStatus {
    return run_phase_two(kOp, workspace, workspaceSize, executor, stream);
  });
}
