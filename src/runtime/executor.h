// fusekit internal: the executor that phase one returns and phase two consumes, and the two
// helpers every aclnn entry point is written with.
//
//   aclnnXxxGetWorkspaceSize(...)  -> validate + plan (C++ API), then finish_phase_one(...)
//   aclnnXxx(ws, size, ex, stream) -> run_phase_two(...)
#ifndef FUSEKIT_RUNTIME_EXECUTOR_H_
#define FUSEKIT_RUNTIME_EXECUTOR_H_

#include <array>
#include <cstdint>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "aclnn/acl_meta.h"
#include "common/c_entry.h"
#include "common/plan.h"
#include "fusekit/status.h"
#include "fusekit/tensor.h"

struct aclOpExecutor {
  explicit aclOpExecutor(const char *op) : op_name(op) {}
  virtual ~aclOpExecutor() = default;
  aclOpExecutor(const aclOpExecutor &) = delete;
  aclOpExecutor &operator=(const aclOpExecutor &) = delete;

  virtual uint64_t workspace_size() const = 0;
  // Runs the plan on the stream. A non-empty *warning is recorded for aclGetRecentErrMsg on
  // success.
  virtual fusekit::Status execute(void *workspace, uint64_t workspace_size, aclrtStream stream,
                                  std::string *warning) = 0;

  const char *op_name;
};

namespace fusekit {

// The C++ API's messages start with its own name ("LazyAdam: ..."); on the aclnn path they carry
// the aclnn name ("aclnnLazyAdam: ..."). Returns the status with that prefix.
Status with_aclnn_name(Status status, const char *cpp_op);

// Records the message of a failed status and returns its aclnn code.
aclnnStatus report(const Status &status);

// Ends phase one: on success registers the executor as live and hands it and its workspace size
// to the caller. Executors are tracked in a set of live ones, so that a consumed or destroyed
// executor is refused without reading the memory it was in.
aclnnStatus finish_phase_one(const char *op, const Status &status,
                             std::unique_ptr<aclOpExecutor> executor, uint64_t *workspace_size,
                             aclOpExecutor **out);

// A per-step scalar an aclnn face takes as a tensor (lr, step): one element of `dtype` with data
// (`ndim`: a required rank, 0: any). Unless `read_first` (the implementation reads it before it
// writes anything), it must not share memory with a tensor the step writes.
struct ScalarTensorArg {
  const aclTensor *tensor;
  const char *name;
  DType dtype;
  int ndim = 0;
  bool read_first = false;
};

// Phase one's arguments, checked in the order every entry point uses: the views of the operator's
// tensors in role order (named by the roles; an optional role takes null), the scalar tensor's
// view, the two outputs present, then the scalar's own rules. The first refusal, naming the
// argument.
Status aclnn_views(const char *op, std::span<const TensorRole> roles,
                   std::span<const aclTensor *const> args, std::span<TensorView *const> views,
                   const ScalarTensorArg *scalar, TensorView *scalar_view,
                   const uint64_t *workspace_size, aclOpExecutor *const *executor);

// Phase one's plan: the problem of `tensors`, checked as phase two would check it, planned;
// messages carry the aclnn name.
template <class Op>
Status plan_phase_one(const typename Op::Tensors &tensors, const typename Op::Options &options,
                      PlanStateOf<Op> *plan) {
  typename Op::Problem problem;
  Status st = Op::Problem::make(tensors, options, &problem);
  if (st.ok()) st = problem.check(tensors);  // phase one refuses what phase two would
  if (st.ok()) st = make_plan<Op>(problem, options, plan);
  return with_aclnn_name(st, Op::kName);
}

// A face's warning for a run that left `count` rows (or blocks) unchanged: "aclnnXxx: warning: 3
// rows were left unchanged because <because>"; empty when count is 0.
std::string unchanged_warning(const char *op, int64_t count, const char *what, const char *because);

// The executor of every aclnn face: the plan and tensors of phase one, the per-run scalars (a
// scalar tensor is read by the implementation when phase two runs), and the operator's warning
// for a run that left something unchanged (empty: none), recorded for aclGetRecentErrMsg.
template <class Op>
class PlanExecutor final : public aclOpExecutor {
 public:
  using Warning = std::string (*)(const typename Op::Problem &, const typename Op::Stats &);
  PlanExecutor(const char *op, const PlanStateOf<Op> &plan, const typename Op::Tensors &tensors,
               const typename Op::Scalars &scalars, Warning warning)
      : aclOpExecutor(op), plan_(plan), tensors_(tensors), scalars_(scalars), warning_(warning) {}
  uint64_t workspace_size() const override { return plan_.workspace_bytes; }
  Status execute(void *workspace, uint64_t workspace_size, aclrtStream stream,
                 std::string *warning) override {
    typename Op::Stats stats;
    const Status st = with_aclnn_name(
        run_plan<Op>(plan_, tensors_, scalars_, workspace, workspace_size, &stats, stream),
        Op::kName);
    if (st.ok() && warning_ != nullptr) *warning = warning_(plan_.problem, stats);
    return st;
  }

 private:
  PlanStateOf<Op> plan_;
  typename Op::Tensors tensors_;
  typename Op::Scalars scalars_;
  Warning warning_;
};

// An aclnn face's phase one, written once: the views of `args` (the aclTensors in the order of
// Op::kRoles) and of the optional per-step scalar tensor, checked; then the face's own part,
// `setup(scalar_view, options, scalars)`: its attribute checks, the operator's options and per-run
// scalars (a Status); then the problem, checked as phase two would, planned; the executor.
template <class Op, class Setup>
aclnnStatus aclnn_phase_one(const char *op,
                            const std::array<const aclTensor *, std::size(Op::kRoles)> &args,
                            const ScalarTensorArg *scalar,
                            typename PlanExecutor<Op>::Warning warning, uint64_t *workspace_size,
                            aclOpExecutor **executor, Setup &&setup) {
  return guard_c_entry(op, ACLNN_ERR_INNER, [&]() -> aclnnStatus {
    typename Op::Tensors tensors;
    TensorView scalar_view;
    Status st = aclnn_views(op, Op::kRoles, args, Op::views(tensors), scalar, &scalar_view,
                            workspace_size, executor);
    typename Op::Options options;
    typename Op::Scalars scalars;
    if (st.ok()) st = setup(static_cast<const TensorView &>(scalar_view), options, scalars);
    PlanStateOf<Op> plan;
    if (st.ok()) st = plan_phase_one<Op>(tensors, options, &plan);
    std::unique_ptr<aclOpExecutor> ex;
    if (st.ok()) ex = std::make_unique<PlanExecutor<Op>>(op, plan, tensors, scalars, warning);
    return finish_phase_one(op, st, std::move(ex), workspace_size, executor);
  });
}

// Phase two of every aclnn face: checks the workspace and stream, runs the executor and frees it
// (on failure too). Nothing throws out of it.
aclnnStatus run_phase_two(const char *op, void *workspace, uint64_t workspace_size,
                          aclOpExecutor *executor, aclrtStream stream) noexcept;

}  // namespace fusekit

#endif  // FUSEKIT_RUNTIME_EXECUTOR_H_
