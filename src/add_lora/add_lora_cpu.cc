// AddLora on the CPU: the run of the CPU implementations, in stages.
//   check    one pass over the indices: every index is read (an index > W stops here, before
//            anything is written) and the rows of each adapter are counted;
//   group    the counting sort's second pass: the row numbers placed adapter by adapter into the
//            workspace (stable: the rows of one adapter stay in ascending order);
//   copy     out a separate tensor only: the part of y that no update touches is copied into out,
//            each element once, threads over rows;
//   compute  the kernel over the groups: the Highway one (add_lora_hwy.cc: prefill GEMM tiles,
//            decode streams, threads from common/parallel.h) or the plain scalar one.
// The workspace layout is this file's: the grouping, the float32 shrunk rows t, and for the
// Highway kernel the packed weights of one group and each thread's scratch.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "add_lora/add_lora_impl.h"
#include "common/parallel.h"
#include "common/str_cat.h"

namespace fusekit {
namespace {

constexpr const char *kOp = "AddLora";

struct WorkspaceLayout {
  size_t group_start = 0, cursor = 0, rows = 0, t = 0, a_panel = 0, b_panel = 0, per_thread = 0;
  size_t per_thread_bytes = 0;
  AddLoraScratchSizes sizes{};
  size_t total = 0;
  bool overflow = false;
};

WorkspaceLayout layout_for(AddLoraCpuKernel kernel, const AddLoraProblem &p, int threads) {
  WorkspaceLayout l;
  l.sizes = add_lora_scratch_sizes(p.h1, p.h2, p.r);
  const bool panels = kernel == AddLoraCpuKernel::kHwy;
  double estimate = static_cast<double>(p.b) * static_cast<double>(l.sizes.t_stride) * 4.0 +
                    static_cast<double>(p.w) * 16.0;
  if (panels) {
    estimate += static_cast<double>(l.sizes.a_panel_bytes) +
                static_cast<double>(l.sizes.b_panel_bytes) +
                static_cast<double>(l.sizes.per_thread_bytes) * threads;
  }
  if (!(estimate < 1e18)) {
    l.overflow = true;
    return l;
  }
  size_t off = 0;
  l.group_start = off;
  off += align_up(static_cast<size_t>(p.w + 1) * sizeof(int64_t));
  l.cursor = off;
  off += align_up(static_cast<size_t>(p.w + 1) * sizeof(int64_t));
  l.rows = off;
  off += align_up(static_cast<size_t>(p.b) * sizeof(uint32_t));
  l.t = off;
  off += align_up(static_cast<size_t>(p.b) * static_cast<size_t>(l.sizes.t_stride) * sizeof(float));
  if (panels) {
    l.a_panel = off;
    off += align_up(l.sizes.a_panel_bytes);
    l.b_panel = off;
    off += align_up(l.sizes.b_panel_bytes);
    l.per_thread = off;
    l.per_thread_bytes = align_up(l.sizes.per_thread_bytes);
    off += l.per_thread_bytes * static_cast<size_t>(threads);
  }
  l.total = off + kWorkspaceAlign;  // room to align the caller's pointer
  return l;
}

// The cpu_hwy kernel's items on the thread layer, each stage one parallel_chunks call: a thread
// that the OS deschedules leaves the chunks it has not claimed to the others, and a call waits
// only for chunks in progress. Per prefill group (groups of prefill_min_rows rows or more): pack,
// shrink, expand. Decode groups, all together: when there are enough of them to share out (at
// least 4 per thread), one chunk is a whole group, shrink then expand, so that the decode stages
// cost one call and no wait between them; otherwise the shrink items, then the expand items (4 per
// chunk). Small work (under about 2 x 262144 multiply-adds) runs on the calling thread alone.
// Every output element is computed by one item, whichever thread runs it: the bits do not depend
// on the thread count.
void drive_hwy(const AddLoraHwyKernel &k, const AddLoraArgs &a, const AddLoraScratch &s,
               int threads, int64_t prefill_min_rows, AddLoraStats *st) {
  constexpr int64_t kDecodeItemsPerChunk = 4;  // decode expand items claimed at once
  // Which groups take which path; the decode groups are listed in s.group_list.
  int64_t valid = 0;
  for (int64_t ad = 0; ad < a.adapters; ++ad) {
    const int64_t n = a.group_start[ad + 1] - a.group_start[ad];
    valid += n;
    if (n == 0) continue;
    if (n >= prefill_min_rows) {
      ++st->prefill_groups;
    } else {
      s.group_list[st->decode_groups++] = ad;
    }
  }
  const double work =
      static_cast<double>(valid) * static_cast<double>(a.r) * static_cast<double>(a.h1 + a.h2);
  const int nt =
      static_cast<int>(std::clamp<double>(work / 262144.0, 1.0, static_cast<double>(threads)));
  auto buf = [&](int worker) {
    return reinterpret_cast<float *>(s.per_thread +
                                     static_cast<size_t>(worker) * s.per_thread_bytes);
  };
  auto stage = [&](const AddLoraWork &w, int64_t items, int64_t per_chunk) {
    parallel_chunks((items + per_chunk - 1) / per_chunk, nt, [&](int64_t c, int worker) {
      k.items(a, s, w, c * per_chunk, std::min(items, (c + 1) * per_chunk), buf(worker));
    });
  };

  // ---- prefill groups, one after another (they share the packed panels) ----
  for (int64_t ad = 0; ad < a.adapters && st->prefill_groups > 0; ++ad) {
    const int64_t g0 = a.group_start[ad], n = a.group_start[ad + 1] - g0;
    if (n == 0 || n < prefill_min_rows) continue;
    const AddLoraItemCounts c = k.counts(a, s, n);
    stage({AddLoraStage::kPack, ad, g0, n}, c.pack, 1);
    stage({AddLoraStage::kShrink, ad, g0, n}, c.shrink, 1);
    stage({AddLoraStage::kExpand, ad, g0, n}, c.expand, 1);
  }

  // ---- decode groups ----
  const int64_t n_dec = st->decode_groups;
  if (n_dec == 0) return;
  const AddLoraItemCounts c = k.counts(a, s, 0);
  if (n_dec >= int64_t{4} * nt) {
    stage({AddLoraStage::kDecodeGroup}, n_dec, 1);
    return;
  }
  stage({AddLoraStage::kDecodeShrink}, n_dec * c.rank_chunks, 1);
  stage({AddLoraStage::kDecodeExpand}, n_dec * c.column_blocks, kDecodeItemsPerChunk);
}

}  // namespace

size_t add_lora_cpu_workspace_bytes(AddLoraCpuKernel kernel, const AddLoraProblem &p, int threads) {
  const WorkspaceLayout l = layout_for(kernel, p, threads);
  return l.overflow ? std::numeric_limits<size_t>::max() : l.total;
}

Status add_lora_cpu_run(AddLoraCpuKernel kernel, int64_t prefill_min_rows, const AddLoraProblem &p,
                        const AddLoraTensors &t, const RunContext &ctx, AddLoraStats *stats) {
  AddLoraStats &st = *stats;
  StageTimer &timer = *ctx.timer;
  const int threads = ctx.threads;
  const int64_t b = p.b, w = p.w;
  const WorkspaceLayout lay = layout_for(kernel, p, threads);
  char *base = ctx.workspace;
  auto *group_start = reinterpret_cast<int64_t *>(base + lay.group_start);
  auto *cursor = reinterpret_cast<int64_t *>(base + lay.cursor);
  auto *rows = reinterpret_cast<uint32_t *>(base + lay.rows);

  // ---- check: every index read, the rows of each adapter counted; nothing is written to out
  // until every index has been read ----
  // int32 (CANN's type) or int64 (torch's and vLLM's), read as they are: no narrowing copy.
  const bool wide = t.indices.dtype == DType::kInt64;
  const auto *idx32 = static_cast<const int32_t *>(t.indices.data);
  const auto *idx64 = static_cast<const int64_t *>(t.indices.data);
  const int64_t istride = t.indices.strides[0];
  const auto index = [&](int64_t i) -> int64_t {
    return wide ? idx64[i * istride] : int64_t{idx32[i * istride]};
  };
  std::fill(group_start, group_start + w + 1, int64_t{0});
  int64_t none = 0;
  for (int64_t i = 0; i < b; ++i) {
    const int64_t a = index(i);
    if (a < 0 || a == w) {
      ++none;
    } else if (a > w) {
      return Status::ShapeMismatch(str_cat(kOp, ": indices[", i, "] = ", a, " but weightB has ", w,
                                           " adapters (valid: 0..", w - 1, ", or -1 / ", w,
                                           " for no adapter); nothing was written"));
    } else {
      ++group_start[a + 1];
    }
  }
  st.rows_with_adapter = b - none;
  st.rows_without_adapter = none;
  timer.stage("check");

  // ---- group: the counting sort's placement, stable ----
  for (int64_t a = 0; a < w; ++a) group_start[a + 1] += group_start[a];
  std::copy(group_start, group_start + w, cursor);
  for (int64_t i = 0; i < b; ++i) {
    const int64_t a = index(i);
    if (a >= 0 && a < w) rows[cursor[a]++] = static_cast<uint32_t>(i);
  }
  timer.stage("group");

  // ---- copy: out a separate tensor; the part of y that no update touches, each element once ----
  const size_t es = dtype_size(p.desc.y.dtype);
  const bool in_place = t.out.data == t.y.data;
  if (!in_place) {
    const auto *ybytes = static_cast<const char *>(t.y.data);
    auto *obytes = static_cast<char *>(t.out.data);
    const int64_t ys = t.y.strides[0], os = t.out.strides[0];
    const int64_t h2 = p.h2, h3 = p.h3, off = p.y_offset;
    parallel_for(b, threads, std::max<int64_t>(1, 16384 / std::max<int64_t>(h3, 1)),
                 [&](int64_t lo, int64_t hi) {
                   for (int64_t i = lo; i < hi; ++i) {
                     const char *src = ybytes + static_cast<size_t>(i * ys) * es;
                     char *dst = obytes + static_cast<size_t>(i * os) * es;
                     const int64_t a = index(i);
                     if (a < 0 || a >= w) {
                       std::memcpy(dst, src, static_cast<size_t>(h3) * es);
                     } else {
                       std::memcpy(dst, src, static_cast<size_t>(off) * es);
                       const size_t tail = static_cast<size_t>(off + h2);
                       std::memcpy(dst + tail * es, src + tail * es,
                                   static_cast<size_t>(h3 - off - h2) * es);
                     }
                   }
                 });
    timer.stage("copy");
  }
  if (st.rows_with_adapter == 0) {
    timer.stage("compute");
    return Status::Ok();
  }

  // ---- compute ----
  AddLoraArgs args;
  args.dtype = p.desc.y.dtype;
  args.x = t.x.data;
  args.x_stride = t.x.strides[0];
  args.y = t.y.data;
  args.y_stride = t.y.strides[0];
  args.out = t.out.data;
  args.out_stride = t.out.strides[0];
  if (p.has_a) {
    const TensorView &wa = t.weight_a;
    args.wa =
        static_cast<const char *>(wa.data) + static_cast<size_t>(p.layer * wa.strides[1]) * es;
    args.wa_adapter_stride = wa.strides[0];
    args.wa_row_stride = wa.strides[2];
  } else {
    args.wa = nullptr;
    args.wa_adapter_stride = args.wa_row_stride = 0;
  }
  const TensorView &wb = t.weight_b;
  args.wb = static_cast<const char *>(wb.data) + static_cast<size_t>(p.layer * wb.strides[1]) * es;
  args.wb_adapter_stride = wb.strides[0];
  args.wb_row_stride = wb.strides[2];
  args.h1 = p.h1;
  args.h2 = p.h2;
  args.r = p.r;
  args.y_offset = p.y_offset;
  args.scale = p.scale;
  args.rows = rows;
  args.group_start = group_start;
  args.adapters = w;

  AddLoraScratch scratch{};
  scratch.t = reinterpret_cast<float *>(base + lay.t);
  scratch.t_stride = lay.sizes.t_stride;
  if (kernel == AddLoraCpuKernel::kReference) {
    add_lora_reference(args, scratch);
    timer.stage("compute");
    return Status::Ok();
  }
  scratch.a_panel = reinterpret_cast<float *>(base + lay.a_panel);
  scratch.b_panel = reinterpret_cast<float *>(base + lay.b_panel);
  scratch.per_thread = base + lay.per_thread;
  scratch.per_thread_bytes = lay.per_thread_bytes;
  scratch.group_list = cursor;  // the sort is done with it
  drive_hwy(add_lora_hwy(), args, scratch, threads, prefill_min_rows, &st);
  timer.stage("compute");
  return Status::Ok();
}

}  // namespace fusekit
