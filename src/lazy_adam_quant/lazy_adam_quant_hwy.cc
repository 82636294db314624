// LazyAdamQuant, the cpu_hwy implementation's kernel: Highway SIMD over the columns of a row,
// compiled for every x86 target Highway builds and dispatched at run time. Per touched row: the
// gradient rows summed in order of occurrence (float32), then per block of 256 columns the
// dequantization (a gather from the 256-float map), LazyAdam's update, the new m, v and var kept
// in the thread's scratch with the block maxima (and var's largest magnitude); then the row's
// guard; then var stored and the codes (the nearest-code searches of common/quant_codes_hwy-inl.h,
// ApplyAdamWQuant's). Prefetches the gradient, var, code and absmax rows of the entry a few ahead.
// The same float32 operations in the same order as the reference kernel (no FMA): bitwise equal.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "lazy_adam_quant/lazy_adam_quant_hwy.cc"
#include <hwy/cache_control.h>
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/adam_update.h"
#include "common/float_types.h"
#include "common/fp8_codes.h"
#include "common/fp8_codes_hwy-inl.h"
#include "common/hwy_dispatch.h"
#include "common/hwy_dtype-inl.h"
#include "common/quant_codes_hwy-inl.h"
#include "fusekit/float16.h"
#include "lazy_adam_quant/lazy_adam_quant_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace fusekit::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace {

HWY_INLINE void PrefetchBytes(const void *p, int64_t bytes) {
  const auto *b = static_cast<const char *>(p);
  for (int64_t off = 0; off < bytes; off += 64) hwy::Prefetch(b + off);
  hwy::Prefetch(b + bytes - 1);
}

// The guard of a row's block, as ApplyAdamWQuant's GuardedBlock: the reference's check (every new
// m, v and var finite as stored) from var's largest magnitude bits and the block maxima. A NaN m or
// v makes its var NaN (m * -lr; sqrt(v)), which var_ok catches; an infinite m or v makes its
// maximum +Inf (Max keeps +Inf and may drop NaN lanes, which var_ok has caught). v >= 0 (|.|).
HWY_INLINE bool GuardedBlock(bool var_ok, float max_m, float max_v) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  return var_ok && max_m < kInf && max_v < kInf;
}

template <class DF>
HWY_INLINE hn::Vec<DF> LoadGrad(DF df, const float *p) {
  return hn::LoadU(df, p);
}

// The row's gradient in float32 into g: the first occurrence widened, then each later one added in
// order (the reference's sum, operation for operation).
template <typename G>
void SumGradient(const LazyAdamQuantRowsArgs &a, int64_t k, int64_t next, float *g) {
  const hn::ScalableTag<float> df;
  const auto N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t D = a.dim, vec = D / N * N;
  auto row = [&](int64_t q) {
    return static_cast<const G *>(a.grad) +
           static_cast<int64_t>(a.entries[q] & 0xffffffffu) * a.grad_stride;
  };
  const G *g0 = row(k);
  int64_t j = 0;
  for (; j < vec; j += N) hn::StoreU(LoadWide(df, g0 + j), df, g + j);
  for (; j < D; ++j) g[j] = to_float(g0[j]);
  for (int64_t q = k + 1; q < next; ++q) {
    const G *h = row(q);
    for (j = 0; j < vec; j += N) {
      hn::StoreU(hn::Add(hn::LoadU(df, g + j), LoadWide(df, h + j)), df, g + j);
    }
    for (; j < D; ++j) g[j] = g[j] + to_float(h[j]);
  }
}

// kFp8: the FP8 state format (docs/fp8_state.md): codes decoded and made by bit arithmetic, the
// scratch keeps m and sqrt(v). Else the dynamic maps (gathers and searches). kDim: D when known at
// compile time (RowsOf: FP8 rows of 32 columns), else 0 (a.dim): the loops over a
// row's vectors then have a fixed count, unrolled, without the tails.
template <typename T, typename G, bool kFp8, int64_t kDim = 0>
int64_t Rows(const LazyAdamQuantRowsArgs &a, int64_t begin, int64_t end, void *scratch_mem) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(di)> d8;
  const auto N = static_cast<int64_t>(hn::Lanes(df));
  const LaqScratch s = laq_scratch(scratch_mem, a.dim);
  const int64_t D = kDim != 0 ? kDim : a.dim, ahead = a.prefetch_ahead;
  const int64_t blocks = kDim != 0 ? (kDim + kLaqBlock - 1) / kLaqBlock : a.blocks;
  const auto zero = hn::Zero(df);
  const auto b1 = hn::Set(df, a.beta1), b2 = hn::Set(df, a.beta2);
  const auto omb1 = hn::Set(df, a.one_minus_beta1), omb2 = hn::Set(df, a.one_minus_beta2);
  const auto eps = hn::Set(df, a.epsilon), neg_lr = hn::Set(df, a.neg_lr);
  const auto magnitude = hn::Set(di, 0x7fffffff);
  const auto var_limit = hn::Set(di, static_cast<int32_t>(adam_stored_finite_limit<T>()));
  int64_t skipped = 0;
  // FP8 rows of one block (D <= 256): a row's var and codes are stored after the next row's update,
  // from buffers of its own (two sets, taken in turn), so that the next row's square roots and
  // divisions run beside this row's coding instead of the row's own chain of update, maxima,
  // scales and codes running alone (at D = 32 that chain, not the operations, set the time).
  const bool defer = kFp8 && blocks == 1;
  HWY_ALIGN float defer_m[2][kFp8 ? kLaqBlock : 1];
  HWY_ALIGN float defer_v[2][kFp8 ? kLaqBlock : 1];
  HWY_ALIGN float defer_w[2][kFp8 ? kLaqBlock : 1];
  int cur = 0;
  struct Pending {
    T *var = nullptr;
    uint8_t *mc = nullptr, *vc = nullptr;
    Fp8BlockScale sm{}, sv{};
    int buf = 0;
  } pending;
  // The FP8 store of block [lo, lo + len) of a row whose guard held, its scales sm, sv already
  // stored: var and the codes, from the buffers bm, bv, bw (indexed by column).
  auto store_fp8 = [&](const float *bm, const float *bv, const float *bw, int64_t lo, int64_t len,
                       T *var, uint8_t *mc, uint8_t *vc, const Fp8BlockScale &sm,
                       const Fp8BlockScale &sv) HWY_ATTR {
    const int64_t vec_len = len / N * N;
    const auto inv_m = hn::Set(df, sm.inv), inv_v = hn::Set(df, sv.inv);
    if (sm.inv != 0.0f && sv.inv != 0.0f) {  // the usual block: no test per vector
      for (int64_t j = lo; j < lo + vec_len; j += N) {
        StoreNarrow(df, hn::LoadU(df, bw + j), var + j);
        StoreFp8Codes(d8, di, Fp8Code<kE4M3>(df, di, hn::Mul(hn::LoadU(df, bm + j), inv_m)),
                      mc + j);
        StoreFp8Codes(d8, di, Fp8Code<kUE4M4>(df, di, hn::Mul(hn::LoadU(df, bv + j), inv_v)),
                      vc + j);
      }
    } else {
      const auto zero_code = hn::Zero(di);
      for (int64_t j = lo; j < lo + vec_len; j += N) {
        StoreNarrow(df, hn::LoadU(df, bw + j), var + j);
        const auto cm = sm.inv == 0.0f
                            ? zero_code
                            : Fp8Code<kE4M3>(df, di, hn::Mul(hn::LoadU(df, bm + j), inv_m));
        const auto cv = sv.inv == 0.0f
                            ? zero_code
                            : Fp8Code<kUE4M4>(df, di, hn::Mul(hn::LoadU(df, bv + j), inv_v));
        StoreFp8Codes(d8, di, cm, mc + j);
        StoreFp8Codes(d8, di, cv, vc + j);
      }
    }
    for (int64_t j = lo + vec_len; j < lo + len; ++j) {
      var[j] = from_float<T>(bw[j]);
      mc[j] = fp8_block_code<kE4M3>(bm[j], sm);
      vc[j] = fp8_block_code<kUE4M4>(bv[j], sv);
    }
  };
  auto store_pending = [&] {
    const int pb = pending.buf;
    store_fp8(defer_m[pb], defer_v[pb], defer_w[pb], 0, D, pending.var, pending.mc, pending.vc,
              pending.sm, pending.sv);
    pending.var = nullptr;
  };
  int64_t k = begin;
  while (k < end) {
    if (k + ahead < end) {
      const uint64_t e = a.entries[k + ahead];
      if (e >> 32 < a.row_limit) {
        const LaqRow<T> t = laq_row<T>(a, static_cast<int64_t>(e >> 32));
        PrefetchBytes(
            static_cast<const G *>(a.grad) + static_cast<int64_t>(e & 0xffffffffu) * a.grad_stride,
            D * static_cast<int64_t>(sizeof(G)));
        PrefetchBytes(t.var, D * static_cast<int64_t>(sizeof(T)));
        PrefetchBytes(t.m, D);
        PrefetchBytes(t.v, D);
        PrefetchBytes(t.absmax_m, blocks * 4);
        PrefetchBytes(t.absmax_v, blocks * 4);
      }
    }
    const uint64_t row = a.entries[k] >> 32;
    const int64_t next = laq_group_end(a, k, end);
    if (row >= a.row_limit) {  // padding
      k = next;
      continue;
    }
    const float *g = s.g;
    if constexpr (sizeof(G) == 4) {
      if (next == k + 1) {  // one float32 gradient row: read where it is
        g = static_cast<const float *>(a.grad) +
            static_cast<int64_t>(a.entries[k] & 0xffffffffu) * a.grad_stride;
      } else {
        SumGradient<G>(a, k, next, s.g);
      }
    } else {
      SumGradient<G>(a, k, next, s.g);
    }
    k = next;
    const auto [var, mc, vc, absmax_m, absmax_v] = laq_row<T>(a, static_cast<int64_t>(row));
    float *bm = s.m, *bv = s.v, *bw = s.w;  // the row's new m, v (FP8: sqrt(v)) and var
    if constexpr (kFp8) {
      if (defer) {
        bm = defer_m[cur];
        bv = defer_v[cur];
        bw = defer_w[cur];
      }
    }

    // (1) Per block: dequantize, update into the scratch, the maxima; nothing is stored yet.
    bool row_ok = true;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t lo = b * kLaqBlock, len = std::min(kLaqBlock, D - lo);
      const int64_t vec_len = len / N * N;
      const float scale_m = absmax_m[b], scale_v = absmax_v[b];
      const auto vscale_m = hn::Set(df, scale_m), vscale_v = hn::Set(df, scale_v);
      // FP8: the decode's folded scales (Fp8Decode); a block whose scale does not fold (above
      // 1e36) runs the update one element at a time.
      const auto vscale256_m = hn::Set(df, scale_m * 256.0f);
      const auto vscale256_v = hn::Set(df, scale_v * 256.0f);
      const int64_t upd_len =
          kFp8 && !(fp8_scale_folds<kE4M3>(scale_m) && fp8_scale_folds<kUE4M4>(scale_v)) ? 0
                                                                                         : vec_len;
      auto acc_m = zero, acc_v = zero;
      auto acc_w = hn::Zero(di);
      for (int64_t j = lo; j < lo + upd_len; j += N) {
        const auto gj = LoadGrad(df, g + j);
        hn::Vec<decltype(df)> m_old, v_old;
        if constexpr (kFp8) {
          m_old = Fp8Decode<kE4M3>(df, mc + j, vscale_m, vscale256_m);
          const auto s_old = Fp8Decode<kUE4M4>(df, vc + j, vscale_v, vscale256_v);
          v_old = GuardLostVOfSquare(m_old, hn::Mul(s_old, s_old));  // (always on in FP8)
        } else {
          const auto mcode = hn::PromoteTo(di, hn::LoadU(d8, mc + j));
          const auto vcode = hn::PromoteTo(di, hn::LoadU(d8, vc + j));
          m_old = hn::Mul(hn::GatherIndex(df, a.map_m.q, mcode), vscale_m);
          v_old = hn::Mul(hn::GatherIndex(df, a.map_v.q, vcode), vscale_v);
          if (a.guard_lost_v) {
            v_old = hn::IfThenElse(hn::AndNot(hn::Eq(m_old, zero), hn::Eq(v_old, zero)),
                                   hn::Mul(m_old, m_old), v_old);
          }
        }
        const auto m = hn::Add(hn::Mul(m_old, b1), hn::Mul(gj, omb1));
        const auto v = hn::Abs(hn::Add(hn::Mul(v_old, b2), hn::Mul(hn::Mul(gj, gj), omb2)));
        const auto sv = hn::Sqrt(v);
        const auto w =
            hn::Add(LoadWide(df, var + j), hn::Div(hn::Mul(m, neg_lr), hn::Add(sv, eps)));
        const auto kept_v = kFp8 ? sv : v;
        hn::StoreU(m, df, bm + j);
        hn::StoreU(kept_v, df, bv + j);
        hn::StoreU(w, df, bw + j);
        acc_m = hn::Max(hn::Abs(m), acc_m);
        acc_v = hn::Max(kept_v, acc_v);
        acc_w = hn::Max(acc_w, hn::And(hn::BitCast(di, w), magnitude));
      }
      float max_m = 0.0f, max_v = 0.0f;
      bool var_ok = true;
      if (upd_len > 0) {
        max_m = hn::GetLane(hn::MaxOfLanes(df, acc_m));
        max_v = hn::GetLane(hn::MaxOfLanes(df, acc_v));
        var_ok = hn::AllTrue(di, hn::Lt(acc_w, var_limit));
      }
      for (int64_t j = lo + upd_len; j < lo + len; ++j) {
        const float gj = g[j];
        float m_old, v_old;
        if constexpr (kFp8) {
          m_old = fp8_value<kE4M3>(mc[j]) * scale_m;
          const float s_old = fp8_value<kUE4M4>(vc[j]) * scale_v;
          v_old = s_old * s_old;
        } else {
          m_old = a.map_m.q[mc[j]] * scale_m;
          v_old = a.map_v.q[vc[j]] * scale_v;
        }
        if (a.guard_lost_v && v_old == 0.0f && m_old != 0.0f) v_old = m_old * m_old;
        const float m = m_old * a.beta1 + gj * a.one_minus_beta1;
        const float v = std::fabs(v_old * a.beta2 + (gj * gj) * a.one_minus_beta2);
        const float sv = std::sqrt(v);
        const float w = to_float(var[j]) + (m * a.neg_lr) / (sv + a.epsilon);
        var_ok = var_ok && adam_produced_finite<T>(m, v, w);
        bm[j] = m;
        bv[j] = kFp8 ? sv : v;
        bw[j] = w;
        max_m = std::max(max_m, std::fabs(m));
        max_v = std::max(max_v, bv[j]);
      }
      s.max_m[b] = max_m;
      s.max_v[b] = max_v;
      row_ok = row_ok && GuardedBlock(var_ok, max_m, max_v);
    }
    // The previous row's var and codes, now that this row's update is under way.
    if (kFp8 && pending.var != nullptr) store_pending();
    // (2) The guard: the whole row, or nothing.
    if (!row_ok) {
      ++skipped;
      continue;
    }
    if (kFp8 && defer) {  // the scales now, var and the codes after the next row's update
      pending.sm = fp8_block_scale<kE4M3>(s.max_m[0] + 0.0f);
      pending.sv = fp8_block_scale<kUE4M4>(s.max_v[0] + 0.0f);
      absmax_m[0] = pending.sm.scale;
      absmax_v[0] = pending.sv.scale;
      pending.var = var;
      pending.mc = mc;
      pending.vc = vc;
      pending.buf = cur;
      cur ^= 1;
      continue;
    }
    // (3) Per block: var, absmax, the codes.
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t lo = b * kLaqBlock, len = std::min(kLaqBlock, D - lo);
      const int64_t vec_len = len / N * N;
      const float max_m = s.max_m[b] + 0.0f, max_v = s.max_v[b] + 0.0f;
      if constexpr (kFp8) {
        const Fp8BlockScale sm = fp8_block_scale<kE4M3>(max_m);
        const Fp8BlockScale sv = fp8_block_scale<kUE4M4>(max_v);
        absmax_m[b] = sm.scale;
        absmax_v[b] = sv.scale;
        store_fp8(bm, bv, bw, lo, len, var, mc, vc, sm, sv);
        continue;
      }
      absmax_m[b] = max_m;
      absmax_v[b] = max_v;
      const float div_m = max_m == 0.0f ? 1.0f : max_m;
      const float div_v = max_v == 0.0f ? 1.0f : max_v;
      const auto vdiv_m = hn::Set(df, div_m), vdiv_v = hn::Set(df, div_v);
      const bool recip_m = recip_ok(a.map_m, div_m), recip_v = recip_ok(a.map_v, div_v);
      const auto vrecip_m = hn::Set(df, 1.0f / div_m), vrecip_v = hn::Set(df, 1.0f / div_v);
      for (int64_t j = lo; j < lo + vec_len; j += N) {
        StoreNarrow(df, hn::LoadU(df, s.w + j), var + j);
        const auto cm = BlockCodes(df, a.map_m, hn::LoadU(df, s.m + j), vdiv_m, recip_m, vrecip_m);
        const auto cv = BlockCodes(df, a.map_v, hn::LoadU(df, s.v + j), vdiv_v, recip_v, vrecip_v);
        hn::StoreU(hn::DemoteTo(d8, cm), d8, mc + j);
        hn::StoreU(hn::DemoteTo(d8, cv), d8, vc + j);
      }
      for (int64_t j = lo + vec_len; j < lo + len; ++j) {
        var[j] = from_float<T>(s.w[j]);
        mc[j] = quant_code_reference(a.map_m, s.m[j] / div_m);
        vc[j] = quant_code_reference(a.map_v, s.v[j] / div_v);
      }
    }
  }
  if (kFp8 && pending.var != nullptr) store_pending();
  return skipped;
}

// FP8 rows of 32 columns (the seed shape's; two vectors of AVX-512, where the row's chain of
// update, maxima, scales and codes, not its operations, sets the time) take kernels compiled for
// that D; other lengths and the dynamic maps the general one.
template <bool kFp8>
int64_t RowsOf(const LazyAdamQuantRowsArgs &a, int64_t begin, int64_t end, void *scratch) {
  return with_float_type(a.dtype, [&]<class T>() {  // the gradient float32, or var's dtype
    auto rows = [&]<class G>() {
      if constexpr (kFp8) {
        if (a.dim == 32) return Rows<T, G, true, 32>(a, begin, end, scratch);
      }
      return Rows<T, G, kFp8>(a, begin, end, scratch);
    };
    return a.grad_dtype == DType::kFloat32 ? rows.template operator()<float>()
                                           : rows.template operator()<T>();
  });
}

int64_t LazyAdamQuantRows(const LazyAdamQuantRowsArgs &a, int64_t begin, int64_t end,
                          void *scratch) {
  return RowsOf<false>(a, begin, end, scratch);
}

int64_t LazyAdamQuantFp8Rows(const LazyAdamQuantRowsArgs &a, int64_t begin, int64_t end,
                             void *scratch) {
  return RowsOf<true>(a, begin, end, scratch);
}

}  // namespace
}  // namespace fusekit::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace fusekit {
HWY_EXPORT(LazyAdamQuantRows);
HWY_EXPORT(LazyAdamQuantFp8Rows);

// Looked up on each call (one table read) so that tests can switch targets.
LazyAdamQuantRowsFn lazy_adam_quant_rows_hwy() {
  return FUSEKIT_HWY_DISPATCH(LazyAdamQuantRows);
}

LazyAdamQuantRowsFn lazy_adam_quant_fp8_rows_hwy() {
  return FUSEKIT_HWY_DISPATCH(LazyAdamQuantFp8Rows);
}

}  // namespace fusekit
#endif  // HWY_ONCE
