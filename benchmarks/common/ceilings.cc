// The machine's ceilings. FMA peak uses Highway's best target at run time, like the kernels.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "common/ceilings.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace fusekit::bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Runs `iters` rounds of 12 independent FMAs on full vectors; returns FLOPs done (and a sink).
double FmaLoop(int64_t iters, float *sink) {
  const hn::ScalableTag<float> d;
  auto a0 = hn::Set(d, 1.0f), a1 = hn::Set(d, 1.1f), a2 = hn::Set(d, 1.2f), a3 = hn::Set(d, 1.3f);
  auto a4 = hn::Set(d, 1.4f), a5 = hn::Set(d, 1.5f), a6 = hn::Set(d, 1.6f), a7 = hn::Set(d, 1.7f);
  auto a8 = hn::Set(d, 1.8f), a9 = hn::Set(d, 1.9f), a10 = hn::Set(d, 2.0f), a11 = hn::Set(d, 2.1f);
  const auto m = hn::Set(d, 0.999999f), c = hn::Set(d, 1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = hn::MulAdd(a0, m, c);
    a1 = hn::MulAdd(a1, m, c);
    a2 = hn::MulAdd(a2, m, c);
    a3 = hn::MulAdd(a3, m, c);
    a4 = hn::MulAdd(a4, m, c);
    a5 = hn::MulAdd(a5, m, c);
    a6 = hn::MulAdd(a6, m, c);
    a7 = hn::MulAdd(a7, m, c);
    a8 = hn::MulAdd(a8, m, c);
    a9 = hn::MulAdd(a9, m, c);
    a10 = hn::MulAdd(a10, m, c);
    a11 = hn::MulAdd(a11, m, c);
  }
  auto s =
      hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)));
  s = hn::Add(s, hn::Add(hn::Add(a8, a9), hn::Add(a10, a11)));
  *sink = hn::GetLane(s);
  return static_cast<double>(iters) * 12.0 * static_cast<double>(hn::Lanes(d)) * 2.0;
}

}  // namespace fusekit::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "acl/acl.h"
#include "common/ceilings.h"
#include "fusekit/threading.h"

namespace fusekit::bench {
HWY_EXPORT(FmaLoop);

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

DeviceBuffer::DeviceBuffer(size_t bytes) : size(bytes) {
  if (aclrtMalloc(&ptr, bytes, ACL_MEM_MALLOC_HUGE_FIRST) != ACL_SUCCESS) ptr = nullptr;
}
DeviceBuffer::~DeviceBuffer() {
  if (ptr != nullptr) aclrtFree(ptr);
}

double copy_bandwidth() {
  static const double cached = [] {
    const size_t bytes = size_t{256} << 20;
    DeviceBuffer src(bytes), dst(bytes);
    const int nt = fusekit::num_threads();
    // First touch with the same split the copies use.
#pragma omp parallel num_threads(nt)
    {
      const size_t t = static_cast<size_t>(omp_get_thread_num()),
                   n = static_cast<size_t>(omp_get_num_threads());
      const size_t b = bytes * t / n, e = bytes * (t + 1) / n;
      std::memset(src.as<char>() + b, 1, e - b);
      std::memset(dst.as<char>() + b, 0, e - b);
    }
    std::vector<double> rates;
    for (int rep = 0; rep < 7; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(nt)
      {
        const size_t t = static_cast<size_t>(omp_get_thread_num()),
                     n = static_cast<size_t>(omp_get_num_threads());
        const size_t b = bytes * t / n, e = bytes * (t + 1) / n;
        std::memcpy(dst.as<char>() + b, src.as<char>() + b, e - b);
      }
      rates.push_back(2.0 * static_cast<double>(bytes) / seconds_since(t0));
    }
    benchmark::DoNotOptimize(dst.as<char>()[bytes / 2]);
    return median(rates);
  }();
  return cached;
}

double median_rate_all_threads(int reps, const std::function<double()> &work) {
  const int nt = fusekit::num_threads();
  std::vector<double> rates;
  for (int rep = 0; rep < reps; ++rep) {
    double units = 0;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(nt) reduction(+ : units)
    units += work();
    rates.push_back(units / seconds_since(t0));
  }
  return median(rates);
}

double fma_peak_flops() {
  static const double cached = median_rate_all_threads(5, [] {
    float sink = 0;
    const double flops = HWY_DYNAMIC_DISPATCH(FmaLoop)(int64_t{20'000'000}, &sink);
    benchmark::DoNotOptimize(sink);
    return flops;
  });
  return cached;
}

void report_bandwidth(benchmark::State &state, double bytes_per_iteration) {
  const double ceiling = copy_bandwidth();
  state.counters["GB/s"] =
      benchmark::Counter(bytes_per_iteration * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["copy_GB/s"] = ceiling * 1e-9;
  // of_copy = achieved / ceiling, computed from the rate benchmark reports (per wall second).
  state.counters["of_copy"] = benchmark::Counter(bytes_per_iteration / ceiling,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

void report_bandwidth_seconds(benchmark::State &state, double bytes, double seconds) {
  const double ceiling = copy_bandwidth();
  state.counters["GB/s"] = bytes / seconds * 1e-9;
  state.counters["copy_GB/s"] = ceiling * 1e-9;
  state.counters["of_copy"] = bytes / seconds / ceiling;
}

void report_flops_seconds(benchmark::State &state, double flops, double seconds) {
  const double peak = fma_peak_flops();
  state.counters["GFLOP/s"] = flops / seconds * 1e-9;
  state.counters["peak_GFLOP/s"] = peak * 1e-9;
  state.counters["of_peak"] = flops / seconds / peak;
}

double median_of(std::vector<double> v) {
  return v.empty() ? 0.0 : median(std::move(v));
}

void report_flops(benchmark::State &state, double flops_per_iteration) {
  const double peak = fma_peak_flops();
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops_per_iteration * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_GFLOP/s"] = peak * 1e-9;
  state.counters["of_peak"] =
      benchmark::Counter(flops_per_iteration / peak, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace fusekit::bench
#endif  // HWY_ONCE
