// fusekit internal, per Highway target: float32, float16 and bfloat16 tensors as float32 vectors,
// and the Adam(W) update on vectors that AdamW and ApplyAdamWQuant share.
//
//   LoadWide(df, p)       a vector of float32 from float, float16_t or bfloat16_t storage;
//   StoreNarrow(df, w, p) the vector stored as float, or rounded to nearest-even into float16_t or
//                         bfloat16_t (NaN stays a quiet NaN);
//   AdamVectors<DF>       the scalars of common/adam_update.h in vectors; Update() is
//   adam_update(),
//                         operation for operation, so that every vector width gives the scalar
//                         result bit for bit.
//
// The 16-bit stores round to nearest-even in integer arithmetic (bfloat16) or with F16C (float16 on
// AVX2 and up); Highway 1.0.3's own bfloat16 demotion truncates, and its float16 emulation below
// AVX2 does too, so neither is used.
//
// Include it after <hwy/highway.h> in a file compiled with foreach_target.h, outside any
// namespace (the usual Highway -inl.h pattern: the guard below toggles once per target).

#include <cstddef>
#include <cstdint>

#include "common/adam_update.h"
#include "fusekit/dtype.h"
#include "fusekit/float16.h"

#if defined(FUSEKIT_COMMON_HWY_DTYPE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef FUSEKIT_COMMON_HWY_DTYPE_INL_H_
#undef FUSEKIT_COMMON_HWY_DTYPE_INL_H_
#else
#define FUSEKIT_COMMON_HWY_DTYPE_INL_H_
#endif

#include <hwy/highway.h>

// Whether this target converts float16 in hardware (F16C).
#undef FUSEKIT_HWY_HW_F16
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define FUSEKIT_HWY_HW_F16 1
#else
#define FUSEKIT_HWY_HW_F16 0
#endif

HWY_BEFORE_NAMESPACE();
namespace fusekit::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---- widening loads and rounding stores ------------------------------------------------------
template <class DF>
HWY_INLINE hn::Vec<DF> LoadWide(DF df, const float *p) {
  return hn::LoadU(df, p);
}
template <class DF>
HWY_INLINE hn::Vec<DF> LoadWide(DF df, const bfloat16_t *p) {
  const hn::Rebind<hwy::bfloat16_t, DF> db;
  return hn::PromoteTo(df, hn::LoadU(db, reinterpret_cast<const hwy::bfloat16_t *>(p)));
}
template <class DF>
HWY_INLINE hn::Vec<DF> LoadWide(DF df, const float16_t *p) {
#if FUSEKIT_HWY_HW_F16
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t *>(p)));
#else
  HWY_ALIGN float tmp[HWY_MAX_BYTES / sizeof(float)];
  for (size_t i = 0; i < hn::Lanes(df); ++i) tmp[i] = half_bits_to_float(p[i].bits);
  return hn::Load(df, tmp);
#endif
}

template <class DF>
HWY_INLINE void StoreNarrow(DF df, hn::Vec<DF> w, float *p) {
  hn::StoreU(w, df, p);
}
template <class DF>
HWY_INLINE void StoreNarrow(DF /* df */, hn::Vec<DF> w, bfloat16_t *p) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> d16;
  const auto bits = hn::BitCast(du, w);
  const auto lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
  const auto rounded = hn::ShiftRight<16>(hn::Add(bits, hn::Add(hn::Set(du, 0x7fffu), lsb)));
  const auto quiet_nan = hn::ShiftRight<16>(hn::Or(bits, hn::Set(du, 0x00400000u)));
  const auto r = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(w)), quiet_nan, rounded);
  hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, r)), d16, reinterpret_cast<uint16_t *>(p));
}
template <class DF>
HWY_INLINE void StoreNarrow([[maybe_unused]] DF df, hn::Vec<DF> w, float16_t *p) {
#if FUSEKIT_HWY_HW_F16
  const hn::Rebind<hwy::float16_t, DF> dh;
  hn::StoreU(hn::DemoteTo(dh, w), dh, reinterpret_cast<hwy::float16_t *>(p));
#else
  HWY_ALIGN float tmp[HWY_MAX_BYTES / sizeof(float)];
  hn::Store(w, df, tmp);
  for (size_t i = 0; i < hn::Lanes(df); ++i) p[i].bits = float_to_half_bits(tmp[i]);
#endif
}

// ---- the Adam update on vectors: adam_update() of common/adam_update.h, operation for operation
// --
template <class DF>
struct AdamVectors {
  hn::Vec<DF> b1, b2, omb1, omb2, gs, step, eps, decay;
  bool decay_before, decay_after;
  AdamVectors(DF df, const AdamScalars &s)
      : b1(hn::Set(df, s.beta1)),
        b2(hn::Set(df, s.beta2)),
        omb1(hn::Set(df, s.one_minus_beta1)),
        omb2(hn::Set(df, s.one_minus_beta2)),
        gs(hn::Set(df, s.gnorm_scale)),
        step(hn::Set(df, s.step_size)),
        eps(hn::Set(df, s.eps_c2s)),
        decay(hn::Set(df, s.decay)),
        decay_before(s.decay_before),
        decay_after(s.decay_after) {}
  // m and v updated in place; returns the new var. sqrt_v, where given, receives sqrt(v), the
  // square root the update divided by (the FP8 state format stores it).
  HWY_INLINE hn::Vec<DF> Update(hn::Vec<DF> grad, hn::Vec<DF> &m, hn::Vec<DF> &v, hn::Vec<DF> w,
                                hn::Vec<DF> *sqrt_v = nullptr) const {
    if (decay_before) w = hn::Mul(w, decay);
    const auto g = hn::Mul(grad, gs);
    m = hn::Add(hn::Mul(m, b1), hn::Mul(g, omb1));
    v = hn::Add(hn::Mul(v, b2), hn::Mul(hn::Mul(g, g), omb2));
    const auto s = hn::Sqrt(v);
    if (sqrt_v != nullptr) *sqrt_v = s;
    w = hn::Add(w, hn::Div(hn::Mul(m, step), hn::Add(s, eps)));
    return decay_after ? hn::Mul(w, decay) : w;
  }
};

}  // namespace fusekit::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // FUSEKIT_COMMON_HWY_DTYPE_INL_H_ toggle
