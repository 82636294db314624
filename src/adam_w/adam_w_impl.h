// fusekit internal: AdamW's implementations (the seam between the plan and the kernels).
#ifndef FUSEKIT_ADAM_W_ADAM_W_IMPL_H_
#define FUSEKIT_ADAM_W_ADAM_W_IMPL_H_

#include <span>
#include <string>

#include "adam_w/adam_w_kernels.h"
#include "common/plan.h"
#include "fusekit/adam_w.h"

namespace fusekit {

// The operator, as the plan layer (common/plan.h) sees it. No workspace.
struct AdamWOp : OpTypes<AdamWProblem, AdamWTensors, AdamWScalars, AdamWOptions, AdamWStats> {
  // The tensors by role, in the order of Tensors, named as the aclnn call names them.
  static constexpr TensorRole kRoles[] = {{"var", true}, {"grad"}, {"m", true}, {"v", true}};
  static auto views(auto &t) {  // Tensors or const Tensors
    return std::array{&t.var, &t.grad, &t.m, &t.v};
  }
  static constexpr const char *kName = "AdamW";
  // The list, in order of preference (adam_w_implementations.cc).
  static std::span<const Implementation<AdamWOp> *const> implementations();
  static std::string problem_fields(const Problem &p, const Tensors &t);
  static std::string result_fields(const Stats &st);
};
using AdamWImpl = Implementation<AdamWOp>;

}  // namespace fusekit

#endif  // FUSEKIT_ADAM_W_ADAM_W_IMPL_H_
