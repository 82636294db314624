// fusekit benchmarks: what a run costs besides the arithmetic, on a tiny problem, for any
// operator's plan class: BM_<Op>PlanReuse (a plan made once, run on the tensors each iteration:
// the binding, the checks, the stages) against BM_<Op>FreshPlan (problem, plan, workspace and run
// each iteration). `run(plan, tensors, workspace, size, iteration)` makes one run with the
// operator's scalars.
#ifndef FUSEKIT_BENCHMARKS_COMMON_PLAN_OVERHEAD_H_
#define FUSEKIT_BENCHMARKS_COMMON_PLAN_OVERHEAD_H_

#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "fusekit/status.h"

namespace fusekit::bench {

template <class Plan>
size_t workspace_of(const Plan &plan) {
  if constexpr (requires { plan.workspace_size(); }) {
    return plan.workspace_size();
  } else {
    return 0;  // AdamW: no workspace
  }
}

template <class Plan, class Problem, class Tensors, class Options, class Run>
void plan_reuse(benchmark::State &state, const Tensors &tensors, const Options &options, Run run) {
  Problem problem;
  Plan plan;
  Status st = Problem::make(tensors, options, &problem);
  if (st.ok()) st = Plan::plan(problem, options, &plan);
  if (!st.ok()) {
    state.SkipWithError(st.message().c_str());
    return;
  }
  std::vector<char> ws(workspace_of(plan));
  int64_t i = 0;
  for (auto _ : state) benchmark::DoNotOptimize(run(plan, tensors, ws.data(), ws.size(), i++).ok());
  state.SetLabel(plan.implementation());
}

template <class Plan, class Problem, class Tensors, class Options, class Run>
void fresh_plan(benchmark::State &state, const Tensors &tensors, const Options &options, Run run) {
  int64_t i = 0;
  for (auto _ : state) {
    Problem problem;
    Plan plan;
    benchmark::DoNotOptimize(Problem::make(tensors, options, &problem).ok());
    benchmark::DoNotOptimize(Plan::plan(problem, options, &plan).ok());
    std::vector<char> ws(workspace_of(plan));
    benchmark::DoNotOptimize(run(plan, tensors, ws.data(), ws.size(), i++).ok());
  }
}

}  // namespace fusekit::bench

#endif  // FUSEKIT_BENCHMARKS_COMMON_PLAN_OVERHEAD_H_
