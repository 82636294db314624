// LazyAdamQuant on the CPU: the run of the CPU implementations, in stages.
//   check   both maps read once into local copies (strides gathered) and checked (256 finite
//           floats, ascending), then one pass over the indices (LazyAdam's check stage,
//           common/row_groups.h: range check, entries, the duplicate bitmap); nothing is written
//           before both pass;
//   tables  the maps' search tables (ApplyAdamWQuant's: common/quant_search.h) and what the
//           kernel derives from them (the VBMI kernel's register tables), kept per thread with the
//           maps they were built from ("tables(cached)" when a run's maps have the same bits);
//           then, where the kernel reads them and the problem asks for them, the 65,536-entry
//           lookup tables in the workspace;
//   group   only when some row is named twice: LazyAdam's grouping (radix sort by row, the groups
//           back in batch order);
//   update  the row kernel over chunks of entries claimed by the threads, each chunk whole rows.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "common/quant_run_tables.h"
#include "common/row_groups.h"
#include "lazy_adam_quant/lazy_adam_quant_impl.h"

namespace fusekit {
namespace {

constexpr const char *kOp = "LazyAdamQuant";

// The workspace: the check and group stages' part, the tables' part (laq_tables_bytes), one
// kernel scratch per thread.
struct WorkspaceLayout {
  RowGroupsLayout groups;
  size_t tables = 0, scratch = 0, scratch_per_thread = 0, total = 0;
};

WorkspaceLayout layout_for(const LazyAdamQuantProblem &p, int threads, bool with_lut) {
  WorkspaceLayout w;
  w.groups = row_groups_layout(p.n, p.rows, threads);
  size_t off = w.groups.total;
  w.tables = off;
  off += laq_tables_bytes(with_lut);
  w.scratch = off;
  w.scratch_per_thread = align_up(lazy_adam_quant_scratch_bytes(std::max<int64_t>(p.d, 1)));
  off += w.scratch_per_thread * static_cast<size_t>(threads);
  w.total = off + kWorkspaceAlign;  // room to align the caller's pointer
  return w;
}

// Entries in flight: enough ahead to cover memory latency, few enough that the prefetched lines
// (six rows per entry: gradient, var, two code rows, two absmax rows) stay within what the core
// can track; LazyAdam's rule on the bytes of the gradient and var rows.
int64_t prefetch_ahead(DType var_dtype, int64_t d) {
  static const int64_t forced = [] {
    const char *e = std::getenv("FUSEKIT_LAZY_ADAM_QUANT_PREFETCH");  // for tuning runs only
    return e != nullptr ? std::atoll(e) : 0;
  }();
  if (forced > 0) return forced;
  const auto row_bytes = static_cast<int64_t>(dtype_size(var_dtype)) * std::max<int64_t>(d, 1);
  return std::clamp<int64_t>(2048 / row_bytes, 2, 16);
}

// The CPU run, as common/quant_implementations.h's list asks for it.
struct Cpu {
  static const char *avx512vbmi_why_not(const LazyAdamQuantProblem &p) {
    return laq_avx512vbmi_why_not(p.state_format);
  }

  static bool wants_table(QuantSearch search, const LazyAdamQuantProblem &p) {
    return p.state_format == QuantStateFormat::kDynamicMap && quant_wants_table(search, p.n * p.d);
  }

  static size_t workspace_bytes(const LazyAdamQuantProblem &p, int threads, bool with_table) {
    return p.n == 0 ? 0 : layout_for(p, threads, with_table).total;
  }

  static Status run(QuantKernelKind kind, QuantSearch search, const LazyAdamQuantProblem &p,
                    const LazyAdamQuantTensors &t, const LazyAdamQuantScalars &s,
                    const RunContext &ctx, LazyAdamQuantStats *stats) {
    const LaqRowStep step = laq_row_step(kind, search, p.state_format, p.desc.var.dtype, p.d);
    float lr = 0;
    FUSEKIT_RETURN_IF_ERROR(host_lr(kOp, s.lr, s.lr_tensor, &lr));
    LazyAdamQuantStats &st = *stats;
    StageTimer &timer = *ctx.timer;
    const int threads = ctx.threads;
    const int64_t n = p.n, rows = p.rows;

    // ---- check: both maps, read once (the FP8 format has none); then every index ----
    const bool fp8 = p.state_format == QuantStateFormat::kFp8;
    alignas(64) float maps[2][kQuantMapSize];
    if (!fp8) FUSEKIT_RETURN_IF_ERROR(read_quant_maps(kOp, t.qmap_m, t.qmap_v, maps));
    if (n == 0) {
      timer.stage("check");
      return Status::Ok();
    }
    const bool with_lut = wants_table(step.search, p);
    const WorkspaceLayout w = layout_for(p, threads, with_lut);
    char *base = ctx.workspace;
    RowEntries e;
    FUSEKIT_RETURN_IF_ERROR(
        row_groups_check(kOp, t.indices, rows, base, w.groups, threads, &e, timer));
    st.indices_padding = e.padding;
    // Rows of no columns: the maps and indices were checked, there is nothing to update.
    if (p.d == 0) return Status::Ok();

    // ---- tables: the search tables (kept by the thread), the kernel's, the lookup tables ----
    LazyAdamQuantRowsArgs a;
    laq_tables_stage(step, fp8, maps, with_lut, base + w.tables, timer, &a);
    a.guard_lost_v = p.guard_lost_v;

    // ---- group: only when some row is named twice ----
    row_groups_group(rows, base, w.groups, threads, &e, timer);

    // ---- update ----
    a.grad = t.gradient.data;
    a.grad_stride = t.gradient.strides[0];
    a.grad_dtype = t.gradient.dtype;
    set_laq_state_args(t.m, t.v, t.var, t.absmax_m, t.absmax_v, p.blocks, &a);
    set_row_step_args(p, lr, e, rows, step.prefetch_ahead, &a);
    update_row_chunks(e, threads, base + w.scratch, w.scratch_per_thread, &st.rows_updated,
                      &st.rows_skipped_nonfinite, [&](int64_t b, int64_t en, char *scratch) {
                        return step.rows(a, b, en, scratch);
                      });
    timer.stage("update");
    return Status::Ok();
  }
};

}  // namespace

LaqRowStep laq_row_step(QuantKernelKind kind, QuantSearch search, QuantStateFormat format,
                        DType var_dtype, int64_t d) {
  if (format == QuantStateFormat::kFp8) {  // no map: bit arithmetic, no tables
    return {kind == QuantKernelKind::kReference ? &lazy_adam_quant_fp8_rows_reference
                                                : lazy_adam_quant_fp8_rows_hwy(),
            QuantSearch::kBinarySearch, nullptr,
            kind == QuantKernelKind::kReference ? 0 : prefetch_ahead(var_dtype, d)};
  }
  switch (kind) {
    case QuantKernelKind::kAvx512Vbmi:
      return {lazy_adam_quant_avx512vbmi().run, QuantSearch::kBinarySearch,
              lazy_adam_quant_avx512vbmi().prepare, prefetch_ahead(var_dtype, d)};
    case QuantKernelKind::kHwy:
      return {lazy_adam_quant_rows_hwy(), search, nullptr, prefetch_ahead(var_dtype, d)};
    default:
      return {&lazy_adam_quant_rows_reference, QuantSearch::kBinarySearch, nullptr, 0};
  }
}

const char *laq_avx512vbmi_why_not(QuantStateFormat format) {
  if (format == QuantStateFormat::kFp8) return kFp8NoMapKernel;
  return fusekit::avx512vbmi_why_not(lazy_adam_quant_avx512vbmi());
}

size_t laq_tables_bytes(bool with_lut) {
  return align_up(sizeof(QuantTableCache)) + (with_lut ? 2 * quant_lut_bytes() : 0);
}

void laq_tables_stage(const LaqRowStep &step, bool fp8, const float maps[2][kQuantMapSize],
                      bool with_lut, char *workspace, StageTimer &timer, LazyAdamQuantRowsArgs *a) {
  if (fp8) return;
  QuantTableCache *cache = quant_thread_cache(QuantCacheUser::kLazyAdamQuant);
  if (cache == nullptr) cache = ::new (workspace) QuantTableCache;
  bool built = refresh_quant_tables(cache, maps, step.prepare);
  a->map_m = cache->tables[0];
  a->map_v = cache->tables[1];
  a->prepared = step.prepare != nullptr ? cache->prepared : nullptr;
  if (with_lut) {
    char *lut = workspace + align_up(sizeof(QuantTableCache));
    build_quant_lut(&a->map_m, lut);
    build_quant_lut(&a->map_v, lut + quant_lut_bytes());
    built = true;
  }
  timer.stage(built ? "tables" : "tables(cached)");
}

void set_laq_state_args(const TensorView &m, const TensorView &v, const TensorView &var,
                        const TensorView &absmax_m, const TensorView &absmax_v, int64_t blocks,
                        LazyAdamQuantRowsArgs *a) {
  a->var = var.data;
  a->var_stride = var.strides[0];
  a->dtype = var.dtype;
  a->m = m.as<uint8_t>();
  a->m_stride = m.strides[0];
  a->v = v.as<uint8_t>();
  a->v_stride = v.strides[0];
  a->absmax_m = absmax_m.as<float>();
  a->absmax_m_stride = absmax_m.strides[0];
  a->absmax_v = absmax_v.as<float>();
  a->absmax_v_stride = absmax_v.strides[0];
  a->blocks = blocks;
}

std::span<const LazyAdamQuantImpl *const> lazy_adam_quant_cpu_implementations() {
  return QuantImplementations<LazyAdamQuantOp, Cpu>::list();
}

}  // namespace fusekit
