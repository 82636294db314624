// aclnnLazyAdamQuant: the aclnn face over fusekit::LazyAdamQuant (fusekit's own operator, in the
// style of aclnnLazyAdam).
#include "aclnnop/aclnn_lazy_adam_quant.h"

#include <memory>
#include <string>

#include "common/adam_update.h"
#include "common/c_entry.h"
#include "common/str_cat.h"
#include "fusekit/lazy_adam_quant.h"
#include "lazy_adam_quant/lazy_adam_quant_impl.h"
#include "runtime/acl_tensor.h"
#include "runtime/executor.h"

namespace fusekit {
namespace {

constexpr const char *kOp = "aclnnLazyAdamQuant";

std::string warning(const LazyAdamQuantProblem & /*p*/, const LazyAdamQuantStats &st) {
  return unchanged_warning(kOp, st.rows_skipped_nonfinite, "rows",
                           "their gradient, or the new m, v, absmax or var the step would give "
                           "them, is not finite");
}
}  // namespace
}  // namespace fusekit

using namespace fusekit;

extern "C" aclnnStatus aclnnLazyAdamQuantGetWorkspaceSize(
    const aclTensor *gradient, const aclTensor *indices, aclTensor *inputM, aclTensor *inputV,
    aclTensor *inputVar, const aclTensor *qmapM, const aclTensor *qmapV, aclTensor *absmaxM,
    aclTensor *absmaxV, const aclTensor *lr, double beta1, double beta2, double epsilon,
    uint64_t *workspaceSize, aclOpExecutor **executor) {
  const ScalarTensorArg lr_arg{lr, "lr", DType::kFloat32};
  return aclnn_phase_one<LazyAdamQuantOp>(
      kOp, {gradient, indices, inputM, inputV, inputVar, qmapM, qmapV, absmaxM, absmaxV}, &lr_arg,
      warning, workspaceSize, executor,
      lazy_adam_aclnn_setup<LazyAdamQuantOp>(beta1, beta2, epsilon));
}

extern "C" aclnnStatus aclnnLazyAdamQuant(void *workspace, uint64_t workspaceSize,
                                          aclOpExecutor *executor, aclrtStream stream) {
  return run_phase_two(kOp, workspace, workspaceSize, executor, stream);
}
