// fusekit: what every operator's plan holds (LazyAdam, AdamW, ApplyAdamWQuant, LazyAdamQuant,
// AddLora keep one PlanState each). Made by the plan() functions, read by run(); a plan is a small
// value that can be copied and kept.
#ifndef FUSEKIT_PLAN_STATE_H_
#define FUSEKIT_PLAN_STATE_H_

#include <cstddef>

namespace fusekit {

// One implementation of operator Op (src/common/plan.h; the lists are in
// src/<op>/<op>_implementations.cc).
template <class Op>
struct Implementation;

template <class Op, class Problem, class Tensors>
struct PlanState {
  Problem problem;                           // what the plan was made for
  const Implementation<Op> *impl = nullptr;  // null: a plan that was not made
  const char *impl_name = "none";
  int threads = 1;
  size_t workspace_bytes = 0;
  Tensors bound;  // the tensors given to plan(tensors...), for run(scalars...)
  bool has_bound = false;
};

}  // namespace fusekit

#endif  // FUSEKIT_PLAN_STATE_H_
