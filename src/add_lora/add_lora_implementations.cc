// AddLora's implementations, in the order a plan tries them. A new backend adds its entry here
// (a CUDA implementation: an entry under FUSEKIT_HAVE_CUDA, defined in add_lora_cuda.cu).
#include <limits>

#include "add_lora/add_lora_impl.h"

namespace fusekit {
namespace {

size_t hwy_workspace_bytes(const AddLoraProblem &p, int threads) {
  return add_lora_cpu_workspace_bytes(AddLoraCpuKernel::kHwy, p, threads);
}
size_t reference_workspace_bytes(const AddLoraProblem &p, int threads) {
  return add_lora_cpu_workspace_bytes(AddLoraCpuKernel::kReference, p, threads);
}
// MinRows: the smallest group that takes the prefill path.
template <int64_t MinRows>
Status run_hwy(const AddLoraProblem &p, const AddLoraTensors &t, const NoScalars & /*s*/,
               const RunContext &ctx, AddLoraStats *st) {
  return add_lora_cpu_run(AddLoraCpuKernel::kHwy, MinRows, p, t, ctx, st);
}
Status run_reference(const AddLoraProblem &p, const AddLoraTensors &t, const NoScalars & /*s*/,
                     const RunContext &ctx, AddLoraStats *st) {
  return add_lora_cpu_run(AddLoraCpuKernel::kReference, 0, p, t, ctx, st);
}
constexpr int64_t kEveryGroup = 1, kNoGroup = std::numeric_limits<int64_t>::max();

// Highway SIMD (prefill GEMM tiles, decode streams), dispatched to the best instruction set of
// this CPU (add_lora_hwy.cc), threads from common/parallel.h; a group of at least
// AddLora::kPrefillMinRows rows takes the prefill path. Its variants put every group on one path.
constexpr AddLoraImpl kCpuHwy{"cpu_hwy", cpu_only<AddLoraOp>, hwy_dispatched_target,
                              hwy_workspace_bytes, run_hwy<AddLora::kPrefillMinRows>};
constexpr AddLoraImpl kCpuHwyPrefill{"cpu_hwy_prefill",     cpu_only<AddLoraOp>,
                                     hwy_dispatched_target, hwy_workspace_bytes,
                                     run_hwy<kEveryGroup>,  /*by_name_only=*/true};
constexpr AddLoraImpl kCpuHwyDecode{"cpu_hwy_decode",      cpu_only<AddLoraOp>,
                                    hwy_dispatched_target, hwy_workspace_bytes,
                                    run_hwy<kNoGroup>,     /*by_name_only=*/true};
// The plain scalar kernel, one thread (add_lora_reference.cc): the fallback and the test
// oracle's twin.
constexpr AddLoraImpl kCpuReference{kReferenceName, cpu_only<AddLoraOp>, scalar_target,
                                    reference_workspace_bytes, run_reference};

constexpr const AddLoraImpl *kImpls[] = {&kCpuHwy, &kCpuHwyPrefill, &kCpuHwyDecode, &kCpuReference};

}  // namespace

std::span<const AddLoraImpl *const> AddLoraOp::implementations() {
  return kImpls;
}

}  // namespace fusekit
