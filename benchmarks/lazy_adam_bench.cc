// LazyAdam benchmark: GB/s at 28 bytes per element plus the 4-byte index, against two ceilings
// measured in the same run:
//   - copy: this machine's sequential copy bandwidth (benchmarks/common/ceilings.h);
//   - floor: the same indexed rows read and written with no arithmetic (m <- g, v <- m,
//     var <- max(v, var): the same 28 bytes per element), in the order the indices come, with
//     the same prefetching and threads. "floor_sorted" is that pattern in ascending row order, the
//     order fusekit's kernel walks the table in after grouping the indices.
// Tables come from aclrtMalloc(HUGE_FIRST), as in the seed's programs.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/ceilings.h"
#include "common/fill.h"
#include "common/parallel.h"
#include "common/plan_overhead.h"
#include "fusekit/lazy_adam.h"
#include "fusekit/threading.h"

namespace {

using fusekit::TensorView;
using fusekit::bench::DeviceBuffer;

struct Shape {
  int64_t rows, n, dim;
};

// The seed's shape (Rec SDK gen_data.py), and the same table bytes at other widths.
Shape shape_for(int64_t dim) {
  if (dim <= 32) return {2'000'000, 564'096, dim};
  const int64_t rows = 2'000'000 * 32 / dim;
  return {rows, 564'096 * 32 / dim, dim};
}

void fill_uniform_1_2(float *p, int64_t n, uint64_t seed) {
  fusekit::bench::xorshift_fill(
      n, seed, [&](int64_t i, uint64_t x) { p[i] = 1.0f + fusekit::bench::unit_float(x); });
}

struct Data {
  Shape s;
  DeviceBuffer m, v, var, grad, idx;
  std::vector<int32_t> sorted_idx;
  // unique: a permutation of the rows, cut (gen_data.py); otherwise drawn with replacement, as a
  // batch that was not deduplicated (about 13% repeats at the seed's shape).
  explicit Data(Shape sh, bool unique = true)
      : s(sh),
        m(static_cast<size_t>(sh.rows * sh.dim) * 4),
        v(static_cast<size_t>(sh.rows * sh.dim) * 4),
        var(static_cast<size_t>(sh.rows * sh.dim) * 4),
        grad(static_cast<size_t>(sh.n * sh.dim) * 4),
        idx(static_cast<size_t>(sh.n) * 4) {
    fill_uniform_1_2(m.as<float>(), sh.rows * sh.dim, 1);
    fill_uniform_1_2(v.as<float>(), sh.rows * sh.dim, 2);
    fill_uniform_1_2(var.as<float>(), sh.rows * sh.dim, 3);
    fill_uniform_1_2(grad.as<float>(), sh.n * sh.dim, 4);
    // Unique indices: a random permutation of the rows, cut (gen_data.py).
    std::vector<int32_t> perm(static_cast<size_t>(sh.rows));
    std::iota(perm.begin(), perm.end(), 0);
    std::mt19937_64 rng(5);
    for (int64_t i = 0; i < sh.n; ++i) {
      std::uniform_int_distribution<int64_t> d(i, sh.rows - 1);
      std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(d(rng))]);
    }
    if (!unique) {
      std::uniform_int_distribution<int32_t> any(0, static_cast<int32_t>(sh.rows - 1));
      for (int64_t i = 0; i < sh.n; ++i) perm[static_cast<size_t>(i)] = any(rng);
    }
    std::memcpy(idx.ptr, perm.data(), static_cast<size_t>(sh.n) * 4);
    sorted_idx.assign(perm.begin(), perm.begin() + sh.n);
    std::sort(sorted_idx.begin(), sorted_idx.end());
  }
  double bytes() const {
    return static_cast<double>(s.n) * (28.0 * static_cast<double>(s.dim) + 4.0);
  }
};

// The floor: read gradient, m, v, var rows and write m, v, var rows, no arithmetic to speak of.
void rmw_floor(const Data &d, const int32_t *order, bool order_is_sorted) {
  const int64_t n = d.s.n, D = d.s.dim;
  const float *g = d.grad.as<const float>();
  float *m = d.m.as<float>(), *v = d.v.as<float>(), *var = d.var.as<float>();
  // The kernel's prefetch distance for this row width (lazy_adam_plan.cc).
  const int64_t kAhead = std::clamp<int64_t>(2048 / (D * 4), 2, 16);
  // The library's own thread layer (chunks from a shared counter), so that the floor and the
  // operator use the same threads (OpenMP's would keep spinning into the operator's run).
  fusekit::parallel_for(n, fusekit::num_threads(), 4096, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      if (i + kAhead < n) {
        const int64_t r = order[i + kAhead];
        for (int64_t off = 0; off < D; off += 16) {
          __builtin_prefetch(m + r * D + off, 1);
          __builtin_prefetch(v + r * D + off, 1);
          __builtin_prefetch(var + r * D + off, 1);
          __builtin_prefetch(g + (i + kAhead) * D + off, 0);
        }
      }
      const int64_t r = order[i];
      // With sorted order the gradient row is some other row of the batch; any fixed one will do
      // for a memory floor, so use position i (sequential) only when order is the batch order.
      const float *gi = g + (order_is_sorted ? (i * 7919 % n) : i) * D;
      float *mr = m + r * D, *vr = v + r * D, *wr = var + r * D;
      for (int64_t j = 0; j < D; ++j) {
        const float mo = mr[j], vo = vr[j];
        mr[j] = gi[j];
        vr[j] = mo;
        wr[j] = std::max(vo, wr[j]);
      }
    }
  });
}

double seconds_of(const std::function<void()> &fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Each iteration times the floor (both orders) and then one LazyAdam step, back to back, so that
// load from elsewhere on this shared 2-core machine hits both alike; the counters use medians.
void BM_LazyAdam(benchmark::State &state) {
  const Data d(shape_for(state.range(0)));
  fusekit::LazyAdam plan;
  const auto st =
      fusekit::LazyAdam::plan(TensorView::of(d.grad.as<float>(), {d.s.n, d.s.dim}),
                              TensorView::of(d.idx.as<int32_t>(), {d.s.n}),
                              TensorView::of(d.m.as<float>(), {d.s.rows, d.s.dim}),
                              TensorView::of(d.v.as<float>(), {d.s.rows, d.s.dim}),
                              TensorView::of(d.var.as<float>(), {d.s.rows, d.s.dim}), {}, &plan);
  if (!st.ok()) {
    state.SkipWithError(st.message().c_str());
    return;
  }
  DeviceBuffer ws(std::max<size_t>(plan.workspace_size(), 64));
  std::vector<double> t_op, t_floor, t_floor_sorted;
  for (auto _ : state) {
    t_floor.push_back(seconds_of([&] { rmw_floor(d, d.idx.as<const int32_t>(), false); }));
    t_floor_sorted.push_back(seconds_of([&] { rmw_floor(d, d.sorted_idx.data(), true); }));
    const double t = seconds_of(
        [&] { benchmark::DoNotOptimize(plan.run(1e-3f, ws.ptr, plan.workspace_size()).ok()); });
    t_op.push_back(t);
    state.SetIterationTime(t);
  }
  using fusekit::bench::median_of;
  const double op = median_of(t_op), fl = median_of(t_floor), fls = median_of(t_floor_sorted);
  fusekit::bench::report_bandwidth_seconds(state, d.bytes(), op);
  state.counters["floor_GB/s"] = d.bytes() / fl * 1e-9;
  state.counters["floor_sorted_GB/s"] = d.bytes() / fls * 1e-9;
  state.counters["of_floor"] = fl / op;  // 1.0: as fast as the floor
  state.counters["of_floor_sorted"] = fls / op;
  state.SetLabel("R=" + std::to_string(d.s.rows) + " N=" + std::to_string(d.s.n) +
                 " D=" + std::to_string(d.s.dim));
}

// A batch with repeated rows takes the grouping path (radix sort by row, sorted walk).
void BM_LazyAdamWithRepeats(benchmark::State &state) {
  const Data d(shape_for(state.range(0)), false);
  fusekit::LazyAdam plan;
  const auto st =
      fusekit::LazyAdam::plan(TensorView::of(d.grad.as<float>(), {d.s.n, d.s.dim}),
                              TensorView::of(d.idx.as<int32_t>(), {d.s.n}),
                              TensorView::of(d.m.as<float>(), {d.s.rows, d.s.dim}),
                              TensorView::of(d.v.as<float>(), {d.s.rows, d.s.dim}),
                              TensorView::of(d.var.as<float>(), {d.s.rows, d.s.dim}), {}, &plan);
  if (!st.ok()) {
    state.SkipWithError(st.message().c_str());
    return;
  }
  DeviceBuffer ws(std::max<size_t>(plan.workspace_size(), 64));
  std::vector<double> t_op;
  for (auto _ : state) {
    const double t = seconds_of(
        [&] { benchmark::DoNotOptimize(plan.run(1e-3f, ws.ptr, plan.workspace_size()).ok()); });
    t_op.push_back(t);
    state.SetIterationTime(t);
  }
  fusekit::bench::report_bandwidth_seconds(state, d.bytes(), fusekit::bench::median_of(t_op));
  state.SetLabel("R=" + std::to_string(d.s.rows) + " N=" + std::to_string(d.s.n) +
                 " D=" + std::to_string(d.s.dim) + " drawn with replacement");
}

// The seed shape on each implementation of the list (the reference is the plain scalar loop).
void BM_LazyAdamImplementation(benchmark::State &state, const std::string &impl) {
  const Data d(shape_for(32));
  fusekit::LazyAdamOptions o;
  o.implementation = impl.c_str();
  fusekit::LazyAdam plan;
  const auto st =
      fusekit::LazyAdam::plan(TensorView::of(d.grad.as<float>(), {d.s.n, d.s.dim}),
                              TensorView::of(d.idx.as<int32_t>(), {d.s.n}),
                              TensorView::of(d.m.as<float>(), {d.s.rows, d.s.dim}),
                              TensorView::of(d.v.as<float>(), {d.s.rows, d.s.dim}),
                              TensorView::of(d.var.as<float>(), {d.s.rows, d.s.dim}), o, &plan);
  if (!st.ok()) {
    state.SkipWithError(st.message().c_str());
    return;
  }
  DeviceBuffer ws(std::max<size_t>(plan.workspace_size(), 64));
  std::vector<double> t_op;
  for (auto _ : state) {
    const double t = seconds_of(
        [&] { benchmark::DoNotOptimize(plan.run(1e-3f, ws.ptr, plan.workspace_size()).ok()); });
    t_op.push_back(t);
    state.SetIterationTime(t);
  }
  fusekit::bench::report_bandwidth_seconds(state, d.bytes(), fusekit::bench::median_of(t_op));
  state.SetLabel(impl);
}

const bool registered_implementations = [] {
  for (const std::string &impl : fusekit::LazyAdam::implementations()) {
    benchmark::RegisterBenchmark(("BM_LazyAdamImplementation/" + impl).c_str(),
                                 BM_LazyAdamImplementation, impl)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(5);
  }
  return true;
}();

// Per-step overhead on a tiny problem (1 index into a 1-row table, D = 8): a plan made once and
// run with bindings each step, against a fresh problem + plan + run each step.
struct Tiny {
  std::vector<float> g = std::vector<float>(8, 0.5f), m = std::vector<float>(8, 0.1f),
                     v = std::vector<float>(8, 0.2f), var = std::vector<float>(8, 1.0f);
  int32_t idx = 0;
  fusekit::LazyAdamTensors tensors() {
    return {TensorView::of(g.data(), {1, 8}), TensorView::of(&idx, {1}),
            TensorView::of(m.data(), {1, 8}), TensorView::of(v.data(), {1, 8}),
            TensorView::of(var.data(), {1, 8})};
  }
};

fusekit::Status lazy_adam_run(const fusekit::LazyAdam &plan, const fusekit::LazyAdamTensors &t,
                              void *ws, size_t size, int64_t /*iteration*/) {
  fusekit::LazyAdamScalars scalars;
  scalars.lr = 1e-3f;
  return plan.run(t, scalars, ws, size);
}
void BM_LazyAdamPlanReuse(benchmark::State &state) {
  Tiny t;
  fusekit::bench::plan_reuse<fusekit::LazyAdam, fusekit::LazyAdamProblem>(
      state, t.tensors(), fusekit::LazyAdamOptions{}, lazy_adam_run);
}
void BM_LazyAdamFreshPlan(benchmark::State &state) {
  Tiny t;
  fusekit::bench::fresh_plan<fusekit::LazyAdam, fusekit::LazyAdamProblem>(
      state, t.tensors(), fusekit::LazyAdamOptions{}, lazy_adam_run);
}

void BM_CopyBandwidth(benchmark::State &state) {
  for (auto _ : state) benchmark::DoNotOptimize(fusekit::bench::copy_bandwidth());
  state.counters["copy_GB/s"] = fusekit::bench::copy_bandwidth() * 1e-9;
}

}  // namespace

BENCHMARK(BM_CopyBandwidth)->Iterations(1);
BENCHMARK(BM_LazyAdamPlanReuse)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LazyAdamFreshPlan)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LazyAdam)
    ->ArgName("D")
    ->Arg(32)
    ->Arg(8)
    ->Arg(64)
    ->Arg(128)
    ->Arg(256)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(15);
BENCHMARK(BM_LazyAdamWithRepeats)
    ->ArgName("D")
    ->Arg(32)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(15);
