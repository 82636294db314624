// AddLora benchmark. Two serving shapes, in place (out = y, as vLLM's add_lora), float16 (the
// seed's dtype) unless named:
//   - prefill: B = 4096 rows over 4 adapters (rows interleaved), H1 = H2 = H3 = 4096, R = 16 and
//     64: GFLOP/s (2 * B * R * (H1 + H2)) against the FMA peak measured in the same run;
//   - decode: B = 32 rows over 32 adapters, H1 = H2 = 4096, R = 16: GB/s of weights read against
//     the copy bandwidth measured in the same run. 8 layers, one per iteration in turn (as a
//     decode step walks the model), so the 64 MiB of weights come from memory, not the cache.
// Both against the roofline floor max(flops / peak, bytes / copy bandwidth), where bytes counts
// everything read and written (x, y read, out written, the adapters' weights, the indices):
// "of_roofline" = floor / measured time (1.0 = at the floor; the target is >= 0.5).
// A batched server's decode step (B = 24 or 96 rows over 3 adapters, H = 2048, bfloat16): the
// decode path against the prefill path, GFLOP/s.
// And the cost of planning: one token on tiny shapes, a reused plan's run (BM_AddLoraPlanReuse)
// against plan + run every call (BM_AddLoraFreshPlan), in microseconds per call.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/ceilings.h"
#include "fusekit/add_lora.h"
#include "fusekit/float16.h"

namespace {

using fusekit::AddLora;
using fusekit::DType;
using fusekit::TensorView;
using fusekit::bench::DeviceBuffer;

void fill_random(DeviceBuffer &buf, DType dt, int64_t n, float amp, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-amp, amp);
  for (int64_t i = 0; i < n; ++i) {
    const float v = u(rng);
    if (dt == DType::kFloat32) {
      buf.as<float>()[i] = v;
    } else {
      buf.as<uint16_t>()[i] =
          dt == DType::kFloat16 ? fusekit::float_to_half_bits(v) : fusekit::float_to_bf16_bits(v);
    }
  }
}

struct Problem {
  int64_t b, h, r, w, layers;
  DType dt;
};

struct Setup {
  Problem p;
  size_t es;
  DeviceBuffer x, y, wa, wb, idx;
  std::vector<AddLora> plans;  // one per layer
  size_t ws_bytes = 0;
  explicit Setup(const Problem &pr, const char *implementation = nullptr)
      : p(pr),
        es(fusekit::dtype_size(pr.dt)),
        x(static_cast<size_t>(pr.b * pr.h) * es),
        y(static_cast<size_t>(pr.b * pr.h) * es),
        wa(static_cast<size_t>(pr.w * pr.layers * pr.r * pr.h) * es),
        wb(static_cast<size_t>(pr.w * pr.layers * pr.h * pr.r) * es),
        idx(static_cast<size_t>(pr.b) * 4) {
    fill_random(x, p.dt, p.b * p.h, 1.0f, 1);
    fill_random(y, p.dt, p.b * p.h, 1.0f, 2);
    fill_random(wa, p.dt, p.w * p.layers * p.r * p.h, 0.02f, 3);
    fill_random(wb, p.dt, p.w * p.layers * p.h * p.r, 0.02f, 4);
    // Every adapter gets B / W rows, in a shuffled order (tokens of several requests).
    std::vector<int32_t> ids(static_cast<size_t>(p.b));
    for (int64_t i = 0; i < p.b; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>(i % p.w);
    std::shuffle(ids.begin(), ids.end(), std::mt19937_64(5));
    std::memcpy(idx.ptr, ids.data(), ids.size() * 4);
    const TensorView vy = TensorView::contiguous(y.ptr, p.dt, {p.b, p.h});
    for (int64_t l = 0; l < p.layers; ++l) {
      fusekit::AddLoraOptions o;
      o.layer_idx = l;
      o.scale = 0.5;
      o.implementation = implementation;
      AddLora plan;
      const auto st = AddLora::plan(vy, TensorView::contiguous(x.ptr, p.dt, {p.b, p.h}),
                                    TensorView::contiguous(wb.ptr, p.dt, {p.w, p.layers, p.h, p.r}),
                                    TensorView::contiguous(idx.ptr, DType::kInt32, {p.b}),
                                    TensorView::contiguous(wa.ptr, p.dt, {p.w, p.layers, p.r, p.h}),
                                    vy, o, &plan);
      if (!st.ok()) return;
      plans.push_back(plan);
      ws_bytes = std::max(ws_bytes, plan.workspace_size());
    }
  }
  double flops() const {
    return 2.0 * static_cast<double>(p.b * p.r) * static_cast<double>(2 * p.h);
  }
  double weight_bytes() const {
    return static_cast<double>(p.w * 2 * p.r * p.h) * static_cast<double>(es);
  }
  double bytes() const {
    return static_cast<double>(3 * p.b * p.h) * static_cast<double>(es) + weight_bytes() +
           4.0 * static_cast<double>(p.b);
  }
};

void run_and_report(benchmark::State &state, Setup &s, bool decode) {
  if (s.plans.size() != static_cast<size_t>(s.p.layers)) {
    state.SkipWithError("plan failed");
    return;
  }
  DeviceBuffer ws(s.ws_bytes);
  std::memset(ws.ptr, 0, s.ws_bytes);
  size_t layer = 0;
  for (auto _ : state) {
    const auto st = s.plans[layer].run(ws.ptr, s.ws_bytes);
    if (!st.ok()) {
      state.SkipWithError(st.message().c_str());
      break;
    }
    layer = (layer + 1) % s.plans.size();
  }
  const double peak = fusekit::bench::fma_peak_flops(), bw = fusekit::bench::copy_bandwidth();
  const double floor_s = std::max(s.flops() / peak, s.bytes() / bw);
  if (decode) {
    fusekit::bench::report_bandwidth(state, s.weight_bytes());
  } else {
    fusekit::bench::report_flops(state, s.flops());
  }
  state.counters["floor_us"] = floor_s * 1e6;
  state.counters["of_roofline"] =
      benchmark::Counter(floor_s, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(fusekit::dtype_name(s.p.dt)) + " B=" + std::to_string(s.p.b) +
                 " W=" + std::to_string(s.p.w) + " H=" + std::to_string(s.p.h) +
                 " R=" + std::to_string(s.p.r) + " " + AddLora::optimized_target() +
                 (floor_s == s.flops() / peak ? " compute-bound" : " memory-bound"));
}

DType dtype_arg(int64_t v) {
  return v == 0 ? DType::kFloat16 : v == 1 ? DType::kBFloat16 : DType::kFloat32;
}

void BM_AddLoraPrefill(benchmark::State &state) {
  Setup s({4096, 4096, state.range(0), 4, 1, dtype_arg(state.range(1))});
  run_and_report(state, s, false);
}
BENCHMARK(BM_AddLoraPrefill)
    ->ArgNames({"R", "dtype"})
    ->Args({16, 0})
    ->Args({64, 0})
    ->Args({64, 1})
    ->Args({64, 2})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.5);

void BM_AddLoraDecode(benchmark::State &state) {
  Setup s({32, 4096, 16, 32, 8, dtype_arg(state.range(0))});
  run_and_report(state, s, true);
}
BENCHMARK(BM_AddLoraDecode)
    ->ArgNames({"dtype"})
    ->Arg(0)
    ->Arg(1)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.5);

// Each implementation of the list on both shapes (float16, R = 16): the reference is the plain
// scalar loop on one thread.
void BM_AddLoraImplementation(benchmark::State &state, const std::string &impl, bool decode) {
  Setup s(decode ? Problem{32, 4096, 16, 32, 8, DType::kFloat16}
                 : Problem{4096, 4096, 16, 4, 1, DType::kFloat16},
          impl.c_str());
  run_and_report(state, s, decode);
  state.SetLabel(impl + (decode ? " decode" : " prefill"));
}

const bool registered_implementations = [] {
  for (const std::string &impl : AddLora::implementations()) {
    for (bool decode : {true, false}) {
      benchmark::RegisterBenchmark(
          ("BM_AddLoraImplementation/" + impl + (decode ? "/decode" : "/prefill")).c_str(),
          BM_AddLoraImplementation, impl, decode)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond)
          ->Iterations(impl == "cpu_reference" ? 2 : 20);
    }
  }
  return true;
}();

// A batched server's decode step: B rows over W = 3 adapters (groups of B / 3 rows), H = 2048,
// R = 16, bfloat16, 4 layers in turn: the shape vLLM's CPU engine hands AddLora for 24 or 96
// sequences on three adapters. cpu_hwy sends groups under AddLora::kPrefillMinRows rows to the
// decode path; cpu_hwy_prefill packs each group's weights and runs the GEMM tiles. GFLOP/s
// against the FMA peak.
void BM_AddLoraServingStep(benchmark::State &state, const std::string &impl) {
  Setup s({state.range(0), 2048, 16, 3, 4, DType::kBFloat16}, impl.c_str());
  run_and_report(state, s, false);
  state.SetLabel(impl + " bfloat16 B=" + std::to_string(state.range(0)) + " W=3 H=2048 R=16");
}

const bool registered_serving = [] {
  for (const char *impl : {"cpu_hwy", "cpu_hwy_prefill"}) {
    benchmark::RegisterBenchmark((std::string("BM_AddLoraServingStep/") + impl).c_str(),
                                 BM_AddLoraServingStep, std::string(impl))
        ->ArgName("B")
        ->Arg(24)
        ->Arg(96)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond)
        ->MinTime(0.3);
  }
  return true;
}();

// One token, tiny shapes (B = 1, H1 = H2 = H3 = 64, R = 16, W = 4, float16, in place): what a
// call costs besides the arithmetic. "us_per_call" per call.
struct Tiny {
  static constexpr int64_t kB = 1, kH = 64, kR = 16, kW = 4;
  std::vector<uint16_t> x, y, wa, wb;
  std::vector<int32_t> idx{2};
  fusekit::AddLoraTensors t;
  Tiny()
      : x(static_cast<size_t>(kB * kH)),
        y(static_cast<size_t>(kB * kH)),
        wa(static_cast<size_t>(kW * kR * kH)),
        wb(static_cast<size_t>(kW * kH * kR)) {
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<float> u(-0.1f, 0.1f);
    for (auto *v : {&x, &y, &wa, &wb}) {
      for (auto &e : *v) e = fusekit::float_to_half_bits(u(rng));
    }
    t.y = TensorView::contiguous(y.data(), DType::kFloat16, {kB, kH});
    t.x = TensorView::contiguous(x.data(), DType::kFloat16, {kB, kH});
    t.weight_b = TensorView::contiguous(wb.data(), DType::kFloat16, {kW, 1, kH, kR});
    t.indices = TensorView::of(idx.data(), {kB});
    t.weight_a = TensorView::contiguous(wa.data(), DType::kFloat16, {kW, 1, kR, kH});
    t.out = t.y;
  }
};

using Clock = std::chrono::steady_clock;

void report_per_call(benchmark::State &state, Clock::time_point start, const char *impl) {
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  state.counters["us_per_call"] =
      state.iterations() > 0 ? us / static_cast<double>(state.iterations()) : 0.0;
  state.SetLabel(std::string("float16 B=1 H=64 R=16 W=4 ") + impl);
}

void BM_AddLoraPlanReuse(benchmark::State &state) {
  Tiny tiny;
  fusekit::AddLoraProblem problem;
  AddLora plan;
  if (!fusekit::AddLoraProblem::make(tiny.t, {}, &problem).ok() ||
      !AddLora::plan(problem, {}, &plan).ok()) {
    state.SkipWithError("plan failed");
    return;
  }
  std::vector<char> ws(plan.workspace_size());
  const Clock::time_point start = Clock::now();
  for (auto _ : state) {
    const auto st = plan.run(tiny.t, ws.data(), ws.size());
    if (!st.ok()) {
      state.SkipWithError(st.message().c_str());
      break;
    }
  }
  report_per_call(state, start, plan.implementation());
}
BENCHMARK(BM_AddLoraPlanReuse)->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);

void BM_AddLoraFreshPlan(benchmark::State &state) {
  Tiny tiny;
  std::vector<char> ws(1 << 20);
  const char *impl = "none";
  const Clock::time_point start = Clock::now();
  for (auto _ : state) {
    AddLora plan;
    auto st = AddLora::plan(tiny.t.y, tiny.t.x, tiny.t.weight_b, tiny.t.indices, tiny.t.weight_a,
                            tiny.t.out, {}, &plan);
    if (st.ok() && plan.workspace_size() > ws.size()) ws.resize(plan.workspace_size());
    if (st.ok()) st = plan.run(ws.data(), ws.size());
    if (!st.ok()) {
      state.SkipWithError(st.message().c_str());
      break;
    }
    impl = plan.implementation();
  }
  report_per_call(state, start, impl);
}
BENCHMARK(BM_AddLoraFreshPlan)->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);

}  // namespace
