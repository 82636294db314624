// aclnnLazyAdam: the aclnn face over fusekit::LazyAdam.
#include "aclnnop/aclnn_lazy_adam.h"

#include <cmath>
#include <memory>

#include "common/c_entry.h"
#include "common/str_cat.h"
#include "fusekit/lazy_adam.h"
#include "runtime/acl_tensor.h"
#include "runtime/executor.h"

namespace fusekit {
namespace {

constexpr const char *kOp = "aclnnLazyAdam";

class LazyAdamExecutor final : public aclOpExecutor {
 public:
  LazyAdamExecutor(const LazyAdam &plan, const LazyAdamTensors &tensors, const TensorView &lr)
      : aclOpExecutor(kOp), plan_(plan), tensors_(tensors) {
    scalars_.lr_tensor = lr;  // read by the implementation when phase two runs
  }
  uint64_t workspace_size() const override { return plan_.workspace_size(); }
  Status execute(void *workspace, uint64_t workspace_size, aclrtStream stream,
                 std::string *warning) override {
    LazyAdamStats stats;
    Status st = with_aclnn_name(
        plan_.run(tensors_, scalars_, workspace, workspace_size, &stats, stream), "LazyAdam");
    if (st.ok() && stats.rows_skipped_nonfinite > 0) {
      *warning = str_cat(kOp, ": warning: ", stats.rows_skipped_nonfinite,
                         " rows were left unchanged because their gradient is not finite");
    }
    return st;
  }

 private:
  LazyAdam plan_;
  LazyAdamTensors tensors_;
  LazyAdamScalars scalars_;
};

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
    LazyAdam plan;
    const LazyAdamTensors tensors{g, i, m, v, var};
    if (st.ok()) {
      LazyAdamOptions options;
      options.beta1 = beta1;
      options.beta2 = beta2;
      options.epsilon = epsilon;
      st = plan_phase_one<LazyAdam, LazyAdamProblem>(tensors, options, "LazyAdam", &plan);
    }
    std::unique_ptr<aclOpExecutor> ex;
    if (st.ok()) ex = std::make_unique<LazyAdamExecutor>(plan, tensors, l);
    return finish_phase_one(kOp, st, std::move(ex), workspaceSize, executor);
  });
}

extern "C" aclnnStatus aclnnLazyAdam(void *workspace, uint64_t workspaceSize,
                                     aclOpExecutor *executor, aclrtStream stream) {
  return guard_c_entry(kOp, ACLNN_ERR_INNER, [&]() -> aclnnStatus {
    return run_phase_two(kOp, workspace, workspaceSize, executor, stream);
  });
}
