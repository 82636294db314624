// The arithmetic floor of an Adam(W) step (see adam_arithmetic.h). Highway's best target at run
// time, like the kernels. Each of kStates independent vector states runs the step's recurrence:
//   g = (w + 1) * gs; [m = m * Am; v = v * Av;]  m = m * b1 + g * (1 - b1);
//   v = v * b2 + (g * g) * (1 - b2);  w = (w + (m * step) / (sqrt(v) + eps)) * decay;
//   [m = m / Am; v = v / Av   (or in double: float(m * (1.0 / Am)), or in float: m * (1 / Am))]
// The bracketed parts are the 8-bit step's dequantization and normalization; the codes, the block
// maxima and every load and store are left out, so this is a lower bound on the step's time.
// The FP8 format's mix keeps s = sqrt(v) as its state (docs/fp8_state.md):
//   g = (w + 1) * gs; m = m * Am; s = s * As; v = s * s;  m = m * b1 + g * (1 - b1);
//   v = v * b2 + (g * g) * (1 - b2);  s = sqrt(v);  w = (w + (m * step) / (s + eps)) * decay;
//   m = m * (1 / Am); s = s * (1 / As)
// (the bit arithmetic of the codes left out as above).
// Values stay normal and bounded: w settles near -1, where g changes sign, and m, v near 1e-10 and
// 1e-16 (with g = w * gs, w decayed to 0 and every state went subnormal within the 2M rounds: on
// Intel cores each subnormal operand is a microcode assist, and the "floor" read 18-25 ns per
// element on a Sapphire Rapids VM, 2026-12-03). Am, Av are not 1, so that no division is a
// trivial one. The one add of the +1 is not part of a step.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "common/adam_arithmetic.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace fusekit::bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int kStates = 6;

// Runs `iters` rounds over kStates vectors; returns the elements done; *sink keeps the results.
// kMix: the AdamArithmetic value.
template <int kMix>
double AdamLoop(int64_t iters, float *sink) {
  const hn::ScalableTag<float> d;
  const auto gs = hn::Set(d, 1e-3f), b1 = hn::Set(d, 0.9f), omb1 = hn::Set(d, 0.1f);
  const auto b2 = hn::Set(d, 0.999f), omb2 = hn::Set(d, 0.001f), step = hn::Set(d, -1e-3f);
  const auto eps = hn::Set(d, 1e-8f), decay = hn::Set(d, 0.99999f), one = hn::Set(d, 1.0f);
  const auto am = hn::Set(d, 1.0009765625f), av = hn::Set(d, 0.9990234375f);
  const auto ram = hn::Set(d, 1.0f / 1.0009765625f), rav = hn::Set(d, 1.0f / 0.9990234375f);
  hn::Vec<decltype(d)> w[kStates], m[kStates], v[kStates];
  for (int k = 0; k < kStates; ++k) {
    w[k] = hn::Set(d, 1.0f + 0.125f * static_cast<float>(k));
    m[k] = hn::Set(d, 1e-3f);
    v[k] = hn::Set(d, kMix == 4 ? 1e-3f : 1e-6f);  // FP8: v holds s = sqrt(v)
  }
  for (int64_t i = 0; i < iters; ++i) {
    for (int k = 0; k < kStates; ++k) {
      const auto g = hn::Mul(hn::Add(w[k], one), gs);
      auto mk = m[k], vk = v[k];
      if constexpr (kMix == 4) {  // FP8: the state is m and s = sqrt(v)
        mk = hn::Mul(mk, am);
        const auto sk = hn::Mul(vk, av);
        vk = hn::Mul(sk, sk);
        mk = hn::Add(hn::Mul(mk, b1), hn::Mul(g, omb1));
        vk = hn::Add(hn::Mul(vk, b2), hn::Mul(hn::Mul(g, g), omb2));
        const auto s = hn::Sqrt(vk);
        w[k] = hn::Mul(hn::Add(w[k], hn::Div(hn::Mul(mk, step), hn::Add(s, eps))), decay);
        m[k] = hn::Mul(mk, ram);
        v[k] = hn::Mul(s, rav);
        continue;
      }
      if constexpr (kMix != 0) {
        mk = hn::Mul(mk, am);
        vk = hn::Mul(vk, av);
      }
      mk = hn::Add(hn::Mul(mk, b1), hn::Mul(g, omb1));
      vk = hn::Add(hn::Mul(vk, b2), hn::Mul(hn::Mul(g, g), omb2));
      w[k] = hn::Mul(hn::Add(w[k], hn::Div(hn::Mul(mk, step), hn::Add(hn::Sqrt(vk), eps))), decay);
      if constexpr (kMix == 1) {  // divisions
        mk = hn::Div(mk, am);
        vk = hn::Div(vk, av);
      } else if constexpr (kMix == 2) {  // double products
#if HWY_TARGET == HWY_SCALAR
        mk = hn::Set(
            d, static_cast<float>(static_cast<double>(hn::GetLane(mk)) * (1.0 / 1.0009765625)));
        vk = hn::Set(
            d, static_cast<float>(static_cast<double>(hn::GetLane(vk)) * (1.0 / 0.9990234375)));
#else
        const hn::Repartition<double, decltype(d)> dd;
        const hn::Half<decltype(d)> dh;
        const auto rm = hn::Set(dd, 1.0 / 1.0009765625), rv = hn::Set(dd, 1.0 / 0.9990234375);
        mk = hn::Combine(d, hn::DemoteTo(dh, hn::Mul(hn::PromoteTo(dd, hn::UpperHalf(dh, mk)), rm)),
                         hn::DemoteTo(dh, hn::Mul(hn::PromoteTo(dd, hn::LowerHalf(dh, mk)), rm)));
        vk = hn::Combine(d, hn::DemoteTo(dh, hn::Mul(hn::PromoteTo(dd, hn::UpperHalf(dh, vk)), rv)),
                         hn::DemoteTo(dh, hn::Mul(hn::PromoteTo(dd, hn::LowerHalf(dh, vk)), rv)));
#endif
      } else if constexpr (kMix == 3) {  // float32 reciprocal
        mk = hn::Mul(mk, ram);
        vk = hn::Mul(vk, rav);
      }
      m[k] = mk;
      v[k] = vk;
    }
  }
  auto s = hn::Zero(d);
  for (int k = 0; k < kStates; ++k) s = hn::Add(s, hn::Add(w[k], hn::Add(m[k], v[k])));
  *sink = hn::GetLane(s);
  return static_cast<double>(iters) * kStates * static_cast<double>(hn::Lanes(d));
}

double AdamLoopMix(int mix, int64_t iters, float *sink) {
  switch (mix) {
    case 1:
      return AdamLoop<1>(iters, sink);
    case 2:
      return AdamLoop<2>(iters, sink);
    case 3:
      return AdamLoop<3>(iters, sink);
    case 4:
      return AdamLoop<4>(iters, sink);
    default:
      return AdamLoop<0>(iters, sink);
  }
}

}  // namespace fusekit::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <benchmark/benchmark.h>

#include <map>
#include <mutex>
#include <utility>

#include "common/adam_arithmetic.h"
#include "common/ceilings.h"
#include "fusekit/threading.h"

namespace fusekit::bench {
HWY_EXPORT(AdamLoopMix);

double adam_arithmetic_seconds_per_element(AdamArithmetic mix) {
  static std::mutex mu;
  static std::map<std::pair<AdamArithmetic, int>, double> cache;  // per mix and thread count
  const std::lock_guard<std::mutex> lock(mu);
  const std::pair<AdamArithmetic, int> key{mix, fusekit::num_threads()};
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  const double elements_per_second = median_rate_all_threads(5, [mix] {
    float sink = 0;
    const double elements =
        HWY_DYNAMIC_DISPATCH(AdamLoopMix)(static_cast<int>(mix), int64_t{2'000'000}, &sink);
    benchmark::DoNotOptimize(sink);
    return elements;
  });
  return cache[key] = 1.0 / elements_per_second;
}

}  // namespace fusekit::bench
#endif  // HWY_ONCE
