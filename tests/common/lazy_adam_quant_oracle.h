// fusekit tests: LazyAdamQuant's row step (docs/lazy_adam_quant.md, docs/fp8_state.md) as the
// tests' oracles compute it, written from the docs and not from the library: the nearest code by
// std::lower_bound over the map and a float32 comparison of the two bracketing distances (no
// thresholds, no tables), the FP8 codes of tests/common/fp8_oracle.h, the 16-bit storage of
// tests/common/half_floats.h. The oracles of LazyAdamQuant (a batch of gradient rows) and
// EmbeddingBagLazyAdamQuant (a batch of bags) sum a row's gradient their way and end in this step.
#ifndef FUSEKIT_TESTS_COMMON_LAZY_ADAM_QUANT_ORACLE_H_
#define FUSEKIT_TESTS_COMMON_LAZY_ADAM_QUANT_ORACLE_H_

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "common/fp8_oracle.h"
#include "common/half_floats.h"
#include "common/test_util.h"
#include "fusekit/dtype.h"

namespace fusekit::testing {

using QuantMap = std::array<float, 256>;

// The random 8-bit state the LazyAdamQuant and EmbeddingBagLazyAdamQuant tests start from, in
// `c` (a test's case: m, v, am, av, rows, blocks, bstride, bat(), fp8()): every code drawn (in the
// FP8 format never E4M3's NaN codes: a finite state), the blocks' absmax (scales, in FP8: m up to
// 224 and sqrt(v) up to 149, larger but of the same shapes), row 2's first block of m all zero and
// row 3's first block of v all zero beside a non-zero m (the lost-v guard's case).
template <class Case>
void fill_random_quant_state(Case &c, std::mt19937_64 &rng, size_t cells) {
  c.m.resize(cells);
  c.v.resize(cells);
  for (auto &x : c.m) {
    x = static_cast<uint8_t>(rng() & 0xff);
    if (c.fp8() && (x & 0x7f) == 0x7f) x ^= 1;  // not E4M3's NaN codes: finite state
  }
  for (auto &x : c.v) x = static_cast<uint8_t>(rng() & 0xff);
  const auto bcells = static_cast<size_t>(std::max<int64_t>(c.rows * c.bstride, 1));
  c.am = uniform(rng, bcells, 0.001f, 0.5f);
  c.av = uniform(rng, bcells, 1e-6f, 0.3f);
  if (c.rows > 3 && c.blocks > 0) c.am[c.bat(2, 0)] = 0.0f;  // an all-zero moment block
  if (c.rows > 4 && c.blocks > 0) c.av[c.bat(3, 0)] = 0.0f;  // v all zero beside m: the guard's
}

// ApplyAdamWQuant's nearest code, with m's sign fix when `sign_fix` (and the map is signed).
inline int nearest_code(const QuantMap &q, float x, bool sign_fix) {
  if (std::isnan(x)) x = 0.0f;
  int hi = static_cast<int>(std::lower_bound(q.begin(), q.end(), x) - q.begin());
  if (hi == 256) hi = 255;
  const int lo = std::max(hi - 1, 0);
  const float d_hi = q[hi] - x, d_lo = x - q[lo];
  const int pick = d_hi < d_lo ? hi : lo;
  int code = static_cast<int>(std::lower_bound(q.begin(), q.end(), q[pick]) - q.begin());
  if (sign_fix && q[0] < 0.0f && x * q[code] < 0.0f)
    code = std::clamp(code + (x > 0.0f ? 1 : -1), 0, 255);
  return code;
}

// The value var holds after storing w (float32, or rounded to the 16-bit dtype).
inline float stored(DType t, float w) {
  return t == DType::kFloat32 ? w : widen(t, narrow(t, w));
}

// The step's constants: the maps (dynamic-map format), the format, the lost-v guard, var's dtype,
// the attributes as float32 and the (bias-corrected) lr.
struct QuantStepOracle {
  const QuantMap *qm = nullptr, *qv = nullptr;
  bool fp8 = false, guard = false;
  DType dtype = DType::kFloat32;
  float beta1 = 0, beta2 = 0, eps = 0, lr = 0;
};

// One row of D columns with summed gradient g: var read and written through get_var(j) and
// set_var(j, w); the row's codes m[0, D), v[0, D) and its blocks' absmax (or FP8 scales)
// am[0, B), av[0, B). Returns false, with nothing changed, when the guard skips the row.
template <class GetVar, class SetVar>
bool quant_step_oracle_row(const QuantStepOracle &o, const float *g, int64_t D, GetVar &&get_var,
                           SetVar &&set_var, uint8_t *m_codes, uint8_t *v_codes, float *am,
                           float *av) {
  const float omb1 = 1.0f - o.beta1, omb2 = 1.0f - o.beta2;
  std::vector<float> mm(static_cast<size_t>(D)), vv(mm.size()), ww(mm.size());
  bool finite = true;
  for (int64_t j = 0; j < D; ++j) {
    const auto u = static_cast<size_t>(j);
    const int64_t b = j / 256;
    float m, v;
    if (o.fp8) {
      m = kOracleE4M3.decode(m_codes[j]) * am[b];
      const float s = kOracleUE4M4.decode(v_codes[j]) * av[b];
      v = s * s;
    } else {
      m = (*o.qm)[m_codes[j]] * am[b];
      v = (*o.qv)[v_codes[j]] * av[b];
    }
    if (o.guard && v == 0.0f && m != 0.0f) v = m * m;  // the lost-v guard
    m = m * o.beta1 + g[u] * omb1;
    v = std::fabs(v * o.beta2 + (g[u] * g[u]) * omb2);
    const float d = std::sqrt(v) + o.eps;
    const float w = get_var(j) + (m * -o.lr) / d;
    finite = finite && std::isfinite(m) && std::isfinite(v) && std::isfinite(stored(o.dtype, w));
    mm[u] = m;
    vv[u] = o.fp8 ? std::sqrt(v) : v;  // the FP8 format codes sqrt(v)
    ww[u] = w;
  }
  if (!finite) return false;
  for (int64_t j = 0; j < D; ++j) set_var(j, ww[static_cast<size_t>(j)]);
  for (int64_t b = 0; b * 256 < D; ++b) {
    const int64_t lo = b * 256, hi = std::min<int64_t>(D, lo + 256);
    if (o.fp8) {
      am[b] = kOracleE4M3.code_block(&mm[static_cast<size_t>(lo)], hi - lo, m_codes + lo);
      av[b] = kOracleUE4M4.code_block(&vv[static_cast<size_t>(lo)], hi - lo, v_codes + lo);
      continue;
    }
    float amax = 0.0f, vmax = 0.0f;
    for (int64_t j = lo; j < hi; ++j) {
      amax = std::max(amax, std::fabs(mm[static_cast<size_t>(j)]));
      vmax = std::max(vmax, vv[static_cast<size_t>(j)]);
    }
    am[b] = amax;
    av[b] = vmax;
    const float dm = amax == 0.0f ? 1.0f : amax, dv = vmax == 0.0f ? 1.0f : vmax;
    for (int64_t j = lo; j < hi; ++j) {
      m_codes[j] = static_cast<uint8_t>(nearest_code(*o.qm, mm[static_cast<size_t>(j)] / dm, true));
      v_codes[j] =
          static_cast<uint8_t>(nearest_code(*o.qv, vv[static_cast<size_t>(j)] / dv, false));
    }
  }
  return true;
}

// Bitwise var and block scales, exact codes (the 8-bit optimizers' tests: ApplyAdamWQuant's,
// EmbeddingBagLazyAdamQuant's); at most five failures of each kind are reported.
inline void expect_same_quant_state(const FloatBuf &var, const FloatBuf &want_var,
                                    const std::vector<uint8_t> &m,
                                    const std::vector<uint8_t> &want_m,
                                    const std::vector<uint8_t> &v,
                                    const std::vector<uint8_t> &want_v,
                                    const std::vector<float> &am, const std::vector<float> &want_am,
                                    const std::vector<float> &av,
                                    const std::vector<float> &want_av) {
  size_t bad = 0;
  for (size_t i = 0; i < var.size() && bad < 5; ++i) {
    if (var.bits(i) != want_var.bits(i)) {
      ADD_FAILURE() << "var[" << i << "]: got " << var.get(i) << " want " << want_var.get(i);
      ++bad;
    }
  }
  for (size_t i = 0; i < m.size() && bad < 10; ++i) {
    if (m[i] != want_m[i] || v[i] != want_v[i]) {
      ADD_FAILURE() << "codes[" << i << "]: got m " << int{m[i]} << " v " << int{v[i]}
                    << ", want m " << int{want_m[i]} << " v " << int{want_v[i]};
      ++bad;
    }
  }
  for (size_t b = 0; b < am.size() && bad < 15; ++b) {
    if (std::bit_cast<uint32_t>(am[b]) != std::bit_cast<uint32_t>(want_am[b]) ||
        std::bit_cast<uint32_t>(av[b]) != std::bit_cast<uint32_t>(want_av[b])) {
      ADD_FAILURE() << "absmax[" << b << "]: got " << am[b] << ", " << av[b] << " want "
                    << want_am[b] << ", " << want_av[b];
      ++bad;
    }
  }
}

}  // namespace fusekit::testing

#endif  // FUSEKIT_TESTS_COMMON_LAZY_ADAM_QUANT_ORACLE_H_
