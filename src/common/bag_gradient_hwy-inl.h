// fusekit internal, per Highway target: the gradient of one table row of an embedding-bag
// optimizer (common/embedding_bags.h), on vectors; shared by EmbeddingBagLazyAdam's kernel and
// common/bag_gradient_hwy.cc (EmbeddingBagLazyAdamQuant's):
//
//   BagRowGradient(a, entries, k, end, D, scratch, in_place, &g)
//     the row whose group of entries starts at k: g = x_i1, then g = g + x_i2, ... with
//     x_i = grad_output[b_i] * c_i (the row itself when unscaled), into scratch; with in_place, a
//     row looked up once in an unscaled table is read where it is (g points at it). Returns the end
//     of the group. The operations of bag_row_gradient_reference, in its order (bitwise equal).
//
// Include it after common/lazy_adam_rows_hwy-inl.h (ForEachSpan), in the same way.

#if defined(FUSEKIT_COMMON_BAG_GRADIENT_HWY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef FUSEKIT_COMMON_BAG_GRADIENT_HWY_INL_H_
#undef FUSEKIT_COMMON_BAG_GRADIENT_HWY_INL_H_
#else
#define FUSEKIT_COMMON_BAG_GRADIENT_HWY_INL_H_
#endif

HWY_INLINE int64_t BagRowGradient(const BagGradientArgs &a, const uint64_t *entries, int64_t k,
                                  int64_t end, int64_t D, float *scratch, bool in_place,
                                  const float **g_out) {
  const bool scaled = a.scaled();
  // The grad_output row of lookup i and its coefficient c_i = s_b * w_i.
  const auto source = [&](uint64_t entry, float *coef) {
    const auto i = static_cast<int64_t>(entry & 0xffffffffu);
    const uint32_t b = a.bag(entry);
    const float s = a.bag_scale != nullptr ? a.bag_scale[b] : 1.0f;
    *coef = a.weights != nullptr ? s * a.weights[i * a.weight_stride] : s;
    return a.grad_output + static_cast<int64_t>(b) * a.grad_stride;
  };
  const uint64_t row = entries[k] >> 32;
  float coef;
  const float *g = source(entries[k], &coef);
  int64_t next = k + 1;
  const bool repeated = next < end && (entries[next] >> 32) == row;
  if (in_place && !scaled && !repeated) {
    *g_out = g;
    return next;
  }
  if (scaled) {
    ForEachSpan(D, [&](auto d, int64_t j) {
      hn::StoreU(hn::Mul(hn::LoadU(d, g + j), hn::Set(d, coef)), d, scratch + j);
    });
  } else {
    ForEachSpan(D, [&](auto d, int64_t j) { hn::StoreU(hn::LoadU(d, g + j), d, scratch + j); });
  }
  for (; next < end && (entries[next] >> 32) == row; ++next) {
    const float *h = source(entries[next], &coef);
    if (scaled) {
      ForEachSpan(D, [&](auto d, int64_t j) {
        const auto x = hn::Mul(hn::LoadU(d, h + j), hn::Set(d, coef));
        hn::StoreU(hn::Add(hn::LoadU(d, scratch + j), x), d, scratch + j);
      });
    } else {
      ForEachSpan(D, [&](auto d, int64_t j) {
        hn::StoreU(hn::Add(hn::LoadU(d, scratch + j), hn::LoadU(d, h + j)), d, scratch + j);
      });
    }
  }
  *g_out = scratch;
  return next;
}

#endif  // FUSEKIT_COMMON_BAG_GRADIENT_HWY_INL_H_
