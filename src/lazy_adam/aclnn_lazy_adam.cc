// aclnnLazyAdam: the aclnn face over fusekit::LazyAdam.
#include "aclnnop/aclnn_lazy_adam.h"

#include <cmath>
#include <memory>

#include "common/adam_update.h"
#include "common/c_entry.h"
#include "common/str_cat.h"
#include "fusekit/lazy_adam.h"
#include "lazy_adam/lazy_adam_impl.h"
#include "runtime/acl_tensor.h"
#include "runtime/executor.h"

namespace fusekit {
namespace {

constexpr const char *kOp = "aclnnLazyAdam";

std::string warning(const LazyAdamProblem & /*p*/, const LazyAdamStats &st) {
  return unchanged_warning(kOp, st.rows_skipped_nonfinite, "rows", "their gradient is not finite");
}
}  // namespace
}  // namespace fusekit

using namespace fusekit;

extern "C" aclnnStatus aclnnLazyAdamGetWorkspaceSize(
    const aclTensor *gradient, const aclTensor *indices, const aclTensor *inputM,
    const aclTensor *inputV, const aclTensor *inputVar, const aclTensor *lr, double beta1,
    double beta2, double epsilon, uint64_t *workspaceSize, aclOpExecutor **executor) {
  // lr is read before anything is written: it may share memory with the tables.
  const ScalarTensorArg lr_arg{lr, "lr", DType::kFloat32, 0, /*read_first=*/true};
  return aclnn_phase_one<LazyAdamOp>(kOp, {gradient, indices, inputM, inputV, inputVar}, &lr_arg,
                                     warning, workspaceSize, executor,
                                     lazy_adam_aclnn_setup<LazyAdamOp>(beta1, beta2, epsilon));
}

extern "C" aclnnStatus aclnnLazyAdam(void *workspace, uint64_t workspaceSize,
                                     aclOpExecutor *executor, aclrtStream stream) {
  return run_phase_two(kOp, workspace, workspaceSize, executor, stream);
}
