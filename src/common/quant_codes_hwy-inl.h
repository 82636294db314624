// fusekit internal, per Highway target: the nearest-code searches of the 8-bit optimizers
// (ApplyAdamWQuant, LazyAdamQuant) on Highway vectors, for every target Highway builds, over the
// tables of common/quant_search.h:
//   Codes(df, t, x)         the exact code of each lane of x (NaN taken as 0), sign fix included:
//                           the packed table (one lookup, one comparison), the count table and
//                           refine steps, or 8 branch-free binary-search steps without a table;
//   BlockCodes(df, t, m, vdiv, use_recip, vrecip)
//                           the code of m / div; with the packed table and recip_ok(t, div) by the
//                           reciprocal product, lanes near a threshold or bucket edge redone
//                           exactly with the division;
// all bitwise equal to quant_code_reference(t, m / div).
//
// Include it after <hwy/highway.h> in a file compiled with foreach_target.h, outside any
// namespace. Everything is in an anonymous namespace (a copy per including file).

#include <cstdint>

#include "common/quant_search.h"

#if defined(FUSEKIT_COMMON_QUANT_CODES_HWY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef FUSEKIT_COMMON_QUANT_CODES_HWY_INL_H_
#undef FUSEKIT_COMMON_QUANT_CODES_HWY_INL_H_
#else
#define FUSEKIT_COMMON_QUANT_CODES_HWY_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace fusekit::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace {

// ---- the nearest code ------------------------------------------------------------------------
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToSigned<DF>> Codes(DF df, const QuantMapTables &t, hn::Vec<DF> x) {
  const hn::RebindToSigned<DF> di;
  const hn::RebindToUnsigned<DF> du;
  x = hn::IfThenZeroElse(hn::IsNaN(x), x);
  if (t.packed != nullptr) {
    // One lookup: the bucket's codes below and above its threshold, and the threshold's low bits.
    x = hn::Add(x, hn::Zero(df));  // -0 becomes +0
    const auto bits = hn::BitCast(du, x);
    const auto flip =
        hn::Or(hn::BitCast(du, hn::BroadcastSignBit(hn::BitCast(di, x))), hn::Set(du, 0x80000000u));
    const auto key = hn::Xor(bits, flip);
    const auto e = hn::GatherIndex(di, reinterpret_cast<const int32_t *>(t.packed),
                                   hn::BitCast(di, hn::ShiftRight<16>(key)));
    const auto low = hn::BitCast(di, hn::And(key, hn::Set(du, 0xffffu)));
    const auto thr_low = hn::BitCast(di, hn::ShiftRight<16>(hn::BitCast(du, e)));
    const auto ff = hn::Set(di, 0xff);
    return hn::IfThenElse(hn::Lt(low, thr_low), hn::And(e, ff), hn::And(hn::ShiftRight<8>(e), ff));
  }
  hn::Vec<decltype(di)> c;
  if (t.lut != nullptr) {
    const auto bits = hn::BitCast(du, x);
    const auto flip =
        hn::Or(hn::BitCast(du, hn::BroadcastSignBit(hn::BitCast(di, x))), hn::Set(du, 0x80000000u));
    const auto bucket = hn::ShiftRight<16>(hn::Xor(bits, flip));
    c = hn::And(
        hn::GatherOffset(di, reinterpret_cast<const int32_t *>(t.lut), hn::BitCast(di, bucket)),
        hn::Set(di, 0xff));
    for (int s = 0; s < t.refine_steps; ++s) {
      const auto th = hn::GatherIndex(df, t.thr, c);
      c = hn::Sub(c, hn::VecFromMask(di, hn::RebindMask(di, hn::Ge(x, th))));
    }
  } else {
    c = hn::Zero(di);
    for (int step = 128; step > 0; step >>= 1) {
      const auto cand = hn::Add(c, hn::Set(di, step));
      const auto th = hn::GatherIndex(df, t.thr, hn::Sub(cand, hn::Set(di, 1)));
      c = hn::IfThenElse(hn::RebindMask(di, hn::Ge(x, th)), cand, c);
    }
  }
  auto code = t.identity_first ? c : hn::GatherIndex(di, t.first, c);
  if (t.sign_fix) {
    const auto zero = hn::Zero(df);
    const auto qc = hn::GatherIndex(df, t.q, code);
    const auto need = hn::RebindMask(di, hn::Lt(hn::Mul(x, qc), zero));
    const auto dir =
        hn::IfThenElse(hn::RebindMask(di, hn::Gt(x, zero)), hn::Set(di, 1), hn::Set(di, -1));
    const auto moved = hn::Min(hn::Max(hn::Add(code, dir), hn::Zero(di)), hn::Set(di, 255));
    code = hn::IfThenElse(need, moved, code);
  }
  return code;
}

// The packed-table code of x' = m * (1 / absmax), and the lanes where x' may sit on the other side
// of a threshold or bucket edge than x = m / absmax would: x' is within 3 units in the last place
// of x (two float32 roundings and the reciprocal's), so a lane whose key is more than kMargin
// keys from its bucket's threshold and edges has x's code. The caller redoes unsure vectors
// exactly with the division.
constexpr int32_t kMargin = 8;
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToSigned<DF>> PackedCodesApprox(
    DF df, const uint32_t *packed, hn::Vec<DF> x, hn::Mask<hn::RebindToSigned<DF>> *unsure) {
  const hn::RebindToSigned<DF> di;
  const hn::RebindToUnsigned<DF> du;
  x = hn::Add(hn::IfThenZeroElse(hn::IsNaN(x), x), hn::Zero(df));
  const auto bits = hn::BitCast(du, x);
  const auto flip =
      hn::Or(hn::BitCast(du, hn::BroadcastSignBit(hn::BitCast(di, x))), hn::Set(du, 0x80000000u));
  const auto key = hn::Xor(bits, flip);
  const auto e = hn::GatherIndex(di, reinterpret_cast<const int32_t *>(packed),
                                 hn::BitCast(di, hn::ShiftRight<16>(key)));
  const auto low = hn::BitCast(di, hn::And(key, hn::Set(du, 0xffffu)));
  const auto thr_low = hn::BitCast(di, hn::ShiftRight<16>(hn::BitCast(du, e)));
  const auto ff = hn::Set(di, 0xff);
  *unsure = hn::Or(hn::Lt(hn::Abs(hn::Sub(low, thr_low)), hn::Set(di, kMargin + 1)),
                   hn::Or(hn::Lt(low, hn::Set(di, kMargin + 1)),
                          hn::Gt(low, hn::Set(di, 0xffff - kMargin - 1))));
  return hn::IfThenElse(hn::Lt(low, thr_low), hn::And(e, ff), hn::And(hn::ShiftRight<8>(e), ff));
}

// A block's codes for one map: by reciprocal when the table is packed and 1 / absmax is a normal
// float (checked lanes redone exactly), else by division.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToSigned<DF>> BlockCodes(DF df, const QuantMapTables &t, hn::Vec<DF> m,
                                                      hn::Vec<DF> vdiv, bool use_recip,
                                                      hn::Vec<DF> vrecip) {
  const hn::RebindToSigned<DF> di;
  if (use_recip) {
    hn::Mask<decltype(di)> unsure;
    const auto c = PackedCodesApprox(df, t.packed, hn::Mul(m, vrecip), &unsure);
    if (HWY_LIKELY(hn::AllFalse(di, unsure))) return c;
  }
  return Codes(df, t, hn::Div(m, vdiv));
}

inline bool recip_ok(const QuantMapTables &t, float div) {
  return t.packed != nullptr && div >= 0x1p-126f && div <= 0x1p126f;
}

}  // namespace
}  // namespace fusekit::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // FUSEKIT_COMMON_QUANT_CODES_HWY_INL_H_ toggle
