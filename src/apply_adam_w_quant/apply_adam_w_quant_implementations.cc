// ApplyAdamWQuant's implementations, in the order a plan tries them. A new backend adds its entry
// here (a CUDA implementation: an entry under FUSEKIT_HAVE_CUDA, defined in its own file).
#include "apply_adam_w_quant/apply_adam_w_quant_impl.h"

namespace fusekit {
namespace {

// ---- cpu_avx512vbmi: the AVX-512 VBMI kernel, maps and searches in registers ----
const char *vbmi_why_not(const ApplyAdamWQuantProblem &p) {
  if (const char *why = cpu_only<ApplyAdamWQuantOp>(p); why != nullptr) return why;
  return adam_w_quant_avx512vbmi_why_not();
}
const char *vbmi_target() {
  return "AVX512VBMI";
}
size_t vbmi_workspace_bytes(const ApplyAdamWQuantProblem &p, int /*threads*/) {
  return adam_w_quant_cpu_workspace_bytes(p, false);
}
Status vbmi_run(const ApplyAdamWQuantProblem &p, const ApplyAdamWQuantTensors &t,
                const ApplyAdamWQuantScalars &s, const RunContext &ctx, ApplyAdamWQuantStats *st) {
  const AdamWQuantCpuKernel k{adam_w_quant_blocks_avx512vbmi(), QuantSearch::kBinarySearch,
                              &adam_w_quant_prepare_avx512vbmi};
  return adam_w_quant_cpu_run(k, p, t, s, ctx, st);
}

// ---- cpu_hwy: the generic Highway kernel, dispatched to the best target of this CPU; the lookup
// tables on a large tensor (S = kAuto), or always or never (the variants planned by name) ----
template <QuantSearch S>
size_t hwy_workspace_bytes(const ApplyAdamWQuantProblem &p, int /*threads*/) {
  return adam_w_quant_cpu_workspace_bytes(p, adam_w_quant_wants_table(S, p));
}
template <QuantSearch S>
Status hwy_run(const ApplyAdamWQuantProblem &p, const ApplyAdamWQuantTensors &t,
               const ApplyAdamWQuantScalars &s, const RunContext &ctx, ApplyAdamWQuantStats *st) {
  const AdamWQuantCpuKernel k{adam_w_quant_blocks_hwy(), S, nullptr};
  return adam_w_quant_cpu_run(k, p, t, s, ctx, st);
}

// ---- cpu_reference: the plain scalar kernel, the fallback and the test oracle's twin ----
size_t reference_workspace_bytes(const ApplyAdamWQuantProblem &p, int /*threads*/) {
  return adam_w_quant_cpu_workspace_bytes(p, false);
}
Status reference_run(const ApplyAdamWQuantProblem &p, const ApplyAdamWQuantTensors &t,
                     const ApplyAdamWQuantScalars &s, const RunContext &ctx,
                     ApplyAdamWQuantStats *st) {
  const AdamWQuantCpuKernel k{&adam_w_quant_blocks_reference, QuantSearch::kBinarySearch, nullptr};
  return adam_w_quant_cpu_run(k, p, t, s, ctx, st);
}

constexpr ApplyAdamWQuantImpl kCpuAvx512Vbmi{"cpu_avx512vbmi", vbmi_why_not, vbmi_target,
                                             vbmi_workspace_bytes, vbmi_run};
constexpr ApplyAdamWQuantImpl kCpuHwy{"cpu_hwy", cpu_only<ApplyAdamWQuantOp>, hwy_dispatched_target,
                                      hwy_workspace_bytes<QuantSearch::kAuto>,
                                      hwy_run<QuantSearch::kAuto>};
constexpr ApplyAdamWQuantImpl kCpuHwyTable{"cpu_hwy_table",
                                           cpu_only<ApplyAdamWQuantOp>,
                                           hwy_dispatched_target,
                                           hwy_workspace_bytes<QuantSearch::kTable>,
                                           hwy_run<QuantSearch::kTable>,
                                           /*by_name_only=*/true};
constexpr ApplyAdamWQuantImpl kCpuHwyBinarySearch{"cpu_hwy_binary_search",
                                                  cpu_only<ApplyAdamWQuantOp>,
                                                  hwy_dispatched_target,
                                                  hwy_workspace_bytes<QuantSearch::kBinarySearch>,
                                                  hwy_run<QuantSearch::kBinarySearch>,
                                                  /*by_name_only=*/true};
constexpr ApplyAdamWQuantImpl kCpuReference{kReferenceName, cpu_only<ApplyAdamWQuantOp>,
                                            scalar_target, reference_workspace_bytes,
                                            reference_run};

constexpr const ApplyAdamWQuantImpl *kImpls[] = {&kCpuAvx512Vbmi, &kCpuHwy, &kCpuHwyTable,
                                                 &kCpuHwyBinarySearch, &kCpuReference};

}  // namespace

std::span<const ApplyAdamWQuantImpl *const> ApplyAdamWQuantOp::implementations() {
  return kImpls;
}

}  // namespace fusekit
