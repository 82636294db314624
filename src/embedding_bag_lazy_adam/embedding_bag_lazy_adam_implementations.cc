// EmbeddingBagLazyAdam's implementations, in the order a plan tries them.
#include <algorithm>

#include "embedding_bag_lazy_adam/embedding_bag_lazy_adam_impl.h"

namespace fusekit {
namespace {

// Rows in flight: LazyAdam's rule (lazy_adam_implementations.cc), four rows per entry.
int64_t prefetch_ahead(int64_t dim) {
  const int64_t row_bytes = std::max<int64_t>(dim, 1) * 4;
  return std::clamp<int64_t>(2048 / row_bytes, 2, 16);
}

// The batch is bound per run: the workspace a plan books is that of the batch its problem was
// described with; run_workspace_bytes gives each run's.
size_t workspace_bytes(const EmbeddingBagLazyAdamProblem &p, int threads) {
  return embedding_bag_lazy_adam_cpu_run_workspace_bytes(p, p.desc, threads);
}

Status run_hwy(const EmbeddingBagLazyAdamProblem &p, const EmbeddingBagLazyAdamTensors &t,
               const EmbeddingBagLazyAdamScalars &s, const RunContext &ctx,
               EmbeddingBagLazyAdamStats *st) {
  return embedding_bag_lazy_adam_cpu_run(embedding_bag_lazy_adam_rows_optimized(),
                                         prefetch_ahead(p.d), p, t, s, ctx, st);
}
Status run_reference(const EmbeddingBagLazyAdamProblem &p, const EmbeddingBagLazyAdamTensors &t,
                     const EmbeddingBagLazyAdamScalars &s, const RunContext &ctx,
                     EmbeddingBagLazyAdamStats *st) {
  return embedding_bag_lazy_adam_cpu_run(&embedding_bag_lazy_adam_rows_reference, 0, p, t, s, ctx,
                                         st);
}

// Highway SIMD rows, dispatched to the best instruction set of this CPU.
constexpr EmbeddingBagLazyAdamImpl kCpuHwy{"cpu_hwy",
                                           cpu_only<EmbeddingBagLazyAdamOp>,
                                           hwy_dispatched_target,
                                           workspace_bytes,
                                           run_hwy,
                                           false,
                                           embedding_bag_lazy_adam_cpu_run_workspace_bytes};
// The plain scalar kernel: the fallback and the test oracle's twin.
constexpr EmbeddingBagLazyAdamImpl kCpuReference{kReferenceName,
                                                 cpu_only<EmbeddingBagLazyAdamOp>,
                                                 scalar_target,
                                                 workspace_bytes,
                                                 run_reference,
                                                 false,
                                                 embedding_bag_lazy_adam_cpu_run_workspace_bytes};

constexpr const EmbeddingBagLazyAdamImpl *kImpls[] = {&kCpuHwy, &kCpuReference};

}  // namespace

std::span<const EmbeddingBagLazyAdamImpl *const> EmbeddingBagLazyAdamOp::implementations() {
  return kImpls;
}

}  // namespace fusekit
