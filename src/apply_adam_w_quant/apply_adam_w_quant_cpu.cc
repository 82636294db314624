// ApplyAdamWQuant on the CPU: the run of the CPU implementations, in stages.
//   check   both maps read once into local copies (strides gathered) and checked: 256 finite
//           floats, ascending; nothing is written before this passes;
//   tables  the maps' search tables (the decision thresholds found by bisection over the float
//           bits, the first index of each value, the sign-fix flag) and what the kernel derives
//           from them (the VBMI kernel's register tables), then, where the kernel reads them and
//           the problem asks for them, the 65,536-entry lookup tables;
//   update  the kernel over runs of blocks claimed by the threads (contiguous tensors), or each
//           block gathered into contiguous buffers, updated and scattered back (any other layout).
//
// The search tables are a pure function of the map's 256 floats (their bits), and building them
// costs about 15 us per map. A thread keeps the last tables it built for an m map and for a v map,
// with the map they were built from: a run whose map has the same bits (memcmp of the 1 KiB
// copies) uses them as they are, whichever plan it is. The maps are still read and checked by
// every run. Training loops run every tensor of a model with the same two maps, so after the first
// run of a thread the stage is a comparison ("tables(cached)" in the FUSEKIT_VERBOSE line). The
// lookup tables (256 KiB per map) are not kept: they are rebuilt in the workspace by each run that
// uses them (the generic kernel on 65,536 elements or more).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>

#include "apply_adam_w_quant/apply_adam_w_quant_impl.h"
#include "common/parallel.h"
#include "common/quant_run_tables.h"

namespace fusekit {
namespace {

constexpr const char *kOp = "ApplyAdamWQuant";
constexpr int64_t kBlock = kAdamWQuantBlockSize;

// The workspace: room for the tables when the thread has no cache, then the two lookup tables.
struct WorkspaceLayout {
  size_t fallback = 0, lut = 0, total = 0;
};
WorkspaceLayout layout_for(bool with_tables) {
  WorkspaceLayout w;
  w.fallback = 0;
  w.lut = align_up(sizeof(QuantTableCache));
  w.total = w.lut + (with_tables ? 2 * quant_lut_bytes() : 0) + kWorkspaceAlign;
  return w;
}

// Element offsets of the flat (row-major) indices [start, start + count) of a view.
void element_offsets(const TensorView &t, int64_t start, int64_t count, int64_t *out) {
  int64_t idx[TensorView::kMaxDims] = {};
  int64_t rest = start, off = 0;
  for (int i = t.ndim - 1; i >= 0; --i) {
    idx[i] = t.shape[i] > 0 ? rest % t.shape[i] : 0;
    rest = t.shape[i] > 0 ? rest / t.shape[i] : 0;
    off += idx[i] * t.strides[i];
  }
  for (int64_t k = 0; k < count; ++k) {
    out[k] = off;
    for (int i = t.ndim - 1; i >= 0; --i) {
      if (++idx[i] < t.shape[i]) {
        off += t.strides[i];
        break;
      }
      off -= (t.shape[i] - 1) * t.strides[i];
      idx[i] = 0;
    }
  }
}

// Copies runs of consecutive offsets (a row of an inner-contiguous view) with one memcpy each.
template <typename Copy>
void for_each_run(const int64_t *offs, int64_t count, Copy &&copy) {
  int64_t k = 0;
  while (k < count) {
    int64_t j = k + 1;
    while (j < count && offs[j] == offs[j - 1] + 1) ++j;
    copy(k, offs[k], j - k);
    k = j;
  }
}

void gather(const TensorView &t, const int64_t *offs, int64_t count, void *dst) {
  const auto es = static_cast<int64_t>(dtype_size(t.dtype));
  const auto *src = static_cast<const char *>(t.data);
  auto *d = static_cast<char *>(dst);
  for_each_run(offs, count, [&](int64_t k, int64_t off, int64_t len) {
    std::memcpy(d + k * es, src + off * es, static_cast<size_t>(len * es));
  });
}

void scatter(const TensorView &t, const int64_t *offs, int64_t count, const void *src_buf) {
  const auto es = static_cast<int64_t>(dtype_size(t.dtype));
  auto *dst = static_cast<char *>(t.data);
  const auto *s = static_cast<const char *>(src_buf);
  for_each_run(offs, count, [&](int64_t k, int64_t off, int64_t len) {
    std::memcpy(dst + off * es, s + k * es, static_cast<size_t>(len * es));
  });
}

// What the run needs to know of a kernel.
struct Kernel {
  AdamWQuantBlocksFn blocks;
  QuantSearch search;  // how it finds codes: kBinarySearch for a kernel that never reads the tables
  // Tables the kernel derives from the two maps' search tables, once per run (cached with them),
  // into kAdamWQuantPreparedBytes; or null.
  void (*prepare)(const QuantMapTables &m, const QuantMapTables &v, void *out);
};
Kernel kernel_of(QuantKernelKind kind, QuantSearch search, QuantStateFormat format) {
  if (is_fp8_state(format)) {  // no map: bit arithmetic, no tables
    if (kind == QuantKernelKind::kReference) {
      return {format == QuantStateFormat::kFp8Ue3m5 ? &adam_w_quant_fp8_ue3m5_blocks_reference
                                                    : &adam_w_quant_fp8_blocks_reference,
              QuantSearch::kBinarySearch, nullptr};
    }
    return {adam_w_quant_fp8_blocks_hwy(format), QuantSearch::kBinarySearch, nullptr};
  }
  switch (kind) {
    case QuantKernelKind::kAvx512Vbmi:
      return {adam_w_quant_avx512vbmi().run, QuantSearch::kBinarySearch,
              adam_w_quant_avx512vbmi().prepare};
    case QuantKernelKind::kHwy:
      return {adam_w_quant_blocks_hwy(), search, nullptr};
    default:
      return {&adam_w_quant_blocks_reference, QuantSearch::kBinarySearch, nullptr};
  }
}

// The CPU run, as common/quant_implementations.h's list asks for it.
struct Cpu {
  static const char *avx512vbmi_why_not(const ApplyAdamWQuantProblem &p) {
    if (is_fp8_state(p.state_format)) return kFp8NoMapKernel;
    return fusekit::avx512vbmi_why_not(adam_w_quant_avx512vbmi());
  }

  static bool wants_table(QuantSearch search, const ApplyAdamWQuantProblem &p) {
    return p.state_format == QuantStateFormat::kDynamicMap && quant_wants_table(search, p.n);
  }

  static size_t workspace_bytes(const ApplyAdamWQuantProblem &p, int /*threads*/, bool with_table) {
    // The FP8 format reads no map and builds no table: no workspace.
    return p.n == 0 || is_fp8_state(p.state_format) ? 0 : layout_for(with_table).total;
  }

  static Status run(QuantKernelKind kind, QuantSearch search, const ApplyAdamWQuantProblem &p,
                    const ApplyAdamWQuantTensors &t, const ApplyAdamWQuantScalars &scalars,
                    const RunContext &ctx, ApplyAdamWQuantStats *stats) {
    const Kernel kernel = kernel_of(kind, search, p.state_format);
    AdamScalars adam;
    FUSEKIT_RETURN_IF_ERROR(host_adam_scalars(kOp, scalars, p, &adam));
    ApplyAdamWQuantStats &st = *stats;
    StageTimer &timer = *ctx.timer;
    const bool fp8 = is_fp8_state(p.state_format);

    // ---- check: both maps, read once (the FP8 format has none) ----
    alignas(64) float maps[2][kQuantMapSize];
    if (!fp8) FUSEKIT_RETURN_IF_ERROR(read_quant_maps(kOp, t.qmap_m, t.qmap_v, maps));
    timer.stage("check");
    const int64_t n = p.n, blocks = p.blocks;
    if (n == 0) return Status::Ok();

    // ---- tables: the search tables (kept by the thread), the kernel's, the lookup tables ----
    AdamWQuantArgs a;
    if (!fp8) {
      QuantTableCache *cache = quant_thread_cache(QuantCacheUser::kApplyAdamWQuant);
      if (cache == nullptr) cache = ::new (ctx.workspace) QuantTableCache;
      bool built = refresh_quant_tables(cache, maps, kernel.prepare);
      a.map_m = cache->tables[0];
      a.map_v = cache->tables[1];
      a.prepared = kernel.prepare != nullptr ? cache->prepared : nullptr;
      if (wants_table(kernel.search, p)) {
        const WorkspaceLayout w = layout_for(true);
        build_quant_lut(&a.map_m, ctx.workspace + w.lut);
        build_quant_lut(&a.map_v, ctx.workspace + w.lut + quant_lut_bytes());
        built = true;
      }
      timer.stage(built ? "tables" : "tables(cached)");
    }
    a.guard_lost_v = p.guard_lost_v;

    // ---- update ----
    static_cast<AdamScalars &>(a) = adam;
    a.var = t.var.data;
    a.grad = t.grad.data;
    a.m = t.m.as<uint8_t>();
    a.v = t.v.as<uint8_t>();
    a.absmax_m = t.absmax_m.as<float>();
    a.absmax_m_stride = t.absmax_m.strides[0];
    a.absmax_v = t.absmax_v.as<float>();
    a.absmax_v_stride = t.absmax_v.strides[0];
    a.n = n;
    a.dtype = p.desc.var.dtype;
    const AdamWQuantBlocksFn blocks_fn = kernel.blocks;
    const int threads = ctx.threads;

    std::atomic<int64_t> skipped{0};
    if (p.contiguous) {
      // Runs of blocks claimed by the threads; blocks are independent, so results do not depend on
      // which thread takes a run. Runs of up to 1024 blocks (256K elements) keep the kernel's
      // per-call setup (copying its register tables) negligible, and about 8 runs per thread let a
      // thread slowed down on a shared machine leave its work to the others.
      const int64_t run =
          std::clamp<int64_t>(blocks / (int64_t{8} * std::max(threads, 1)), 16, 1024);
      const int64_t chunks = (blocks + run - 1) / run;
      parallel_chunks(chunks, threads, [&](int64_t c, int) {
        const int64_t b = c * run;
        const int64_t s = blocks_fn(a, b, std::min(blocks, b + run));
        if (s != 0) skipped.fetch_add(s, std::memory_order_relaxed);
      });
      timer.stage("update");
    } else {
      // Any other layout: each block is gathered into contiguous buffers, updated, scattered back.
      const TensorView *views[4] = {&t.var, &t.grad, &t.m, &t.v};
      parallel_for(blocks, threads, 16, [&](int64_t b, int64_t e) {
        alignas(64) char var_buf[kBlock * 4], grad_buf[kBlock * 4];
        alignas(64) uint8_t m_buf[kBlock], v_buf[kBlock];
        int64_t offs[4][kBlock];
        int64_t local_skipped = 0;
        for (int64_t blk = b; blk < e; ++blk) {
          const int64_t lo = blk * kBlock, len = std::min(kBlock, n - lo);
          for (int k = 0; k < 4; ++k) element_offsets(*views[k], lo, len, offs[k]);
          gather(t.var, offs[0], len, var_buf);
          gather(t.grad, offs[1], len, grad_buf);
          gather(t.m, offs[2], len, m_buf);
          gather(t.v, offs[3], len, v_buf);
          AdamWQuantArgs one = a;
          one.var = var_buf;
          one.grad = grad_buf;
          one.m = m_buf;
          one.v = v_buf;
          one.absmax_m = a.absmax_m + blk * a.absmax_m_stride;
          one.absmax_v = a.absmax_v + blk * a.absmax_v_stride;
          one.n = len;
          if (blocks_fn(one, 0, 1) != 0) {
            ++local_skipped;
            continue;
          }
          scatter(t.var, offs[0], len, var_buf);
          scatter(t.m, offs[2], len, m_buf);
          scatter(t.v, offs[3], len, v_buf);
        }
        skipped.fetch_add(local_skipped, std::memory_order_relaxed);
      });
      timer.stage("gather_update_scatter");
    }
    st.blocks_skipped_nonfinite = skipped.load();
    st.blocks_updated = blocks - st.blocks_skipped_nonfinite;
    return Status::Ok();
  }
};

}  // namespace

std::span<const ApplyAdamWQuantImpl *const> apply_adam_w_quant_cpu_implementations() {
  return QuantImplementations<ApplyAdamWQuantOp, Cpu>::list();
}

}  // namespace fusekit
