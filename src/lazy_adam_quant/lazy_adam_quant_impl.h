// fusekit internal: LazyAdamQuant's implementations (the seam between the plan and the kernels).
#ifndef FUSEKIT_LAZY_ADAM_QUANT_LAZY_ADAM_QUANT_IMPL_H_
#define FUSEKIT_LAZY_ADAM_QUANT_LAZY_ADAM_QUANT_IMPL_H_

#include <array>
#include <cstddef>
#include <span>
#include <string>

#include "common/plan.h"
#include "common/quant_implementations.h"
#include "common/quant_run_tables.h"
#include "common/quant_search.h"
#include "fusekit/lazy_adam_quant.h"
#include "lazy_adam_quant/lazy_adam_quant_kernels.h"

namespace fusekit {

// The operator, as the plan layer (common/plan.h) sees it.
struct LazyAdamQuantOp : OpTypes<LazyAdamQuantProblem, LazyAdamQuantTensors, LazyAdamQuantScalars,
                                 LazyAdamQuantOptions, LazyAdamQuantStats> {
  // The tensors by role, in the order of Tensors, named as the aclnn call names them.
  static constexpr TensorRole kRoles[] = {{"gradient"},     {"indices"},        {"inputM", true},
                                          {"inputV", true}, {"inputVar", true}, {"qmapM"},
                                          {"qmapV"},        {"absmaxM", true},  {"absmaxV", true}};
  static auto views(auto &t) {  // Tensors or const Tensors
    return std::array{&t.gradient, &t.indices, &t.m,        &t.v,       &t.var,
                      &t.qmap_m,   &t.qmap_v,  &t.absmax_m, &t.absmax_v};
  }
  static constexpr const char *kName = "LazyAdamQuant";
  // The list, in order of preference (lazy_adam_quant_implementations.cc).
  static std::span<const Implementation<LazyAdamQuantOp> *const> implementations();
  static std::string problem_fields(const Problem &p, const Tensors &t);
  static std::string result_fields(const Stats &st);
};
using LazyAdamQuantImpl = Implementation<LazyAdamQuantOp>;

// Plan time: LazyAdamQuant's state tables, named in messages as the operator names them (m and v
// uint8 [R, D], var float32, float16 or bfloat16 [R, D], absmax float32 [R, ceil(D / 256)], each
// with a contiguous last dimension and rows that do not overlap); shared with
// EmbeddingBagLazyAdamQuant.
struct LaqStateNames {
  const char *m, *v, *var, *absmax_m, *absmax_v;
};
Status check_laq_state(const char *op, const LaqStateNames &names, const TensorView &m,
                       const TensorView &v, const TensorView &var, const TensorView &absmax_m,
                       const TensorView &absmax_v);

// LazyAdamQuant's row step in a CPU run, for the runs built on it (LazyAdamQuant's own,
// EmbeddingBagLazyAdamQuant's): the row kernel of an implementation, how it finds codes, the tables
// it derives from the maps, its prefetch distance (entries).
struct LaqRowStep {
  LazyAdamQuantRowsFn rows;
  QuantSearch search;  // kBinarySearch for a kernel that never reads the lookup tables
  QuantPrepareFn
      prepare;  // the kernel's own tables from the maps' (kQuantVbmiTablesBytes), or null
  int64_t prefetch_ahead;
};
LaqRowStep laq_row_step(QuantKernelKind kind, QuantSearch search, QuantStateFormat format,
                        DType var_dtype, int64_t d);
// Why cpu_avx512vbmi does not run this state format on this machine, or null.
const char *laq_avx512vbmi_why_not(QuantStateFormat format);
// The tables stage's part of a run's workspace (64-aligned): room for the search tables when the
// thread has no cache, and the two lookup tables when the run builds them.
size_t laq_tables_bytes(bool with_lut);
// The tables stage (after the data checks passed): the maps' search tables kept by the thread (or
// built in `workspace`), the kernel's own tables, the lookup tables with_lut; sets the maps'
// fields of *a. Nothing for the FP8 format (no map).
void laq_tables_stage(const LaqRowStep &step, bool fp8, const float maps[2][kQuantMapSize],
                      bool with_lut, char *workspace, StageTimer &timer, LazyAdamQuantRowsArgs *a);
// The state's fields of *a: var, the code rows, the absmax rows, blocks per row.
void set_laq_state_args(const TensorView &m, const TensorView &v, const TensorView &var,
                        const TensorView &absmax_m, const TensorView &absmax_v, int64_t blocks,
                        LazyAdamQuantRowsArgs *a);

// The CPU implementations, common/quant_implementations.h's list over this operator's CPU run
// (lazy_adam_quant_cpu.cc).
std::span<const LazyAdamQuantImpl *const> lazy_adam_quant_cpu_implementations();

}  // namespace fusekit

#endif  // FUSEKIT_LAZY_ADAM_QUANT_LAZY_ADAM_QUANT_IMPL_H_
