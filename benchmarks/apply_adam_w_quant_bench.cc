// ApplyAdamWQuant benchmark: one 8-bit AdamW step over a 64M-element tensor in each dtype, in GB/s
// at 16 bytes per element (float32: var read and written, grad read, one code each of m and v read
// and written; 10 bytes for float16/bfloat16), against the copy bandwidth measured in the same run
// (benchmarks/common/ceilings.h). Beside it, on the same tensor:
//   - AdamW (float32 m and v): the fused 32-bit step the 8-bit one replaces, 28 bytes per element;
//     the 8-bit step should take no longer;
//   - the 8-bit step with the nearest code found by 8-step binary search instead of the table;
//   - the arithmetic floors (common/adam_arithmetic.h): the least time the multiplies, adds, square
//     root and divisions of each step take on this machine for the same 64M elements, with no
//     memory traffic, codes or maxima: a step cannot run faster than its floor;
//   - the per-call overhead on a tiny tensor (one block of 256 elements): a reused plan's run
//     (PlanReuse, for each implementation this machine runs) and plan + run each time (FreshPlan),
//     in microseconds per call.
// The AdamW yardstick is built where the adam_w operator is (FUSEKIT_BENCH_WITH_ADAM_W; it is also
// benchmarks/adam_w_bench). Buffers come from aclrtMalloc(HUGE_FIRST), as in the seed's programs.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/adam_arithmetic.h"
#include "common/ceilings.h"
#include "common/fill.h"
#include "common/plan_overhead.h"
#include "fusekit/apply_adam_w_quant.h"
#if defined(FUSEKIT_BENCH_WITH_ADAM_W)
#include "common/adam_w_step.h"  // the float32 AdamW step beside the 8-bit one
#endif
#include "fusekit/float16.h"

namespace {

using fusekit::DType;
using fusekit::TensorView;
using fusekit::bench::DeviceBuffer;

constexpr int64_t kN = int64_t{64} << 20;

// xorshift values in [-1, 1) (gradients, var) and random codes, filled in parallel.
void fill(void *p, DType t, int64_t n, uint64_t seed, float scale) {
  fusekit::bench::xorshift_fill(n, seed, [&](int64_t i, uint64_t x) {
    const float f = scale * (2.0f * fusekit::bench::unit_float(x) - 1.0f);
    switch (t) {
      case DType::kFloat32:
        static_cast<float *>(p)[i] = f;
        break;
      case DType::kFloat16:
        static_cast<uint16_t *>(p)[i] = fusekit::float_to_half_bits(f);
        break;
      case DType::kBFloat16:
        static_cast<uint16_t *>(p)[i] = fusekit::float_to_bf16_bits(f);
        break;
      case DType::kUInt8:
        static_cast<uint8_t *>(p)[i] = static_cast<uint8_t>(x >> 56);
        break;
      default:
        break;
    }
  });
}

struct QuantData {
  DType dtype;
  DeviceBuffer var, grad, m, v, absmax_m, absmax_v;
  std::array<float, 256> qm = fusekit::create_dynamic_map(true),
                         qv = fusekit::create_dynamic_map(false);
  explicit QuantData(DType t)
      : dtype(t),
        var(static_cast<size_t>(kN) * fusekit::dtype_size(t)),
        grad(static_cast<size_t>(kN) * fusekit::dtype_size(t)),
        m(static_cast<size_t>(kN)),
        v(static_cast<size_t>(kN)),
        absmax_m(static_cast<size_t>(kN / 256) * 4),
        absmax_v(static_cast<size_t>(kN / 256) * 4) {
    fill(var.ptr, t, kN, 1, 1.0f);
    fill(grad.ptr, t, kN, 2, 0.01f);
    fill(m.ptr, DType::kUInt8, kN, 3, 1.0f);
    fill(v.ptr, DType::kUInt8, kN, 4, 1.0f);
    for (int64_t b = 0; b < kN / 256; ++b) {
      absmax_m.as<float>()[b] = 0.01f;
      absmax_v.as<float>()[b] = 1e-4f;
    }
  }
  TensorView flat(const DeviceBuffer &b, DType t, int64_t n) const {
    return TensorView::contiguous(b.ptr, t, &n, 1);
  }
};

// implementation: a name (cpu_hwy_binary_search: cpu_hwy without the lookup tables), or null.
void BM_ApplyAdamWQuant(benchmark::State &state, DType t, const char *implementation = nullptr) {
  QuantData d(t);
  fusekit::ApplyAdamWQuantOptions o;
  o.weight_decay = 0.01;
  o.implementation = implementation;
  fusekit::ApplyAdamWQuant plan;
  const fusekit::Status st = fusekit::ApplyAdamWQuant::plan(
      d.flat(d.var, t, kN), d.flat(d.grad, t, kN), d.flat(d.m, DType::kUInt8, kN),
      d.flat(d.v, DType::kUInt8, kN), TensorView::of(d.qm.data(), {256}),
      TensorView::of(d.qv.data(), {256}), d.flat(d.absmax_m, DType::kFloat32, kN / 256),
      d.flat(d.absmax_v, DType::kFloat32, kN / 256), o, &plan);
  if (!st.ok()) {
    state.SkipWithError(st.message().c_str());
    return;
  }
  DeviceBuffer ws(plan.workspace_size());
  int64_t step = 0;
  for (auto _ : state) {
    const fusekit::Status r = plan.run(step++, 1e-3f, ws.ptr, ws.size);
    if (!r.ok()) state.SkipWithError(r.message().c_str());
  }
  const double bytes_per_elem = t == DType::kFloat32 ? 16.0 : 10.0;
  fusekit::bench::report_bandwidth(state, bytes_per_elem * static_cast<double>(kN));
  state.counters["elements"] = static_cast<double>(kN);
  state.SetLabel(plan.implementation());
}

// Each implementation of the list that this machine runs, float32 (the reference: the plain
// scalar loop).
const bool registered_implementations = [] {
  for (const std::string &impl : fusekit::ApplyAdamWQuant::implementations()) {
    benchmark::RegisterBenchmark(("BM_ApplyAdamWQuantImplementation/" + impl).c_str(),
                                 [impl](benchmark::State &state) {
                                   BM_ApplyAdamWQuant(state, DType::kFloat32, impl.c_str());
                                 })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(impl == "cpu_reference" ? 2 : 10);
  }
  return true;
}();

#if defined(FUSEKIT_BENCH_WITH_ADAM_W)
void BM_AdamW(benchmark::State &state) {
  fusekit::bench::adam_w_step(state, kN);
}
#endif  // FUSEKIT_BENCH_WITH_ADAM_W

// One block of 256 float32 elements: what a run costs besides the arithmetic.
struct Tiny {
  static constexpr int64_t kElements = 256;
  std::vector<float> var = std::vector<float>(kElements, 0.5f),
                     grad = std::vector<float>(kElements, 0.01f), am = {0.01f}, av = {1e-4f};
  std::vector<uint8_t> m = std::vector<uint8_t>(kElements, 140),
                       v = std::vector<uint8_t>(kElements, 60);
  std::array<float, 256> qm = fusekit::create_dynamic_map(true),
                         qv = fusekit::create_dynamic_map(false);
  fusekit::ApplyAdamWQuantTensors tensors() {
    return {TensorView::of(var.data(), {kElements}), TensorView::of(grad.data(), {kElements}),
            TensorView::of(m.data(), {kElements}),   TensorView::of(v.data(), {kElements}),
            TensorView::of(qm.data(), {256}),        TensorView::of(qv.data(), {256}),
            TensorView::of(am.data(), {1}),          TensorView::of(av.data(), {1})};
  }
};

fusekit::Status apply_adam_w_quant_run(const fusekit::ApplyAdamWQuant &plan,
                                       const fusekit::ApplyAdamWQuantTensors &t, void *ws,
                                       size_t size, int64_t iteration) {
  fusekit::ApplyAdamWQuantScalars scalars;
  scalars.step = iteration & 1023;
  return plan.run(t, scalars, ws, size);
}
void BM_ApplyAdamWQuantPlanReuse(benchmark::State &state, const char *impl) {
  Tiny t;
  fusekit::ApplyAdamWQuantOptions o;
  o.implementation = impl;
  fusekit::bench::plan_reuse<fusekit::ApplyAdamWQuant, fusekit::ApplyAdamWQuantProblem>(
      state, t.tensors(), o, apply_adam_w_quant_run);
}
void BM_ApplyAdamWQuantFreshPlan(benchmark::State &state) {
  Tiny t;
  fusekit::bench::fresh_plan<fusekit::ApplyAdamWQuant, fusekit::ApplyAdamWQuantProblem>(
      state, t.tensors(), fusekit::ApplyAdamWQuantOptions{}, apply_adam_w_quant_run);
}

// The arithmetic floor for kN elements, all threads, reported as the benchmark's (manual) time.
void BM_ArithmeticFloor(benchmark::State &state, fusekit::bench::AdamArithmetic mix) {
  const double per_element = fusekit::bench::adam_arithmetic_seconds_per_element(mix);
  for (auto _ : state) state.SetIterationTime(per_element * static_cast<double>(kN));
  state.counters["ns_per_element"] = per_element * 1e9;
  state.counters["elements"] = static_cast<double>(kN);
}

BENCHMARK_CAPTURE(BM_ApplyAdamWQuant, float32, DType::kFloat32, nullptr)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_ApplyAdamWQuant, bfloat16, DType::kBFloat16, nullptr)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_ApplyAdamWQuant, float16, DType::kFloat16, nullptr)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
#if defined(FUSEKIT_BENCH_WITH_ADAM_W)
BENCHMARK(BM_AdamW)
    ->Name("BM_AdamW/float32_fused_step")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
#endif
BENCHMARK_CAPTURE(BM_ApplyAdamWQuant, float32_binary_search, DType::kFloat32,
                  "cpu_hwy_binary_search")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK_CAPTURE(BM_ApplyAdamWQuantPlanReuse, auto, nullptr) -> Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_ApplyAdamWQuantPlanReuse, cpu_avx512vbmi, "cpu_avx512vbmi")
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_ApplyAdamWQuantPlanReuse, cpu_hwy, "cpu_hwy")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_ApplyAdamWQuantPlanReuse, cpu_reference, "cpu_reference")
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ApplyAdamWQuantFreshPlan)->Unit(benchmark::kMicrosecond);

BENCHMARK_CAPTURE(BM_ArithmeticFloor, adam_w, fusekit::bench::AdamArithmetic::kAdamW)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->Iterations(1);
BENCHMARK_CAPTURE(BM_ArithmeticFloor, quant_divide, fusekit::bench::AdamArithmetic::kQuantDivide)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->Iterations(1);
BENCHMARK_CAPTURE(BM_ArithmeticFloor, quant_double, fusekit::bench::AdamArithmetic::kQuantDouble)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->Iterations(1);
BENCHMARK_CAPTURE(BM_ArithmeticFloor, quant_reciprocal,
                  fusekit::bench::AdamArithmetic::kQuantReciprocal)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->Iterations(1);

}  // namespace
