// fusekit internal: AddLora's implementations (the seam between the plan and the kernels).
#ifndef FUSEKIT_ADD_LORA_ADD_LORA_IMPL_H_
#define FUSEKIT_ADD_LORA_ADD_LORA_IMPL_H_

#include <array>
#include <cstddef>
#include <span>
#include <string>

#include "add_lora/add_lora_kernels.h"
#include "common/plan.h"
#include "fusekit/add_lora.h"

namespace fusekit {

// The operator, as the plan layer (common/plan.h) sees it. No per-run scalars (scale is an
// attribute).
struct AddLoraOp
    : OpTypes<AddLoraProblem, AddLoraTensors, NoScalars, AddLoraOptions, AddLoraStats> {
  // The tensors by role, in the order of Tensors, named as the aclnn call names them.
  static constexpr TensorRole kRoles[] = {
      {"y"},        {"x"}, {"weightB"}, {"indices"}, {.name = "weightAOptional", .optional = true},
      {"out", true}};
  static auto views(auto &t) {  // Tensors or const Tensors
    return std::array{&t.y, &t.x, &t.weight_b, &t.indices, &t.weight_a, &t.out};
  }
  static constexpr const char *kName = "AddLora";
  // The list, in order of preference (add_lora_implementations.cc).
  static std::span<const Implementation<AddLoraOp> *const> implementations();
  static std::string problem_fields(const Problem &p, const Tensors &t);
  static std::string result_fields(const Stats &st);
};
using AddLoraImpl = Implementation<AddLoraOp>;

// The CPU implementations (add_lora_cpu.cc): the stages check, group, copy and compute, with
// either the Highway kernel (its packed panels and per-thread scratch in the workspace) or the
// plain scalar one. The Highway kernel's groups of at least `prefill_min_rows` rows take the
// prefill path (GEMM tiles), smaller ones the decode path: AddLora::kPrefillMinRows for cpu_hwy;
// its variants cpu_hwy_prefill (1: every group) and cpu_hwy_decode (none), planned by name only,
// are for tests and tuning runs.
enum class AddLoraCpuKernel { kReference, kHwy };
size_t add_lora_cpu_workspace_bytes(AddLoraCpuKernel kernel, const AddLoraProblem &p, int threads);
Status add_lora_cpu_run(AddLoraCpuKernel kernel, int64_t prefill_min_rows, const AddLoraProblem &p,
                        const AddLoraTensors &t, const RunContext &ctx, AddLoraStats *stats);

}  // namespace fusekit

#endif  // FUSEKIT_ADD_LORA_ADD_LORA_IMPL_H_
