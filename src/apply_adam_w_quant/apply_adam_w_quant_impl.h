// fusekit internal: ApplyAdamWQuant's implementations (the seam between the plan and the kernels).
#ifndef FUSEKIT_APPLY_ADAM_W_QUANT_APPLY_ADAM_W_QUANT_IMPL_H_
#define FUSEKIT_APPLY_ADAM_W_QUANT_APPLY_ADAM_W_QUANT_IMPL_H_

#include <cstddef>
#include <span>

#include "apply_adam_w_quant/apply_adam_w_quant_kernels.h"
#include "common/implementation.h"
#include "fusekit/apply_adam_w_quant.h"

namespace fusekit {

struct ApplyAdamWQuantImpl {
  const char *name;
  const char *(*why_not)(const ApplyAdamWQuantProblem &p);  // null: supported on this machine
  const char *(*target)();                                  // instruction set, for FUSEKIT_VERBOSE
  size_t (*workspace_bytes)(const ApplyAdamWQuantProblem &p, int threads);
  // The step is already resolved and checked (a CPU implementation reads step_tensor on the host).
  Status (*run)(const ApplyAdamWQuantProblem &p, const ApplyAdamWQuantTensors &t,
                const ApplyAdamWQuantScalars &s, const RunContext &ctx,
                ApplyAdamWQuantStats *stats);
  // Whether a run builds the 65,536-entry lookup tables for this problem.
  bool (*uses_table)(const ApplyAdamWQuantProblem &p);
};

// The list, in order of preference (apply_adam_w_quant_implementations.cc).
std::span<const ApplyAdamWQuantImpl *const> apply_adam_w_quant_impls();

// What the CPU run (apply_adam_w_quant_cpu.cc) needs to know of a CPU implementation's kernel.
struct AdamWQuantCpuKernel {
  AdamWQuantBlocksFn blocks;
  // Whether the kernel reads the lookup tables; they are built when it does and the problem asks
  // for them (adam_w_quant_wants_table).
  bool reads_tables;
  // Tables the kernel derives from the two maps' search tables, once per run (cached with them),
  // into kAdamWQuantPreparedBytes; or null.
  void (*prepare)(const QuantMapTables &m, const QuantMapTables &v, void *out);
};

// Whether the problem asks for the lookup tables: QuantSearch::kTable, or kAuto on a tensor of
// 65,536 elements or more (building them costs about 0.1 ms).
bool adam_w_quant_wants_table(const ApplyAdamWQuantProblem &p);

// The CPU implementations' workspace and run, in stages: check (both maps), tables, update.
size_t adam_w_quant_cpu_workspace_bytes(const ApplyAdamWQuantProblem &p, bool with_tables);
Status adam_w_quant_cpu_run(const AdamWQuantCpuKernel &kernel, const ApplyAdamWQuantProblem &p,
                            const ApplyAdamWQuantTensors &t, int64_t step, const RunContext &ctx,
                            ApplyAdamWQuantStats *stats);

}  // namespace fusekit

#endif  // FUSEKIT_APPLY_ADAM_W_QUANT_APPLY_ADAM_W_QUANT_IMPL_H_
