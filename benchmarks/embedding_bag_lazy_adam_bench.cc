// EmbeddingBagLazyAdam benchmark: the fused embedding-bag backward + LazyAdam step against the
// unfused path (the per-lookup gradient [L, D] materialized, grad_output[bag] * c, then one
// LazyAdam step on the L rows), in the same run, and in GB/s against this machine's copy
// bandwidth.
//
// BM_EmbeddingBagLazyAdam/<lo>/<hi>/<mode>: issue 32's table (R = 1,000,000 x D = 32 float32,
// from aclrtMalloc(HUGE_FIRST)), a batch of B = 8192 bags of lo .. hi ids drawn uniformly from
// the table (1-4: ~20.5k lookups; 40-60, multi-hot: ~410k), mode 0 sum, 1 mean with per-sample
// weights. Each iteration times the unfused path and then the fused step back to back, so that
// load from elsewhere on this shared machine hits both alike; the counters are medians of the
// iterations. Counters: ms (fused), unfused_ms, speedup (unfused / fused), GB/s (the bytes the
// fused step must move: m, v, var of each distinct row read and written, 24 D bytes, grad_output
// 4 B D, ids 8 L, weights 4 L, offsets), copy_GB/s, of_copy, rows (distinct rows updated).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "common/bags.h"
#include "common/ceilings.h"
#include "common/parallel.h"
#include "fusekit/embedding_bag_lazy_adam.h"
#include "fusekit/lazy_adam.h"
#include "fusekit/threading.h"

namespace {

using fusekit::TensorView;
using fusekit::bench::DeviceBuffer;

constexpr int64_t kRows = 1'000'000, kDim = 32, kBags = 8192;

using fusekit::bench::fill_uniform;
using fusekit::bench::seconds_since;

void BM_EmbeddingBagLazyAdam(benchmark::State &state) {
  const int lo = static_cast<int>(state.range(0)), hi = static_cast<int>(state.range(1));
  const bool mean = state.range(2) != 0;  // mean pooling with per-sample weights
  const size_t table = static_cast<size_t>(kRows * kDim);
  DeviceBuffer m(table * 4), v(table * 4), var(table * 4);
  fill_uniform(m.as<float>(), kRows * kDim, 1, -0.1f, 0.1f);
  fill_uniform(v.as<float>(), kRows * kDim, 2, 0.0f, 0.01f);
  fill_uniform(var.as<float>(), kRows * kDim, 3, -1.0f, 1.0f);

  // The batch: B bags of lo .. hi ids, uniform over the table.
  fusekit::bench::BagBatch batch = fusekit::bench::make_bag_batch(kRows, kDim, kBags, lo, hi, mean);
  const std::vector<int64_t> &offsets = batch.offsets;
  std::vector<int64_t> &indices = batch.indices;
  std::vector<float> &grad_output = batch.grad_output, &weights = batch.weights;
  const int64_t lookups = batch.lookups();

  // The fused step: a plan for the table, run on this batch.
  fusekit::EmbeddingBagLazyAdamTensors t;
  t.grad_output = TensorView::of(grad_output.data(), {kBags, kDim});
  t.indices = TensorView::of(indices.data(), {lookups});
  t.offsets = TensorView::of(offsets.data(), {kBags + 1});
  if (mean) t.per_sample_weights = TensorView::of(weights.data(), {lookups});
  t.m = TensorView::of(m.as<float>(), {kRows, kDim});
  t.v = TensorView::of(v.as<float>(), {kRows, kDim});
  t.var = TensorView::of(var.as<float>(), {kRows, kDim});
  fusekit::EmbeddingBagLazyAdamOptions o;
  o.pooling = mean ? fusekit::PoolingMode::kMean : fusekit::PoolingMode::kSum;
  fusekit::EmbeddingBagLazyAdam plan;
  fusekit::Status st = fusekit::EmbeddingBagLazyAdam::plan(t, o, &plan);
  if (!st.ok()) {
    state.SkipWithError(st.message().c_str());
    return;
  }
  std::vector<char> ws(plan.workspace_size(t));

  // The unfused path: the per-lookup gradient, then LazyAdam on L rows.
  DeviceBuffer per_lookup(static_cast<size_t>(lookups * kDim) * 4);
  float *g = per_lookup.as<float>();
  std::vector<int64_t> bag_of(static_cast<size_t>(lookups));
  for (int64_t b = 0; b < kBags; ++b) {
    for (int64_t i = offsets[static_cast<size_t>(b)]; i < offsets[static_cast<size_t>(b + 1)]; ++i)
      bag_of[static_cast<size_t>(i)] = b;
  }
  fusekit::LazyAdam lazy;
  st = fusekit::LazyAdam::plan(TensorView::of(g, {lookups, kDim}),
                               TensorView::of(indices.data(), {lookups}), t.m, t.v, t.var,
                               {.beta1 = 0.9, .beta2 = 0.999, .epsilon = 1e-8}, &lazy);
  if (!st.ok()) {
    state.SkipWithError(st.message().c_str());
    return;
  }
  std::vector<char> lazy_ws(lazy.workspace_size());
  const int threads = fusekit::num_threads();
  const auto unfused = [&] {
    // The backward of an embedding bag as torch writes it (per lookup: the bag's gradient times
    // its coefficient), on fusekit's threads (an OpenMP team would spin against them), then the
    // optimizer.
    fusekit::parallel_for(lookups, threads, 4096, [&](int64_t begin, int64_t end, int) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t b = bag_of[static_cast<size_t>(i)];
        float c = 1.0f;
        if (mean) {
          c = 1.0f /
              static_cast<float>(offsets[static_cast<size_t>(b + 1)] -
                                 offsets[static_cast<size_t>(b)]) *
              weights[static_cast<size_t>(i)];
        }
        const float *src = grad_output.data() + b * kDim;
        float *dst = g + i * kDim;
        for (int64_t j = 0; j < kDim; ++j) dst[j] = src[j] * c;
      }
    });
    return lazy.run(1e-3f, lazy_ws.data(), lazy_ws.size());
  };

  std::vector<double> t_fused, t_unfused;
  fusekit::EmbeddingBagLazyAdamStats stats;
  for (auto _ : state) {
    auto t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(unfused().ok());
    t_unfused.push_back(seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    st = plan.run(t, {.lr = 1e-3f, .lr_tensor = {}}, ws.data(), ws.size(), &stats);
    t_fused.push_back(seconds_since(t0));
    if (!st.ok()) {
      state.SkipWithError(st.message().c_str());
      return;
    }
  }
  const double fused = fusekit::bench::median_of(t_fused);
  const double unf = fusekit::bench::median_of(t_unfused);
  const double bytes = static_cast<double>(stats.rows_updated) * 24.0 * kDim +
                       static_cast<double>(kBags) * 4.0 * kDim +
                       static_cast<double>(lookups) * (mean ? 12.0 : 8.0) +
                       static_cast<double>(kBags + 1) * 8.0;
  fusekit::bench::report_bandwidth_seconds(state, bytes, fused);
  state.counters["ms"] = fused * 1e3;
  state.counters["unfused_ms"] = unf * 1e3;
  state.counters["speedup"] = unf / fused;
  state.counters["lookups"] = static_cast<double>(lookups);
  state.counters["rows"] = static_cast<double>(stats.rows_updated);
  state.SetLabel(std::string(plan.implementation()) + (mean ? ", mean, weighted" : ", sum"));
}

void BM_CopyBandwidth(benchmark::State &state) {
  for (auto _ : state) benchmark::DoNotOptimize(fusekit::bench::copy_bandwidth());
  state.counters["copy_GB/s"] = fusekit::bench::copy_bandwidth() * 1e-9;
}

}  // namespace

BENCHMARK(BM_CopyBandwidth)->Iterations(1);
BENCHMARK(BM_EmbeddingBagLazyAdam)
    ->Args({1, 4, 0})
    ->Args({1, 4, 1})
    ->Args({40, 60, 0})
    ->Args({40, 60, 1})
    ->Iterations(15)
    ->Unit(benchmark::kMillisecond);
