// fusekit internal: LazyAdam's implementations (the seam between the plan and the kernels).
#ifndef FUSEKIT_LAZY_ADAM_LAZY_ADAM_IMPL_H_
#define FUSEKIT_LAZY_ADAM_LAZY_ADAM_IMPL_H_

#include <array>
#include <cstddef>
#include <span>
#include <string>

#include "common/plan.h"
#include "fusekit/lazy_adam.h"
#include "lazy_adam/lazy_adam_kernels.h"

namespace fusekit {

// The operator, as the plan layer (common/plan.h) sees it.
struct LazyAdamOp
    : OpTypes<LazyAdamProblem, LazyAdamTensors, LazyAdamScalars, LazyAdamOptions, LazyAdamStats> {
  // The tensors by role, in the order of Tensors, named as the aclnn call names them.
  static constexpr TensorRole kRoles[] = {
      {"gradient"}, {"indices"}, {"inputM", true}, {"inputV", true}, {"inputVar", true}};
  static auto views(auto &t) {  // Tensors or const Tensors
    return std::array{&t.gradient, &t.indices, &t.m, &t.v, &t.var};
  }
  static constexpr const char *kName = "LazyAdam";
  // The list, in order of preference (lazy_adam_implementations.cc).
  static std::span<const Implementation<LazyAdamOp> *const> implementations();
  static std::string problem_fields(const Problem &p, const Tensors &t);
  static std::string result_fields(const Stats &st);
};
using LazyAdamImpl = Implementation<LazyAdamOp>;

// The CPU implementations' run: the stages check, group and update (lazy_adam_cpu.cc), with the
// row kernel and the prefetch distance of the implementation.
size_t lazy_adam_cpu_workspace_bytes(const LazyAdamProblem &p, int threads);
// Reads lr (the scalar or, when set, the lr tensor on the host) and refuses a non-finite one
// before anything else.
Status lazy_adam_cpu_run(LazyAdamRowsFn kernel, int64_t prefetch_ahead, const LazyAdamProblem &p,
                         const LazyAdamTensors &t, const LazyAdamScalars &s, const RunContext &ctx,
                         LazyAdamStats *stats);

}  // namespace fusekit

#endif  // FUSEKIT_LAZY_ADAM_LAZY_ADAM_IMPL_H_
