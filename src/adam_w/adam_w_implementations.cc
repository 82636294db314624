// AdamW's implementations, in the order a plan tries them, and the run of the CPU ones: one stage,
// update, the kernel over chunks of elements claimed by the threads (any split gives the same bits:
// every element is independent). A new backend adds its entry here.
#include <atomic>

#include "adam_w/adam_w_impl.h"
#include "common/adam_update.h"
#include "common/parallel.h"

namespace fusekit {
namespace {

Status cpu_run(AdamWElementsFn kernel, const AdamWProblem &p, const AdamWTensors &t,
               const AdamWScalars &s, const RunContext &ctx, AdamWStats *st) {
  AdamWArgs a;
  FUSEKIT_RETURN_IF_ERROR(host_adam_scalars(AdamWOp::kName, s, p, &a));
  ctx.timer->stage("bind");
  if (p.n == 0) return Status::Ok();
  a.var = t.var.data;
  a.grad = t.grad.data;
  a.m = t.m.as<float>();
  a.v = t.v.as<float>();
  a.dtype = p.desc.var.dtype;
  std::atomic<int64_t> skipped{0};
  parallel_for(p.n, ctx.threads, 16384, [&](int64_t b, int64_t e) {
    const int64_t k = kernel(a, b, e);
    if (k != 0) skipped.fetch_add(k, std::memory_order_relaxed);
  });
  st->elements_skipped_nonfinite = skipped.load();
  ctx.timer->stage("update");
  return Status::Ok();
}

Status run_hwy(const AdamWProblem &p, const AdamWTensors &t, const AdamWScalars &s,
               const RunContext &ctx, AdamWStats *st) {
  return cpu_run(adam_w_elements_hwy(), p, t, s, ctx, st);
}
Status run_reference(const AdamWProblem &p, const AdamWTensors &t, const AdamWScalars &s,
                     const RunContext &ctx, AdamWStats *st) {
  return cpu_run(&adam_w_elements_reference, p, t, s, ctx, st);
}
// Highway SIMD, dispatched to the best instruction set of this CPU (adam_w_hwy.cc).
constexpr AdamWImpl kCpuHwy{"cpu_hwy", cpu_only<AdamWOp>, hwy_dispatched_target, nullptr, run_hwy};
// The plain scalar kernel (adam_w_reference.cc): the fallback and the test oracle's twin.
constexpr AdamWImpl kCpuReference{kReferenceName, cpu_only<AdamWOp>, scalar_target, nullptr,
                                  run_reference};

constexpr const AdamWImpl *kImpls[] = {&kCpuHwy, &kCpuReference};

}  // namespace

std::span<const AdamWImpl *const> AdamWOp::implementations() {
  return kImpls;
}

}  // namespace fusekit
