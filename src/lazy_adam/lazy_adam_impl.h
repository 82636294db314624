// fusekit internal: LazyAdam's implementations (the seam between the plan and the kernels).
#ifndef FUSEKIT_LAZY_ADAM_LAZY_ADAM_IMPL_H_
#define FUSEKIT_LAZY_ADAM_LAZY_ADAM_IMPL_H_

#include <cstddef>
#include <span>

#include "common/implementation.h"
#include "fusekit/lazy_adam.h"
#include "lazy_adam/lazy_adam_kernels.h"

namespace fusekit {

struct LazyAdamImpl {
  const char *name;
  const char *(*why_not)(const LazyAdamProblem &p);  // null: supported on this machine
  const char *(*target)();                           // instruction set, for FUSEKIT_VERBOSE
  size_t (*workspace_bytes)(const LazyAdamProblem &p, int threads);
  // lr is already resolved (a CPU implementation reads lr_tensor on the host).
  Status (*run)(const LazyAdamProblem &p, const LazyAdamTensors &t, const LazyAdamScalars &s,
                const RunContext &ctx, LazyAdamStats *stats);
};

// The list, in order of preference (lazy_adam_implementations.cc).
std::span<const LazyAdamImpl *const> lazy_adam_impls();

// The CPU implementations' run: the stages check, group and update (lazy_adam_cpu.cc), with the
// row kernel and the prefetch distance of the implementation.
size_t lazy_adam_cpu_workspace_bytes(const LazyAdamProblem &p, int threads);
Status lazy_adam_cpu_run(LazyAdamRowsFn kernel, int64_t prefetch_ahead, const LazyAdamProblem &p,
                         const LazyAdamTensors &t, float lr, const RunContext &ctx,
                         LazyAdamStats *stats);

}  // namespace fusekit

#endif  // FUSEKIT_LAZY_ADAM_LAZY_ADAM_IMPL_H_
