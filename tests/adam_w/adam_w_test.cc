// AdamW: every expected value comes from the oracle below, the step in plain float32 scalar code
// written independently of the library, with 16-bit conversions by _Float16 and by integer rounding
// written here. Every float32 operation is fixed, so var, m and v must match bit for bit for every
// implementation (cpu_hwy on every SIMD target, cpu_reference), dtype and thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "adam_w/adam_w_kernels.h"
#include "common/half_floats.h"
#include "common/simd_targets.h"
#include "common/test_util.h"
#include "fusekit/adam_w.h"

namespace {

using namespace fusekit;           // the library under test
using namespace fusekit::testing;  // tests/common

struct Hyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, wd = 0.0, eps = 1e-8, gnorm = 1.0;
  int64_t step = 10;
  bool decay_before = false;  // WeightDecayOrder::kBeforeUpdate (torch.optim.AdamW's order)
};

struct State {
  FloatBuf var, grad;
  std::vector<float> m, v;
  AdamWTensors tensors() {
    const auto n = static_cast<int64_t>(m.size());
    return {var.view(), grad.view(), TensorView::of(m.data(), {n}), TensorView::of(v.data(), {n})};
  }
};

State make_state(uint64_t salt, DType t, size_t n) {
  auto rng = rng_for(salt);
  State s;
  s.var = FloatBuf(t, uniform(rng, n, -1, 1));
  s.grad = FloatBuf(t, uniform(rng, n, -1, 1));
  s.m = uniform(rng, n, -0.1f, 0.1f);
  s.v = uniform(rng, n, 0.f, 0.01f);
  return s;
}

// The value var holds after storing w (float32, or rounded to the 16-bit dtype).
float stored(DType t, float w) {
  return t == DType::kFloat32 ? w : widen(t, narrow(t, w));
}

// The oracle: returns the number of skipped elements (an element whose gradient, or whose new m,
// v or var as stored, would be NaN or Inf, is left as it is).
int64_t oracle_step(State &st, const Hyper &h) {
  const float b1 = static_cast<float>(h.beta1), b2 = static_cast<float>(h.beta2);
  const float lr = static_cast<float>(h.lr), wd = static_cast<float>(h.wd);
  const float eps = static_cast<float>(h.eps), gs = static_cast<float>(h.gnorm);
  const float t = static_cast<float>(h.step + 1);
  const float c1 = 1.0f - powf(b1, t);
  const float c2s = sqrtf(1.0f - powf(b2, t));
  const float step_size = -lr * c2s / c1, eps_c2s = eps * c2s, decay = 1.0f - lr * wd;
  int64_t skipped = 0;
  for (size_t i = 0; i < st.m.size(); ++i) {
    const float gr = st.grad.get(i);
    if (!std::isfinite(gr)) {
      ++skipped;
      continue;
    }
    const float g = gr * gs;
    const float m = st.m[i] * b1 + g * (1.0f - b1);
    const float v = st.v[i] * b2 + (g * g) * (1.0f - b2);
    float w = st.var.get(i);
    if (wd > 0.0f && h.decay_before) w = w * decay;
    w = w + (m * step_size) / (std::sqrt(v) + eps_c2s);
    if (wd > 0.0f && !h.decay_before) w = w * decay;
    if (!std::isfinite(m) || !std::isfinite(v) || !std::isfinite(stored(st.var.dtype, w))) {
      ++skipped;
      continue;
    }
    st.m[i] = m;
    st.v[i] = v;
    st.var.set(i, w);
  }
  return skipped;
}

float lr_of(const Hyper &h) {
  return static_cast<float>(h.lr);
}

AdamWOptions options_of(const Hyper &h) {
  AdamWOptions o;
  o.beta1 = h.beta1;
  o.beta2 = h.beta2;
  o.weight_decay = h.wd;
  o.eps = h.eps;
  o.gnorm_scale = h.gnorm;
  o.decay_order = h.decay_before ? WeightDecayOrder::kBeforeUpdate : WeightDecayOrder::kAfterUpdate;
  return o;
}

void expect_same(const State &got, const State &want) {
  size_t bad = 0;
  for (size_t i = 0; i < got.m.size() && bad < 5; ++i) {
    if (got.var.bits(i) != want.var.bits(i) || !fusekit::testing::bits_equal(got.m[i], want.m[i]) ||
        !fusekit::testing::bits_equal(got.v[i], want.v[i])) {
      ADD_FAILURE() << "[" << i << "]: got var " << got.var.get(i) << " m " << got.m[i] << " v "
                    << got.v[i] << ", want " << want.var.get(i) << " " << want.m[i] << " "
                    << want.v[i];
      ++bad;
    }
  }
}

// The implementations this machine runs.
std::vector<std::string> supported_implementations() {
  std::vector<std::string> out;
  std::vector<float> x(4);
  const AdamWTensors t{TensorView::of(x.data(), {1}), TensorView::of(x.data() + 1, {1}),
                       TensorView::of(x.data() + 2, {1}), TensorView::of(x.data() + 3, {1})};
  for (const std::string &name : AdamW::implementations()) {
    AdamWOptions o;
    o.implementation = name.c_str();
    AdamWProblem problem;
    EXPECT_TRUE(AdamWProblem::make(t, o, &problem).ok());
    AdamW plan;
    const Status st = AdamW::plan(problem, o, &plan);
    EXPECT_TRUE(st.ok() || st.code() == StatusCode::kNoImplementation) << st.message();
    if (st.ok()) out.push_back(name);
  }
  return out;
}

TEST(AdamW, TheImplementationList) {
  EXPECT_EQ(AdamW::implementations(), (std::vector<std::string>{"cpu_hwy", "cpu_reference"}));
  EXPECT_EQ(supported_implementations(), AdamW::implementations());
}

TEST(AdamW, MatchesOracleOnEveryDtypeImplementationAndThreadCount) {
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(fusekit::dtype_name(t));
    State start = make_state(30, t, 10007);
    start.grad.set(5, std::numeric_limits<float>::quiet_NaN());
    start.grad.set(9000, -std::numeric_limits<float>::infinity());
    Hyper h;
    h.wd = 0.01;
    h.gnorm = 0.9;
    h.step = 41;
    State want = start;
    EXPECT_EQ(oracle_step(want, h), 2);
    for (const std::string &impl : supported_implementations()) {
      SCOPED_TRACE(impl);
      for (int threads : {1, 2, 4}) {
        SCOPED_TRACE(threads);
        State got = start;
        AdamWOptions o = options_of(h);
        o.implementation = impl.c_str();
        o.num_threads = threads;
        AdamWStats stats;
        const AdamWTensors tt = got.tensors();
        ASSERT_TRUE(
            fusekit::adam_w_step(tt.var, tt.grad, tt.m, tt.v, h.step, lr_of(h), o, &stats).ok());
        EXPECT_EQ(stats.elements_skipped_nonfinite, 2);
        expect_same(got, want);
      }
    }
  }
}

// cpu_hwy on every SIMD target Highway built and this CPU runs, with lengths around the vector
// widths (the scalar tails).
TEST(AdamW, EverySimdTarget) {
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(fusekit::dtype_name(t));
    for (size_t n : {size_t{1}, size_t{7}, size_t{16}, size_t{33}, size_t{1000}}) {
      SCOPED_TRACE(n);
      State start = make_state(31 + n, t, n);
      if (n > 20) start.grad.set(17, std::numeric_limits<float>::infinity());
      Hyper h;
      h.wd = 0.1;
      State want = start;
      oracle_step(want, h);
      fusekit::testing::for_each_simd_target([&](const char *target) {
        EXPECT_STREQ(fusekit::hwy_dispatched_target(), target);
        State got = start;
        AdamWOptions o = options_of(h);
        o.implementation = "cpu_hwy";
        const AdamWTensors tt = got.tensors();
        ASSERT_TRUE(fusekit::adam_w_step(tt.var, tt.grad, tt.m, tt.v, h.step, lr_of(h), o).ok());
        expect_same(got, want);
      });
    }
  }
}

// Dimensions of size 1 may have any stride (nothing steps by it): var, grad, m and v of shape
// [1, n, 1] with strides 2^61 or 2^62 - 1 on both size-1 dimensions are contiguous, and no address
// is formed from those strides (UBSan would report one in the sanitizer builds). Every
// implementation and SIMD target, the oracle's bits.
TEST(AdamW, HugeStridesOfSizeOneDimensionsAreNeverStepped) {
  const int64_t n = 77;
  const State start = make_state(35, DType::kBFloat16, n);
  Hyper h;
  h.wd = 0.1;
  State want = start;
  oracle_step(want, h);
  for (const int64_t huge : {int64_t{1} << 61, (int64_t{1} << 62) - 1}) {
    SCOPED_TRACE(huge);
    auto check = [&](const char *impl) {
      State got = start;
      auto view = [&](void *p, DType t) {
        return TensorView::strided(p, t, {1, n, 1}, {huge, 1, huge});
      };
      AdamWOptions o = options_of(h);
      o.implementation = impl;
      ASSERT_TRUE(fusekit::adam_w_step(view(got.var.data(), DType::kBFloat16),
                                       view(got.grad.data(), DType::kBFloat16),
                                       view(got.m.data(), DType::kFloat32),
                                       view(got.v.data(), DType::kFloat32), h.step, lr_of(h), o)
                      .ok());
      expect_same(got, want);
    };
    for (const std::string &impl : supported_implementations()) check(impl.c_str());
    fusekit::testing::for_each_simd_target([&](const char *) { check("cpu_hwy"); });
  }
}

// ---- the decay before the update (WeightDecayOrder::kBeforeUpdate) ------------------------------

// torch.optim.AdamW's step (torch/optim/adamw.py, the single-tensor path), in float64 on the
// float32 attributes (the operator converts them to float32 when it plans; from the doubles the
// results move by less than an ulp), t = step + 1:
//   param *= 1 - lr * wd;  m.lerp_(g, 1 - beta1);  v = v * beta2 + g * g * (1 - beta2)
//   denom = sqrt(v) / sqrt(1 - beta2^t) + eps;  param += -(lr / (1 - beta1^t)) * m / denom
// with g = grad * gnorm_scale (torch has no gnorm_scale; 1 leaves it out). `after` puts the decay
// after the update instead (CANN's order), for the check that the test tells the two apart.
// Also returns, per element, the tolerance of a float32 computation of it: 4 float32 ulps of the
// decayed var and 64 of the update's magnitude (the float32 bias corrections lose up to ~30 ulps
// where 1 - beta2^t cancels), and 4 of m's and v's terms.
struct Reference64 {
  std::vector<double> var, m, v, var_tol, m_tol, v_tol;
};
Reference64 torch_adamw_f64(const State &st, const Hyper &h, bool after = false) {
  const double b1 = static_cast<float>(h.beta1), b2 = static_cast<float>(h.beta2);
  const double lr = static_cast<float>(h.lr), wd = static_cast<float>(h.wd);
  const double eps = static_cast<float>(h.eps), gs = static_cast<float>(h.gnorm);
  const double t = static_cast<double>(h.step + 1);
  const double bc1 = 1.0 - std::pow(b1, t), bc2_sqrt = std::sqrt(1.0 - std::pow(b2, t));
  const double u = 0x1p-24;  // a float32 ulp, relative
  Reference64 r;
  for (size_t i = 0; i < st.m.size(); ++i) {
    const double g = static_cast<double>(st.grad.get(i)) * gs;
    double p = st.var.get(i);
    if (wd > 0.0 && !after) p *= 1.0 - lr * wd;
    const double m = st.m[i] + (g - st.m[i]) * (1.0 - b1);  // lerp
    const double v = st.v[i] * b2 + g * g * (1.0 - b2);
    const double upd = -(lr / bc1) * m / (std::sqrt(v) / bc2_sqrt + eps);
    const double upd_mag = (lr / bc1) * (std::fabs(st.m[i] * b1) + std::fabs(g * (1.0 - b1))) /
                           (std::sqrt(v) / bc2_sqrt + eps);
    double w = p + upd;
    if (wd > 0.0 && after) w *= 1.0 - lr * wd;
    r.var.push_back(w);
    r.m.push_back(m);
    r.v.push_back(v);
    r.var_tol.push_back(u * (4.0 * std::fabs(p) + 4.0 * std::fabs(w) + 64.0 * upd_mag));
    r.m_tol.push_back(u * 4.0 * (std::fabs(st.m[i] * b1) + std::fabs(g * (1.0 - b1))));
    r.v_tol.push_back(u * 4.0 * (std::fabs(st.v[i] * b2) + g * g * (1.0 - b2)));
  }
  return r;
}

// One ulp of the 16-bit dtype at x (0 for float32: the float32 tolerance covers it).
double ulp16(DType t, double x) {
  if (t == DType::kFloat32) return 0.0;
  const int mant = t == DType::kBFloat16 ? 7 : 10, min_exp = t == DType::kBFloat16 ? -126 : -14;
  const int e = x == 0.0 ? min_exp : std::max(std::ilogb(x), min_exp);
  return std::ldexp(1.0, e - mant);
}

// How many elements of `got` are farther from the float64 reference than its tolerance.
size_t count_far(const State &got, const Reference64 &r) {
  size_t far = 0;
  for (size_t i = 0; i < got.m.size(); ++i) {
    const double tol = r.var_tol[i] + ulp16(got.var.dtype, r.var[i]);
    far += !(std::fabs(got.var.get(i) - r.var[i]) <= tol) ||
           !(std::fabs(got.m[i] - r.m[i]) <= r.m_tol[i]) ||
           !(std::fabs(got.v[i] - r.v[i]) <= r.v_tol[i]);
  }
  return far;
}

// The hyperparameters of the decay-before tests: lr * wd of 5e-3 and 0.1 make the two orders
// differ by far more than the tolerance (checked below); 1e-5 is AdamW's usual size; step 0
// (t = 1), a mid step, and a late one where the bias corrections are near 1.
std::vector<Hyper> decay_before_hypers() {
  std::vector<Hyper> out;
  for (auto [lr, wd, step] : {std::tuple{0.05, 0.1, int64_t{9}}, std::tuple{0.1, 1.0, int64_t{0}},
                              std::tuple{1e-3, 0.01, int64_t{1000}}}) {
    Hyper h;
    h.lr = lr;
    h.wd = wd;
    h.step = step;
    h.decay_before = true;
    out.push_back(h);
  }
  return out;
}

// The decay before the update, on every dtype, implementation and SIMD target, with lengths around
// the vector widths: cpu_reference within a few float32 ulps of a float64 run of torch's algorithm
// (and bit for bit the float32 oracle), every other implementation and target bit for bit
// cpu_reference.
TEST(AdamWDecayBefore, MatchesAFloat64RunOfTorchsAdamWOnEveryImplementationAndTarget) {
  const std::vector<size_t> sizes = {1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 1000};
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(fusekit::dtype_name(t));
    for (const Hyper &h : decay_before_hypers()) {
      SCOPED_TRACE(::testing::Message() << "lr " << h.lr << " wd " << h.wd << " step " << h.step);
      size_t elements = 0, told_apart = 0;
      for (size_t n : sizes) {
        SCOPED_TRACE(n);
        const State start = make_state(500 + n, t, n);
        const Reference64 want64 = torch_adamw_f64(start, h);
        State want = start;
        EXPECT_EQ(oracle_step(want, h), 0);
        State ref = start;
        AdamWOptions o = options_of(h);
        o.implementation = "cpu_reference";
        AdamWStats stats;
        const AdamWTensors rt = ref.tensors();
        ASSERT_TRUE(
            fusekit::adam_w_step(rt.var, rt.grad, rt.m, rt.v, h.step, lr_of(h), o, &stats).ok());
        EXPECT_EQ(stats.elements_skipped_nonfinite, 0);
        EXPECT_EQ(count_far(ref, want64), 0u);
        expect_same(ref, want);
        // The test can tell the orders apart: the decay after is outside the tolerance.
        elements += n;
        told_apart += count_far(ref, torch_adamw_f64(start, h, /*after=*/true));
        auto check = [&](const char *impl) {
          State got = start;
          AdamWOptions oi = options_of(h);
          oi.implementation = impl;
          const AdamWTensors tt = got.tensors();
          ASSERT_TRUE(fusekit::adam_w_step(tt.var, tt.grad, tt.m, tt.v, h.step, lr_of(h), oi).ok());
          expect_same(got, ref);
        };
        for (const std::string &impl : supported_implementations()) {
          SCOPED_TRACE(impl);
          check(impl.c_str());
        }
        fusekit::testing::for_each_simd_target([&](const char *) { check("cpu_hwy"); });
      }
      // (In float32; the 16-bit roundings hide most of the difference, which the bitwise check
      // against the float32 oracle above still sees.)
      if (t == DType::kFloat32 && h.lr * h.wd >= 1e-3) {
        EXPECT_GT(told_apart, elements * 99 / 100) << "the decay after would pass as well";
      }
    }
  }
}

// The decay before the update over many chunks: every implementation and thread count bit for bit
// the float32 oracle.
TEST(AdamWDecayBefore, EveryThreadCountGivesTheSameBits) {
  for (DType t : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(fusekit::dtype_name(t));
    const State start = make_state(600, t, 70001);
    const Hyper h = decay_before_hypers()[0];
    State want = start;
    oracle_step(want, h);
    for (const std::string &impl : supported_implementations()) {
      SCOPED_TRACE(impl);
      for (int threads : {1, 2, 3, 4}) {
        SCOPED_TRACE(threads);
        State got = start;
        AdamWOptions o = options_of(h);
        o.implementation = impl.c_str();
        o.num_threads = threads;
        const AdamWTensors tt = got.tensors();
        ASSERT_TRUE(fusekit::adam_w_step(tt.var, tt.grad, tt.m, tt.v, h.step, lr_of(h), o).ok());
        expect_same(got, want);
      }
    }
  }
}

// The guard with the decay before: an element whose decayed var (lr * wd = 3: var * -2 overflows
// from 1.7e38) or whose update would not be finite is left entirely unchanged, its decay included;
// its neighbours in the same vector are decayed and updated.
TEST(AdamWDecayBefore, AnElementLeftUnchangedIsNotDecayed) {
  const size_t n = 77;
  State start = make_state(610, DType::kFloat32, n);
  start.var.set(5, 2e38f);
  start.var.set(70, -3e38f);  // the scalar tail
  start.grad.set(40, std::numeric_limits<float>::quiet_NaN());
  Hyper h;
  h.lr = 1.0;
  h.wd = 3.0;
  h.decay_before = true;
  State want = start;
  EXPECT_EQ(oracle_step(want, h), 3);
  EXPECT_NE(want.var.bits(6), start.var.bits(6));
  auto check = [&](const char *impl) {
    State got = start;
    AdamWOptions o = options_of(h);
    o.implementation = impl;
    AdamWStats stats;
    const AdamWTensors tt = got.tensors();
    ASSERT_TRUE(
        fusekit::adam_w_step(tt.var, tt.grad, tt.m, tt.v, h.step, lr_of(h), o, &stats).ok());
    EXPECT_EQ(stats.elements_skipped_nonfinite, 3);
    expect_same(got, want);
    for (size_t i : {size_t{5}, size_t{40}, size_t{70}}) {
      EXPECT_EQ(got.var.bits(i), start.var.bits(i)) << i;
      EXPECT_TRUE(fusekit::testing::bits_equal(got.m[i], start.m[i])) << i;
      EXPECT_TRUE(fusekit::testing::bits_equal(got.v[i], start.v[i])) << i;
    }
  };
  for (const std::string &impl : supported_implementations()) {
    SCOPED_TRACE(impl);
    check(impl.c_str());
  }
  fusekit::testing::for_each_simd_target([&](const char *) { check("cpu_hwy"); });
}

// The default is CANN's order (after), and with no decay (wd <= 0) the order changes nothing.
TEST(AdamWDecayBefore, TheDefaultIsAfterAndWithoutDecayTheOrdersAgree) {
  EXPECT_EQ(AdamWOptions{}.decay_order, WeightDecayOrder::kAfterUpdate);
  const State start = make_state(620, DType::kFloat32, 100);
  for (double wd : {0.0, -0.5}) {
    SCOPED_TRACE(wd);
    State a = start, b = start;
    Hyper h;
    h.lr = 0.1;
    h.wd = wd;
    const AdamWTensors ta = a.tensors(), tb = b.tensors();
    ASSERT_TRUE(fusekit::adam_w_step(ta.var, ta.grad, ta.m, ta.v, 3, lr_of(h), options_of(h)).ok());
    h.decay_before = true;
    ASSERT_TRUE(fusekit::adam_w_step(tb.var, tb.grad, tb.m, tb.v, 3, lr_of(h), options_of(h)).ok());
    expect_same(a, b);
  }
  AdamWProblem problem;
  State s = make_state(621, DType::kFloat32, 10);
  AdamWOptions o;
  o.decay_order = WeightDecayOrder::kBeforeUpdate;
  ASSERT_TRUE(AdamWProblem::make(s.tensors(), o, &problem).ok());
  EXPECT_EQ(problem.decay_order, WeightDecayOrder::kBeforeUpdate);
  ASSERT_TRUE(AdamWProblem::make(s.tensors(), {}, &problem).ok());
  EXPECT_EQ(problem.decay_order, WeightDecayOrder::kAfterUpdate);
}

TEST(AdamWDecayBefore, AnOrderOutOfRangeIsRefused) {
  State s = make_state(630, DType::kFloat32, 64);
  const State before = s;
  for (int bad : {2, -1, 7}) {
    SCOPED_TRACE(bad);
    AdamWOptions o;
    o.weight_decay = 0.1;
    o.decay_order = static_cast<WeightDecayOrder>(bad);
    const AdamWTensors t = s.tensors();
    const Status st = fusekit::adam_w_step(t.var, t.grad, t.m, t.v, 0, 1e-3f, o);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("AdamW: decay_order = " + std::to_string(bad) + " must be 0"),
              std::string::npos)
        << st.message();
    expect_same(s, before);
  }
}

// Finite inputs whose step overflows, and non-finite or impossible state: each such element is
// left bit for bit as it was and counted, identically on every implementation and SIMD target;
// the other elements of the same vectors are updated. n = 1000 puts cases in the vectors and in
// the scalar tail.
State overflow_state(DType t) {
  const size_t n = 1000;
  State s = make_state(90, t, n);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  if (t != DType::kFloat16) {
    s.grad.set(3, 1e20f);  // g * g overflows: v = +Inf
    s.grad.set(40, -1e20f);
    s.grad.set(997, 3e19f);  // the tail
  }
  s.m[100] = nan;
  s.m[101] = -inf;
  s.v[200] = inf;
  s.v[201] = -1.0f;  // sqrt of a negative v: NaN
  s.v[202] = nan;
  s.v[998] = -inf;
  s.var.set(300, inf);
  s.var.set(301, nan);
  return s;
}

TEST(AdamW, ProducedNonFiniteValuesLeaveTheElementUnchanged) {
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(fusekit::dtype_name(t));
    const State start = overflow_state(t);
    Hyper h;
    State want = start;
    const int64_t skipped = oracle_step(want, h);
    EXPECT_EQ(skipped, t == DType::kFloat16 ? 8 : 11);
    for (size_t i : {size_t{100}, size_t{200}, size_t{201}, size_t{300}, size_t{998}}) {
      EXPECT_EQ(want.var.bits(i), start.var.bits(i)) << i;
      EXPECT_TRUE(fusekit::testing::bits_equal(want.m[i], start.m[i])) << i;
      EXPECT_TRUE(fusekit::testing::bits_equal(want.v[i], start.v[i])) << i;
    }
    auto check = [&](const char *impl) {
      State got = start;
      AdamWOptions o = options_of(h);
      o.implementation = impl;
      AdamWStats stats;
      const AdamWTensors tt = got.tensors();
      ASSERT_TRUE(
          fusekit::adam_w_step(tt.var, tt.grad, tt.m, tt.v, h.step, lr_of(h), o, &stats).ok());
      EXPECT_EQ(stats.elements_skipped_nonfinite, skipped);
      expect_same(got, want);
      size_t bad = 0;
      for (size_t i = 0; i < got.m.size(); ++i) bad += !std::isfinite(got.var.get(i));
      EXPECT_EQ(bad, 2u);  // the two non-finite var it was given
    };
    for (const std::string &impl : supported_implementations()) {
      SCOPED_TRACE(impl);
      check(impl.c_str());
    }
    fusekit::testing::for_each_simd_target([&](const char *) { check("cpu_hwy"); });
  }
}

// A var that the step would push past the largest finite value of its dtype as stored (float16
// rounds 65520 and above to Inf, bfloat16 3.3961776e38 and above): that element is left
// unchanged. Zero state and a gradient of -1 at step 0 move var up by about lr; the other
// elements have zero gradient and state, so they keep their var.
TEST(AdamW, AVarThatWouldBeStoredAsInfinityIsLeftUnchanged) {
  struct Big {
    DType t;
    float var;
    double lr;
  };
  for (const Big &big :
       {Big{DType::kFloat32, std::numeric_limits<float>::max(), 1e33},
        Big{DType::kBFloat16, 3.3895314e38f, 1e36}, Big{DType::kFloat16, 65504.0f, 100.0}}) {
    SCOPED_TRACE(fusekit::dtype_name(big.t));
    const size_t n = 77;
    std::vector<float> var(n, 1000.0f), grad(n, 0.0f);
    var[21] = big.var;
    grad[21] = -1.0f;
    grad[22] = -1.0f;   // the same push on a var that stays finite
    var[70] = big.var;  // and in the scalar tail
    grad[70] = -1.0f;
    State start;
    start.var = FloatBuf(big.t, var);
    start.grad = FloatBuf(big.t, grad);
    start.m.assign(n, 0.0f);
    start.v.assign(n, 0.0f);
    Hyper h;
    h.lr = big.lr;
    h.step = 0;
    State want = start;
    EXPECT_EQ(oracle_step(want, h), 2);
    EXPECT_GT(want.var.get(22), 1000.0f);
    auto check = [&](const char *impl) {
      State got = start;
      AdamWOptions o = options_of(h);
      o.implementation = impl;
      AdamWStats stats;
      const AdamWTensors tt = got.tensors();
      ASSERT_TRUE(
          fusekit::adam_w_step(tt.var, tt.grad, tt.m, tt.v, h.step, lr_of(h), o, &stats).ok());
      EXPECT_EQ(stats.elements_skipped_nonfinite, 2);
      expect_same(got, want);
      EXPECT_EQ(got.var.bits(21), start.var.bits(21));
    };
    for (const std::string &impl : supported_implementations()) {
      SCOPED_TRACE(impl);
      check(impl.c_str());
    }
    fusekit::testing::for_each_simd_target([&](const char *) { check("cpu_hwy"); });
  }
}

// gnormScale = 1e30: gradients of 1e-30 scale to about 1, one of 1e10 to 1e40 = +Inf.
TEST(AdamW, AGradientThatOverflowsWhenScaledLeavesTheElementUnchanged) {
  for (DType t : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(fusekit::dtype_name(t));
    State start = make_state(91, t, 333);
    auto rng = rng_for(92);
    start.grad = FloatBuf(t, uniform(rng, 333, -1e-30f, 1e-30f));
    start.grad.set(17, 1e10f);
    Hyper h;
    h.gnorm = 1e30;
    State want = start;
    EXPECT_EQ(oracle_step(want, h), 1);
    for (const std::string &impl : supported_implementations()) {
      SCOPED_TRACE(impl);
      State got = start;
      AdamWOptions o = options_of(h);
      o.implementation = impl.c_str();
      AdamWStats stats;
      const AdamWTensors tt = got.tensors();
      ASSERT_TRUE(
          fusekit::adam_w_step(tt.var, tt.grad, tt.m, tt.v, h.step, lr_of(h), o, &stats).ok());
      EXPECT_EQ(stats.elements_skipped_nonfinite, 1);
      expect_same(got, want);
      EXPECT_EQ(got.var.bits(17), start.var.bits(17));
    }
  }
}

// eps below 2^-114 in float32 is refused (eps * sqrt(1 - beta2^t) could round to 0, and a zero
// gradient on zero state would give 0 / 0); 2^-114 itself, with the largest beta2, keeps a zero
// element at 0 / 2^-126 = 0.
TEST(AdamW, EpsBelowTheSmallestNormalFloatIsRefused) {
  State s = make_state(93, DType::kFloat32, 64);
  const State before = s;
  AdamWOptions o;
  for (double eps : {1e-45, 1e-40, 1e-36, static_cast<double>(std::nextafter(0x1p-114f, 0.0f))}) {
    SCOPED_TRACE(eps);
    o.eps = eps;
    const AdamWTensors t = s.tensors();
    const Status st = fusekit::adam_w_step(t.var, t.grad, t.m, t.v, 0, 1e-3f, o);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("AdamW: eps = "), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("must be finite and >= 4.81482486e-35"), std::string::npos)
        << st.message();
    expect_same(s, before);
  }
  std::fill(s.grad.f32.begin(), s.grad.f32.end(), 0.0f);
  std::fill(s.m.begin(), s.m.end(), 0.0f);
  std::fill(s.v.begin(), s.v.end(), 0.0f);
  Hyper h;
  h.eps = 0x1p-114;
  h.beta2 = 1.0 - 0x1p-24;
  h.step = 0;
  State want = s;
  EXPECT_EQ(oracle_step(want, h), 0);
  for (const std::string &impl : supported_implementations()) {
    SCOPED_TRACE(impl);
    State got = s;
    AdamWOptions oi = options_of(h);
    oi.implementation = impl.c_str();
    AdamWStats stats;
    const AdamWTensors t = got.tensors();
    ASSERT_TRUE(fusekit::adam_w_step(t.var, t.grad, t.m, t.v, h.step, lr_of(h), oi, &stats).ok());
    EXPECT_EQ(stats.elements_skipped_nonfinite, 0);
    expect_same(got, want);
  }
}

// The guard's limits (common/adam_update.h): a float32 w is stored as a finite value of the dtype
// iff its magnitude bits are below the dtype's limit. Checked against this file's own rounding on
// the 8192 bit patterns around each limit (both signs) and on a sample of all floats.
TEST(AdamW, StoredFiniteLimitsMatchTheRounding) {
  auto check = [](DType t, uint32_t limit) {
    SCOPED_TRACE(fusekit::dtype_name(t));
    size_t bad = 0;
    auto one = [&](uint32_t bits) {
      const float w = std::bit_cast<float>(bits);
      const bool finite = std::isfinite(t == DType::kFloat32 ? w : widen(t, narrow(t, w)));
      bad += finite != ((bits & 0x7fffffffu) < limit);
    };
    for (uint32_t d = 0; d < 8192; ++d) {
      one(limit - 4096 + d);
      one((limit - 4096 + d) | 0x80000000u);
    }
    for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 65521) one(static_cast<uint32_t>(b));
    EXPECT_EQ(bad, 0u);
  };
  check(DType::kFloat32, fusekit::adam_stored_finite_limit<float>());
  check(DType::kBFloat16, fusekit::adam_stored_finite_limit<fusekit::bfloat16_t>());
  check(DType::kFloat16, fusekit::adam_stored_finite_limit<fusekit::float16_t>());
}

TEST(AdamW, Refusals) {
  std::vector<float> var(100), grad(100), m(100), v(50);
  Status st = fusekit::adam_w_step(
      TensorView::of(var.data(), {100}), TensorView::of(grad.data(), {100}),
      TensorView::of(m.data(), {100}), TensorView::of(v.data(), {50}), 0, 1e-3f);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("AdamW: v has 50 elements"), std::string::npos) << st.message();
  st = fusekit::adam_w_step(TensorView::of(var.data(), {100}), TensorView::of(var.data(), {100}),
                            TensorView::of(m.data(), {100}), TensorView::of(grad.data(), {100}), 0,
                            1e-3f);
  EXPECT_NE(st.message().find("overlap"), std::string::npos) << st.message();
  st = fusekit::adam_w_step(TensorView::strided(var.data(), DType::kFloat32, {50}, {2}),
                            TensorView::of(grad.data(), {50}), TensorView::of(m.data(), {50}),
                            TensorView::of(v.data(), {50}), 0, 1e-3f);
  EXPECT_NE(st.message().find("var must be contiguous"), std::string::npos) << st.message();
  st = fusekit::adam_w_step(TensorView::of(var.data(), {50}), TensorView::of(grad.data(), {50}),
                            TensorView::of(m.data(), {50}), TensorView::of(v.data(), {50}), -3,
                            1e-3f);
  EXPECT_NE(st.message().find("AdamW: step = -3"), std::string::npos) << st.message();
  AdamWOptions o;
  o.beta2 = 1.5;
  st = fusekit::adam_w_step(TensorView::of(var.data(), {50}), TensorView::of(grad.data(), {50}),
                            TensorView::of(m.data(), {50}), TensorView::of(v.data(), {50}), 0,
                            1e-3f, o);
  EXPECT_NE(st.message().find("beta2 = 1.5"), std::string::npos) << st.message();
}

// One plan, many runs with new tensors (new pointers) and new data: each equals a fresh call.
TEST(AdamWPlan, OnePlanManyRunsEqualFreshCalls) {
  Hyper h;
  h.wd = 0.02;
  for (const std::string &impl : supported_implementations()) {
    SCOPED_TRACE(impl);
    AdamWOptions o = options_of(h);
    o.implementation = impl.c_str();
    State first = make_state(40, DType::kBFloat16, 5000);
    AdamWProblem problem;
    ASSERT_TRUE(AdamWProblem::make(first.tensors(), o, &problem).ok());
    AdamW plan;
    ASSERT_TRUE(AdamW::plan(problem, o, &plan).ok());
    EXPECT_EQ(plan.implementation(), impl);
    for (int k = 0; k < 5; ++k) {
      SCOPED_TRACE(k);
      const State start = make_state(41 + static_cast<uint64_t>(k), DType::kBFloat16, 5000);
      auto got = std::make_unique<State>(start);
      State fresh = start, want = start;
      Hyper hk = h;
      hk.step = 5 * k;
      AdamWScalars sc;
      sc.step = hk.step;
      sc.lr = lr_of(hk);
      ASSERT_TRUE(plan.run(got->tensors(), sc).ok());
      const AdamWTensors ft = fresh.tensors();
      ASSERT_TRUE(fusekit::adam_w_step(ft.var, ft.grad, ft.m, ft.v, hk.step, lr_of(hk), o).ok());
      expect_same(*got, fresh);
      oracle_step(want, hk);
      expect_same(*got, want);
    }
  }
}

TEST(AdamWPlan, ABindingOfAnotherLayoutIsRefusedAndNothingIsWritten) {
  State s = make_state(50, DType::kFloat32, 600);
  AdamWProblem problem;
  ASSERT_TRUE(AdamWProblem::make(s.tensors(), {}, &problem).ok());
  AdamW plan;
  ASSERT_TRUE(AdamW::plan(problem, {}, &plan).ok());
  const State before = s;
  std::vector<uint16_t> half(600, 0x7fa5);
  std::vector<float> wide(1200, fusekit::testing::poison_float());
  struct Case {
    const char *what, *fragment;
    AdamWTensors t;
    AdamWScalars sc;
  };
  const AdamWTensors t = s.tensors();
  AdamWScalars sc;
  sc.step = 3;
  std::vector<Case> cases;
  cases.push_back({"var of another dtype", "var is bfloat16", t, sc});
  cases.back().t.var = TensorView::contiguous(half.data(), DType::kBFloat16, {600});
  cases.push_back({"m of another shape", "m is float32 [2, 300]", t, sc});
  cases.back().t.m = TensorView::of(wide.data(), {2, 300});
  cases.push_back({"v with another stride", "v is", t, sc});
  cases.back().t.v = TensorView::strided(wide.data(), DType::kFloat32, {600}, {2});
  cases.push_back({"null data", "grad has no data", t, sc});
  cases.back().t.grad.data = nullptr;
  cases.push_back({"m aliasing v", "m and v overlap", t, sc});
  cases.back().t.m = t.v;
  cases.push_back({"another device", "var", t, sc});
  cases.back().t.var.device = fusekit::Device::kCuda;
  cases.push_back({"a step out of range", "step = -1", t, sc});
  cases.back().sc.step = -1;
  cases.push_back({"a step tensor of another dtype", "step must be one int64", t, sc});
  cases.back().sc.step_tensor = TensorView::of(wide.data(), {1});
  cases.push_back({"a negative lr", "lr = -0.5 must be finite and >= 0", t, sc});
  cases.back().sc.lr = -0.5f;
  cases.push_back({"a NaN lr", "lr = nan", t, sc});
  cases.back().sc.lr = std::numeric_limits<float>::quiet_NaN();
  for (const Case &c : cases) {
    SCOPED_TRACE(c.what);
    const Status st = plan.run(c.t, c.sc);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find(c.fragment), std::string::npos) << st.message();
    expect_same(s, before);
    EXPECT_TRUE(std::all_of(half.begin(), half.end(), [](uint16_t x) { return x == 0x7fa5; }));
    EXPECT_TRUE(std::all_of(wide.begin(), wide.end(), fusekit::testing::is_poison));
  }
  ASSERT_TRUE(plan.run(t, sc).ok());
  State want = before;
  Hyper h;
  h.step = 3;
  oracle_step(want, h);
  expect_same(s, want);
}

TEST(AdamWPlan, StepFromATensorIsReadAtRunTime) {
  State s = make_state(70, DType::kFloat16, 300);
  AdamWProblem problem;
  ASSERT_TRUE(AdamWProblem::make(s.tensors(), {}, &problem).ok());
  AdamW plan;
  ASSERT_TRUE(AdamW::plan(problem, {}, &plan).ok());
  int64_t step = 0;
  AdamWScalars sc;
  sc.step = 999;
  sc.step_tensor = TensorView::of(&step, {1});
  Hyper h;
  step = h.step = 123;
  State want = s;
  oracle_step(want, h);
  ASSERT_TRUE(plan.run(s.tensors(), sc).ok());
  expect_same(s, want);
}

TEST(AdamWPlan, VerboseNamesTheImplementation) {
  // FUSEKIT_VERBOSE is read once per process: ctest sets it for this test (CMakeLists.txt).
  if (std::getenv("FUSEKIT_VERBOSE") == nullptr) GTEST_SKIP() << "FUSEKIT_VERBOSE not set";
  for (const std::string &impl : supported_implementations()) {
    State s = make_state(80, DType::kFloat32, 100);
    AdamWOptions o;
    o.implementation = impl.c_str();
    ::testing::internal::CaptureStderr();
    const AdamWTensors t = s.tensors();
    ASSERT_TRUE(fusekit::adam_w_step(t.var, t.grad, t.m, t.v, 0, 1e-3f, o).ok());
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("fusekit_verbose,AdamW,n=100,"), std::string::npos) << err;
    const std::string isa = impl == "cpu_hwy" ? fusekit::hwy_dispatched_target() : "scalar";
    EXPECT_NE(err.find("impl=" + impl + ",isa=" + isa + ","), std::string::npos) << err;
    EXPECT_NE(err.find("update="), std::string::npos) << err;
    EXPECT_EQ(err.find("decay="), std::string::npos) << err;  // only the order before is named
    o.decay_order = WeightDecayOrder::kBeforeUpdate;
    ::testing::internal::CaptureStderr();
    ASSERT_TRUE(fusekit::adam_w_step(t.var, t.grad, t.m, t.v, 0, 1e-3f, o).ok());
    const std::string before = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(before.find("AdamW,n=100,dtype=float32,decay=before,impl=" + impl), std::string::npos)
        << before;
  }
}

}  // namespace
