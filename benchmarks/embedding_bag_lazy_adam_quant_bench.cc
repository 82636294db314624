// EmbeddingBagLazyAdamQuant benchmark: the 8-bit fused embedding-bag step against the float32 one
// (EmbeddingBagLazyAdam) on the same batch, in the same run (issue 32's target: the 8-bit fused
// step within 1.2x of the float32 fused step at 1M x 32, batch 8192, bags 1-4, 2 threads).
//
// BM_EmbeddingBagLazyAdamQuant/<lo>/<hi>/<format>/<mode>: issue 32's table (R = 1,000,000 x
// D = 32, var float32; every table from aclrtMalloc(HUGE_FIRST)), a batch of B = 8192 bags of
// lo .. hi ids drawn uniformly (benchmarks/common/bags.h), format 0 the dynamic maps (with the
// lost-v guard, as fusekit.torch runs them) or 1 FP8, mode 0 sum, 1 mean with per-sample weights;
// the 8-bit state packed by row as fusekit.torch.SparseAdam8bit and FusedEmbeddingBag(state="8bit")
// allocate it (codes [R, 2, D], scales [R, 2, 1]). After 5 untimed runs of each, each iteration
// times the float32 fused step and the 8-bit one back to back, on tables of their own, in
// alternating order (so that neither finds the batch's grad_output warm from the other more often);
// the counters are medians of the iterations: ms (8-bit), fp32_ms, vs_fp32 (8-bit / float32, of the
// medians), ratio_median (the median of the iterations' ratios), GB/s (the bytes the 8-bit step
// moves: per distinct row var read and written, both code rows and both scale rows read and
// written, 12 D + 16; grad_output, ids, weights, offsets), state_B/row.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "common/bags.h"
#include "common/ceilings.h"
#include "fusekit/embedding_bag_lazy_adam.h"
#include "fusekit/embedding_bag_lazy_adam_quant.h"

namespace {

using fusekit::TensorView;
using fusekit::bench::DeviceBuffer;
using fusekit::bench::fill_uniform;
using fusekit::bench::seconds_since;

constexpr int64_t kRows = 1'000'000, kDim = 32, kBags = 8192, kThreads = 2;

void BM_EmbeddingBagLazyAdamQuant(benchmark::State &state) {
  const int lo = static_cast<int>(state.range(0)), hi = static_cast<int>(state.range(1));
  const bool fp8 = state.range(2) != 0;
  const bool mean = state.range(3) != 0;  // mean pooling with per-sample weights
  const size_t table = static_cast<size_t>(kRows * kDim);
  fusekit::bench::BagBatch batch = fusekit::bench::make_bag_batch(kRows, kDim, kBags, lo, hi, mean);
  const int64_t lookups = batch.lookups();

  // The float32 fused step on its own tables.
  DeviceBuffer m(table * 4), v(table * 4), var32(table * 4);
  fill_uniform(m.as<float>(), kRows * kDim, 1, -0.1f, 0.1f);
  fill_uniform(v.as<float>(), kRows * kDim, 2, 0.0f, 0.01f);
  fill_uniform(var32.as<float>(), kRows * kDim, 3, -1.0f, 1.0f);
  fusekit::EmbeddingBagLazyAdamTensors t32;
  t32.grad_output = TensorView::of(batch.grad_output.data(), {kBags, kDim});
  t32.indices = TensorView::of(batch.indices.data(), {lookups});
  t32.offsets = TensorView::of(batch.offsets.data(), {kBags + 1});
  if (mean) t32.per_sample_weights = TensorView::of(batch.weights.data(), {lookups});
  t32.m = TensorView::of(m.as<float>(), {kRows, kDim});
  t32.v = TensorView::of(v.as<float>(), {kRows, kDim});
  t32.var = TensorView::of(var32.as<float>(), {kRows, kDim});
  fusekit::EmbeddingBagLazyAdamOptions o32;
  o32.pooling = mean ? fusekit::PoolingMode::kMean : fusekit::PoolingMode::kSum;
  o32.num_threads = kThreads;
  fusekit::EmbeddingBagLazyAdam plan32;
  fusekit::Status st = fusekit::EmbeddingBagLazyAdam::plan(t32, o32, &plan32);
  if (!st.ok()) {
    state.SkipWithError(st.message().c_str());
    return;
  }
  std::vector<char> ws32(plan32.workspace_size(t32));

  // The 8-bit fused step: var, codes [R, 2, D] and scales [R, 2, 1] (packed by row).
  DeviceBuffer var8(table * 4), codes(table * 2), scales(static_cast<size_t>(kRows) * 8);
  fill_uniform(var8.as<float>(), kRows * kDim, 3, -1.0f, 1.0f);
  fusekit::bench::xorshift_fill(static_cast<int64_t>(table) * 2, 6, [&](int64_t i, uint64_t x) {
    uint8_t c = static_cast<uint8_t>(x >> 56);
    if (fp8 && (i / kDim) % 2 == 0 && (c & 0x7f) == 0x7f) c ^= 1;  // m: not E4M3's NaN codes
    codes.as<uint8_t>()[i] = c;
  });
  fill_uniform(scales.as<float>(), kRows * 2, 7, 0.0f, fp8 ? 1e-4f : 0.05f);
  const auto qm = fusekit::create_dynamic_map(true), qv = fusekit::create_dynamic_map(false);
  fusekit::EmbeddingBagLazyAdamQuantTensors t8;
  t8.grad_output = t32.grad_output;
  t8.indices = t32.indices;
  t8.offsets = t32.offsets;
  t8.per_sample_weights = t32.per_sample_weights;
  t8.m = TensorView::strided(codes.as<uint8_t>(), fusekit::DType::kUInt8, {kRows, kDim},
                             {2 * kDim, 1});
  t8.v = TensorView::strided(codes.as<uint8_t>() + kDim, fusekit::DType::kUInt8, {kRows, kDim},
                             {2 * kDim, 1});
  t8.var = TensorView::of(var8.as<float>(), {kRows, kDim});
  t8.qmap_m = TensorView::of(qm.data(), {fp8 ? 0 : 256});
  t8.qmap_v = TensorView::of(qv.data(), {fp8 ? 0 : 256});
  t8.absmax_m =
      TensorView::strided(scales.as<float>(), fusekit::DType::kFloat32, {kRows, 1}, {2, 1});
  t8.absmax_v =
      TensorView::strided(scales.as<float>() + 1, fusekit::DType::kFloat32, {kRows, 1}, {2, 1});
  fusekit::EmbeddingBagLazyAdamQuantOptions o8;
  o8.pooling = o32.pooling;
  o8.state_format = fp8 ? fusekit::QuantStateFormat::kFp8 : fusekit::QuantStateFormat::kDynamicMap;
  o8.guard_lost_v = true;
  o8.num_threads = kThreads;
  fusekit::EmbeddingBagLazyAdamQuant plan8;
  st = fusekit::EmbeddingBagLazyAdamQuant::plan(t8, o8, &plan8);
  if (!st.ok()) {
    state.SkipWithError(st.message().c_str());
    return;
  }
  std::vector<char> ws8(plan8.workspace_size(t8));

  // A warm-up (the thread pool, the search tables, the first touches of the state's pages), then
  // the timed iterations.
  for (int k = 0; k < 5; ++k) {
    (void)plan32.run(t32, {.lr = 1e-3f, .lr_tensor = {}}, ws32.data(), ws32.size());
    (void)plan8.run(t8, {.lr = 1e-3f, .lr_tensor = {}}, ws8.data(), ws8.size());
  }
  std::vector<double> t_fp32, t_8bit, ratios;
  fusekit::EmbeddingBagLazyAdamStats stats;
  bool fp32_first = true;
  for (auto _ : state) {
    double a = 0, b = 0;
    for (int k = 0; k < 2; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      if ((k == 0) == fp32_first) {
        st = plan32.run(t32, {.lr = 1e-3f, .lr_tensor = {}}, ws32.data(), ws32.size());
        a = seconds_since(t0);
      } else {
        st = plan8.run(t8, {.lr = 1e-3f, .lr_tensor = {}}, ws8.data(), ws8.size(), &stats);
        b = seconds_since(t0);
      }
      if (!st.ok()) {
        state.SkipWithError(st.message().c_str());
        return;
      }
    }
    fp32_first = !fp32_first;
    t_fp32.push_back(a);
    t_8bit.push_back(b);
    ratios.push_back(b / a);
  }
  const double q = fusekit::bench::median_of(t_8bit), f = fusekit::bench::median_of(t_fp32);
  const double bytes = static_cast<double>(stats.rows_updated) * (12.0 * kDim + 16.0) +
                       static_cast<double>(kBags) * 4.0 * kDim +
                       static_cast<double>(lookups) * (mean ? 12.0 : 8.0) +
                       static_cast<double>(kBags + 1) * 8.0;
  fusekit::bench::report_bandwidth_seconds(state, bytes, q);
  state.counters["ms"] = q * 1e3;
  state.counters["fp32_ms"] = f * 1e3;
  state.counters["vs_fp32"] = q / f;
  state.counters["ratio_median"] = fusekit::bench::median_of(ratios);
  state.counters["rows"] = static_cast<double>(stats.rows_updated);
  state.counters["state_B/row"] = 2.0 * kDim + 8.0;
  state.SetLabel(std::string(plan8.implementation()) + (fp8 ? ", fp8" : ", dynamic map") +
                 (mean ? ", mean, weighted" : ", sum"));
}

}  // namespace

BENCHMARK(BM_EmbeddingBagLazyAdamQuant)
    ->Args({1, 4, 0, 0})
    ->Args({1, 4, 1, 0})
    ->Args({1, 4, 0, 1})
    ->Args({1, 4, 1, 1})
    ->Args({40, 60, 0, 0})
    ->Args({40, 60, 1, 0})
    ->Iterations(61)
    ->Unit(benchmark::kMillisecond);
