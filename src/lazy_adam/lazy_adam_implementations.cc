// LazyAdam's implementations, in the order a plan tries them. A new backend adds its entry here
// (a CUDA implementation: an entry under FUSEKIT_HAVE_CUDA, defined in lazy_adam_cuda.cu).
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "lazy_adam/lazy_adam_impl.h"

namespace fusekit {
namespace {

// Rows in flight: enough entries ahead to cover memory latency, few enough that the prefetched
// lines (four rows per entry) stay within what the core can track. FBGEMM's sparse optimizers
// prefetch 16 rows ahead.
int64_t prefetch_ahead(int64_t dim) {
  static const int64_t forced = [] {
    const char *e = std::getenv("FUSEKIT_LAZY_ADAM_PREFETCH");  // for tuning runs only
    return e != nullptr ? std::atoll(e) : 0;
  }();
  if (forced > 0) return forced;
  const int64_t row_bytes = std::max<int64_t>(dim, 1) * 4;
  return std::clamp<int64_t>(2048 / row_bytes, 2, 16);
}

Status run_hwy(const LazyAdamProblem &p, const LazyAdamTensors &t, const LazyAdamScalars &s,
               const RunContext &ctx, LazyAdamStats *st) {
  return lazy_adam_cpu_run(lazy_adam_rows_optimized(), prefetch_ahead(p.d), p, t, s, ctx, st);
}
Status run_reference(const LazyAdamProblem &p, const LazyAdamTensors &t, const LazyAdamScalars &s,
                     const RunContext &ctx, LazyAdamStats *st) {
  return lazy_adam_cpu_run(&lazy_adam_rows_reference, 0, p, t, s, ctx, st);
}

// Highway SIMD rows, dispatched to the best instruction set of this CPU (lazy_adam_hwy.cc).
constexpr LazyAdamImpl kCpuHwy{"cpu_hwy", cpu_only<LazyAdamOp>, hwy_dispatched_target,
                               lazy_adam_cpu_workspace_bytes, run_hwy};
// The plain scalar kernel (lazy_adam_reference.cc): the fallback and the test oracle's twin.
constexpr LazyAdamImpl kCpuReference{kReferenceName, cpu_only<LazyAdamOp>, scalar_target,
                                     lazy_adam_cpu_workspace_bytes, run_reference};

constexpr const LazyAdamImpl *kImpls[] = {&kCpuHwy, &kCpuReference};

}  // namespace

std::span<const LazyAdamImpl *const> LazyAdamOp::implementations() {
  return kImpls;
}

}  // namespace fusekit
