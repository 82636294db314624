// aclnnApplyAdamWQuant: the aclnn face over fusekit::ApplyAdamWQuant.
#include "aclnnop/aclnn_apply_adam_w_quant.h"

#include <cstring>
#include <memory>
#include <string>

#include "apply_adam_w_quant/apply_adam_w_quant_impl.h"
#include "common/adam_update.h"
#include "common/c_entry.h"
#include "common/str_cat.h"
#include "fusekit/apply_adam_w_quant.h"
#include "runtime/acl_tensor.h"
#include "runtime/executor.h"

namespace fusekit {
namespace {

constexpr const char *kOp = "aclnnApplyAdamWQuant";

std::string warning(const ApplyAdamWQuantProblem &p, const ApplyAdamWQuantStats &st) {
  if (st.blocks_skipped_nonfinite == 0) return {};
  return str_cat(kOp, ": warning: ", st.blocks_skipped_nonfinite, " of ", p.blocks,
                 " blocks were left unchanged because their gradient, or the new m, v, absmax "
                 "or var the step would give them, is not finite");
}
}  // namespace
}  // namespace fusekit

using namespace fusekit;

extern "C" aclnnStatus aclnnApplyAdamWQuantGetWorkspaceSize(
    aclTensor *varRef, const aclTensor *grad, aclTensor *mRef, aclTensor *vRef,
    const aclTensor *qmapM, const aclTensor *qmapV, aclTensor *absmaxMRef, aclTensor *absmaxVRef,
    const aclTensor *step, double lr, double beta1, double beta2, double weightDecay, double eps,
    double gnormScale, char *quantModeOptional, int64_t blockSize, uint64_t *workspaceSize,
    aclOpExecutor **executor) {
  const ScalarTensorArg step_arg{step, "step", DType::kInt64, 1};
  return aclnn_phase_one<ApplyAdamWQuantOp>(
      kOp, {varRef, grad, mRef, vRef, qmapM, qmapV, absmaxMRef, absmaxVRef}, &step_arg, warning,
      workspaceSize, executor,
      [&](const TensorView &s, ApplyAdamWQuantOptions &options, ApplyAdamWQuantScalars &scalars) {
        if (blockSize != kAdamWQuantBlockSize) {
          return Status::Invalid(
              str_cat(kOp, ": blockSize = ", blockSize, "; only 256 is supported"));
        }
        if (quantModeOptional != nullptr && std::strcmp(quantModeOptional, "BLOCKWISE") != 0) {
          return Status::Invalid(str_cat(kOp, ": quantModeOptional = \"", quantModeOptional,
                                         "\"; only null or \"BLOCKWISE\" is supported"));
        }
        FUSEKIT_RETURN_IF_ERROR(check_adam_lr(kOp, lr));
        options = {.beta1 = beta1,
                   .beta2 = beta2,
                   .weight_decay = weightDecay,
                   .eps = eps,
                   .gnorm_scale = gnormScale,
                   .block_size = blockSize};
        scalars.step_tensor = s;  // read by the implementation when phase two runs
        scalars.lr = static_cast<float>(lr);
        return Status::Ok();
      });
}

extern "C" aclnnStatus aclnnApplyAdamWQuant(void *workspace, uint64_t workspaceSize,
                                            aclOpExecutor *executor, aclrtStream stream) {
  return run_phase_two(kOp, workspace, workspaceSize, executor, stream);
}
