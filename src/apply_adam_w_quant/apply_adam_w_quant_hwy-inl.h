// fusekit internal, per Highway target: ApplyAdamWQuant's generic kernel (QuantBlocks) and its
// guard, for every target Highway builds. Included by apply_adam_w_quant_hwy.cc (the cpu_hwy
// implementation) and apply_adam_w_quant_avx512vbmi.cc (whose kernel runs a partial last block,
// and some maps' sign fix, through these). The same float32 operations in the same
// order as the reference kernel (no FMA), so results are bitwise equal.
//
// Per block: (1) dequantize (a gather from the 256-float map), the Adam update, the new m, v and
// var kept in three 1 KiB buffers, their block maxima (and var's largest magnitude); (2) the guard:
// a block whose new m, v or var (as stored) would be NaN or Inf is left unchanged and counted
// (GuardedBlock below; a NaN or Inf gradient is one case); (3) var stored, and requantize: the
// nearest code by a table lookup over the normalized value's float bits and one or two comparisons
// with the decision thresholds (or, without the table, 8 branch-free steps): the searches of
// common/quant_codes_hwy-inl.h, shared with LazyAdamQuant.
//
// The FP8 state format has its own kernel (Fp8Blocks): the same steps, but var stored by the
// update loop (its old bits kept for a block the guard refuses) and the codes by bit arithmetic
// (common/fp8_codes_hwy-inl.h).
//
// Include it after <hwy/highway.h> in a file compiled with foreach_target.h, outside any namespace.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "apply_adam_w_quant/apply_adam_w_quant_kernels.h"
#include "fusekit/float16.h"

#if defined(FUSEKIT_APPLY_ADAM_W_QUANT_HWY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef FUSEKIT_APPLY_ADAM_W_QUANT_HWY_INL_H_
#undef FUSEKIT_APPLY_ADAM_W_QUANT_HWY_INL_H_
#else
#define FUSEKIT_APPLY_ADAM_W_QUANT_HWY_INL_H_
#endif

#include <hwy/highway.h>

#include "common/fp8_codes_hwy-inl.h"  // Fp8Decode, Fp8Code, StoreFp8Codes: the FP8 state format
#include "common/hwy_dtype-inl.h"
#include "common/quant_codes_hwy-inl.h"  // Codes, BlockCodes, recip_ok: the nearest code

HWY_BEFORE_NAMESPACE();
namespace fusekit::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace {  // internal linkage: no clash with other operators' kernels of the same names

constexpr int64_t kBlock = 256;

// The guard of a block, from what the update loop gathered: `var_bits`, the largest magnitude bits
// of the new var (NaN above Inf); the block maxima max |m| and max v. It is the reference kernel's
// check (every new m, v and var finite as stored) made from the block's maxima:
//  - a var at or above its dtype's limit shows in var_bits;
//  - a NaN m, and a v that is NaN, -Inf or negative, make that element's var NaN (m * step_size;
//    sqrt(v)), so they show in var_bits too;
//  - an m of +-Inf or a v of +Inf makes its maximum +Inf (Max keeps +Inf; it drops NaN lanes,
//    which var_bits has caught).
// So this holds exactly where the reference's check holds. The maxima reduced over lanes by
// MaxOfLanes are used only where it holds: EMU128's MaxOfLanes starts from -FLT_MAX, not -Inf, and
// differs only when every lane is -Inf (every v seen NaN or -Inf), which the guard refuses.
HWY_INLINE bool GuardedBlock(bool var_ok, float max_m, float max_v) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  return var_ok && max_m < kInf && max_v < kInf;
}

// The lost-v guard on a vector (docs/fp8_state.md): v = m * m where v is 0 and m is not.
template <class V>
HWY_INLINE V GuardLostV(V m, V v) {
  const auto zero = hn::Zero(hn::DFromV<V>());
  return hn::IfThenElse(hn::AndNot(hn::Eq(m, zero), hn::Eq(v, zero)), hn::Mul(m, m), v);
}

// max(|m|, acc) on a vector: one VRANGEPS (the larger magnitude, its sign cleared) on AVX-512;
// where m is NaN the result may drop it (the block's var is then NaN: the guard sees it there).
template <class V>
HWY_INLINE V MaxAbs(V m, V acc) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (sizeof(hn::TFromV<V>) == 4 && hn::MaxLanes(hn::DFromV<V>()) == 16)
    return V{_mm512_range_ps(m.raw, acc.raw, 0x0b)};
#endif
  return hn::Max(hn::Abs(m), acc);
}

// The FP8 format's codes of a block whose guard held (StoreFp8Block without var and scales), its
// codes by Fp8CodeInBlock, for the block's scales sm (m) and sv (sqrt(v), in format FV: UE4M4 or
// UE3M5).
template <const Fp8Format &FV, class DF, class DI, class D8>
HWY_INLINE void StoreFp8BlockCodes(DF df, DI di, D8 d8, const float *m_new, const float *s_new,
                                   const Fp8BlockScale &sm, const Fp8BlockScale &sv, int64_t len,
                                   uint8_t *mc, uint8_t *vc) {
  const auto N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t vec_len = len / N * N;
  const auto inv_m = hn::Set(df, sm.inv), inv_v = hn::Set(df, sv.inv);
  if (sm.inv != 0.0f && sv.inv != 0.0f) {  // the usual block: no zero scale, no test per vector
    for (int64_t j = 0; j < vec_len; j += N) {
      StoreFp8Codes(d8, di, Fp8CodeInBlock<kE4M3>(df, di, hn::Mul(hn::Load(df, m_new + j), inv_m)),
                    mc + j);
      StoreFp8Codes(d8, di, Fp8CodeInBlock<FV>(df, di, hn::Mul(hn::Load(df, s_new + j), inv_v)),
                    vc + j);
    }
  } else {  // a zero block codes every element 0
    const auto zero = hn::Zero(di);
    for (int64_t j = 0; j < vec_len; j += N) {
      StoreFp8Codes(d8, di,
                    sm.inv == 0.0f
                        ? zero
                        : Fp8CodeInBlock<kE4M3>(df, di, hn::Mul(hn::Load(df, m_new + j), inv_m)),
                    mc + j);
      StoreFp8Codes(d8, di,
                    sv.inv == 0.0f
                        ? zero
                        : Fp8CodeInBlock<FV>(df, di, hn::Mul(hn::Load(df, s_new + j), inv_v)),
                    vc + j);
    }
  }
  for (int64_t j = vec_len; j < len; ++j) {
    mc[j] = fp8_block_code<kE4M3>(m_new[j], sm);
    vc[j] = fp8_block_code<FV>(s_new[j], sv);
  }
}

// The guard's view of the new var of a block (GuardedBlock's var_ok): whether every w, as stored
// in T, is finite. For float32 on AVX-512 one VFPCLASSPS per vector (NaN or Inf) into a mask;
// otherwise the largest magnitude bits against T's limit (adam_stored_finite_limit).
template <class DF, typename T>
struct VarCheck {
  using DI = hn::RebindToSigned<DF>;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  static constexpr bool kClass = std::is_same_v<T, float> && hn::MaxLanes(DF()) == 16;
#else
  static constexpr bool kClass = false;
#endif
  hn::Vec<DI> acc;  // (the aggregate's initializers: Zero, 0)
  uint32_t bad;
  HWY_INLINE void Add(hn::Vec<DF> w) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    if constexpr (kClass) {
      bad |= _mm512_fpclass_ps_mask(w.raw, 0x99);  // QNaN, SNaN, +Inf, -Inf
      return;
    }
#endif
    acc = hn::Max(acc, hn::And(hn::BitCast(DI(), w), hn::Set(DI(), 0x7fffffff)));
  }
  HWY_INLINE bool Ok() const {
    if constexpr (kClass) return bad == 0;
    return hn::AllTrue(
        DI(), hn::Lt(acc, hn::Set(DI(), static_cast<int32_t>(adam_stored_finite_limit<T>()))));
  }
};

// v, which the compiler may no longer see through: a copy made of it is not a copy to it (GCC
// turns a loop's load-and-store of the same bits into a memcpy before the loop, here slower).
template <class V>
HWY_INLINE V Opaque(V v) {
#if HWY_ARCH_X86 && HWY_TARGET != HWY_EMU128 && HWY_TARGET != HWY_SCALAR
  asm("" : "+v"(v.raw));
#endif
  return v;
}

// The N elements of var at p as float32 (LoadWide), their bits copied to `out` (N * sizeof(T)
// bytes).
template <class DF, typename T>
HWY_INLINE hn::Vec<DF> LoadAndKeepVar(DF df, const T *p, unsigned char *out) {
  if constexpr (sizeof(T) == 4) {
    const auto w = hn::LoadU(df, reinterpret_cast<const float *>(p));
    hn::StoreU(Opaque(w), df, reinterpret_cast<float *>(out));
    return w;
  } else {
    const hn::Rebind<uint16_t, DF> d16;
    hn::StoreU(Opaque(hn::LoadU(d16, reinterpret_cast<const uint16_t *>(p))), d16,
               reinterpret_cast<uint16_t *>(out));
    return LoadWide(df, p);
  }
}

// The FP8 state format's blocks (docs/fp8_state.md): the same operations as QuantBlocks<T, true>,
// bit for bit, in fewer instructions:
//  - the update loop stores the new var where it goes and keeps the old var's bits in a buffer,
//    which a block that the guard refuses gets back (so the block ends bit for bit unchanged, as
//    before: nothing else reads var while the kernel runs); the coding loop stores only codes;
//  - E4M3's NaN codes are looked for once per block (a block holding one runs one element at a
//    time, and its guard refuses it), not mapped per vector;
//  - no multiplication by a gnorm_scale of 1 (kUnitGs: grad * 1 is grad), the decay after the
//    update a template argument (kDecayAfter: a.decay_after); |m|'s maximum by MaxAbs;
//    var's check by VarCheck; the codes by Fp8CodeInBlock;
//  - the lost-v guard only where it can act: in a block whose scale of sqrt(v) is finite and at
//    least 2^-50, v is 0 exactly where its code is 0, so a block without such a code runs without
//    the guard, and one with them takes the guard's mask from the codes (SquareGuardedByCode);
//  - a block's codes are stored after the next block's update loop (Pending), not after its own.
// FV: sqrt(v)'s format (kUE4M4, state format fp8; kUE3M5, fp8_ue3m5).
template <typename T, const Fp8Format &FV, bool kUnitGs, bool kDecayAfter>
int64_t Fp8Blocks(const AdamWQuantArgs &a, int64_t begin, int64_t end) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(di)> d8;
  const auto N = static_cast<int64_t>(hn::Lanes(df));
  auto *var = static_cast<T *>(a.var);
  const auto *grad = static_cast<const T *>(a.grad);
  uint8_t *const mcodes = a.m, *const vcodes = a.v;  // (byte stores would make a.m reloaded)
  const auto zero = hn::Zero(df);
  const AdamVectors<decltype(df)> adam(df, a);
  // The new m and sqrt(v) of this block (mv_new[cur]) and of the block before (mv_new[cur ^ 1]),
  // whose codes are stored after this block's update loop (Pending, below).
  HWY_ALIGN float mv_new[2][2][kBlock];
  HWY_ALIGN float w_new[kBlock];  // the old var's bits (vectors), the new var (the scalar tail)
  int64_t skipped = 0;
  // A block whose guard held and whose codes are not stored yet: its codes are made after the next
  // block's update loop (or at the end), when its scales have long been known; so the coding loop
  // never waits on the block's maxima and the scales' divisions, which end the update loop's
  // longest chain.
  struct Pending {
    int64_t lo = -1, len = 0;
    Fp8BlockScale sm{}, sv{};
  } pend;
  int cur = 0;
  auto store_pending = [&] {
    if (pend.lo < 0) return;
    StoreFp8BlockCodes<FV>(df, di, d8, mv_new[cur ^ 1][0], mv_new[cur ^ 1][1], pend.sm, pend.sv,
                           pend.len, mcodes + pend.lo, vcodes + pend.lo);
    pend.lo = -1;
  };

  for (int64_t b = begin; b < end; ++b) {
    const int64_t lo = b * kBlock, len = std::min(kBlock, a.n - lo);
    const int64_t vec_len = len / N * N;
    float *const m_new = mv_new[cur][0], *const v_new = mv_new[cur][1];
    float *absmax_m = a.absmax_m + b * a.absmax_m_stride;
    float *absmax_v = a.absmax_v + b * a.absmax_v_stride;
    const float scale_m = *absmax_m, scale_v = *absmax_v;
    const auto vscale_m = hn::Set(df, scale_m), vscale_v = hn::Set(df, scale_v);
    const auto vscale256_m = hn::Set(df, scale_m * kE4M3.float16_factor());
    const auto vscale256_v = hn::Set(df, scale_v * FV.float16_factor());
    // A block whose scale does not fold (above 1e36), or that holds an E4M3 NaN code, runs its
    // update one element at a time.
    const int64_t upd_len = !(fp8_scale_folds<kE4M3>(scale_m) && fp8_scale_folds<FV>(scale_v)) ||
                                    Fp8HasNanCode(mcodes + lo, vec_len)
                                ? 0
                                : vec_len;
    auto acc_m = zero, acc_v = hn::Set(df, -std::numeric_limits<float>::infinity());
    VarCheck<decltype(df), T> var_check{hn::Zero(di), 0};
    T *var_b = var + lo;
    auto *old_bits = reinterpret_cast<unsigned char *>(w_new);
    // The update loop, with the lost-v guard or without (kGuard, below), software-pipelined in
    // three stages so that fewer operations wait in the core's window for the square root and the
    // division: each turn decodes the codes of vector j + 2N, updates vector j + N up to its square
    // root (m and its maximum done there), and finishes vector j (the division, var, s).
    auto update = [&](auto guard_tag) HWY_ATTR {
      constexpr int kGuard = decltype(guard_tag)::value;
      using V = hn::Vec<decltype(df)>;
      struct Decoded {
        V m, sv;
      };
      struct Front {
        V s, mstep, w;
      };
      auto decode = [&](int64_t j) HWY_ATTR {
        const int64_t i = lo + j;
        return Decoded{Fp8DecodeNoNan<kE4M3>(df, mcodes + i, vscale_m, vscale256_m),
                       Fp8DecodeNoNan<FV>(df, vcodes + i, vscale_v, vscale256_v)};
      };
      auto front = [&](int64_t j, const Decoded &d) HWY_ATTR {
        const int64_t i = lo + j;
        auto m = d.m;
        auto v = kGuard == 1 ? SquareGuardedByCode(df, vcodes + i, m, d.sv) : hn::Mul(d.sv, d.sv);
        if constexpr (kGuard == 2) v = GuardLostVOfSquare(m, v);
        // adam.Update, operation for operation.
        auto w = LoadAndKeepVar(df, var + i, old_bits + j * sizeof(T));
        if (adam.decay_before) w = hn::Mul(w, adam.decay);
        const auto g = kUnitGs ? LoadWide(df, grad + i) : hn::Mul(LoadWide(df, grad + i), adam.gs);
        m = hn::Add(hn::Mul(m, adam.b1), hn::Mul(g, adam.omb1));
        v = hn::Add(hn::Mul(v, adam.b2), hn::Mul(hn::Mul(g, g), adam.omb2));
        hn::Store(m, df, m_new + j);
        acc_m = MaxAbs(m, acc_m);
        return Front{hn::Sqrt(v), hn::Mul(m, adam.step), w};
      };
      auto back = [&](int64_t j, const Front &f) HWY_ATTR {
        auto w = hn::Add(f.w, hn::Div(f.mstep, hn::Add(f.s, adam.eps)));
        if (kDecayAfter) w = hn::Mul(w, adam.decay);
        StoreNarrow(df, w, var + lo + j);
        hn::Store(f.s, df, v_new + j);
        acc_v = hn::Max(f.s, acc_v);
        var_check.Add(w);
      };
      if (upd_len == 0) return;
      Front f = front(0, decode(0));
      Decoded d = decode(N < upd_len ? N : 0);
      for (int64_t j = N; j < upd_len; j += N) {
        const Decoded next_d = decode(j + N < upd_len ? j + N : j);  // (the last turn: again)
        const Front next_f = front(j, d);
        back(j - N, f);
        f = next_f;
        d = next_d;
      }
      back(upd_len - N, f);
    };
    // The lost-v guard (v = m * m where v = s * s is 0) where the scale of sqrt(v) is finite and at
    // least 2^-50: there a code of 0 gives s = +0 and v = +0, and every other code s >= 2^-10 *
    // 2^-50 (the least nonzero UE4M4 value times the scale, rounded: no less), so v = s * s >=
    // 2^-120, a normal float (not even flushed to zero): v is 0 exactly where the code is 0. So a
    // block without a code of 0 (the usual one) needs no guard, and another one takes its mask from
    // the codes (off the update's longest chain) rather than from v.
    if (scale_v >= 0x1p-50f && scale_v <= std::numeric_limits<float>::max()) {
      if (!Fp8HasZeroCode(vcodes + lo, upd_len)) {
        update(std::integral_constant<int, 0>());
      } else {
        update(std::integral_constant<int, 1>());
      }
    } else {
      update(std::integral_constant<int, 2>());
    }
    store_pending();  // the block before's codes
    float max_m = 0.0f, max_v = -std::numeric_limits<float>::infinity();
    bool var_ok = true;
    if (upd_len > 0) {
      max_m = hn::GetLane(hn::MaxOfLanes(df, acc_m));
      max_v = hn::GetLane(hn::MaxOfLanes(df, acc_v));
      var_ok = var_check.Ok();
    }
    for (int64_t j = upd_len; j < len; ++j) {
      const int64_t i = lo + j;
      float m = fp8_value<kE4M3>(mcodes[i]) * scale_m;
      const float sv = fp8_value<FV>(vcodes[i]) * scale_v;
      float v = sv * sv;
      if (v == 0.0f && m != 0.0f) v = m * m;
      const float w = adam_update(a, to_float(grad[i]), &m, &v, to_float(var[i]));
      var_ok = var_ok && adam_produced_finite<T>(m, v, w);
      v = std::sqrt(v);
      m_new[j] = m;
      v_new[j] = v;
      w_new[j] = w;
      max_m = std::max(max_m, std::fabs(m));
      max_v = std::max(max_v, v);
    }
    if (!GuardedBlock(var_ok, max_m, max_v)) {
      // var back as it was (the scalar tail wrote none of it).
      std::memcpy(var_b, old_bits, static_cast<size_t>(upd_len) * sizeof(T));
      ++skipped;
      continue;
    }
    for (int64_t j = upd_len; j < len; ++j) var_b[j] = from_float<T>(w_new[j]);
    pend.sm = fp8_block_scale<kE4M3>(max_m + 0.0f);
    pend.sv = fp8_block_scale<FV>(max_v + 0.0f);
    *absmax_m = pend.sm.scale;
    *absmax_v = pend.sv.scale;
    pend.lo = lo;
    pend.len = len;
    cur ^= 1;
  }
  store_pending();
  return skipped;
}

// The dynamic-map format (the FP8 format's kernel is Fp8Blocks above).
template <typename T>
int64_t QuantBlocks(const AdamWQuantArgs &a, int64_t begin, int64_t end) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(di)> d8;
  const auto N = static_cast<int64_t>(hn::Lanes(df));
  auto *var = static_cast<T *>(a.var);
  const auto *grad = static_cast<const T *>(a.grad);
  const auto zero = hn::Zero(df);
  const AdamVectors<decltype(df)> adam(df, a);
  const auto magnitude = hn::Set(di, 0x7fffffff);
  const auto var_limit = hn::Set(di, static_cast<int32_t>(adam_stored_finite_limit<T>()));
  HWY_ALIGN float m_new[kBlock];
  HWY_ALIGN float v_new[kBlock];
  HWY_ALIGN float w_new[kBlock];
  int64_t skipped = 0;

  for (int64_t b = begin; b < end; ++b) {
    const int64_t lo = b * kBlock, len = std::min(kBlock, a.n - lo);
    const int64_t vec_len = len / N * N;
    // (1) The Adam update into the buffers; nothing is stored yet.
    float *absmax_m = a.absmax_m + b * a.absmax_m_stride;
    float *absmax_v = a.absmax_v + b * a.absmax_v_stride;
    const float scale_m = *absmax_m, scale_v = *absmax_v;
    const auto vscale_m = hn::Set(df, scale_m), vscale_v = hn::Set(df, scale_v);
    const int64_t upd_len = vec_len;
    auto acc_m = zero, acc_v = hn::Set(df, -std::numeric_limits<float>::infinity());
    auto acc_w = hn::Zero(di);
    for (int64_t j = 0; j < upd_len; j += N) {
      const int64_t i = lo + j;
      const auto mc = hn::PromoteTo(di, hn::LoadU(d8, a.m + i));
      const auto vc = hn::PromoteTo(di, hn::LoadU(d8, a.v + i));
      auto m = hn::Mul(hn::GatherIndex(df, a.map_m.q, mc), vscale_m);
      auto v = hn::Mul(hn::GatherIndex(df, a.map_v.q, vc), vscale_v);
      if (a.guard_lost_v) v = GuardLostV(m, v);
      const auto w = adam.Update(LoadWide(df, grad + i), m, v, LoadWide(df, var + i));
      hn::Store(m, df, m_new + j);
      hn::Store(v, df, v_new + j);
      hn::Store(w, df, w_new + j);
      acc_m = hn::Max(hn::Abs(m), acc_m);
      acc_v = hn::Max(v, acc_v);
      acc_w = hn::Max(acc_w, hn::And(hn::BitCast(di, w), magnitude));
    }
    float max_m = 0.0f, max_v = -std::numeric_limits<float>::infinity();
    bool var_ok = true;
    if (upd_len > 0) {
      max_m = hn::GetLane(hn::MaxOfLanes(df, acc_m));
      max_v = hn::GetLane(hn::MaxOfLanes(df, acc_v));
      var_ok = hn::AllTrue(di, hn::Lt(acc_w, var_limit));
    }
    for (int64_t j = upd_len; j < len; ++j) {
      const int64_t i = lo + j;
      float m = a.map_m.q[a.m[i]] * scale_m;
      float v = a.map_v.q[a.v[i]] * scale_v;
      if (a.guard_lost_v && v == 0.0f && m != 0.0f) v = m * m;
      const float w = adam_update(a, to_float(grad[i]), &m, &v, to_float(var[i]));
      var_ok = var_ok && adam_produced_finite<T>(m, v, w);
      m_new[j] = m;
      v_new[j] = v;
      w_new[j] = w;
      max_m = std::max(max_m, std::fabs(m));
      max_v = std::max(max_v, v);
    }
    // (2) The guard.
    if (!GuardedBlock(var_ok, max_m, max_v)) {
      ++skipped;
      continue;
    }
    // (3) Store var and absmax; requantize.
    max_m = max_m + 0.0f;
    max_v = max_v + 0.0f;
    *absmax_m = max_m;
    *absmax_v = max_v;
    const float div_m = max_m == 0.0f ? 1.0f : max_m;
    const float div_v = max_v == 0.0f ? 1.0f : max_v;
    const auto vdiv_m = hn::Set(df, div_m), vdiv_v = hn::Set(df, div_v);
    const bool recip_m = recip_ok(a.map_m, div_m), recip_v = recip_ok(a.map_v, div_v);
    const auto vrecip_m = hn::Set(df, 1.0f / div_m), vrecip_v = hn::Set(df, 1.0f / div_v);
    for (int64_t j = 0; j < vec_len; j += N) {
      StoreNarrow(df, hn::Load(df, w_new + j), var + lo + j);
      const auto cm = BlockCodes(df, a.map_m, hn::Load(df, m_new + j), vdiv_m, recip_m, vrecip_m);
      const auto cv = BlockCodes(df, a.map_v, hn::Load(df, v_new + j), vdiv_v, recip_v, vrecip_v);
      hn::StoreU(hn::DemoteTo(d8, cm), d8, a.m + lo + j);
      hn::StoreU(hn::DemoteTo(d8, cv), d8, a.v + lo + j);
    }
    for (int64_t j = vec_len; j < len; ++j) {
      var[lo + j] = from_float<T>(w_new[j]);
      a.m[lo + j] = quant_code_reference(a.map_m, m_new[j] / div_m);
      a.v[lo + j] = quant_code_reference(a.map_v, v_new[j] / div_v);
    }
  }
  return skipped;
}

}  // namespace
}  // namespace fusekit::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // FUSEKIT_APPLY_ADAM_W_QUANT_HWY_INL_H_ toggle
