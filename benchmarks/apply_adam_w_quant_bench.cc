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
//     in microseconds per call;
//   - the FP8 state format (docs/fp8_state.md; `_fp8` cases): the same 16 bytes per element, the
//     codes made by bit arithmetic;
//   - BM_ApplyAdamWQuantFormats: the float32 AdamW step, the dynamic-map step and the FP8 step on
//     64M elements each, timed back to back in every iteration (so that the load of this shared
//     machine reaches all three alike), with their ratios and the FP8 step against its copy
//     ceiling and its arithmetic floor (common/adam_arithmetic.h, kFp8);
//   - BM_ApplyAdamWQuantLostVGuard/<impl>: the dynamic-map step with the lost-v guard off and on
//     (docs/fp8_state.md), back to back in every iteration, on each implementation.
// The AdamW yardstick is built where the adam_w operator is (FUSEKIT_BENCH_WITH_ADAM_W; it is also
// benchmarks/adam_w_bench). Buffers come from aclrtMalloc(HUGE_FIRST), as in the seed's programs.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
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
#include "fusekit/threading.h"

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

using fusekit::QuantStateFormat;

// The 8-bit state and the step's inputs, in either state format. FP8: m's codes are random E4M3
// codes other than the two NaN codes (0x7f, 0xff), v's random UE4M4 codes (all finite), the scales
// those of blocks whose largest |m| is 0.01 and largest sqrt(v) 0.01; the maps are not used.
struct QuantData {
  DType dtype;
  QuantStateFormat format;
  int64_t n;  // elements (a multiple of 256)
  DeviceBuffer var, grad, m, v, absmax_m, absmax_v;
  std::array<float, 256> qm = fusekit::create_dynamic_map(true),
                         qv = fusekit::create_dynamic_map(false);
  explicit QuantData(DType t, QuantStateFormat f = QuantStateFormat::kDynamicMap,
                     int64_t elements = kN)
      : dtype(t),
        format(f),
        n(elements),
        var(static_cast<size_t>(n) * fusekit::dtype_size(t)),
        grad(static_cast<size_t>(n) * fusekit::dtype_size(t)),
        m(static_cast<size_t>(n)),
        v(static_cast<size_t>(n)),
        absmax_m(static_cast<size_t>(n / 256) * 4),
        absmax_v(static_cast<size_t>(n / 256) * 4) {
    fill(var.ptr, t, n, 1, 1.0f);
    fill(grad.ptr, t, n, 2, 0.01f);
    fill(m.ptr, DType::kUInt8, n, 3, 1.0f);
    fill(v.ptr, DType::kUInt8, n, 4, 1.0f);
    const bool fp8 = fusekit::is_fp8_state(f);
    if (fp8) {
      uint8_t *mc = m.as<uint8_t>();
#pragma omp parallel for
      for (int64_t i = 0; i < n; ++i) mc[i] ^= (mc[i] & 0x7f) == 0x7f ? 1 : 0;  // no NaN code
    }
    for (int64_t b = 0; b < n / 256; ++b) {
      absmax_m.as<float>()[b] = fp8 ? 0.01f / 448.0f : 0.01f;
      absmax_v.as<float>()[b] = !fp8                               ? 1e-4f
                                : f == QuantStateFormat::kFp8Ue3m5 ? 0.01f / 31.5f
                                                                   : 0.01f / 496.0f;
    }
  }
  TensorView flat(const DeviceBuffer &b, DType t, int64_t count) const {
    return TensorView::contiguous(b.ptr, t, &count, 1);
  }
  // The maps' views: 256 floats, or empty in the FP8 format.
  TensorView map(const std::array<float, 256> &q) const {
    return TensorView::of(q.data(), {fusekit::is_fp8_state(format) ? 0 : 256});
  }
  fusekit::Status plan(const fusekit::ApplyAdamWQuantOptions &o,
                       fusekit::ApplyAdamWQuant *out) const {
    return fusekit::ApplyAdamWQuant::plan(
        flat(var, dtype, n), flat(grad, dtype, n), flat(m, DType::kUInt8, n),
        flat(v, DType::kUInt8, n), map(qm), map(qv), flat(absmax_m, DType::kFloat32, n / 256),
        flat(absmax_v, DType::kFloat32, n / 256), o, out);
  }
};

// Options of the benchmark's steps: weight decay 0.01, the format, the guard, the implementation.
fusekit::ApplyAdamWQuantOptions step_options(QuantStateFormat f, bool guard_lost_v = false,
                                             const char *implementation = nullptr) {
  fusekit::ApplyAdamWQuantOptions o;
  o.weight_decay = 0.01;
  o.state_format = f;
  o.guard_lost_v = guard_lost_v;
  o.implementation = implementation;
  return o;
}

// A planned 8-bit step over its own QuantData, with its workspace.
struct QuantStep {
  QuantData d;
  fusekit::ApplyAdamWQuant plan;
  fusekit::Status status;
  std::unique_ptr<DeviceBuffer> ws;
  int64_t step = 0;
  QuantStep(DType t, const fusekit::ApplyAdamWQuantOptions &o, int64_t elements = kN)
      : d(t, o.state_format, elements) {
    status = d.plan(o, &plan);
    if (status.ok())
      ws = std::make_unique<DeviceBuffer>(std::max<size_t>(plan.workspace_size(), 64));
  }
  fusekit::Status run() { return plan.run(step++, 1e-3f, ws->ptr, plan.workspace_size()); }
};

double seconds_of(const std::function<fusekit::Status()> &fn, std::string *error) {
  const auto t0 = std::chrono::steady_clock::now();
  const fusekit::Status s = fn();
  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!s.ok() && error->empty()) *error = s.message();
  return t;
}

// implementation: a name (cpu_hwy_binary_search: cpu_hwy without the lookup tables), or null.
void BM_ApplyAdamWQuant(benchmark::State &state, DType t, const char *implementation = nullptr,
                        QuantStateFormat format = QuantStateFormat::kDynamicMap) {
  QuantData d(t, format);
  fusekit::ApplyAdamWQuant plan;
  const fusekit::Status st = d.plan(step_options(format, false, implementation), &plan);
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

// The targets of issue #33 in one benchmark: each iteration runs, back to back, the float32 AdamW
// step (where it is built), the dynamic-map 8-bit step and the FP8 8-bit step, each on its own
// 64M-element tensors (float32 var and grad); the iteration's time is the FP8 step's. Counters
// (medians over the iterations): fp8_ms, dynamic_map_ms, adam_w_ms; dynamic_over_fp8 (the
// FP8 step's speed-up over the dynamic map's; target >= 1.6), fp8_over_adam_w (FP8 time / float32
// AdamW time); GB/s and of_copy of the FP8 step at 16 bytes per element; arith_floor_ms (the FP8
// step's arithmetic alone: common/adam_arithmetic.h, kFp8) and of_arith_floor (floor / time: 1.0
// is a step bound by its arithmetic and nothing else).
void BM_ApplyAdamWQuantFormats(benchmark::State &state) {
  QuantStep fp8(DType::kFloat32, step_options(QuantStateFormat::kFp8));
  QuantStep dyn(DType::kFloat32, step_options(QuantStateFormat::kDynamicMap));
  for (const QuantStep *q : {&fp8, &dyn}) {
    if (!q->status.ok()) {
      state.SkipWithError(q->status.message().c_str());
      return;
    }
  }
#if defined(FUSEKIT_BENCH_WITH_ADAM_W)
  fusekit::bench::AdamWStep adam_w(kN);
  if (!adam_w.status.ok()) {
    state.SkipWithError(adam_w.status.message().c_str());
    return;
  }
#endif
  std::vector<double> t_fp8, t_dyn, t_adam_w;
  std::string error;
  for (auto _ : state) {
#if defined(FUSEKIT_BENCH_WITH_ADAM_W)
    t_adam_w.push_back(seconds_of([&] { return adam_w.run(); }, &error));
#endif
    t_dyn.push_back(seconds_of([&] { return dyn.run(); }, &error));
    const double t = seconds_of([&] { return fp8.run(); }, &error);
    t_fp8.push_back(t);
    state.SetIterationTime(t);
  }
  if (!error.empty()) state.SkipWithError(error.c_str());
  using fusekit::bench::median_of;
  const double op = median_of(t_fp8), dm = median_of(t_dyn);
  fusekit::bench::report_bandwidth_seconds(state, 16.0 * static_cast<double>(kN), op);
  state.counters["fp8_ms"] = op * 1e3;
  state.counters["dynamic_map_ms"] = dm * 1e3;
  state.counters["dynamic_over_fp8"] = dm / op;
#if defined(FUSEKIT_BENCH_WITH_ADAM_W)
  const double aw = median_of(t_adam_w);
  state.counters["adam_w_ms"] = aw * 1e3;
  state.counters["fp8_over_adam_w"] = op / aw;
#endif
  const double floor =
      fusekit::bench::adam_arithmetic_seconds_per_element(fusekit::bench::AdamArithmetic::kFp8) *
      static_cast<double>(kN);
  state.counters["arith_floor_ms"] = floor * 1e3;
  state.counters["of_arith_floor"] = floor / op;
  state.SetLabel(std::string("fp8 ") + fp8.plan.implementation() + ", dynamic map " +
                 dyn.plan.implementation());
}

// The arithmetic alone: 65,536 float32 elements (640 KiB of 8-bit state and operands: in this
// machine's 1 MiB L2), one thread, each iteration the float32 AdamW step (where it is built), the
// dynamic-map step and the FP8 step in turn; counters: ns per element of each (medians), and the
// FP8 step's arithmetic floor per element (kFp8, measured on one thread).
void BM_ApplyAdamWQuantInCache(benchmark::State &state) {
  constexpr int64_t kSmall = 65536;
  const int threads = fusekit::num_threads();
  fusekit::set_num_threads(1);
  QuantStep fp8(DType::kFloat32, step_options(QuantStateFormat::kFp8), kSmall);
  QuantStep dyn(DType::kFloat32, step_options(QuantStateFormat::kDynamicMap), kSmall);
#if defined(FUSEKIT_BENCH_WITH_ADAM_W)
  fusekit::bench::AdamWStep adam_w(kSmall);
#endif
  std::vector<double> t_fp8, t_dyn, t_adam_w;
  std::string error;
  if (!fp8.status.ok() || !dyn.status.ok()) error = "plan failed";
  for (auto _ : state) {
    if (!error.empty()) break;
#if defined(FUSEKIT_BENCH_WITH_ADAM_W)
    t_adam_w.push_back(seconds_of([&] { return adam_w.run(); }, &error));
#endif
    t_dyn.push_back(seconds_of([&] { return dyn.run(); }, &error));
    const double t = seconds_of([&] { return fp8.run(); }, &error);
    t_fp8.push_back(t);
    state.SetIterationTime(t);
  }
  // The floor on one thread, as the steps ran.
  const double floor =
      fusekit::bench::adam_arithmetic_seconds_per_element(fusekit::bench::AdamArithmetic::kFp8);
  fusekit::set_num_threads(threads);
  if (!error.empty()) {
    state.SkipWithError(error.c_str());
    return;
  }
  using fusekit::bench::median_of;
  const double per = 1e9 / static_cast<double>(kSmall);
  state.counters["fp8_ns/elem"] = median_of(t_fp8) * per;
  state.counters["dynamic_map_ns/elem"] = median_of(t_dyn) * per;
#if defined(FUSEKIT_BENCH_WITH_ADAM_W)
  state.counters["adam_w_ns/elem"] = median_of(t_adam_w) * per;
#endif
  state.counters["fp8_floor_ns/elem"] = floor * 1e9;
  state.SetLabel(std::string("fp8 ") + fp8.plan.implementation() + ", dynamic map " +
                 dyn.plan.implementation());
}

// The lost-v guard's cost in the dynamic-map format: each iteration runs the step with the guard
// off and then on, each on its own 64M float32 tensors, on one implementation. Counters (medians):
// off_ms, on_ms, on_over_off.
void BM_ApplyAdamWQuantLostVGuard(benchmark::State &state, const std::string &impl) {
  QuantStep off(DType::kFloat32, step_options(QuantStateFormat::kDynamicMap, false, impl.c_str()));
  QuantStep on(DType::kFloat32, step_options(QuantStateFormat::kDynamicMap, true, impl.c_str()));
  for (const QuantStep *q : {&off, &on}) {
    if (!q->status.ok()) {
      state.SkipWithError(q->status.message().c_str());
      return;
    }
  }
  std::vector<double> t_off, t_on;
  std::string error;
  for (auto _ : state) {
    t_off.push_back(seconds_of([&] { return off.run(); }, &error));
    const double t = seconds_of([&] { return on.run(); }, &error);
    t_on.push_back(t);
    state.SetIterationTime(t);
  }
  if (!error.empty()) state.SkipWithError(error.c_str());
  using fusekit::bench::median_of;
  state.counters["off_ms"] = median_of(t_off) * 1e3;
  state.counters["on_ms"] = median_of(t_on) * 1e3;
  state.counters["on_over_off"] = median_of(t_on) / median_of(t_off);
  state.SetLabel(on.plan.implementation());
}

const bool registered_guard = [] {
  for (const std::string &impl : fusekit::ApplyAdamWQuant::implementations()) {
    if (impl != "cpu_avx512vbmi" && impl != "cpu_hwy") continue;  // the two kernels
    benchmark::RegisterBenchmark(("BM_ApplyAdamWQuantLostVGuard/" + impl).c_str(),
                                 BM_ApplyAdamWQuantLostVGuard, impl)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(11);
  }
  return true;
}();

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
BENCHMARK_CAPTURE(BM_ApplyAdamWQuant, float32_fp8, DType::kFloat32, nullptr, QuantStateFormat::kFp8)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_ApplyAdamWQuant, bfloat16_fp8, DType::kBFloat16, nullptr,
                  QuantStateFormat::kFp8)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_ApplyAdamWQuant, float32_fp8_ue3m5, DType::kFloat32, nullptr,
                  QuantStateFormat::kFp8Ue3m5)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_ApplyAdamWQuantFormats)
    ->Name("BM_ApplyAdamWQuantFormats/float32")
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->Iterations(11);
BENCHMARK(BM_ApplyAdamWQuantInCache)
    ->Name("BM_ApplyAdamWQuantInCache/float32")
    ->Unit(benchmark::kMicrosecond)
    ->UseManualTime()
    ->Iterations(300);

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
BENCHMARK_CAPTURE(BM_ArithmeticFloor, fp8, fusekit::bench::AdamArithmetic::kFp8)
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime()
    ->Iterations(1);

}  // namespace
