// aclnnAddLora: the aclnn face over fusekit::AddLora.
#include "aclnnop/aclnn_add_lora.h"

#include <memory>

#include "common/c_entry.h"
#include "common/str_cat.h"
#include "fusekit/add_lora.h"
#include "runtime/acl_tensor.h"
#include "runtime/executor.h"

namespace fusekit {
namespace {

constexpr const char *kOp = "aclnnAddLora";

class AddLoraExecutor final : public aclOpExecutor {
 public:
  AddLoraExecutor(const AddLora &plan, const AddLoraTensors &tensors)
      : aclOpExecutor(kOp), plan_(plan), tensors_(tensors) {}
  uint64_t workspace_size() const override { return plan_.workspace_size(); }
  Status execute(void *workspace, uint64_t workspace_size, aclrtStream stream,
                 std::string * /*warning*/) override {
    return with_aclnn_name(plan_.run(tensors_, workspace, workspace_size, nullptr, stream),
                           "AddLora");
  }

 private:
  AddLora plan_;
  AddLoraTensors tensors_;
};

}  // namespace
}  // namespace fusekit

using namespace fusekit;

extern "C" aclnnStatus aclnnAddLoraGetWorkspaceSize(
    const aclTensor *y, const aclTensor *x, const aclTensor *weightB, const aclTensor *indices,
    const aclTensor *weightAOptional, int64_t layerIdx, double scale, int64_t yOffset,
    int64_t ySliceSize, const aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor) {
  return guard_c_entry(kOp, ACLNN_ERR_INNER, [&]() -> aclnnStatus {
    TensorView vy, vx, vb, vi, va, vo;
    Status st = view_of(y, kOp, "y", &vy);
    if (st.ok()) st = view_of(x, kOp, "x", &vx);
    if (st.ok()) st = view_of(weightB, kOp, "weightB", &vb);
    if (st.ok()) st = view_of(indices, kOp, "indices", &vi);
    if (st.ok()) st = view_of(weightAOptional, kOp, "weightAOptional", &va, /*optional=*/true);
    if (st.ok()) st = view_of(out, kOp, "out", &vo);
    if (st.ok() && workspaceSize == nullptr)
      st = Status::NullPointer(str_cat(kOp, ": workspaceSize is null"));
    if (st.ok() && executor == nullptr)
      st = Status::NullPointer(str_cat(kOp, ": executor is null"));
    AddLora plan;
    const AddLoraTensors tensors{vy, vx, vb, vi, va, vo};
    if (st.ok()) {
      AddLoraOptions options;
      options.layer_idx = layerIdx;
      options.scale = scale;
      options.y_offset = yOffset;
      options.y_slice_size = ySliceSize;
      AddLoraProblem problem;
      st = AddLoraProblem::make(tensors, options, &problem);
      if (st.ok()) st = problem.check(tensors);  // phase one refuses what phase two would
      if (st.ok()) st = AddLora::plan(problem, options, &plan);
      st = with_aclnn_name(st, "AddLora");
    }
    std::unique_ptr<aclOpExecutor> ex;
    if (st.ok()) ex = std::make_unique<AddLoraExecutor>(plan, tensors);
    return finish_phase_one(kOp, st, std::move(ex), workspaceSize, executor);
  });
}

extern "C" aclnnStatus aclnnAddLora(void *workspace, uint64_t workspaceSize,
                                    aclOpExecutor *executor, aclrtStream stream) {
  return guard_c_entry(kOp, ACLNN_ERR_INNER, [&]() -> aclnnStatus {
    return run_phase_two(kOp, workspace, workspaceSize, executor, stream);
  });
}
