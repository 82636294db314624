// fusekit internal: AdamW's implementations (the seam between the plan and the kernels).
#ifndef FUSEKIT_ADAM_W_ADAM_W_IMPL_H_
#define FUSEKIT_ADAM_W_ADAM_W_IMPL_H_

#include <span>

#include "adam_w/adam_w_kernels.h"
#include "common/implementation.h"
#include "fusekit/adam_w.h"

namespace fusekit {

// No workspace: RunContext::workspace is null.
struct AdamWImpl {
  const char *name;
  const char *(*why_not)(const AdamWProblem &p);  // null: supported on this machine
  const char *(*target)();                        // instruction set, for FUSEKIT_VERBOSE
  // The step is already resolved and checked (a CPU implementation reads step_tensor on the host).
  Status (*run)(const AdamWProblem &p, const AdamWTensors &t, const AdamWScalars &s,
                const RunContext &ctx, AdamWStats *stats);
};

// The list, in order of preference (adam_w_implementations.cc).
std::span<const AdamWImpl *const> adam_w_impls();

}  // namespace fusekit

#endif  // FUSEKIT_ADAM_W_ADAM_W_IMPL_H_
