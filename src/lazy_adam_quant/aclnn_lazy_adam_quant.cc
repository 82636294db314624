// aclnnLazyAdamQuant: the aclnn face over fusekit::LazyAdamQuant (fusekit's own operator, in the
// style of aclnnLazyAdam).
#include "aclnnop/aclnn_lazy_adam_quant.h"

#include <memory>
#include <string>

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
  if (st.rows_skipped_nonfinite == 0) return {};
  return str_cat(kOp, ": warning: ", st.rows_skipped_nonfinite,
                 " rows were left unchanged because their gradient, or the new m, v, absmax or "
                 "var the step would give them, is not finite");
}
}  // namespace
}  // namespace fusekit

using namespace fusekit;

extern "C" aclnnStatus aclnnLazyAdamQuantGetWorkspaceSize(
    const aclTensor *gradient, const aclTensor *indices, aclTensor *inputM, aclTensor *inputV,
    aclTensor *inputVar, const aclTensor *qmapM, const aclTensor *qmapV, aclTensor *absmaxM,
    aclTensor *absmaxV, const aclTensor *lr, double beta1, double beta2, double epsilon,
    uint64_t *workspaceSize, aclOpExecutor **executor) {
  return guard_c_entry(kOp, ACLNN_ERR_INNER, [&]() -> aclnnStatus {
    TensorView g, i, m, v, var, qm, qv, am, av, l;
    Status st = phase_one_views(kOp,
                                {{gradient, "gradient", &g},
                                 {indices, "indices", &i},
                                 {inputM, "inputM", &m},
                                 {inputV, "inputV", &v},
                                 {inputVar, "inputVar", &var},
                                 {qmapM, "qmapM", &qm},
                                 {qmapV, "qmapV", &qv},
                                 {absmaxM, "absmaxM", &am},
                                 {absmaxV, "absmaxV", &av},
                                 {lr, "lr", &l}},
                                workspaceSize, executor);
    if (st.ok()) {
      st = check_scalar_tensor(
          kOp, "lr", l, DType::kFloat32, 0,
          {{&m, "inputM"}, {&v, "inputV"}, {&var, "inputVar"}, {&am, "absmaxM"}, {&av, "absmaxV"}});
    }
    PlanStateOf<LazyAdamQuantOp> plan;
    const LazyAdamQuantTensors tensors{g, i, m, v, var, qm, qv, am, av};
    if (st.ok()) {
      LazyAdamQuantOptions options;
      options.beta1 = beta1;
      options.beta2 = beta2;
      options.epsilon = epsilon;
      st = plan_phase_one<LazyAdamQuantOp>(tensors, options, &plan);
    }
    std::unique_ptr<aclOpExecutor> ex;
    if (st.ok()) {
      LazyAdamQuantScalars scalars;
      scalars.lr_tensor = l;  // read by the implementation when phase two runs
      ex = std::make_unique<PlanExecutor<LazyAdamQuantOp>>(kOp, plan, tensors, scalars, warning);
    }
    return finish_phase_one(kOp, st, std::move(ex), workspaceSize, executor);
  });
}

extern "C" aclnnStatus aclnnLazyAdamQuant(void *workspace, uint64_t workspaceSize,
                                          aclOpExecutor *executor, aclrtStream stream) {
  return guard_c_entry(kOp, ACLNN_ERR_INNER, [&]() -> aclnnStatus {
    return run_phase_two(kOp, workspace, workspaceSize, executor, stream);
  });
}
