// fusekit internal, per Highway target: LazyAdam's row step on vectors, shared by the kernels
// that end in it (LazyAdam, EmbeddingBagLazyAdam):
//
//   PrefetchRow(p, dim)       every cache line of a row of dim floats;
//   LazyAdamConsts            the float32 constants of the step;
//   UpdateLanes(d, c, g, ...) m, v, var of lanes [j, j + Lanes(d)) from the gradient g;
//   LanesFinite(d, g)         whether the lanes of g are all finite;
//   ForEachSpan(D, fn)        fn(tag, j) over [0, D): full vectors, then 8 and 4 lanes, then single
//                             lanes (every width does the same float32 operations per lane).
//
// Include it after <hwy/highway.h> in a file compiled with foreach_target.h, inside
// HWY_BEFORE_NAMESPACE / namespace fusekit::HWY_NAMESPACE with `hn` defined (the guard below
// toggles once per target).

#if defined(FUSEKIT_COMMON_LAZY_ADAM_ROWS_HWY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef FUSEKIT_COMMON_LAZY_ADAM_ROWS_HWY_INL_H_
#undef FUSEKIT_COMMON_LAZY_ADAM_ROWS_HWY_INL_H_
#else
#define FUSEKIT_COMMON_LAZY_ADAM_ROWS_HWY_INL_H_
#endif

HWY_INLINE void PrefetchRow(const float *p, int64_t dim) {
  const auto *bytes = reinterpret_cast<const char *>(p);
  const int64_t n = dim * static_cast<int64_t>(sizeof(float));
  for (int64_t off = 0; off < n; off += 64) hwy::Prefetch(bytes + off);
  hwy::Prefetch(bytes + n - 1);
}

struct LazyAdamConsts {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, epsilon, neg_lr;
};

// The update of lanes [j, j + Lanes(d)) of one row. Every op is an exact IEEE operation, in the
// order of the scalar formula, so any vector width gives the scalar result bit for bit.
template <class D>
HWY_INLINE void UpdateLanes(D d, const LazyAdamConsts &c, const float *HWY_RESTRICT g,
                            float *HWY_RESTRICT m, float *HWY_RESTRICT v, float *HWY_RESTRICT var) {
  const auto gj = hn::LoadU(d, g);
  const auto mj = hn::Add(hn::Mul(hn::LoadU(d, m), hn::Set(d, c.beta1)),
                          hn::Mul(gj, hn::Set(d, c.one_minus_beta1)));
  const auto vj = hn::Abs(hn::Add(hn::Mul(hn::LoadU(d, v), hn::Set(d, c.beta2)),
                                  hn::Mul(hn::Mul(gj, gj), hn::Set(d, c.one_minus_beta2))));
  const auto denom = hn::Add(hn::Sqrt(vj), hn::Set(d, c.epsilon));
  hn::StoreU(mj, d, m);
  hn::StoreU(vj, d, v);
  hn::StoreU(hn::Add(hn::LoadU(d, var), hn::Div(hn::Mul(mj, hn::Set(d, c.neg_lr)), denom)), d, var);
}

// Nonzero (NaN) when any of the lanes is NaN or Inf: g * 0 is 0 for finite g.
template <class D>
HWY_INLINE bool LanesFinite(D d, const float *HWY_RESTRICT g) {
  const auto z = hn::Zero(d);
  return hn::AllTrue(d, hn::Eq(hn::Mul(hn::LoadU(d, g), z), z));
}

// Applies fn(tag, j) over [0, D): full vectors, then one vector each of 8 and 4 lanes where the
// full vector is wider, then single lanes. A row of 8 floats is one 8-lane step even on AVX-512.
template <class Fn>
HWY_INLINE void ForEachSpan(int64_t D, Fn &&fn) {
  const hn::ScalableTag<float> d;
  const auto N = static_cast<int64_t>(hn::Lanes(d));
  int64_t j = 0;
  for (; j + N <= D; j += N) fn(d, j);
#if HWY_TARGET != HWY_SCALAR
  if (N > 8 && j + 8 <= D) {
    fn(hn::CappedTag<float, 8>(), j);
    j += 8;
  }
  if (N > 4 && j + 4 <= D) {
    fn(hn::CappedTag<float, 4>(), j);
    j += 4;
  }
#endif
  for (; j < D; ++j) fn(hn::CappedTag<float, 1>(), j);
}

#endif  // FUSEKIT_COMMON_LAZY_ADAM_ROWS_HWY_INL_H_
