// aclnnLazyAdam: the aclnn face over fusekit::LazyAdam.
#include "aclnnop/aclnn_lazy_adam.h"

#include <cmath>
#include <memory>

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
  if (st.rows_skipped_nonfinite == 0) return {};
  return str_cat(kOp, ": warning: ", st.rows_skipped_nonfinite,
                 " rows were left unchanged because their gradient is not finite");
}
}  // namespace
}  // namespace fusekit

using namespace fusekit;

extern "C" aclnnStatus aclnnLazyAdamGetWorkspaceSize(
    const aclTensor *gradient, const aclTensor *indices, const aclTensor *inputM,
    const aclTensor *inputV, const aclTensor *inputVar, const aclTensor *lr, double beta1,
    double beta2, double epsilon, uint64_t *workspaceSize, aclOpExecutor **executor) {
  return guard_c_entry(kOp, ACLNN_ERR_INNER, [&]() -> aclnnStatus {
    TensorView g, i, m, v, var, l;
    Status st = phase_one_views(kOp,
                                {{gradient, "gradient", &g},
                                 {indices, "indices", &i},
                                 {inputM, "inputM", &m},
                                 {inputV, "inputV", &v},
                                 {inputVar, "inputVar", &var},
                                 {lr, "lr", &l}},
                                workspaceSize, executor);
    // lr is read before anything is written: it may share memory with the tables.
    if (st.ok()) st = check_scalar_tensor(kOp, "lr", l, DType::kFloat32, 0, {});
    PlanStateOf<LazyAdamOp> plan;
    const LazyAdamTensors tensors{g, i, m, v, var};
    if (st.ok()) {
      LazyAdamOptions options;
      options.beta1 = beta1;
      options.beta2 = beta2;
      options.epsilon = epsilon;
      st = plan_phase_one<LazyAdamOp>(tensors, options, &plan);
    }
    std::unique_ptr<aclOpExecutor> ex;
    if (st.ok()) {
      LazyAdamScalars scalars;
      scalars.lr_tensor = l;  // read by the implementation when phase two runs
      ex = std::make_unique<PlanExecutor<LazyAdamOp>>(kOp, plan, tensors, scalars, warning);
    }
    return finish_phase_one(kOp, st, std::move(ex), workspaceSize, executor);
  });
}

extern "C" aclnnStatus aclnnLazyAdam(void *workspace, uint64_t workspaceSize,
                                     aclOpExecutor *executor, aclrtStream stream) {
  return guard_c_entry(kOp, ACLNN_ERR_INNER, [&]() -> aclnnStatus {
    return run_phase_two(kOp, workspace, workspaceSize, executor, stream);
  });
}
