// One float32 AdamW step over n elements (var, grad, m, v float32: 28 bytes per element) on
// buffers from aclrtMalloc(HUGE_FIRST), in GB/s: adam_w_bench's main case, and the 32-bit peer that
// apply_adam_w_quant_bench runs beside the 8-bit step. Inputs: xorshift values filled in parallel.
#ifndef FUSEKIT_BENCHMARKS_COMMON_ADAM_W_STEP_H_
#define FUSEKIT_BENCHMARKS_COMMON_ADAM_W_STEP_H_

#include <benchmark/benchmark.h>
#include <cstdint>

#include "common/ceilings.h"
#include "common/fill.h"
#include "fusekit/adam_w.h"

namespace fusekit::bench {

// xorshift values in scale * [-1, 1).
inline void fill_floats(float *p, int64_t n, uint64_t seed, float scale) {
  xorshift_fill(n, seed,
                [&](int64_t i, uint64_t x) { p[i] = scale * (2.0f * unit_float(x) - 1.0f); });
}

// `implementation`: a name from fusekit::AdamW::implementations(), or null (the plan's choice).
inline void adam_w_step(benchmark::State &state, int64_t n, const char *implementation = nullptr) {
  const auto bytes = static_cast<size_t>(n) * 4;
  DeviceBuffer var(bytes), grad(bytes), m(bytes), v(bytes);
  fill_floats(var.as<float>(), n, 1, 1.0f);
  fill_floats(grad.as<float>(), n, 2, 0.01f);
  fill_floats(m.as<float>(), n, 3, 0.001f);
  fill_floats(v.as<float>(), n, 4, 1e-6f);
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) v.as<float>()[i] *= v.as<float>()[i] < 0 ? -1.0f : 1.0f;
  AdamWOptions o;
  o.weight_decay = 0.01;
  o.implementation = implementation;
  AdamW plan;
  const Status st = AdamW::plan(TensorView::contiguous(var.ptr, DType::kFloat32, &n, 1),
                                TensorView::contiguous(grad.ptr, DType::kFloat32, &n, 1),
                                TensorView::contiguous(m.ptr, DType::kFloat32, &n, 1),
                                TensorView::contiguous(v.ptr, DType::kFloat32, &n, 1), o, &plan);
  if (!st.ok()) {
    state.SkipWithError(st.message().c_str());
    return;
  }
  int64_t step = 0;
  for (auto _ : state) {
    const Status r = plan.run(step++, 1e-3f);
    if (!r.ok()) state.SkipWithError(r.message().c_str());
  }
  report_bandwidth(state, 28.0 * static_cast<double>(n));
  state.counters["elements"] = static_cast<double>(n);
  state.SetLabel(plan.implementation());
}

}  // namespace fusekit::bench

#endif  // FUSEKIT_BENCHMARKS_COMMON_ADAM_W_STEP_H_
