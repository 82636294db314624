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

#include "common/ceilings.h"
#include "common/plan_overhead.h"
#include "fusekit/adam_w.h"

namespace {

using fusekit::DType;
using fusekit::TensorView;
using fusekit::bench::DeviceBuffer;

constexpr int64_t kN = int64_t{64} << 20;

// xorshift values in scale * [-1, 1), filled in parallel.
void fill(float *p, int64_t n, uint64_t seed, float scale) {
#pragma omp parallel
  {
    const int64_t tid = omp_get_thread_num(), nt = omp_get_num_threads();
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(tid) + 1;
    for (int64_t i = n * tid / nt; i < n * (tid + 1) / nt; ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      p[i] = scale * (static_cast<float>(x >> 40) * (2.0f / 16777216.0f) - 1.0f);
    }
  }
}

void BM_AdamW(benchmark::State &state, const char *implementation = nullptr) {
  DeviceBuffer var(static_cast<size_t>(kN) * 4), grad(static_cast<size_t>(kN) * 4),
      m(static_cast<size_t>(kN) * 4), v(static_cast<size_t>(kN) * 4);
  fill(var.as<float>(), kN, 1, 1.0f);
  fill(grad.as<float>(), kN, 2, 0.01f);
  fill(m.as<float>(), kN, 3, 0.001f);
  fill(v.as<float>(), kN, 4, 1e-6f);
#pragma omp parallel for
  for (int64_t i = 0; i < kN; ++i) v.as<float>()[i] *= v.as<float>()[i] < 0 ? -1.0f : 1.0f;
  fusekit::AdamWOptions o;
  o.weight_decay = 0.01;
  o.implementation = implementation;
  fusekit::AdamW plan;
  int64_t n = kN;
  const fusekit::Status st =
      fusekit::AdamW::plan(TensorView::contiguous(var.ptr, DType::kFloat32, &n, 1),
                           TensorView::contiguous(grad.ptr, DType::kFloat32, &n, 1),
                           TensorView::contiguous(m.ptr, DType::kFloat32, &n, 1),
                           TensorView::contiguous(v.ptr, DType::kFloat32, &n, 1), o, &plan);
  if (!st.ok()) {
    state.SkipWithError(st.message().c_str());
    return;
  }
  int64_t step = 0;
  for (auto _ : state) {
    const fusekit::Status r = plan.run(step++, 1e-3f);
    if (!r.ok()) state.SkipWithError(r.message().c_str());
  }
  fusekit::bench::report_bandwidth(state, 28.0 * static_cast<double>(kN));
  state.counters["elements"] = static_cast<double>(kN);
  state.SetLabel(plan.implementation());
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
