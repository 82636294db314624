// fusekit internal: LazyAdamQuant's implementations (the seam between the plan and the kernels).
#ifndef FUSEKIT_LAZY_ADAM_QUANT_LAZY_ADAM_QUANT_IMPL_H_
#define FUSEKIT_LAZY_ADAM_QUANT_LAZY_ADAM_QUANT_IMPL_H_

#include <cstddef>
#include <span>

#include "common/implementation.h"
#include "fusekit/lazy_adam_quant.h"
#include "lazy_adam_quant/lazy_adam_quant_kernels.h"

namespace fusekit {

struct LazyAdamQuantImpl {
  const char *name;
  const char *(*why_not)(const LazyAdamQuantProblem &p);  // null: supported on this machine
  const char *(*target)();                                // instruction set, for FUSEKIT_VERBOSE
  size_t (*workspace_bytes)(const LazyAdamQuantProblem &p, int threads);
  // lr is already resolved and checked (a CPU implementation reads lr_tensor on the host).
  Status (*run)(const LazyAdamQuantProblem &p, const LazyAdamQuantTensors &t,
                const LazyAdamQuantScalars &s, const RunContext &ctx, LazyAdamQuantStats *stats);
};

// The list, in order of preference (lazy_adam_quant_implementations.cc).
std::span<const LazyAdamQuantImpl *const> lazy_adam_quant_impls();

// What the CPU run (lazy_adam_quant_cpu.cc) needs to know of a CPU implementation's kernel.
struct LazyAdamQuantCpuKernel {
  LazyAdamQuantRowsFn rows;
  // Whether the kernel reads the 65,536-entry lookup tables; they are built when it does and the
  // problem asks for them (lazy_adam_quant_wants_table).
  bool reads_tables;
  // Tables the kernel derives from the two maps' search tables (kQuantVbmiTablesBytes), or null.
  void (*prepare)(const QuantMapTables &m, const QuantMapTables &v, void *out);
  int64_t prefetch_ahead;  // entries
};

// Whether the problem asks for the lookup tables: QuantSearch::kTable, or kAuto on a step of
// 65,536 elements (N * D) or more.
bool lazy_adam_quant_wants_table(const LazyAdamQuantProblem &p);

// The CPU implementations' workspace and run, in stages: check (maps, indices), tables, group,
// update.
size_t lazy_adam_quant_cpu_workspace_bytes(const LazyAdamQuantProblem &p, int threads,
                                           bool with_lut);
Status lazy_adam_quant_cpu_run(const LazyAdamQuantCpuKernel &kernel, const LazyAdamQuantProblem &p,
                               const LazyAdamQuantTensors &t, float lr, const RunContext &ctx,
                               LazyAdamQuantStats *stats);

}  // namespace fusekit

#endif  // FUSEKIT_LAZY_ADAM_QUANT_LAZY_ADAM_QUANT_IMPL_H_
