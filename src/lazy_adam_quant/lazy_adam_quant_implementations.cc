// LazyAdamQuant's implementations, in the order a plan tries them. A new backend adds its entry
// here (a CUDA implementation: an entry under FUSEKIT_HAVE_CUDA, defined in its own file).
#include <algorithm>
#include <cstdlib>

#include "lazy_adam_quant/lazy_adam_quant_impl.h"

namespace fusekit {
namespace {

// Entries in flight: enough ahead to cover memory latency, few enough that the prefetched lines
// (six rows per entry: gradient, var, two code rows, two absmax rows) stay within what the core
// can track; LazyAdam's rule on the bytes of the gradient and var rows.
int64_t prefetch_ahead(const LazyAdamQuantProblem &p) {
  static const int64_t forced = [] {
    const char *e = std::getenv("FUSEKIT_LAZY_ADAM_QUANT_PREFETCH");  // for tuning runs only
    return e != nullptr ? std::atoll(e) : 0;
  }();
  if (forced > 0) return forced;
  const auto row_bytes =
      static_cast<int64_t>(dtype_size(p.desc.var.dtype)) * std::max<int64_t>(p.d, 1);
  return std::clamp<int64_t>(2048 / row_bytes, 2, 16);
}

// ---- cpu_avx512vbmi: maps and searches in registers, no gathers ----
const char *vbmi_why_not(const LazyAdamQuantProblem &p) {
  if (const char *why = cpu_only<LazyAdamQuantOp>(p); why != nullptr) return why;
  return lazy_adam_quant_avx512vbmi_why_not();
}
const char *vbmi_target() {
  return "AVX512VBMI";
}
size_t vbmi_workspace_bytes(const LazyAdamQuantProblem &p, int threads) {
  return lazy_adam_quant_cpu_workspace_bytes(p, threads, false);
}
Status vbmi_run(const LazyAdamQuantProblem &p, const LazyAdamQuantTensors &t,
                const LazyAdamQuantScalars &s, const RunContext &ctx, LazyAdamQuantStats *st) {
  const LazyAdamQuantCpuKernel k{lazy_adam_quant_rows_avx512vbmi(), QuantSearch::kBinarySearch,
                                 &lazy_adam_quant_prepare_avx512vbmi, prefetch_ahead(p)};
  return lazy_adam_quant_cpu_run(k, p, t, s, ctx, st);
}

// ---- cpu_hwy: the Highway kernel, dispatched to the best target of this CPU; the lookup tables
// on a large step (S = kAuto), or always or never (the variants planned by name) ----
template <QuantSearch S>
size_t hwy_workspace_bytes(const LazyAdamQuantProblem &p, int threads) {
  return lazy_adam_quant_cpu_workspace_bytes(p, threads, lazy_adam_quant_wants_table(S, p));
}
template <QuantSearch S>
Status hwy_run(const LazyAdamQuantProblem &p, const LazyAdamQuantTensors &t,
               const LazyAdamQuantScalars &s, const RunContext &ctx, LazyAdamQuantStats *st) {
  const LazyAdamQuantCpuKernel k{lazy_adam_quant_rows_hwy(), S, nullptr, prefetch_ahead(p)};
  return lazy_adam_quant_cpu_run(k, p, t, s, ctx, st);
}

// ---- cpu_reference: the plain scalar kernel, the fallback and the test oracle's twin ----
size_t reference_workspace_bytes(const LazyAdamQuantProblem &p, int threads) {
  return lazy_adam_quant_cpu_workspace_bytes(p, threads, false);
}
Status reference_run(const LazyAdamQuantProblem &p, const LazyAdamQuantTensors &t,
                     const LazyAdamQuantScalars &s, const RunContext &ctx, LazyAdamQuantStats *st) {
  const LazyAdamQuantCpuKernel k{&lazy_adam_quant_rows_reference, QuantSearch::kBinarySearch,
                                 nullptr, 0};
  return lazy_adam_quant_cpu_run(k, p, t, s, ctx, st);
}

constexpr LazyAdamQuantImpl kCpuAvx512Vbmi{"cpu_avx512vbmi", vbmi_why_not, vbmi_target,
                                           vbmi_workspace_bytes, vbmi_run};
constexpr LazyAdamQuantImpl kCpuHwy{"cpu_hwy", cpu_only<LazyAdamQuantOp>, hwy_dispatched_target,
                                    hwy_workspace_bytes<QuantSearch::kAuto>,
                                    hwy_run<QuantSearch::kAuto>};
constexpr LazyAdamQuantImpl kCpuHwyTable{"cpu_hwy_table",
                                         cpu_only<LazyAdamQuantOp>,
                                         hwy_dispatched_target,
                                         hwy_workspace_bytes<QuantSearch::kTable>,
                                         hwy_run<QuantSearch::kTable>,
                                         /*by_name_only=*/true};
constexpr LazyAdamQuantImpl kCpuHwyBinarySearch{"cpu_hwy_binary_search",
                                                cpu_only<LazyAdamQuantOp>,
                                                hwy_dispatched_target,
                                                hwy_workspace_bytes<QuantSearch::kBinarySearch>,
                                                hwy_run<QuantSearch::kBinarySearch>,
                                                /*by_name_only=*/true};
constexpr LazyAdamQuantImpl kCpuReference{kReferenceName, cpu_only<LazyAdamQuantOp>, scalar_target,
                                          reference_workspace_bytes, reference_run};

constexpr const LazyAdamQuantImpl *kImpls[] = {&kCpuAvx512Vbmi, &kCpuHwy, &kCpuHwyTable,
                                               &kCpuHwyBinarySearch, &kCpuReference};

}  // namespace

std::span<const LazyAdamQuantImpl *const> LazyAdamQuantOp::implementations() {
  return kImpls;
}

}  // namespace fusekit
