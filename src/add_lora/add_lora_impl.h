// fusekit internal: AddLora's implementations (the seam between the plan and the kernels).
#ifndef FUSEKIT_ADD_LORA_ADD_LORA_IMPL_H_
#define FUSEKIT_ADD_LORA_ADD_LORA_IMPL_H_

#include <cstddef>
#include <span>

#include "add_lora/add_lora_kernels.h"
#include "common/implementation.h"
#include "fusekit/add_lora.h"

namespace fusekit {

struct AddLoraImpl {
  const char *name;
  const char *(*why_not)(const AddLoraProblem &p);  // null: supported on this machine
  const char *(*target)();                          // instruction set, for FUSEKIT_VERBOSE
  // SIZE_MAX when the workspace for this problem does not fit 64-bit sizes.
  size_t (*workspace_bytes)(const AddLoraProblem &p, int threads);
  Status (*run)(const AddLoraProblem &p, const AddLoraTensors &t, const RunContext &ctx,
                AddLoraStats *stats);
};

// The list, in order of preference (add_lora_implementations.cc).
std::span<const AddLoraImpl *const> add_lora_impls();

// The CPU implementations (add_lora_cpu.cc): the stages check, group, copy and compute, with
// either the Highway kernel (its packed panels and per-thread scratch in the workspace) or the
// plain scalar one.
enum class AddLoraCpuKernel { kReference, kHwy };
size_t add_lora_cpu_workspace_bytes(AddLoraCpuKernel kernel, const AddLoraProblem &p, int threads);
Status add_lora_cpu_run(AddLoraCpuKernel kernel, const AddLoraProblem &p, const AddLoraTensors &t,
                        const RunContext &ctx, AddLoraStats *stats);

}  // namespace fusekit

#endif  // FUSEKIT_ADD_LORA_ADD_LORA_IMPL_H_
