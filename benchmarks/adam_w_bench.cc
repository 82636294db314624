// AdamW benchmark: one float32 AdamW step over a 64M-element tensor (var, grad, m, v float32: 28
// bytes per element), in GB/s against the copy bandwidth measured in the same run
// (benchmarks/common/ceilings.h); and the per-call overhead on a tiny tensor (256 elements): a
// reused plan's run (PlanReuse, for each implementation) and plan + run each time (FreshPlan), in
// microseconds per call. apply_adam_w_quant_bench runs the same 64M step beside the 8-bit one.
// Buffers come from aclrtMalloc(HUGE_FIRST), as in the seed's programs.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/adam_w_step.h"
#include "common/ceilings.h"
#include "common/plan_overhead.h"
#include "fusekit/adam_w.h"

namespace {

using fusekit::DType;
using fusekit::TensorView;
using fusekit::bench::DeviceBuffer;

constexpr int64_t kN = int64_t{64} << 20;

void BM_AdamW(benchmark::State &state, const char *implementation = nullptr) {
  fusekit::bench::adam_w_step(state, kN, implementation);
}

// Each implementation of the list (the reference: the plain scalar loop).
const bool registered_implementations = [] {
  for (const std::string &impl : fusekit::AdamW::implementations()) {
    benchmark::RegisterBenchmark(("BM_AdamWImplementation/" + impl).c_str(),
                                 [impl](benchmark::State &state) { BM_AdamW(state, impl.c_str()); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(impl == "cpu_reference" ? 3 : 10);
  }
  return true;
}();

// 256 float32 elements: what a run costs besides the arithmetic.
struct Tiny {
  static constexpr int64_t kElements = 256;
  std::vector<float> var = std::vector<float>(kElements, 0.5f),
                     grad = std::vector<float>(kElements, 0.01f),
                     m = std::vector<float>(kElements, 1e-3f),
                     v = std::vector<float>(kElements, 1e-6f);
  fusekit::AdamWTensors tensors() {
    return {TensorView::of(var.data(), {kElements}), TensorView::of(grad.data(), {kElements}),
            TensorView::of(m.data(), {kElements}), TensorView::of(v.data(), {kElements})};
  }
};

fusekit::Status adam_w_run(const fusekit::AdamW &plan, const fusekit::AdamWTensors &t, void *,
                           size_t, int64_t iteration) {
  fusekit::AdamWScalars scalars;
  scalars.step = iteration & 1023;
  return plan.run(t, scalars);
}
void BM_AdamWPlanReuse(benchmark::State &state, const char *impl) {
  Tiny t;
  fusekit::AdamWOptions o;
  o.implementation = impl;
  fusekit::bench::plan_reuse<fusekit::AdamW, fusekit::AdamWProblem>(state, t.tensors(), o,
                                                                    adam_w_run);
}
void BM_AdamWFreshPlan(benchmark::State &state) {
  Tiny t;
  fusekit::bench::fresh_plan<fusekit::AdamW, fusekit::AdamWProblem>(
      state, t.tensors(), fusekit::AdamWOptions{}, adam_w_run);
}

}  // namespace

BENCHMARK_CAPTURE(BM_AdamWPlanReuse, auto, nullptr) -> Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_AdamWPlanReuse, cpu_reference, "cpu_reference")->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_AdamWFreshPlan)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_AdamW, auto, nullptr) -> Name("BM_AdamW/float32_fused_step")
    -> Unit(benchmark::kMillisecond) -> UseRealTime();
