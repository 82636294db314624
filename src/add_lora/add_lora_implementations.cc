// AddLora's implementations, in the order a plan tries them. A new backend adds its entry here
// (a CUDA implementation: an entry under FUSEKIT_HAVE_CUDA, defined in add_lora_cuda.cu).
#include "add_lora/add_lora_impl.h"

namespace fusekit {
namespace {

size_t hwy_workspace_bytes(const AddLoraProblem &p, int threads) {
  return add_lora_cpu_workspace_bytes(AddLoraCpuKernel::kHwy, p, threads);
}
size_t reference_workspace_bytes(const AddLoraProblem &p, int threads) {
  return add_lora_cpu_workspace_bytes(AddLoraCpuKernel::kReference, p, threads);
}
Status run_hwy(const AddLoraProblem &p, const AddLoraTensors &t, const NoScalars & /*s*/,
               const RunContext &ctx, AddLoraStats *st) {
  return add_lora_cpu_run(AddLoraCpuKernel::kHwy, p, t, ctx, st);
}
Status run_reference(const AddLoraProblem &p, const AddLoraTensors &t, const NoScalars & /*s*/,
                     const RunContext &ctx, AddLoraStats *st) {
  return add_lora_cpu_run(AddLoraCpuKernel::kReference, p, t, ctx, st);
}
// Highway SIMD (prefill GEMM tiles, decode streams), dispatched to the best instruction set of
// this CPU (add_lora_hwy.cc), threads from common/parallel.h.
constexpr AddLoraImpl kCpuHwy{"cpu_hwy", cpu_only<AddLoraOp>, hwy_dispatched_target,
                              hwy_workspace_bytes, run_hwy};
// The plain scalar kernel, one thread (add_lora_reference.cc): the fallback and the test
// oracle's twin.
constexpr AddLoraImpl kCpuReference{kReferenceName, cpu_only<AddLoraOp>, scalar_target,
                                    reference_workspace_bytes, run_reference};

constexpr const AddLoraImpl *kImpls[] = {&kCpuHwy, &kCpuReference};

}  // namespace

std::span<const AddLoraImpl *const> AddLoraOp::implementations() {
  return kImpls;
}

}  // namespace fusekit
