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

// The float32 AdamW step's tensors and plan (weight decay 0.01): run() steps them once.
// `implementation`: a name from fusekit::AdamW::implementations(), or null (the plan's choice).
struct AdamWStep {
  int64_t n;
  DeviceBuffer var, grad, m, v;
  AdamW plan;
  Status status;
  int64_t step = 0;
  explicit AdamWStep(int64_t elements, const char *implementation = nullptr)
      : n(elements),
        var(static_cast<size_t>(n) * 4),
        grad(static_cast<size_t>(n) * 4),
        m(static_cast<size_t>(n) * 4),
        v(static_cast<size_t>(n) * 4) {
    fill_floats(var.as<float>(), n, 1, 1.0f);
    fill_floats(grad.as<float>(), n, 2, 0.01f);
    fill_floats(m.as<float>(), n, 3, 0.001f);
    fill_floats(v.as<float>(), n, 4, 1e-6f);
    float *vp = v.as<float>();
#pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) vp[i] *= vp[i] < 0 ? -1.0f : 1.0f;
    AdamWOptions o;
    o.weight_decay = 0.01;
    o.implementation = implementation;
    status = AdamW::plan(TensorView::contiguous(var.ptr, DType::kFloat32, &n, 1),
                         TensorView::contiguous(grad.ptr, DType::kFloat32, &n, 1),
                         TensorView::contiguous(m.ptr, DType::kFloat32, &n, 1),
                         TensorView::contiguous(v.ptr, DType::kFloat32, &n, 1), o, &plan);
  }
  Status run() {
    return plan.run(step++, 1e-3f);
  }
  static constexpr double kBytesPerElement = 28.0;  // var r+w, grad r, m r+w, v r+w
};

inline void adam_w_step(benchmark::State &state, int64_t n, const char *implementation = nullptr) {
  AdamWStep s(n, implementation);
  if (!s.status.ok()) {
    state.SkipWithError(s.status.message().c_str());
    return;
  }
  for (auto _ : state) {
    const Status r = s.run();
    if (!r.ok()) state.SkipWithError(r.message().c_str());
  }
  report_bandwidth(state, AdamWStep::kBytesPerElement * static_cast<double>(n));
  state.counters["elements"] = static_cast<double>(n);
  state.SetLabel(s.plan.implementation());
}

}  // namespace fusekit::bench

#endif  // FUSEKIT_BENCHMARKS_COMMON_ADAM_W_STEP_H_
