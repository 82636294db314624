// fusekit internal: ApplyAdamWQuant's implementations (the seam between the plan and the kernels).
#ifndef FUSEKIT_APPLY_ADAM_W_QUANT_APPLY_ADAM_W_QUANT_IMPL_H_
#define FUSEKIT_APPLY_ADAM_W_QUANT_APPLY_ADAM_W_QUANT_IMPL_H_

#include <array>
#include <cstddef>
#include <span>
#include <string>

#include "apply_adam_w_quant/apply_adam_w_quant_kernels.h"
#include "common/plan.h"
#include "common/quant_search.h"
#include "fusekit/apply_adam_w_quant.h"

namespace fusekit {

// The operator, as the plan layer (common/plan.h) sees it.
struct ApplyAdamWQuantOp
    : OpTypes<ApplyAdamWQuantProblem, ApplyAdamWQuantTensors, ApplyAdamWQuantScalars,
              ApplyAdamWQuantOptions, ApplyAdamWQuantStats> {
  // The tensors by role, in the order of Tensors, named as the aclnn call names them.
  static constexpr TensorRole kRoles[] = {{"varRef", true},       {"grad"},
                                          {"mRef", true},         {"vRef", true},
                                          {"qmapM", false, true}, {"qmapV", false, true},
                                          {"absmaxMRef", true},   {"absmaxVRef", true}};
  static auto views(auto &t) {  // Tensors or const Tensors
    return std::array{&t.var, &t.grad, &t.m, &t.v, &t.qmap_m, &t.qmap_v, &t.absmax_m, &t.absmax_v};
  }
  static constexpr const char *kName = "ApplyAdamWQuant";
  // The list, in order of preference (apply_adam_w_quant_implementations.cc).
  static std::span<const Implementation<ApplyAdamWQuantOp> *const> implementations();
  static std::string problem_fields(const Problem &p, const Tensors &t);
  static std::string result_fields(const Stats &st);
};
using ApplyAdamWQuantImpl = Implementation<ApplyAdamWQuantOp>;

// What the CPU run (apply_adam_w_quant_cpu.cc) needs to know of a CPU implementation's kernel.
struct AdamWQuantCpuKernel {
  AdamWQuantBlocksFn blocks;
  // Whether the kernel builds and reads the lookup tables: kBinarySearch for a kernel that never
  // does, kAuto (when the tensor is large), kTable (always).
  QuantSearch search;
  // Tables the kernel derives from the two maps' search tables, once per run (cached with them),
  // into kAdamWQuantPreparedBytes; or null.
  void (*prepare)(const QuantMapTables &m, const QuantMapTables &v, void *out);
};

// Whether a run of `kernel` on the problem builds the lookup tables.
bool adam_w_quant_wants_table(QuantSearch search, const ApplyAdamWQuantProblem &p);

// The CPU implementations' workspace and run, in stages: check (both maps), tables, update.
size_t adam_w_quant_cpu_workspace_bytes(const ApplyAdamWQuantProblem &p, bool with_tables);
Status adam_w_quant_cpu_run(const AdamWQuantCpuKernel &kernel, const ApplyAdamWQuantProblem &p,
                            const ApplyAdamWQuantTensors &t, const ApplyAdamWQuantScalars &s,
                            const RunContext &ctx, ApplyAdamWQuantStats *stats);

}  // namespace fusekit

#endif  // FUSEKIT_APPLY_ADAM_W_QUANT_APPLY_ADAM_W_QUANT_IMPL_H_
