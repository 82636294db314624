// ApplyAdamWQuant: every expected value comes from the oracle below, a plain float32 scalar
// implementation of spec/apply_adam_w_quant.md written independently of the library: the nearest
// code by std::lower_bound over the map and a float32 comparison of the two bracketing distances
// (no thresholds, no tables), 16-bit conversions by _Float16 and by integer rounding written here.
// The spec fixes every float32 operation, so var and absmax must match bit for bit and codes
// exactly, for every implementation this machine runs (cpu_avx512vbmi, cpu_hwy on every SIMD
// target, cpu_reference), search method and thread count. AdamW has its own tests (tests/adam_w).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_apply_adam_w_quant.h"
#include "apply_adam_w_quant/apply_adam_w_quant_kernels.h"
#include "common/fp8_oracle.h"
#include "common/half_floats.h"
#include "common/lazy_adam_quant_oracle.h"
#include "common/simd_targets.h"
#include "common/test_util.h"
#include "fusekit/apply_adam_w_quant.h"
#include "fusekit/threading.h"

namespace {

using namespace fusekit;           // the library under test
using namespace fusekit::testing;  // tests/common
using Map = std::array<float, 256>;

// ---- maps --------------------------------------------------------------------------------------
Map linspace_map(float lo, float hi) {
  Map q;
  for (int i = 0; i < 256; ++i) q[i] = static_cast<float>(lo + (hi - lo) * i / 255.0);
  return q;
}
// bitsandbytes' construction, written out again: decades 1e-6 .. 1, midpoints of [0.1, 1] splits.
Map dynamic_oracle(bool is_signed) {
  std::vector<double> d;
  for (int i = 0; i < 7; ++i) {
    const int parts = is_signed ? (1 << i) : (2 << i);
    for (int k = 0; k < parts; ++k) {
      const double mid = ((0.1 + 0.9 * k / parts) + (0.1 + 0.9 * (k + 1) / parts)) / 2.0;
      d.push_back(std::pow(10.0, i - 6) * mid);
      if (is_signed) d.push_back(-std::pow(10.0, i - 6) * mid);
    }
  }
  d.push_back(0.0);
  d.push_back(1.0);
  std::sort(d.begin(), d.end());
  Map q;
  for (int i = 0; i < 256; ++i) q[i] = static_cast<float>(d[i]);
  return q;
}

// ---- the oracle --------------------------------------------------------------------------------
// nearest_code: tests/common/lazy_adam_quant_oracle.h (ApplyAdamWQuant's rule, written once).

struct Hyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, wd = 0.0, eps = 1e-8, gnorm = 1.0;
  int64_t step = 10;
  // The state format (docs/fp8_state.md) and the lost-v guard (always on in the FP8 format).
  QuantStateFormat format = QuantStateFormat::kDynamicMap;
  bool guard = false;
  bool fp8() const { return fusekit::is_fp8_state(format); }
  // sqrt(v)'s code in an FP8 format: UE4M4 (fp8) or UE3M5 (fp8_ue3m5).
  const fusekit::testing::Fp8Oracle &v_code() const {
    return format == QuantStateFormat::kFp8Ue3m5 ? fusekit::testing::kOracleUE3M5 : kOracleUE4M4;
  }
};

struct Scal {
  float b1, b2, omb1, omb2, gs, step_size, eps_c2s, decay;
  bool apply_decay;
};
Scal scalars(const Hyper &h) {
  Scal s;
  s.b1 = static_cast<float>(h.beta1);
  s.b2 = static_cast<float>(h.beta2);
  const float lr = static_cast<float>(h.lr), wd = static_cast<float>(h.wd),
              eps = static_cast<float>(h.eps);
  const float t = static_cast<float>(h.step + 1);
  const float c1 = 1.0f - powf(s.b1, t);
  const float c2s = sqrtf(1.0f - powf(s.b2, t));
  s.step_size = -lr * c2s / c1;
  s.eps_c2s = eps * c2s;
  s.decay = 1.0f - lr * wd;
  s.apply_decay = wd > 0.0f;
  s.omb1 = 1.0f - s.b1;
  s.omb2 = 1.0f - s.b2;
  s.gs = static_cast<float>(h.gnorm);
  return s;
}

struct State {
  FloatBuf var, grad;
  std::vector<uint8_t> m, v;
  std::vector<float> absmax_m, absmax_v;
  Map qm, qv;
};

// stored: tests/common/lazy_adam_quant_oracle.h.

// Returns the number of skipped blocks: a block whose gradient, or whose new m, v, absmax or var
// (as stored) would be NaN or Inf, is left as it is.
int64_t oracle_step(State &st, const Hyper &h) {
  const Scal s = scalars(h);
  const size_t n = st.var.size();
  int64_t skipped = 0;
  for (size_t lo = 0; lo < n; lo += 256) {
    const size_t len = std::min<size_t>(256, n - lo), b = lo / 256;
    bool finite = true;
    for (size_t j = 0; j < len; ++j) finite = finite && std::isfinite(st.grad.get(lo + j));
    std::vector<float> mm(len), vv(len), ww(len);
    float am = 0.0f, av = -INFINITY;
    for (size_t j = 0; j < len && finite; ++j) {
      const size_t i = lo + j;
      const float g = st.grad.get(i) * s.gs;
      float m, v;
      if (h.fp8()) {
        m = kOracleE4M3.decode(st.m[i]) * st.absmax_m[b];
        const float sv = h.v_code().decode(st.v[i]) * st.absmax_v[b];
        v = sv * sv;
      } else {
        m = st.qm[st.m[i]] * st.absmax_m[b];
        v = st.qv[st.v[i]] * st.absmax_v[b];
      }
      if (h.guard && v == 0.0f && m != 0.0f) v = m * m;  // the lost-v guard
      m = m * s.b1 + g * s.omb1;
      v = v * s.b2 + (g * g) * s.omb2;
      float w = st.var.get(i);
      w = w + (m * s.step_size) / (std::sqrt(v) + s.eps_c2s);
      if (s.apply_decay) w = w * s.decay;
      finite = std::isfinite(m) && std::isfinite(v) && std::isfinite(stored(st.var.dtype, w));
      ww[j] = w;
      mm[j] = m;
      vv[j] = h.fp8() ? std::sqrt(v) : v;  // the FP8 format codes sqrt(v)
      am = std::max(am, std::fabs(m));
      av = std::max(av, vv[j]);
    }
    if (!finite || !std::isfinite(am) || !std::isfinite(av)) {
      ++skipped;
      continue;
    }
    for (size_t j = 0; j < len; ++j) st.var.set(lo + j, ww[j]);
    if (h.fp8()) {
      st.absmax_m[b] = kOracleE4M3.code_block(mm.data(), static_cast<int64_t>(len), &st.m[lo]);
      st.absmax_v[b] = h.v_code().code_block(vv.data(), static_cast<int64_t>(len), &st.v[lo]);
      continue;
    }
    am += 0.0f;
    av += 0.0f;
    st.absmax_m[b] = am;
    st.absmax_v[b] = av;
    for (size_t j = 0; j < len; ++j) {
      st.m[lo + j] =
          static_cast<uint8_t>(nearest_code(st.qm, mm[j] / (am == 0.0f ? 1.0f : am), true));
      st.v[lo + j] =
          static_cast<uint8_t>(nearest_code(st.qv, vv[j] / (av == 0.0f ? 1.0f : av), false));
    }
  }
  return skipped;
}

// Random state: codes uniform, absmax in a sensible range, grads in [-g, g].
State make_state(uint64_t salt, DType t, size_t n, const Map &qm, const Map &qv,
                 float gmax = 1.0f) {
  auto rng = rng_for(salt);
  State s;
  s.var = FloatBuf(t, uniform(rng, n, -2.f, 2.f));
  s.grad = FloatBuf(t, uniform(rng, n, -gmax, gmax));
  s.m.resize(n);
  s.v.resize(n);
  for (auto &c : s.m) c = static_cast<uint8_t>(rng() & 0xff);
  for (auto &c : s.v) c = static_cast<uint8_t>(rng() & 0xff);
  const size_t blocks = (n + 255) / 256;
  s.absmax_m = uniform(rng, blocks, 0.001f, 0.5f);
  s.absmax_v = uniform(rng, blocks, 1e-6f, 0.3f);
  if (blocks > 2) s.absmax_m[1] = 0.0f;  // an all-zero moment block
  s.qm = qm;
  s.qv = qv;
  return s;
}

float lr_of(const Hyper &h) {
  return static_cast<float>(h.lr);
}

ApplyAdamWQuantOptions options_of(const Hyper &h) {
  ApplyAdamWQuantOptions o;
  o.beta1 = h.beta1;
  o.beta2 = h.beta2;
  o.weight_decay = h.wd;
  o.eps = h.eps;
  o.gnorm_scale = h.gnorm;
  o.state_format = h.format;
  o.guard_lost_v = h.guard;
  return o;
}

Status run_api(State &s, const Hyper &h, ApplyAdamWQuantOptions o,
               ApplyAdamWQuantStats *stats = nullptr) {
  const auto n = static_cast<int64_t>(s.var.size());
  const auto blocks = static_cast<int64_t>(s.absmax_m.size());
  return fusekit::apply_adam_w_quant_step(
      s.var.view(), s.grad.view(), TensorView::of(s.m.data(), {n}), TensorView::of(s.v.data(), {n}),
      TensorView::of(s.qm.data(), {h.fp8() ? 0 : 256}),
      TensorView::of(s.qv.data(), {h.fp8() ? 0 : 256}), TensorView::of(s.absmax_m.data(), {blocks}),
      TensorView::of(s.absmax_v.data(), {blocks}), h.step, lr_of(h), o, stats);
}

ApplyAdamWQuantScalars scalars_at(int64_t step) {
  ApplyAdamWQuantScalars sc;
  sc.step = step;
  return sc;
}

ApplyAdamWQuantTensors tensors_of(State &s) {
  const auto n = static_cast<int64_t>(s.var.size());
  const auto blocks = static_cast<int64_t>(s.absmax_m.size());
  return {s.var.view(),
          s.grad.view(),
          TensorView::of(s.m.data(), {n}),
          TensorView::of(s.v.data(), {n}),
          TensorView::of(s.qm.data(), {256}),
          TensorView::of(s.qv.data(), {256}),
          TensorView::of(s.absmax_m.data(), {blocks}),
          TensorView::of(s.absmax_v.data(), {blocks})};
}

// Whether this machine runs the implementation (planned for a small problem by name).
bool supported(const std::string &name) {
  std::vector<float> var(10), grad(10), am(1), av(1), q(256);
  std::vector<uint8_t> m(10), v(10);
  const ApplyAdamWQuantTensors t{
      TensorView::of(var.data(), {10}), TensorView::of(grad.data(), {10}),
      TensorView::of(m.data(), {10}),   TensorView::of(v.data(), {10}),
      TensorView::of(q.data(), {256}),  TensorView::of(q.data(), {256}),
      TensorView::of(am.data(), {1}),   TensorView::of(av.data(), {1})};
  ApplyAdamWQuantOptions o;
  o.implementation = name.c_str();
  ApplyAdamWQuantProblem problem;
  EXPECT_TRUE(ApplyAdamWQuantProblem::make(t, o, &problem).ok());
  ApplyAdamWQuant plan;
  const Status st = ApplyAdamWQuant::plan(problem, o, &plan);
  EXPECT_TRUE(st.ok() || st.code() == StatusCode::kNoImplementation) << st.message();
  return st.ok();
}

// One way to run the step: an implementation this machine supports, by name (cpu_hwy's variants
// cpu_hwy_table and cpu_hwy_binary_search among them: cpu_hwy itself picks by size).
struct Way {
  std::string impl;
};
const std::vector<Way> &ways() {
  static const std::vector<Way> all = [] {
    std::vector<Way> w;
    for (const std::string &name : ApplyAdamWQuant::implementations()) {
      if (supported(name)) w.push_back({name});
    }
    return w;
  }();
  return all;
}
const std::string &way_name(const Way &w) {
  return w.impl;
}
// cpu_hwy with each search method.
const Way kHwySearches[] = {{"cpu_hwy_table"}, {"cpu_hwy_binary_search"}};
ApplyAdamWQuantOptions options_of(const Hyper &h, const Way &w) {
  ApplyAdamWQuantOptions o = options_of(h);
  o.implementation = w.impl.c_str();
  return o;
}

// Bitwise var and absmax, exact codes (the spec's one-step allowance is never needed here: both
// sides perform the same float32 operations).
void expect_same(const State &got, const State &want) {
  expect_same_quant_state(got.var, want.var, got.m, want.m, got.v, want.v, got.absmax_m,
                          want.absmax_m, got.absmax_v, want.absmax_v);
}

// ================================================================================================
// The maps
// ================================================================================================
TEST(DynamicMap, SignedAndUnsignedMatchTheConstruction) {
  for (bool is_signed : {true, false}) {
    SCOPED_TRACE(is_signed ? "signed" : "unsigned");
    const Map q = fusekit::create_dynamic_map(is_signed);
    const Map want = dynamic_oracle(is_signed);
    for (int i = 0; i < 256; ++i) EXPECT_EQ(q[i], want[i]) << i;
    for (int i = 1; i < 256; ++i) EXPECT_LT(q[i - 1], q[i]) << i;  // strictly ascending
    EXPECT_EQ(q[255], 1.0f);
    EXPECT_NE(std::find(q.begin(), q.end(), 0.0f), q.end());
    const auto negatives = std::count_if(q.begin(), q.end(), [](float x) { return x < 0; });
    EXPECT_EQ(negatives, is_signed ? 127 : 0);
  }
  const Map s = fusekit::create_dynamic_map(true);
  EXPECT_EQ(s[127], 0.0f);
  EXPECT_FLOAT_EQ(s[128], 5.5e-7f);  // 1e-6 * (0.1 + 1) / 2
  EXPECT_FLOAT_EQ(s[0], -(0.1f + 0.9f * 63 / 64 + 1.0f) / 2);
  for (int i = 0; i < 127; ++i) EXPECT_EQ(s[i], -s[254 - i]);
}

// The exact search (thresholds) against lower_bound + bracketing, on maps with and without zero,
// duplicates, ties at exact midpoints and neighbours of midpoints.
TEST(NearestCode, ThresholdSearchMatchesTheBracketingDefinition) {
  std::vector<std::pair<const char *, Map>> maps = {
      {"dynamic signed", fusekit::create_dynamic_map(true)},
      {"dynamic unsigned", fusekit::create_dynamic_map(false)},
      {"linspace(-1,1)", linspace_map(-1, 1)},
      {"linspace(0,1)", linspace_map(0, 1)},
      {"zeros", Map{}}};
  Map dup = linspace_map(-1, 1);
  for (int i = 100; i < 140; ++i) dup[i] = dup[100];
  for (int i = 200; i < 256; ++i) dup[i] = 0.75f;
  maps.push_back({"duplicates", dup});
  Map nozero;  // all positive but the first: the sign fix acts for small negative x
  for (int i = 0; i < 256; ++i) nozero[i] = i == 0 ? -1.0f : 0.01f + i / 256.0f;
  maps.push_back({"one negative", nozero});
  auto rng = rng_for(1);
  for (auto &[name, q] : maps) {
    SCOPED_TRACE(name);
    std::vector<char> mem(fusekit::quant_tables_bytes(true) + 64);
    auto *aligned =
        reinterpret_cast<void *>((reinterpret_cast<uintptr_t>(mem.data()) + 63) / 64 * 64);
    fusekit::QuantMapTables t;
    fusekit::build_quant_tables(q.data(), 1, true, true, aligned, &t);
    std::vector<float> xs = uniform(rng, 20000, -1.1f, 1.1f);
    for (int i = 0; i < 256; ++i) {
      xs.push_back(q[i]);
      if (i < 255) {
        const float mid = (q[i] + q[i + 1]) / 2;
        for (float x : {mid, std::nextafter(mid, -2.f), std::nextafter(mid, 2.f)}) xs.push_back(x);
      }
    }
    for (float x : {0.0f, -0.0f, 1e-40f, -1e-40f, 1e-30f, -1e-30f, 1.0f, -1.0f, 5.0f, -5.0f})
      xs.push_back(x);
    int bad = 0;
    for (float x : xs) {
      const int want = nearest_code(q, x, true);
      const int got = fusekit::quant_code_reference(t, x);
      if (got != want && bad++ < 5)
        ADD_FAILURE() << "x = " << x << ": code " << got << ", want " << want;
    }
    EXPECT_EQ(bad, 0);
    EXPECT_LE(t.refine_steps,
              std::string(name) == "one negative" || std::string(name) == "duplicates" ? 8 : 2);
  }
}

// ================================================================================================
// The step against the oracle
// ================================================================================================
struct Case {
  DType dtype;
  size_t n;
  bool dynamic;
  Hyper h;
};

void check_case(const Case &c, uint64_t salt) {
  const Map qm = c.dynamic ? fusekit::create_dynamic_map(true) : linspace_map(-1, 1);
  const Map qv = c.dynamic ? fusekit::create_dynamic_map(false) : linspace_map(0, 1);
  const State start = make_state(salt, c.dtype, c.n, qm, qv);
  State want = start;
  const int64_t want_skipped = oracle_step(want, c.h);
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    State got = start;
    const ApplyAdamWQuantOptions o = options_of(c.h, w);
    ApplyAdamWQuantStats stats;
    ASSERT_TRUE(run_api(got, c.h, o, &stats).ok());
    EXPECT_EQ(stats.blocks_skipped_nonfinite, want_skipped);
    expect_same(got, want);
  }
}

class StepTest : public ::testing::TestWithParam<std::tuple<DType, size_t, bool>> {};

TEST_P(StepTest, MatchesOracle) {
  const auto [dtype, n, dynamic] = GetParam();
  Hyper h;
  check_case({dtype, n, dynamic, h}, 100 + n);
  h.step = 0;
  h.wd = 0.01;
  h.gnorm = 0.5;
  check_case({dtype, n, dynamic, h}, 200 + n);
  h.step = 123456789;
  h.lr = 0.1;
  h.beta1 = 0.8;
  h.beta2 = 0.95;
  h.eps = 1e-6;
  h.gnorm = 2.0;
  check_case({dtype, n, dynamic, h}, 300 + n);
}

INSTANTIATE_TEST_SUITE_P(Sizes, StepTest,
                         ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat16,
                                                              DType::kBFloat16),
                                            ::testing::Values(size_t{1}, size_t{255}, size_t{256},
                                                              size_t{257}, size_t{5000}),
                                            ::testing::Bool()),
                         [](const auto &param_info) {
                           const auto &p = param_info.param;
                           return std::string(fusekit::dtype_name(std::get<0>(p))) + "_n" +
                                  std::to_string(std::get<1>(p)) +
                                  (std::get<2>(p) ? "_dynamic" : "_linspace");
                         });

// Several steps in a row: the codes and absmax a step writes are the next step's input.
TEST(Step, TenStepsInARowStayOnTheOracle) {
  State got = make_state(7, DType::kFloat32, 3000, fusekit::create_dynamic_map(true),
                         fusekit::create_dynamic_map(false));
  State want = got;
  auto rng = rng_for(8);
  for (int64_t k = 0; k < 10; ++k) {
    Hyper h;
    h.step = k;
    h.wd = 0.01;
    got.grad = want.grad = FloatBuf(DType::kFloat32, uniform(rng, 3000, -1.f, 1.f));
    oracle_step(want, h);
    ASSERT_TRUE(run_api(got, h, options_of(h)).ok());
  }
  expect_same(got, want);
}

// A few million elements, the default (table) path, all threads.
TEST(Step, ThreeMillionElements) {
  const size_t n = 3'000'000 + 77;
  State start = make_state(9, DType::kFloat32, n, fusekit::create_dynamic_map(true),
                           fusekit::create_dynamic_map(false));
  State want = start;
  Hyper h;
  h.wd = 0.01;
  oracle_step(want, h);
  ApplyAdamWQuantOptions o = options_of(h);
  ApplyAdamWQuant plan;
  const auto N = static_cast<int64_t>(n), B = static_cast<int64_t>(start.absmax_m.size());
  ASSERT_TRUE(ApplyAdamWQuant::plan(
                  start.var.view(), start.grad.view(), TensorView::of(start.m.data(), {N}),
                  TensorView::of(start.v.data(), {N}), TensorView::of(start.qm.data(), {256}),
                  TensorView::of(start.qv.data(), {256}),
                  TensorView::of(start.absmax_m.data(), {B}),
                  TensorView::of(start.absmax_v.data(), {B}), o, &plan)
                  .ok());
  State got = start;
  std::vector<char> ws(plan.workspace_size());
  ASSERT_TRUE(plan.run(h.step, lr_of(h), ws.data(), ws.size()).ok());  // on `start`'s tensors
  expect_same(start, want);
  for (const Way &w : ways()) {  // and every implementation (cpu_hwy: the table by default here)
    SCOPED_TRACE(way_name(w));
    State g = got;
    ASSERT_TRUE(run_api(g, h, options_of(h, w)).ok());
    expect_same(g, want);
  }
}

// cpu_hwy on every SIMD target Highway built and this CPU runs (generic AVX-512 included, also on
// a CPU with VBMI), both search methods, bitwise with the oracle.
TEST(Step, EverySimdTarget) {
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(fusekit::dtype_name(t));
    const State start = make_state(11, t, 2000, fusekit::create_dynamic_map(true),
                                   fusekit::create_dynamic_map(false));
    State want = start;
    Hyper h;
    h.wd = 0.02;
    h.gnorm = 0.7;
    oracle_step(want, h);
    fusekit::testing::for_each_simd_target([&](const char *target) {
      EXPECT_STREQ(fusekit::hwy_dispatched_target(), target);
      for (const Way &w : kHwySearches) {
        State got = start;
        ApplyAdamWQuantOptions o = options_of(h, w);
        ApplyAdamWQuantStats stats;
        ASSERT_TRUE(run_api(got, h, o, &stats).ok());
        expect_same(got, want);
      }
    });
  }
}

TEST(Step, ThreadCountsAreBitwiseEqual) {
  const State start = make_state(12, DType::kBFloat16, 300'000, fusekit::create_dynamic_map(true),
                                 fusekit::create_dynamic_map(false));
  State want = start;
  Hyper h;
  oracle_step(want, h);
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    for (int threads : {1, 2, 4}) {
      SCOPED_TRACE(threads);
      State got = start;
      ApplyAdamWQuantOptions o = options_of(h, w);
      o.num_threads = threads;
      ASSERT_TRUE(run_api(got, h, o).ok());
      expect_same(got, want);
    }
  }
}

// Maps the spec's sign fix and duplicate handling act on.
TEST(Step, UnusualMapsSignFixAndDuplicates) {
  Map qm;
  for (int i = 0; i < 256; ++i) qm[i] = i < 8 ? -1.0f + i * 0.1f : 0.05f + (i - 8) / 260.0f;
  Map qv = linspace_map(0, 1);
  for (int i = 10; i < 60; ++i) qv[i] = qv[10];
  const State start = make_state(13, DType::kFloat32, 4096, qm, qv);
  State want = start;
  Hyper h;
  oracle_step(want, h);
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    State got = start;
    ASSERT_TRUE(run_api(got, h, options_of(h, w)).ok());
    expect_same(got, want);
  }
}

// The seed's example: all-zero maps, inputs and gradient; absmax 5 and 3; step 0.
TEST(Step, SeedExampleValues) {
  State s;
  s.var = FloatBuf(DType::kFloat32, std::vector<float>(256, 0.0f));
  s.grad = FloatBuf(DType::kFloat32, std::vector<float>(256, 0.0f));
  s.m.assign(256, 0);
  s.v.assign(256, 0);
  s.absmax_m = {5};
  s.absmax_v = {3};
  s.qm = Map{};
  s.qv = Map{};
  Hyper h{0.1, 0.1, 0.1, 0.1, 0.01, 0.1, 0};
  State want = s;
  oracle_step(want, h);
  ASSERT_TRUE(run_api(s, h, options_of(h)).ok());
  expect_same(s, want);
  for (size_t i = 0; i < 256; ++i)
    EXPECT_EQ(s.var.bits(i), 0u) << i;  // +0: 0 * step_size / (0 + eps c2s)
  EXPECT_EQ(s.absmax_m[0], 0.0f);
  EXPECT_EQ(s.absmax_v[0], 0.0f);
  EXPECT_EQ(std::count(s.m.begin(), s.m.end(), 0), 256);
}

TEST(Step, NonFiniteBlocksAreLeftBitForBit) {
  for (DType t : {DType::kFloat32, DType::kBFloat16}) {
    State start = make_state(14, t, 256 * 6 + 100, fusekit::create_dynamic_map(true),
                             fusekit::create_dynamic_map(false));
    start.grad.set(256 + 17, std::numeric_limits<float>::quiet_NaN());
    start.grad.set(3 * 256 + 255, -std::numeric_limits<float>::infinity());
    start.grad.set(6 * 256 + 99, std::numeric_limits<float>::infinity());  // the partial last block
    State want = start;
    Hyper h;
    EXPECT_EQ(oracle_step(want, h), 3);
    for (const Way &w : ways()) {
      SCOPED_TRACE(way_name(w));
      State got = start;
      const ApplyAdamWQuantOptions o = options_of(h, w);
      ApplyAdamWQuantStats stats;
      ASSERT_TRUE(run_api(got, h, o, &stats).ok());
      EXPECT_EQ(stats.blocks_skipped_nonfinite, 3);
      EXPECT_EQ(stats.blocks_updated, 4);
      expect_same(got, want);
      for (size_t b : {size_t{1}, size_t{3}, size_t{6}}) {
        EXPECT_TRUE(fusekit::testing::bits_equal(got.absmax_m[b], start.absmax_m[b]));
        for (size_t i = b * 256; i < std::min(got.var.size(), b * 256 + 256); ++i) {
          EXPECT_EQ(got.var.bits(i), start.var.bits(i));
          EXPECT_EQ(got.m[i], start.m[i]);
        }
      }
    }
  }
}

// Block b of `got` holds exactly what it held in `start` (var bits, codes, absmax bits).
void expect_block_unchanged(const State &got, const State &start, size_t b) {
  SCOPED_TRACE(b);
  EXPECT_TRUE(fusekit::testing::bits_equal(got.absmax_m[b], start.absmax_m[b]));
  EXPECT_TRUE(fusekit::testing::bits_equal(got.absmax_v[b], start.absmax_v[b]));
  size_t bad = 0;
  for (size_t i = b * 256; i < std::min(got.var.size(), b * 256 + 256); ++i) {
    bad += got.var.bits(i) != start.var.bits(i) || got.m[i] != start.m[i] || got.v[i] != start.v[i];
  }
  EXPECT_EQ(bad, 0u);
}

// Every var, absmax and moment of `s` finite.
void expect_all_finite(const State &s) {
  size_t bad = 0;
  for (size_t i = 0; i < s.var.size(); ++i) bad += !std::isfinite(s.var.get(i));
  for (size_t b = 0; b < s.absmax_m.size(); ++b) {
    bad += !std::isfinite(s.absmax_m[b]) || !std::isfinite(s.absmax_v[b]);
  }
  EXPECT_EQ(bad, 0u);
}

// A finite gradient of 1e20: g * g = 1e40 overflows float32, so the block's new v (and absmax_v)
// would be +Inf, and the next ordinary step would turn its 256 var into NaN (0 * Inf). The block is
// left unchanged and counted instead; the next step updates every block and stays finite.
TEST(Step, AFiniteGradientWhoseSquareOverflowsLeavesItsBlockUnchanged) {
  for (DType t : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(fusekit::dtype_name(t));
    const size_t n = 256 * 3 + 40;
    State start =
        make_state(17, t, n, fusekit::create_dynamic_map(true), fusekit::create_dynamic_map(false));
    start.grad.set(256 + 9, 1e20f);
    auto rng = rng_for(18);
    const FloatBuf next_grad(t, uniform(rng, n, -1.f, 1.f));
    for (const Way &w : ways()) {
      SCOPED_TRACE(way_name(w));
      State got = start, want = start;
      Hyper h;
      h.step = 5;
      EXPECT_EQ(oracle_step(want, h), 1);
      ApplyAdamWQuantStats stats;
      ASSERT_TRUE(run_api(got, h, options_of(h, w), &stats).ok());
      EXPECT_EQ(stats.blocks_skipped_nonfinite, 1);
      EXPECT_EQ(stats.blocks_updated, 3);
      expect_same(got, want);
      expect_block_unchanged(got, start, 1);
      // An ordinary step next.
      got.grad = want.grad = next_grad;
      h.step = 6;
      EXPECT_EQ(oracle_step(want, h), 0);
      ASSERT_TRUE(run_api(got, h, options_of(h, w), &stats).ok());
      EXPECT_EQ(stats.blocks_skipped_nonfinite, 0);
      EXPECT_EQ(stats.blocks_updated, 4);
      expect_same(got, want);
      expect_all_finite(got);
    }
  }
}

// gnormScale = 1e30 and one gradient of 1e10: the scaled gradient 1e40 is +Inf in float32. That
// block is left unchanged; the others (gradients of 1e-30, scaled to about 1) are updated.
TEST(Step, AGradientThatOverflowsWhenScaledLeavesItsBlockUnchanged) {
  for (DType t : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(fusekit::dtype_name(t));
    const size_t n = 256 * 4 + 100;
    State start =
        make_state(19, t, n, fusekit::create_dynamic_map(true), fusekit::create_dynamic_map(false));
    auto rng = rng_for(20);
    start.grad = FloatBuf(t, uniform(rng, n, -1e-30f, 1e-30f));
    start.grad.set(2 * 256 + 100, 1e10f);
    State want = start;
    Hyper h;
    h.gnorm = 1e30;
    EXPECT_EQ(oracle_step(want, h), 1);
    for (const Way &w : ways()) {
      SCOPED_TRACE(way_name(w));
      State got = start;
      ApplyAdamWQuantStats stats;
      ASSERT_TRUE(run_api(got, h, options_of(h, w), &stats).ok());
      EXPECT_EQ(stats.blocks_skipped_nonfinite, 1);
      EXPECT_EQ(stats.blocks_updated, 4);
      expect_same(got, want);
      expect_block_unchanged(got, start, 2);
      expect_all_finite(got);
    }
  }
}

// A var that the step would push past the largest finite value of its dtype (as stored: float16
// rounds 65520 and above to Inf, bfloat16 3.3961776e38 and above): its block is left unchanged.
// m = v = 0 and a gradient of -1 at step 0 make the Adam term exactly about +lr.
TEST(Step, AVarThatWouldBeStoredAsInfinityLeavesItsBlockUnchanged) {
  struct Big {
    DType t;
    float var;
    double lr;
  };
  for (const Big &big :
       {Big{DType::kFloat32, std::numeric_limits<float>::max(), 1e33},
        Big{DType::kBFloat16, 3.3895314e38f, 1e36}, Big{DType::kFloat16, 65504.0f, 100.0}}) {
    SCOPED_TRACE(fusekit::dtype_name(big.t));
    const size_t n = 256 * 3;
    std::vector<float> var(n, 1000.0f), grad(n, 0.0f);
    var[256 + 30] = big.var;
    grad[256 + 30] = -1.0f;
    grad[2 * 256 + 30] = -1.0f;  // the same push on a var that stays finite
    State start;
    start.var = FloatBuf(big.t, var);
    start.grad = FloatBuf(big.t, grad);
    start.m.assign(n, 127);  // the signed dynamic map's 0
    start.v.assign(n, 0);
    start.absmax_m.assign(3, 0.0f);
    start.absmax_v.assign(3, 0.0f);
    start.qm = fusekit::create_dynamic_map(true);
    start.qv = fusekit::create_dynamic_map(false);
    Hyper h;
    h.lr = big.lr;
    h.step = 0;
    State want = start;
    EXPECT_EQ(oracle_step(want, h), 1);
    for (const Way &w : ways()) {
      SCOPED_TRACE(way_name(w));
      State got = start;
      ApplyAdamWQuantStats stats;
      ASSERT_TRUE(run_api(got, h, options_of(h, w), &stats).ok());
      EXPECT_EQ(stats.blocks_skipped_nonfinite, 1);
      expect_same(got, want);
      expect_block_unchanged(got, start, 1);
      EXPECT_GT(got.var.get(2 * 256 + 30), 1000.0f);  // updated
      expect_all_finite(got);
    }
  }
}

// Non-finite or impossible state (absmax NaN, +-Inf or negative, a NaN var): every block that it
// makes produce a NaN or Inf is left unchanged, identically on every implementation and every
// SIMD target (EMU128 where the compiler builds it), with the vector loop and the scalar tail.
State nonfinite_state(DType t, bool bad_tail) {
  const size_t n = 256 * 8 + 3;  // a last block of 3: shorter than a vector
  State s =
      make_state(21, t, n, fusekit::create_dynamic_map(true), fusekit::create_dynamic_map(false));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  s.absmax_m[1] = 0.2f;
  s.absmax_v[0] = nan;   // every v NaN
  s.absmax_v[1] = -inf;  // v = -Inf, or NaN where the code's value is 0
  for (size_t i = 2 * 256; i < 3 * 256; ++i) s.v[i] = static_cast<uint8_t>(1 + s.v[i] % 255);
  s.absmax_v[2] = -inf;  // every v -Inf
  s.absmax_m[3] = inf;   // m = +-Inf, or NaN at the map's 0
  s.absmax_v[4] = inf;   // v = +Inf, or NaN at the map's 0
  s.var.set(5 * 256 + 7, nan);
  s.absmax_v[6] = -0.5f;  // negative v: sqrt gives NaN
  // block 7: ordinary
  if (bad_tail) {
    s.absmax_v[8] = nan;
  } else {
    s.absmax_v[8] = 0.01f;
  }
  return s;
}

TEST(Step, NonFiniteStateOnEveryImplementationAndSimdTarget) {
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(fusekit::dtype_name(t));
    for (bool bad_tail : {true, false}) {
      SCOPED_TRACE(bad_tail ? "bad tail" : "ordinary tail");
      const State start = nonfinite_state(t, bad_tail);
      State want = start;
      Hyper h;
      h.wd = 0.01;
      const int64_t skipped = oracle_step(want, h);
      EXPECT_EQ(skipped, bad_tail ? 8 : 7);
      for (size_t b = 0; b < 7; ++b) expect_block_unchanged(want, start, b);
      // The library's reference implementation, then every other way and every SIMD target, each
      // against the oracle and against the reference's result.
      State ref = start;
      ApplyAdamWQuantStats stats;
      ASSERT_TRUE(run_api(ref, h, options_of(h, Way{"cpu_reference"}), &stats).ok());
      EXPECT_EQ(stats.blocks_skipped_nonfinite, skipped);
      expect_same(ref, want);
      for (const Way &w : ways()) {
        SCOPED_TRACE(way_name(w));
        State got = start;
        ASSERT_TRUE(run_api(got, h, options_of(h, w), &stats).ok());
        EXPECT_EQ(stats.blocks_skipped_nonfinite, skipped);
        expect_same(got, ref);
      }
      fusekit::testing::for_each_simd_target([&](const char *) {
        for (const Way &w : kHwySearches) {
          State got = start;
          ASSERT_TRUE(run_api(got, h, options_of(h, w), &stats).ok());
          EXPECT_EQ(stats.blocks_skipped_nonfinite, skipped);
          expect_same(got, ref);
        }
      });
    }
  }
}

// The gathering path (a row-strided view) applies the same guard: a skipped block is not
// scattered back, and its absmax is not written.
TEST(Step, NonFiniteStateThroughAStridedView) {
  const int64_t rows = 7, cols = 293, stride = 300;  // 2051 elements: nonfinite_state's n
  const State dense = nonfinite_state(DType::kFloat32, true);
  ASSERT_EQ(dense.var.size(), static_cast<size_t>(rows * cols));
  State want = dense;
  Hyper h;
  EXPECT_EQ(oracle_step(want, h), 8);
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    std::vector<float> var(static_cast<size_t>(rows * stride), 7.0f), grad(var.size(), 7.0f);
    std::vector<uint8_t> m(var.size(), 9), v(var.size(), 9);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const auto d = static_cast<size_t>(r * cols + c), x = static_cast<size_t>(r * stride + c);
        var[x] = dense.var.f32[d];
        grad[x] = dense.grad.f32[d];
        m[x] = dense.m[d];
        v[x] = dense.v[d];
      }
    }
    State got = dense;
    const auto B = static_cast<int64_t>(got.absmax_m.size());
    ApplyAdamWQuantStats stats;
    ASSERT_TRUE(fusekit::apply_adam_w_quant_step(
                    TensorView::strided(var.data(), DType::kFloat32, {rows, cols}, {stride, 1}),
                    TensorView::strided(grad.data(), DType::kFloat32, {rows, cols}, {stride, 1}),
                    TensorView::strided(m.data(), DType::kUInt8, {rows, cols}, {stride, 1}),
                    TensorView::strided(v.data(), DType::kUInt8, {rows, cols}, {stride, 1}),
                    TensorView::of(got.qm.data(), {256}), TensorView::of(got.qv.data(), {256}),
                    TensorView::of(got.absmax_m.data(), {B}),
                    TensorView::of(got.absmax_v.data(), {B}), h.step, lr_of(h), options_of(h, w),
                    &stats)
                    .ok());
    EXPECT_EQ(stats.blocks_skipped_nonfinite, 8);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const auto d = static_cast<size_t>(r * cols + c), x = static_cast<size_t>(r * stride + c);
        got.var.f32[d] = var[x];
        got.m[d] = m[x];
        got.v[d] = v[x];
      }
    }
    expect_same(got, want);
  }
}

// The smallest eps accepted (2^-114) with the largest beta2 (1 - 2^-24) at step 0: eps * c2s =
// 2^-114 * 2^-12 = FLT_MIN, still a normal float, so a block of zero gradient and zero state
// divides 0 by it.
TEST(Step, TheSmallestEpsKeepsAZeroBlockFinite) {
  const size_t n = 300;
  State start;
  auto rng = rng_for(22);
  start.var = FloatBuf(DType::kFloat32, uniform(rng, n, -1.f, 1.f));
  start.grad = FloatBuf(DType::kFloat32, std::vector<float>(n, 0.0f));
  start.m.assign(n, 127);
  start.v.assign(n, 0);
  start.absmax_m.assign(2, 0.0f);
  start.absmax_v.assign(2, 0.0f);
  start.qm = fusekit::create_dynamic_map(true);
  start.qv = fusekit::create_dynamic_map(false);
  Hyper h;
  h.eps = 0x1p-114;
  h.beta2 = 1.0 - 0x1p-24;
  h.step = 0;
  ASSERT_EQ(scalars(h).eps_c2s, FLT_MIN);
  State want = start;
  EXPECT_EQ(oracle_step(want, h), 0);
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    State got = start;
    ApplyAdamWQuantStats stats;
    ASSERT_TRUE(run_api(got, h, options_of(h, w), &stats).ok());
    EXPECT_EQ(stats.blocks_skipped_nonfinite, 0);
    expect_same(got, want);
    expect_all_finite(got);
  }
}

// var exactly between two 16-bit numbers: lr * wd = 0.25 scales var by 0.75 (m = 0, so the Adam
// term is 0) and about a quarter of the products are ties.
TEST(Step, SixteenBitStoresRoundHalfToEven) {
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(fusekit::dtype_name(t));
    State s;
    std::vector<uint16_t> bits;
    for (uint32_t b = 0x3c00; b < 0x3c00 + 4096; ++b) bits.push_back(static_cast<uint16_t>(b));
    const size_t n = bits.size();
    s.var.dtype = s.grad.dtype = t;
    s.var.h = bits;
    s.grad.h.assign(n, 0);
    s.m.assign(n, 127);  // the signed dynamic map's 0
    s.v.assign(n, 0);
    s.qm = fusekit::create_dynamic_map(true);
    s.qv = fusekit::create_dynamic_map(false);
    s.absmax_m.assign((n + 255) / 256, 1.0f);
    s.absmax_v.assign((n + 255) / 256, 1.0f);
    Hyper h;
    h.lr = 0.25;
    h.wd = 1.0;
    size_t ties = 0;
    for (uint16_t b : bits) {
      const float x = widen(t, b) * 0.75f;
      const uint32_t xb = std::bit_cast<uint32_t>(x);
      ties += t == DType::kBFloat16 ? (xb & 0xffffu) == 0x8000u : false;
    }
    if (t == DType::kBFloat16) {
      EXPECT_GT(ties, 100u);
    }
    State want = s;
    oracle_step(want, h);
    for (const Way &w : ways()) {
      SCOPED_TRACE(way_name(w));
      State got = s;
      ASSERT_TRUE(run_api(got, h, options_of(h, w)).ok());
      expect_same(got, want);
    }
  }
  // The spec's two examples, through the kernels: var = 2 (resp. 2^17) in bfloat16, m = g = 0, and
  // lr * wd chosen so that the decay gives exactly 1.01171875 (resp. 65520), halfway between two
  // bfloat16 numbers: round-to-nearest-even gives 0x3F82 and 0x4780 (truncation 0x3F81, 0x477F).
  const float starts[] = {2.0f, 131072.0f};
  const double lrs[] = {0.494140625, 0.5001220703125};
  const uint16_t expected[] = {0x3f82, 0x4780};
  for (int k = 0; k < 2; ++k) {
    for (const Way &w : ways()) {
      SCOPED_TRACE(way_name(w));
      State s;
      s.var = FloatBuf(DType::kBFloat16, std::vector<float>(300, starts[k]));
      s.grad = FloatBuf(DType::kBFloat16, std::vector<float>(300, 0.0f));
      s.m.assign(300, 127);
      s.v.assign(300, 0);
      s.qm = fusekit::create_dynamic_map(true);
      s.qv = fusekit::create_dynamic_map(false);
      s.absmax_m = {1.0f, 1.0f};
      s.absmax_v = {1.0f, 1.0f};
      Hyper h;
      h.lr = lrs[k];
      h.wd = 1.0;
      ASSERT_TRUE(run_api(s, h, options_of(h, w)).ok());
      for (size_t i = 0; i < 300; ++i) ASSERT_EQ(s.var.h[i], expected[k]) << i;
    }
  }
}

// Strided views run on the gathering path and give the contiguous result.
TEST(Step, StridedViews) {
  const int64_t rows = 37, cols = 300, stride = 320;
  const size_t n = static_cast<size_t>(rows * cols);
  const State dense = make_state(15, DType::kFloat32, n, fusekit::create_dynamic_map(true),
                                 fusekit::create_dynamic_map(false));
  State want = dense;
  Hyper h;
  oracle_step(want, h);
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    // Scatter the dense tensors into padded storage.
    std::vector<float> var(static_cast<size_t>(rows * stride), 7.0f), grad(var.size(), 7.0f);
    std::vector<uint8_t> m(var.size(), 9), v(var.size(), 9);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const auto d = static_cast<size_t>(r * cols + c),
                   sidx = static_cast<size_t>(r * stride + c);
        var[sidx] = dense.var.f32[d];
        grad[sidx] = dense.grad.f32[d];
        m[sidx] = dense.m[d];
        v[sidx] = dense.v[d];
      }
    }
    State got = dense;
    const auto B = static_cast<int64_t>(got.absmax_m.size());
    ASSERT_TRUE(fusekit::apply_adam_w_quant_step(
                    TensorView::strided(var.data(), DType::kFloat32, {rows, cols}, {stride, 1}),
                    TensorView::strided(grad.data(), DType::kFloat32, {rows, cols}, {stride, 1}),
                    TensorView::strided(m.data(), DType::kUInt8, {rows, cols}, {stride, 1}),
                    TensorView::strided(v.data(), DType::kUInt8, {rows, cols}, {stride, 1}),
                    TensorView::of(got.qm.data(), {256}), TensorView::of(got.qv.data(), {256}),
                    TensorView::of(got.absmax_m.data(), {B}),
                    TensorView::of(got.absmax_v.data(), {B}), h.step, lr_of(h), options_of(h, w))
                    .ok());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < stride; ++c) {
        const auto d = static_cast<size_t>(r * cols + c),
                   sidx = static_cast<size_t>(r * stride + c);
        if (c >= cols) {
          ASSERT_EQ(var[sidx], 7.0f);
          ASSERT_EQ(m[sidx], 9);
          continue;
        }
        got.var.f32[d] = var[sidx];
        got.m[d] = m[sidx];
        got.v[d] = v[sidx];
      }
    }
    expect_same(got, want);
  }
}

// Dimensions of size 1 may have any stride (nothing steps by it), even 2^61 or 2^62 - 1: var,
// grad, m and v of shape [1, 200, 1] with such strides on both size-1 dimensions, contiguous
// (stride 1: the kernels' path) or every other element (stride 2: each block gathered), and absmax
// of one block with such a stride. No address may be formed from those strides (UBSan reports
// one in the sanitizer builds). Every implementation and SIMD target, against the oracle.
TEST(Step, HugeStridesOfSizeOneDimensionsFormNoAddressOutsideTheTensors) {
  const int64_t n = 200;
  const State start = make_state(16, DType::kFloat32, n, fusekit::create_dynamic_map(true),
                                 fusekit::create_dynamic_map(false));
  State want = start;
  Hyper h;
  h.wd = 0.01;
  EXPECT_EQ(oracle_step(want, h), 0);
  for (const int64_t huge : {int64_t{1} << 61, (int64_t{1} << 62) - 1}) {
    for (const int64_t step : {int64_t{1}, int64_t{2}}) {
      SCOPED_TRACE(::testing::Message() << "stride " << huge << ", elements " << step << " apart");
      auto check = [&](const Way &w) {
        SCOPED_TRACE(way_name(w));
        std::vector<float> var(static_cast<size_t>(n * step), 7.0f), grad(var.size(), 7.0f);
        std::vector<uint8_t> m(var.size(), 9), v(var.size(), 9);
        for (int64_t i = 0; i < n; ++i) {
          const auto d = static_cast<size_t>(i), sidx = static_cast<size_t>(i * step);
          var[sidx] = start.var.f32[d];
          grad[sidx] = start.grad.f32[d];
          m[sidx] = start.m[d];
          v[sidx] = start.v[d];
        }
        State got = start;
        auto view = [&](void *p, DType t) {
          return TensorView::strided(p, t, {1, n, 1}, {huge, step, huge});
        };
        ASSERT_TRUE(fusekit::apply_adam_w_quant_step(
                        view(var.data(), DType::kFloat32), view(grad.data(), DType::kFloat32),
                        view(m.data(), DType::kUInt8), view(v.data(), DType::kUInt8),
                        TensorView::of(got.qm.data(), {256}), TensorView::of(got.qv.data(), {256}),
                        TensorView::strided(got.absmax_m.data(), DType::kFloat32, {1}, {huge}),
                        TensorView::strided(got.absmax_v.data(), DType::kFloat32, {1}, {huge}),
                        h.step, lr_of(h), options_of(h, w))
                        .ok());
        for (int64_t i = 0; i < n * step; ++i) {
          const auto sidx = static_cast<size_t>(i);
          if (i % step != 0) {
            ASSERT_EQ(var[sidx], 7.0f);
            ASSERT_EQ(m[sidx], 9);
            continue;
          }
          const auto d = static_cast<size_t>(i / step);
          got.var.f32[d] = var[sidx];
          got.m[d] = m[sidx];
          got.v[d] = v[sidx];
        }
        expect_same(got, want);
      };
      for (const Way &w : ways()) check(w);
      fusekit::testing::for_each_simd_target([&](const char *) {
        for (const Way &w : kHwySearches) check(w);
      });
    }
  }
}

// Normalized values on and around every decision point, through the kernels: beta1 = beta2 = 0
// makes m = g and v = g * g, and one element of 3 makes absmax_m = 3, so m / absmax lands within an
// ulp or two of each midpoint of the map (where m * (1 / 3) and m / 3 can round differently).
TEST(Step, CodesAroundEveryMidpoint) {
  const Map qm = fusekit::create_dynamic_map(true), qv = fusekit::create_dynamic_map(false);
  std::vector<float> g;
  for (int i = 0; i < 255; ++i) {
    for (const Map *q : {&qm, &qv}) {
      const float mid = ((*q)[i] + (*q)[i + 1]) / 2;
      float x = mid * 3.0f;
      for (int k = 0; k < 6; ++k) x = std::nextafter(x, -INFINITY);
      for (int k = 0; k < 13; ++k, x = std::nextafter(x, INFINITY)) g.push_back(x);
    }
  }
  // Blocks of 255 values plus one 3 (the block's absmax).
  std::vector<float> grads;
  for (size_t i = 0; i < g.size(); ++i) {
    if (grads.size() % 256 == 0) grads.push_back(3.0f);
    grads.push_back(g[i]);
  }
  const size_t n = grads.size();
  State start;
  start.var = FloatBuf(DType::kFloat32, std::vector<float>(n, 0.5f));
  start.grad = FloatBuf(DType::kFloat32, grads);
  start.m.assign(n, 127);
  start.v.assign(n, 0);
  start.absmax_m.assign((n + 255) / 256, 0.0f);
  start.absmax_v.assign((n + 255) / 256, 0.0f);
  start.qm = qm;
  start.qv = qv;
  Hyper h;
  h.beta1 = 0.0;
  h.beta2 = 0.0;
  State want = start;
  oracle_step(want, h);
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    State got = start;
    ASSERT_TRUE(run_api(got, h, options_of(h, w)).ok());
    expect_same(got, want);
  }
}

// A transposed (column-major) view, bfloat16: no dimension is contiguous.
TEST(Step, TransposedViews) {
  const int64_t rows = 29, cols = 41;
  const size_t n = static_cast<size_t>(rows * cols);
  const State dense = make_state(16, DType::kBFloat16, n, fusekit::create_dynamic_map(true),
                                 fusekit::create_dynamic_map(false));
  State want = dense;
  Hyper h;
  h.wd = 0.05;
  oracle_step(want, h);
  std::vector<uint16_t> var(n), grad(n);
  std::vector<uint8_t> m(n), v(n);
  auto at = [&](int64_t r, int64_t c) { return static_cast<size_t>(c * rows + r); };
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const auto d = static_cast<size_t>(r * cols + c);
      var[at(r, c)] = dense.var.h[d];
      grad[at(r, c)] = dense.grad.h[d];
      m[at(r, c)] = dense.m[d];
      v[at(r, c)] = dense.v[d];
    }
  }
  const auto B = static_cast<int64_t>(dense.absmax_m.size());
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    std::vector<uint16_t> var_k = var;
    std::vector<uint8_t> m_k = m, v_k = v;
    State g2 = dense;
    const ApplyAdamWQuantOptions o = options_of(h, w);
    ASSERT_TRUE(fusekit::apply_adam_w_quant_step(
                    TensorView::strided(var_k.data(), DType::kBFloat16, {rows, cols}, {1, rows}),
                    TensorView::strided(grad.data(), DType::kBFloat16, {rows, cols}, {1, rows}),
                    TensorView::strided(m_k.data(), DType::kUInt8, {rows, cols}, {1, rows}),
                    TensorView::strided(v_k.data(), DType::kUInt8, {rows, cols}, {1, rows}),
                    TensorView::of(g2.qm.data(), {256}), TensorView::of(g2.qv.data(), {256}),
                    TensorView::of(g2.absmax_m.data(), {B}),
                    TensorView::of(g2.absmax_v.data(), {B}), h.step, lr_of(h), o)
                    .ok());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const auto d = static_cast<size_t>(r * cols + c);
        g2.var.h[d] = var_k[at(r, c)];
        g2.m[d] = m_k[at(r, c)];
        g2.v[d] = v_k[at(r, c)];
      }
    }
    expect_same(g2, want);
  }
}

// ================================================================================================
// Refusals, through the aclnn face: code, message, nothing written
// ================================================================================================
struct AclCase {
  std::vector<float> var, grad, qm, qv, am, av;
  std::vector<uint8_t> m, v;
  std::vector<int64_t> step = {3};
  std::vector<int64_t> shape = {2, 300};
  aclTensor *t_var = nullptr, *t_grad = nullptr, *t_m = nullptr, *t_v = nullptr, *t_qm = nullptr,
            *t_qv = nullptr, *t_am = nullptr, *t_av = nullptr, *t_step = nullptr;
  AclCase() {
    auto rng = rng_for(20);
    var = uniform(rng, 600, -1, 1);
    grad = uniform(rng, 600, -1, 1);
    m.assign(600, 100);
    v.assign(600, 50);
    const Map a = fusekit::create_dynamic_map(true), b = fusekit::create_dynamic_map(false);
    qm.assign(a.begin(), a.end());
    qv.assign(b.begin(), b.end());
    am = {0.1f, 0.2f, 0.3f};
    av = {0.01f, 0.02f, 0.03f};
    make();
  }
  static aclTensor *tensor(void *p, std::vector<int64_t> shape, aclDataType dt) {
    return aclCreateTensor(shape.data(), shape.size(), dt, nullptr, 0, ACL_FORMAT_ND, shape.data(),
                           shape.size(), p);
  }
  void make() {
    t_var = tensor(var.data(), shape, ACL_FLOAT);
    t_grad = tensor(grad.data(), shape, ACL_FLOAT);
    t_m = tensor(m.data(), shape, ACL_UINT8);
    t_v = tensor(v.data(), shape, ACL_UINT8);
    t_qm = tensor(qm.data(), {256}, ACL_FLOAT);
    t_qv = tensor(qv.data(), {256}, ACL_FLOAT);
    t_am = tensor(am.data(), {3}, ACL_FLOAT);
    t_av = tensor(av.data(), {3}, ACL_FLOAT);
    t_step = tensor(step.data(), {1}, ACL_INT64);
  }
  ~AclCase() {
    for (aclTensor *t : {t_var, t_grad, t_m, t_v, t_qm, t_qv, t_am, t_av, t_step})
      aclDestroyTensor(t);
  }
  // Phase one then (if it succeeds) phase two; returns the first failing status.
  aclnnStatus run(const char *mode = "BLOCKWISE", int64_t block = 256, double lr = 1e-3,
                  double beta1 = 0.9, double eps = 1e-8) {
    uint64_t ws_size = 0;
    aclOpExecutor *ex = nullptr;
    aclnnStatus s = aclnnApplyAdamWQuantGetWorkspaceSize(
        t_var, t_grad, t_m, t_v, t_qm, t_qv, t_am, t_av, t_step, lr, beta1, 0.999, 0.01, eps, 1.0,
        const_cast<char *>(mode), block, &ws_size, &ex);
    if (s != ACLNN_SUCCESS) return s;
    std::vector<char> ws(ws_size);
    return aclnnApplyAdamWQuant(ws.data(), ws_size, ex, nullptr);
  }
};

struct Snapshot {
  std::vector<float> var, am, av;
  std::vector<uint8_t> m, v;
  explicit Snapshot(const AclCase &c) : var(c.var), am(c.am), av(c.av), m(c.m), v(c.v) {}
  bool same(const AclCase &c) const {
    return std::memcmp(var.data(), c.var.data(), var.size() * 4) == 0 && am == c.am && av == c.av &&
           m == c.m && v == c.v;
  }
};

void expect_refused(AclCase &c, aclnnStatus got, aclnnStatus code, const std::string &fragment,
                    const Snapshot &before) {
  EXPECT_EQ(got, code);
  const std::string msg = aclGetRecentErrMsg();
  EXPECT_EQ(msg.rfind("aclnnApplyAdamWQuant", 0), 0u) << msg;
  EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
  EXPECT_TRUE(before.same(c)) << "a refused call modified its tensors: " << msg;
}

TEST(Refusals, EachWithItsCodeAndMessageAndNothingWritten) {
  {
    AclCase c;
    Snapshot s(c);
    ASSERT_EQ(c.run(), ACLNN_SUCCESS) << aclGetRecentErrMsg();
    EXPECT_FALSE(s.same(c));  // the baseline does write
  }
  {
    AclCase c;
    Snapshot s(c);
    aclDestroyTensor(c.t_grad);
    c.t_grad = nullptr;
    expect_refused(c, c.run(), 161001, "grad is null", s);
  }
  {
    AclCase c;
    Snapshot s(c);
    aclDestroyTensor(c.t_grad);
    c.t_grad = AclCase::tensor(c.grad.data(), {2, 300}, ACL_FLOAT16);
    expect_refused(c, c.run(), 161002, "grad has dtype float16", s);
  }
  {
    AclCase c;
    Snapshot s(c);
    aclDestroyTensor(c.t_m);
    c.t_m = AclCase::tensor(c.m.data(), {3, 200}, ACL_UINT8);
    expect_refused(c, c.run(), 161002, "mRef has shape [3, 200]", s);
  }
  {
    AclCase c;
    Snapshot s(c);
    aclDestroyTensor(c.t_av);
    c.t_av = AclCase::tensor(c.av.data(), {2}, ACL_FLOAT);
    expect_refused(c, c.run(), 161002, "absmaxVRef must be float32 [3]", s);
  }
  {
    AclCase c;
    Snapshot s(c);
    aclDestroyTensor(c.t_qm);
    c.t_qm = AclCase::tensor(c.qm.data(), {255}, ACL_FLOAT);
    expect_refused(c, c.run(), 161002, "qmapM must be float32 [256]", s);
  }
  {
    AclCase c;
    Snapshot s(c);
    aclDestroyTensor(c.t_step);
    c.t_step = AclCase::tensor(c.step.data(), {1}, ACL_INT32);
    expect_refused(c, c.run(), 161002, "step must be int64 [1]", s);
  }
  {
    AclCase c;
    Snapshot s(c);
    expect_refused(c, c.run("BLOCKWISE", 128), 161002, "blockSize = 128", s);
  }
  {
    AclCase c;
    Snapshot s(c);
    expect_refused(c, c.run("TENSORWISE"), 161002, "quantModeOptional = \"TENSORWISE\"", s);
  }
  {
    AclCase c;
    Snapshot s(c);
    expect_refused(c, c.run("BLOCKWISE", 256, 1e-3, 1.0), 161002, "beta1 = 1", s);
  }
  {
    AclCase c;
    Snapshot s(c);
    expect_refused(c, c.run("BLOCKWISE", 256, std::nan("")), 161002, "lr = nan", s);
  }
  {
    AclCase c;  // eps * sqrt(1 - beta2^t) would round to 0 in float32: refused in phase one
    Snapshot s(c);
    expect_refused(c, c.run("BLOCKWISE", 256, 1e-3, 0.9, 1e-45), 161002,
                   "eps = 1e-45 must be finite and >= 4.81482486e-35", s);
  }
  {
    AclCase c;  // grad overlapping var
    Snapshot s(c);
    aclDestroyTensor(c.t_grad);
    c.t_grad = AclCase::tensor(c.var.data(), {2, 300}, ACL_FLOAT);
    expect_refused(c, c.run(), 161002, "varRef and grad overlap", s);
  }
  {
    AclCase c;  // absmax inside m's codes
    Snapshot s(c);
    aclDestroyTensor(c.t_am);
    c.t_am = AclCase::tensor(c.m.data() + 4, {3}, ACL_FLOAT);
    expect_refused(c, c.run(), 161002, "mRef and absmaxMRef overlap", s);
  }
  {
    AclCase c;  // phase two: a map out of order
    std::swap(c.qv[40], c.qv[41]);
    Snapshot s(c);
    expect_refused(c, c.run(), 161002, "qmapV[41]", s);
  }
  {
    AclCase c;  // phase two: a non-finite map entry
    c.qm[3] = std::numeric_limits<float>::infinity();
    std::sort(c.qm.begin(), c.qm.end());
    Snapshot s(c);
    expect_refused(c, c.run(), 161002, "qmapM[255] = inf", s);
  }
  {
    AclCase c;  // phase two: step read when it runs
    c.step[0] = -1;
    Snapshot s(c);
    expect_refused(c, c.run(), 161002, "step = -1", s);
  }
}

TEST(Refusals, NonFiniteBlocksWarnOnTheAclnnPath) {
  AclCase c;
  c.grad[300] = std::numeric_limits<float>::quiet_NaN();
  ASSERT_EQ(c.run(), ACLNN_SUCCESS);
  EXPECT_NE(std::string(aclGetRecentErrMsg()).find("1 of 3 blocks were left unchanged"),
            std::string::npos)
      << aclGetRecentErrMsg();
}

TEST(Refusals, CppApiChecks) {
  State s = make_state(21, DType::kFloat32, 1000, fusekit::create_dynamic_map(true),
                       fusekit::create_dynamic_map(false));
  Hyper h;
  ApplyAdamWQuantOptions o = options_of(h);
  o.block_size = 64;
  Status st = run_api(s, h, o);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "ApplyAdamWQuant: blockSize = 64; only 256 is supported");
  o = options_of(h);
  o.eps = 0;
  st = run_api(s, h, o);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("eps = 0"), std::string::npos);
  // eps below 2^-114 in float32 (eps * c2s could round to 0): refused, naming the value and rule.
  for (double eps : {1e-45, 1e-40, 1e-36, static_cast<double>(std::nextafter(0x1p-114f, 0.0f))}) {
    SCOPED_TRACE(eps);
    o.eps = eps;
    st = run_api(s, h, o);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("ApplyAdamWQuant: eps = "), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(">= 4.81482486e-35"), std::string::npos) << st.message();
  }
  EXPECT_EQ(
      st.message(),
      "ApplyAdamWQuant: eps = 4.81482457e-35 must be finite and >= 4.81482486e-35 (2^-114) in "
      "float32, so that eps * sqrt(1 - beta2^t) >= 2^-126 is never 0");
  o.eps = 0x1p-114;  // the smallest accepted
  EXPECT_TRUE(run_api(s, h, o).ok());
  o.eps = 1e-8;
  h.step = -5;
  st = run_api(s, h, options_of(h));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("step = -5"), std::string::npos);
  // A written view that reaches an element twice.
  std::vector<float> var(600), grad(600);
  std::vector<uint8_t> m(600), v(600);
  std::vector<float> am(3), av(3);
  Map qm = fusekit::create_dynamic_map(true), qv = fusekit::create_dynamic_map(false);
  st = fusekit::apply_adam_w_quant_step(
      TensorView::strided(var.data(), DType::kFloat32, {2, 300}, {0, 1}),
      TensorView::of(grad.data(), {2, 300}), TensorView::of(m.data(), {2, 300}),
      TensorView::of(v.data(), {2, 300}), TensorView::of(qm.data(), {256}),
      TensorView::of(qv.data(), {256}), TensorView::of(am.data(), {3}),
      TensorView::of(av.data(), {3}), 0, 1e-3f);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("reaches some elements twice"), std::string::npos) << st.message();
}

// ================================================================================================
// The implementation list and the plan: problem, plan, bind and run
// ================================================================================================
TEST(ApplyAdamWQuantPlan, TheImplementationListAndWhatThisMachineRuns) {
  EXPECT_EQ(ApplyAdamWQuant::implementations(),
            (std::vector<std::string>{"cpu_avx512vbmi", "cpu_hwy", "cpu_hwy_table",
                                      "cpu_hwy_binary_search", "cpu_reference"}));
  EXPECT_TRUE(supported("cpu_hwy"));
  EXPECT_TRUE(supported("cpu_hwy_table"));
  EXPECT_TRUE(supported("cpu_hwy_binary_search"));
  EXPECT_TRUE(supported("cpu_reference"));
#if defined(__x86_64__)
  // Where the CPU has VBMI its kernel must be tested, not skipped.
  const bool vbmi = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                    __builtin_cpu_supports("avx512vbmi");
  EXPECT_EQ(supported("cpu_avx512vbmi"), vbmi);
#endif
  // The plan takes the first supported one.
  State s = make_state(400, DType::kFloat32, 300, fusekit::create_dynamic_map(true),
                       fusekit::create_dynamic_map(false));
  ApplyAdamWQuantProblem problem;
  ASSERT_TRUE(ApplyAdamWQuantProblem::make(tensors_of(s), {}, &problem).ok());
  ApplyAdamWQuant plan;
  ASSERT_TRUE(ApplyAdamWQuant::plan(problem, {}, &plan).ok());
  EXPECT_EQ(plan.implementation(), ways().front().impl);
  // cpu_hwy's two variants are planned by name only: no automatic choice lands on them.
  ApplyAdamWQuantOptions o;
  o.kernel = fusekit::KernelChoice::kOptimized;
  ASSERT_TRUE(ApplyAdamWQuant::plan(problem, o, &plan).ok());
  EXPECT_STRNE(plan.implementation(), "cpu_hwy_table");
  EXPECT_STRNE(plan.implementation(), "cpu_hwy_binary_search");
  // cpu_hwy uses the lookup tables from 65,536 elements on: its workspace says so.
  ApplyAdamWQuant table, search, automatic;
  o.implementation = "cpu_hwy_table";
  ASSERT_TRUE(ApplyAdamWQuant::plan(problem, o, &table).ok());
  o.implementation = "cpu_hwy_binary_search";
  ASSERT_TRUE(ApplyAdamWQuant::plan(problem, o, &search).ok());
  o.implementation = "cpu_hwy";
  ASSERT_TRUE(ApplyAdamWQuant::plan(problem, o, &automatic).ok());
  EXPECT_GT(table.workspace_size(), search.workspace_size());
  EXPECT_EQ(automatic.workspace_size(), search.workspace_size());  // 300 elements: no table
}

// One plan, many runs: each with new tensors (new pointers) and new data, the maps alternating
// between the dynamic and the linspace maps; each run equals a fresh one-call step bit for bit.
TEST(ApplyAdamWQuantPlan, OnePlanManyRunsEqualFreshCalls) {
  const size_t n = 256 * 5 + 77;
  Hyper h;
  h.wd = 0.01;
  h.gnorm = 0.8;
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    const ApplyAdamWQuantOptions o = options_of(h, w);
    State first = make_state(401, DType::kBFloat16, n, fusekit::create_dynamic_map(true),
                             fusekit::create_dynamic_map(false));
    ApplyAdamWQuantProblem problem;
    ASSERT_TRUE(ApplyAdamWQuantProblem::make(tensors_of(first), o, &problem).ok());
    ApplyAdamWQuant plan;
    ASSERT_TRUE(ApplyAdamWQuant::plan(problem, o, &plan).ok());
    EXPECT_EQ(plan.implementation(), w.impl);
    std::vector<char> ws(plan.workspace_size());
    for (int k = 0; k < 6; ++k) {
      SCOPED_TRACE(k);
      const bool linspace = k % 2 == 1;
      const auto start = std::make_unique<State>(
          make_state(410 + static_cast<uint64_t>(k), DType::kBFloat16, n,
                     linspace ? linspace_map(-1, 1) : fusekit::create_dynamic_map(true),
                     linspace ? linspace_map(0, 1) : fusekit::create_dynamic_map(false)));
      auto got = std::make_unique<State>(*start);
      State fresh = *start, want = *start;
      Hyper hk = h;
      hk.step = 3 * k + 1;
      ApplyAdamWQuantScalars sc;
      sc.step = hk.step;
      sc.lr = lr_of(hk);
      ApplyAdamWQuantStats stats;
      ASSERT_TRUE(plan.run(tensors_of(*got), sc, ws.data(), ws.size(), &stats).ok());
      EXPECT_EQ(stats.blocks_updated, 6);
      ASSERT_TRUE(run_api(fresh, hk, o).ok());
      expect_same(*got, fresh);
      oracle_step(want, hk);
      expect_same(*got, want);
    }
  }
}

// The search tables a thread keeps are used only for a map with the same bits: a map changed in
// place (same pointer) between two runs is seen, and a map made invalid is refused.
TEST(ApplyAdamWQuantPlan, AMapChangedInPlaceBetweenRunsIsSeen) {
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    Hyper h;
    State s = make_state(420, DType::kFloat32, 1000, fusekit::create_dynamic_map(true),
                         fusekit::create_dynamic_map(false));
    const auto N = static_cast<int64_t>(s.var.size()), B = static_cast<int64_t>(s.absmax_m.size());
    ApplyAdamWQuant plan;
    ASSERT_TRUE(ApplyAdamWQuant::plan(
                    s.var.view(), s.grad.view(), TensorView::of(s.m.data(), {N}),
                    TensorView::of(s.v.data(), {N}), TensorView::of(s.qm.data(), {256}),
                    TensorView::of(s.qv.data(), {256}), TensorView::of(s.absmax_m.data(), {B}),
                    TensorView::of(s.absmax_v.data(), {B}), options_of(h, w), &plan)
                    .ok());
    std::vector<char> ws(plan.workspace_size());
    State want = s;
    oracle_step(want, h);
    ASSERT_TRUE(plan.run(h.step, lr_of(h), ws.data(), ws.size()).ok());
    expect_same(s, want);
    // Move two entries of each map (still ascending), in place.
    for (Map *q : {&s.qm, &s.qv}) {
      (*q)[200] = ((*q)[199] + (*q)[200]) / 2;
      (*q)[60] = ((*q)[60] + (*q)[61]) / 2;
    }
    want = s;
    h.step = 11;
    oracle_step(want, h);
    ASSERT_TRUE(plan.run(h.step, lr_of(h), ws.data(), ws.size()).ok());
    expect_same(s, want);
    // A map that is no longer ascending: refused, nothing written.
    std::swap(s.qv[40], s.qv[41]);
    const State before = s;
    const Status st = plan.run(12, 1e-3f, ws.data(), ws.size());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("qmapV[41]"), std::string::npos) << st.message();
    expect_same(s, before);
  }
}

TEST(ApplyAdamWQuantPlan, ABindingOfAnotherLayoutIsRefusedAndNothingIsWritten) {
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    Hyper h;
    State s = make_state(430, DType::kFloat32, 600, fusekit::create_dynamic_map(true),
                         fusekit::create_dynamic_map(false));
    const ApplyAdamWQuantOptions o = options_of(h, w);
    ApplyAdamWQuantProblem problem;
    ASSERT_TRUE(ApplyAdamWQuantProblem::make(tensors_of(s), o, &problem).ok());
    ApplyAdamWQuant plan;
    ASSERT_TRUE(ApplyAdamWQuant::plan(problem, o, &plan).ok());
    std::vector<char> ws(plan.workspace_size());
    const State before = s;
    // Other storage, poisoned: must stay as it is.
    std::vector<uint16_t> half(600, 0x7fa5);
    std::vector<float> wide(1200, fusekit::testing::poison_float());
    std::vector<uint8_t> codes(1200, 0xa5);
    Map unordered = s.qm;
    std::swap(unordered[40], unordered[41]);
    struct Binding {
      const char *what, *fragment;
      ApplyAdamWQuantTensors t;
      ApplyAdamWQuantScalars sc;
    };
    std::vector<Binding> cases;
    const ApplyAdamWQuantTensors t = tensors_of(s);
    ApplyAdamWQuantScalars sc;
    sc.step = 10;
    cases.push_back({"var of another dtype", "varRef is bfloat16", t, sc});
    cases.back().t.var = TensorView::contiguous(half.data(), DType::kBFloat16, {600});
    cases.push_back({"var of another shape", "varRef is float32 [2, 300]", t, sc});
    cases.back().t.var = TensorView::of(wide.data(), {2, 300});
    cases.push_back({"m with another stride", "mRef", t, sc});
    cases.back().t.m = TensorView::strided(codes.data(), DType::kUInt8, {600}, {2});
    cases.push_back({"a map with another stride", "qmapM", t, sc});
    cases.back().t.qmap_m = TensorView::strided(wide.data(), DType::kFloat32, {256}, {2});
    cases.push_back({"absmax of another length", "absmaxVRef", t, sc});
    cases.back().t.absmax_v = TensorView::of(wide.data(), {2});
    cases.push_back({"null data", "grad has no data", t, sc});
    cases.back().t.grad.data = nullptr;
    cases.push_back({"m aliasing v", "mRef and vRef overlap", t, sc});
    cases.back().t.m = t.v;
    cases.push_back({"another device", "varRef", t, sc});
    cases.back().t.var.device = fusekit::Device::kCuda;
    cases.push_back({"a step tensor of another dtype", "step must be one int64", t, sc});
    cases.back().sc.step_tensor = TensorView::of(codes.data(), {1});
    cases.push_back({"a step out of range", "step = -1", t, sc});
    cases.back().sc.step = -1;
    cases.push_back({"an infinite lr", "lr = inf must be finite and >= 0", t, sc});
    cases.back().sc.lr = std::numeric_limits<float>::infinity();
    cases.push_back({"a map out of order", "qmapM[41]", t, sc});
    cases.back().t.qmap_m = TensorView::of(unordered.data(), {256});
    for (const Binding &c : cases) {
      SCOPED_TRACE(c.what);
      const Status st = plan.run(c.t, c.sc, ws.data(), ws.size());
      EXPECT_FALSE(st.ok());
      EXPECT_NE(st.message().find(c.fragment), std::string::npos) << st.message();
      expect_same(s, before);
      EXPECT_TRUE(std::all_of(half.begin(), half.end(), [](uint16_t x) { return x == 0x7fa5; }));
      EXPECT_TRUE(std::all_of(wide.begin(), wide.end(), fusekit::testing::is_poison));
      EXPECT_TRUE(std::all_of(codes.begin(), codes.end(), [](uint8_t x) { return x == 0xa5; }));
    }
    // A workspace that is too small.
    if (plan.workspace_size() > 0) {
      EXPECT_EQ(plan.run(t, sc, ws.data(), ws.size() - 1).code(), StatusCode::kInvalidArgument);
      expect_same(s, before);
    }
    // The same plan still runs on the right tensors afterwards.
    ASSERT_TRUE(plan.run(t, sc, ws.data(), ws.size()).ok());
    State want = before;
    h.step = 10;
    oracle_step(want, h);
    expect_same(s, want);
  }
}

TEST(ApplyAdamWQuantPlan, StepFromATensorIsReadAtRunTime) {
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    Hyper h;
    State s = make_state(450, DType::kFloat16, 700, fusekit::create_dynamic_map(true),
                         fusekit::create_dynamic_map(false));
    ApplyAdamWQuantProblem problem;
    ASSERT_TRUE(ApplyAdamWQuantProblem::make(tensors_of(s), options_of(h, w), &problem).ok());
    ApplyAdamWQuant plan;
    ASSERT_TRUE(ApplyAdamWQuant::plan(problem, options_of(h, w), &plan).ok());
    int64_t step = 0;
    ApplyAdamWQuantScalars sc;
    sc.step = 999;  // not used: the tensor wins
    sc.step_tensor = TensorView::of(&step, {1});
    step = h.step = 77;  // set after the plan, before the run
    State want = s;
    oracle_step(want, h);
    std::vector<char> ws(plan.workspace_size());
    ASSERT_TRUE(plan.run(tensors_of(s), sc, ws.data(), ws.size()).ok());
    expect_same(s, want);
  }
}

// An empty tensor: no workspace, nothing written, the maps still checked.
TEST(ApplyAdamWQuantPlan, EmptyTensorNeedsNoWorkspaceButChecksTheMaps) {
  Map qm = fusekit::create_dynamic_map(true), qv = fusekit::create_dynamic_map(false);
  float dummy = 0;
  uint8_t code = 0;
  const ApplyAdamWQuantTensors t{TensorView::of(&dummy, {0}),      TensorView::of(&dummy, {0}),
                                 TensorView::of(&code, {0}),       TensorView::of(&code, {0}),
                                 TensorView::of(qm.data(), {256}), TensorView::of(qv.data(), {256}),
                                 TensorView::of(&dummy, {0}),      TensorView::of(&dummy, {0})};
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    ApplyAdamWQuantProblem problem;
    ASSERT_TRUE(ApplyAdamWQuantProblem::make(t, options_of(Hyper{}, w), &problem).ok());
    ApplyAdamWQuant plan;
    ASSERT_TRUE(ApplyAdamWQuant::plan(problem, options_of(Hyper{}, w), &plan).ok());
    EXPECT_EQ(plan.workspace_size(), 0u);
    ApplyAdamWQuantStats stats;
    ASSERT_TRUE(plan.run(t, {}, nullptr, 0, &stats).ok());
    EXPECT_EQ(stats.blocks_updated, 0);
    qm[3] = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(plan.run(t, {}, nullptr, 0).code(), StatusCode::kInvalidArgument);
    qm = fusekit::create_dynamic_map(true);
  }
}

// One plan run from two threads at once, each with its own tensors and maps (each thread keeps
// its own search tables), each thread's result on the oracle.
TEST(ApplyAdamWQuantPlan, OnePlanFromTwoThreadsWithTheirOwnMaps) {
  const size_t n = 256 * 40 + 3;
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    Hyper h;
    State a = make_state(460, DType::kFloat32, n, fusekit::create_dynamic_map(true),
                         fusekit::create_dynamic_map(false));
    State b = make_state(461, DType::kFloat32, n, linspace_map(-1, 1), linspace_map(0, 1));
    ApplyAdamWQuantOptions o = options_of(h, w);
    o.num_threads = 2;
    ApplyAdamWQuantProblem problem;
    ASSERT_TRUE(ApplyAdamWQuantProblem::make(tensors_of(a), o, &problem).ok());
    ApplyAdamWQuant plan;
    ASSERT_TRUE(ApplyAdamWQuant::plan(problem, o, &plan).ok());
    State want_a = a, want_b = b;
    constexpr int kSteps = 8;
    for (int k = 0; k < kSteps; ++k) {
      Hyper hk = h;
      hk.step = k;
      oracle_step(want_a, hk);
      oracle_step(want_b, hk);
    }
    bool ok_a = true, ok_b = true;
    auto loop = [&](State *s, bool *ok) {
      std::vector<char> ws(plan.workspace_size());
      for (int k = 0; k < kSteps; ++k) {
        *ok = *ok && plan.run(tensors_of(*s), scalars_at(k), ws.data(), ws.size()).ok();
      }
    };
    std::thread ta(loop, &a, &ok_a), tb(loop, &b, &ok_b);
    ta.join();
    tb.join();
    EXPECT_TRUE(ok_a && ok_b);
    expect_same(a, want_a);
    expect_same(b, want_b);
  }
}

TEST(ApplyAdamWQuantPlan, VerboseNamesTheImplementation) {
  // FUSEKIT_VERBOSE is read once per process: this checks the line when the variable is set for
  // the test binary (ctest sets it for this test; see CMakeLists.txt), and passes trivially
  // otherwise.
  if (std::getenv("FUSEKIT_VERBOSE") == nullptr) GTEST_SKIP() << "FUSEKIT_VERBOSE not set";
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    Hyper h;
    State s = make_state(470, DType::kFloat32, 600, fusekit::create_dynamic_map(true),
                         fusekit::create_dynamic_map(false));
    ::testing::internal::CaptureStderr();
    ASSERT_TRUE(run_api(s, h, options_of(h, w)).ok());
    ASSERT_TRUE(run_api(s, h, options_of(h, w)).ok());  // the same maps: the tables are kept
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("fusekit_verbose,ApplyAdamWQuant,n=600,"), std::string::npos) << err;
    const std::string isa = w.impl.starts_with("cpu_hwy") ? fusekit::hwy_dispatched_target()
                            : w.impl == "cpu_reference"   ? "scalar"
                                                          : "AVX512VBMI";
    EXPECT_NE(err.find("impl=" + w.impl + ",isa=" + isa + ","), std::string::npos) << err;
    EXPECT_NE(err.find("check="), std::string::npos) << err;
    // The lookup tables (cpu_hwy_table; cpu_hwy on this size does without) are rebuilt by every
    // run; the rest is kept.
    if (w.impl != "cpu_hwy_table") {
      EXPECT_NE(err.find("tables(cached)="), std::string::npos) << err;
    }
    EXPECT_NE(err.find("update="), std::string::npos) << err;
  }
}

// ================================================================================================
// The FP8 state format and the lost-v guard (docs/fp8_state.md), against the oracle above with
// tests/common/fp8_oracle.h's codes (written from the format's definition)
// ================================================================================================

// A state in the FP8 format: finite codes (no E4M3 NaN code), scales as make_state's absmax, and
// the edges: a zero m block, a block whose v is all zero beside a non-zero m (the guard's case),
// codes below the first normal, saturated codes.
State make_fp8_state(uint64_t salt, DType t, size_t n) {
  State s = make_state(salt, t, n, Map{}, Map{});
  for (auto &c : s.m) {
    if ((c & 0x7f) == 0x7f) c ^= 1;
  }
  const size_t blocks = s.absmax_m.size();
  if (blocks > 3) s.absmax_v[3] = 0.0f;
  for (size_t i = 0; i < std::min<size_t>(n, 16); ++i) {
    s.m[i] = static_cast<uint8_t>(i < 8 ? i : 0x7e | (i & 1) << 7);
    s.v[i] = static_cast<uint8_t>(i < 8 ? i : 0xff);
  }
  // Scales that the SIMD decode cannot fold with its 256 (fp8_scale_folds: a finite scale above
  // FLT_MAX / 256), over codes +-0: 0 * scale is +-0, where a folded scale (Inf) would give NaN.
  // Block 5's m scale 2e36 (m codes 0x00 and 0x80), block 6's v scale FLT_MAX (v codes 0: then the
  // lost-v guard).
  if (blocks > 6) {
    s.absmax_m[5] = 2e36f;
    for (size_t i = 5 * 256; i < std::min<size_t>(n, 6 * 256); ++i) {
      s.m[i] = static_cast<uint8_t>((i & 1) << 7);
    }
    for (size_t i = 6 * 256; i < std::min<size_t>(n, 7 * 256); ++i) s.v[i] = 0;
    s.absmax_v[6] = std::numeric_limits<float>::max();
  }
  return s;
}

Hyper fp8_hyper(QuantStateFormat format = QuantStateFormat::kFp8) {
  Hyper h;
  h.format = format;
  h.guard = true;
  return h;
}

// The formats the FP8 tests run: the dynamic maps with the guard, and the two FP8 formats.
constexpr QuantStateFormat kGuardedFormats[] = {
    QuantStateFormat::kDynamicMap, QuantStateFormat::kFp8, QuantStateFormat::kFp8Ue3m5};
constexpr QuantStateFormat kFp8Formats[] = {QuantStateFormat::kFp8, QuantStateFormat::kFp8Ue3m5};

// Every implementation this machine runs in the FP8 format (cpu_avx512vbmi refuses it).
void check_fp8_case(DType t, size_t n, const Hyper &h, uint64_t salt) {
  const State start = h.fp8() ? make_fp8_state(salt, t, n)
                              : make_state(salt, t, n, fusekit::create_dynamic_map(true),
                                           fusekit::create_dynamic_map(false));
  State want = start;
  const int64_t want_skipped = oracle_step(want, h);
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    State got = start;
    ApplyAdamWQuantStats stats;
    const Status st = run_api(got, h, options_of(h, w), &stats);
    if (h.fp8() && w.impl == "cpu_avx512vbmi") {
      EXPECT_EQ(st.code(), StatusCode::kNoImplementation) << st.message();
      EXPECT_NE(st.message().find("fp8"), std::string::npos) << st.message();
      continue;
    }
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(stats.blocks_skipped_nonfinite, want_skipped);
    expect_same(got, want);
  }
}

class Fp8StepTest : public ::testing::TestWithParam<std::tuple<DType, size_t, QuantStateFormat>> {};

TEST_P(Fp8StepTest, MatchesOracle) {
  const auto [dtype, n, format] = GetParam();
  Hyper h = fp8_hyper(format);  // (kDynamicMap: the dynamic maps with the guard)
  check_fp8_case(dtype, n, h, 400 + n);
  h.step = 0;
  h.wd = 0.01;
  h.gnorm = 0.5;
  check_fp8_case(dtype, n, h, 500 + n);
  h.step = 123456789;
  h.lr = 0.1;
  h.beta1 = 0.8;
  h.beta2 = 0.95;
  h.eps = 1e-6;
  h.gnorm = 2.0;
  check_fp8_case(dtype, n, h, 600 + n);
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, Fp8StepTest,
    ::testing::Combine(::testing::Values(DType::kFloat32, DType::kFloat16, DType::kBFloat16),
                       ::testing::Values(size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{255},
                                         size_t{256}, size_t{257}, size_t{1100}, size_t{5000}),
                       ::testing::ValuesIn(kGuardedFormats)),
    [](const auto &param_info) {
      const auto &p = param_info.param;
      const QuantStateFormat f = std::get<2>(p);
      return std::string(fusekit::dtype_name(std::get<0>(p))) + "_n" +
             std::to_string(std::get<1>(p)) + "_" +
             (f == QuantStateFormat::kDynamicMap ? "dynamic_guarded"
                                                 : fusekit::quant_state_format_name(f));
    });

TEST(Fp8Step, EverySimdTargetAndThreadCount) {
  for (QuantStateFormat format : kGuardedFormats) {
    const bool fp8 = fusekit::is_fp8_state(format);
    for (DType t : {DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE(std::string(fusekit::dtype_name(t)) + " " +
                   fusekit::quant_state_format_name(format) + (fp8 ? "" : "+guard"));
      Hyper h = fp8_hyper(format);
      h.wd = 0.02;
      const State start = fp8 ? make_fp8_state(21, t, 70'000)
                              : make_state(21, t, 70'000, fusekit::create_dynamic_map(true),
                                           fusekit::create_dynamic_map(false));
      State want = start;
      oracle_step(want, h);
      fusekit::testing::for_each_simd_target([&](const char *target) {
        EXPECT_STREQ(fusekit::hwy_dispatched_target(), target);
        for (int threads : {1, 2, 3}) {
          State got = start;
          const Way hwy{"cpu_hwy"};  // (options_of keeps a pointer to its name)
          ApplyAdamWQuantOptions o = options_of(h, hwy);
          o.num_threads = threads;
          ASSERT_TRUE(run_api(got, h, o).ok());
          expect_same(got, want);
        }
      });
    }
  }
}

// From a fresh state (codes 0, scales 0) through twenty steps: the codes and scales a step writes
// are the next step's input; every fifth step leaves half the blocks without gradient.
void twenty_steps_from_a_fresh_state(QuantStateFormat format) {
  const size_t n = 4000;
  State want = make_fp8_state(22, DType::kFloat32, n);
  std::fill(want.m.begin(), want.m.end(), 0);
  std::fill(want.v.begin(), want.v.end(), 0);
  std::fill(want.absmax_m.begin(), want.absmax_m.end(), 0.0f);
  std::fill(want.absmax_v.begin(), want.absmax_v.end(), 0.0f);
  State got = want;
  auto rng = rng_for(23);
  Hyper h = fp8_hyper(format);
  h.wd = 0.01;
  for (int64_t k = 0; k < 20; ++k) {
    h.step = k;
    std::vector<float> g = uniform(rng, n, -1.f, 1.f);
    if (k % 5 == 4) std::fill(g.begin(), g.begin() + n / 2, 0.0f);
    got.grad = want.grad = FloatBuf(DType::kFloat32, g);
    oracle_step(want, h);
    ASSERT_TRUE(run_api(got, h, options_of(h)).ok());
  }
  expect_same(got, want);
  size_t nonzero = 0;
  for (size_t i = 0; i < n; ++i) nonzero += got.m[i] != 0 && got.v[i] != 0;
  EXPECT_GT(nonzero, n * 9 / 10);  // the state is not trivially zero
}

TEST(Fp8Step, TwentyStepsFromAFreshState) {
  for (QuantStateFormat format : kFp8Formats) {
    SCOPED_TRACE(fusekit::quant_state_format_name(format));
    twenty_steps_from_a_fresh_state(format);
  }
}

// A block holding E4M3's NaN code is non-finite state: left bit for bit as it was, and counted.
TEST(Fp8Step, ANaNCodeLeavesItsBlockUnchanged) {
  const Hyper h = fp8_hyper();
  State start = make_fp8_state(24, DType::kFloat32, 1000);
  start.m[300] = 0x7f;  // block 1
  start.m[700] = 0xff;  // block 2
  for (const Way &w : ways()) {
    if (w.impl == "cpu_avx512vbmi") continue;
    SCOPED_TRACE(way_name(w));
    State got = start;
    ApplyAdamWQuantStats stats;
    ASSERT_TRUE(run_api(got, h, options_of(h, w), &stats).ok());
    EXPECT_EQ(stats.blocks_skipped_nonfinite, 2);
    for (size_t b : {size_t{1}, size_t{2}}) expect_block_unchanged(got, start, b);
    EXPECT_NE(got.var.bits(0), start.var.bits(0));  // block 0 was updated
  }
}

// The FP8 format on the gathering path (a transposed view), against the contiguous result.
TEST(Fp8Step, ATransposedViewMatchesTheContiguousRun) {
  const int64_t rows = 40, cols = 30;  // var [rows, cols] seen through its transpose
  const auto n = static_cast<size_t>(rows * cols);
  const Hyper h = fp8_hyper();
  const State start = make_fp8_state(25, DType::kFloat32, n);
  // The contiguous problem of the transposed tensor: element (c, r) of the view is start's
  // r*cols+c.
  State want = start;
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r = 0; r < rows; ++r) {
      const auto dst = static_cast<size_t>(c * rows + r), src = static_cast<size_t>(r * cols + c);
      want.var.f32[dst] = start.var.f32[src];
      want.grad.f32[dst] = start.grad.f32[src];
      want.m[dst] = start.m[src];
      want.v[dst] = start.v[src];
    }
  }
  State contiguous = want;
  oracle_step(want, h);
  State got = start;
  const auto B = static_cast<int64_t>(got.absmax_m.size());
  ASSERT_TRUE(
      fusekit::apply_adam_w_quant_step(
          TensorView::strided(got.var.f32.data(), DType::kFloat32, {cols, rows}, {1, cols}),
          TensorView::strided(got.grad.f32.data(), DType::kFloat32, {cols, rows}, {1, cols}),
          TensorView::strided(got.m.data(), DType::kUInt8, {cols, rows}, {1, cols}),
          TensorView::strided(got.v.data(), DType::kUInt8, {cols, rows}, {1, cols}),
          TensorView::of(got.qm.data(), {0}), TensorView::of(got.qv.data(), {0}),
          TensorView::of(got.absmax_m.data(), {B}), TensorView::of(got.absmax_v.data(), {B}),
          h.step, lr_of(h), options_of(h))
          .ok());
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r = 0; r < rows; ++r) {
      const auto dst = static_cast<size_t>(c * rows + r), src = static_cast<size_t>(r * cols + c);
      contiguous.var.f32[dst] = got.var.f32[src];
      contiguous.m[dst] = got.m[src];
      contiguous.v[dst] = got.v[src];
    }
  }
  contiguous.absmax_m = got.absmax_m;
  contiguous.absmax_v = got.absmax_v;
  expect_same(contiguous, want);
}

// The hazard of issue #33: 64 blocks, each with one gradient of ~1e3 beside gradients of ~1e-6,
// half the blocks without gradient on two steps of three, lr 1e-3, 60 steps. Without the guard the
// dynamic maps let a v code to 0 beside a non-zero m and the element jumps by m / eps; with the
// guard (and in the FP8 format, where it is always on) no step moves an element by more than
// about lr (the largest fp32 Adam move here is lr: |m_hat| <= sqrt(v_hat) for these gradients).
double largest_move(const Hyper &base) {
  const size_t n = 64 * 256;
  State s = base.fp8() ? make_fp8_state(26, DType::kFloat32, n)
                       : make_state(26, DType::kFloat32, n, fusekit::create_dynamic_map(true),
                                    fusekit::create_dynamic_map(false));
  std::fill(s.m.begin(), s.m.end(), base.fp8() ? 0 : 127);  // fresh: every moment 0
  std::fill(s.v.begin(), s.v.end(), 0);
  std::fill(s.absmax_m.begin(), s.absmax_m.end(), 0.0f);
  std::fill(s.absmax_v.begin(), s.absmax_v.end(), 0.0f);
  auto rng = rng_for(27);
  std::uniform_real_distribution<float> tiny(0.5e-6f, 1.5e-6f), big(0.5e3f, 1.5e3f);
  double worst = 0.0;
  for (int64_t k = 0; k < 60; ++k) {
    Hyper h = base;
    h.step = k;
    std::vector<float> g(n);
    for (size_t b = 0; b < 64; ++b) {
      const bool quiet = b % 2 == 1 && k % 3 != 0;
      const size_t hot = b * 256 + rng() % 256;
      for (size_t j = b * 256; j < (b + 1) * 256; ++j) {
        const float sign = (rng() & 1) ? 1.0f : -1.0f;
        g[j] = quiet ? 0.0f : sign * (j == hot ? big(rng) : tiny(rng));
      }
    }
    s.grad = FloatBuf(DType::kFloat32, g);
    const std::vector<float> before = s.var.f32;
    EXPECT_TRUE(run_api(s, h, options_of(h)).ok());
    for (size_t i = 0; i < n; ++i) {
      worst = std::max(worst, std::fabs(static_cast<double>(s.var.f32[i]) - before[i]));
    }
  }
  return worst;
}

TEST(LostVGuard, NoStepMovesAnElementMuchMoreThanLr) {
  for (QuantStateFormat format : kGuardedFormats) {
    EXPECT_LE(largest_move(fp8_hyper(format)), 1.1e-3) << fusekit::quant_state_format_name(format);
  }
}

// The hazard itself, in the state the issue found it in (element 11268 at step 4: m's code 125, v's
// code 0, a zero gradient): without the guard the step is m / eps; with it, at most lr.
TEST(LostVGuard, AVCodedToZeroBesideANonZeroM) {
  for (QuantStateFormat format : kGuardedFormats) {
    SCOPED_TRACE(fusekit::quant_state_format_name(format));
    const bool fp8 = fusekit::is_fp8_state(format);
    Hyper h = fp8_hyper(format);
    h.step = 4;
    State s = fp8 ? make_fp8_state(29, DType::kFloat32, 256)
                  : make_state(29, DType::kFloat32, 256, fusekit::create_dynamic_map(true),
                               fusekit::create_dynamic_map(false));
    s.grad = FloatBuf(DType::kFloat32, std::vector<float>(256, 0.0f));
    std::fill(s.m.begin(), s.m.end(), fp8 ? 0 : 127);  // m = 0 ...
    std::fill(s.v.begin(), s.v.end(), 0);              // ... and v = 0 everywhere,
    s.m[11] = fp8 ? 0x08 : 125;                        // but one m that is not 0:
    s.m[12] = fp8 ? 0x7e : 255;                        // beside the block's largest m
    s.v[12] = 0xff;                                    // and v
    s.absmax_m[0] = 1.0f;
    s.absmax_v[0] = 1.0f;
    const float before = s.var.f32[11];
    for (bool guard : {false, true}) {
      if (fp8 && !guard) continue;  // always on in the FP8 format
      h.guard = guard;
      State got = s, want = s;
      oracle_step(want, h);
      ASSERT_TRUE(run_api(got, h, options_of(h)).ok());
      expect_same(got, want);
      const double move = std::fabs(static_cast<double>(got.var.f32[11]) - before);
      if (guard) {
        EXPECT_LE(move, h.lr) << "guarded";
        EXPECT_GT(move, 0.0);
      } else {
        EXPECT_GT(move, 100 * h.lr) << "the hazard no longer shows without the guard";
      }
    }
  }
}

TEST(Fp8Refusals, MapsAndFormat) {
  State s = make_fp8_state(28, DType::kFloat32, 300);
  const State start = s;
  Hyper h = fp8_hyper();
  // A map given to the FP8 format: refused at plan time, naming the map; nothing written.
  const auto n = static_cast<int64_t>(s.var.size());
  const auto B = static_cast<int64_t>(s.absmax_m.size());
  Status st = fusekit::apply_adam_w_quant_step(
      s.var.view(), s.grad.view(), TensorView::of(s.m.data(), {n}), TensorView::of(s.v.data(), {n}),
      TensorView::of(s.qm.data(), {256}), TensorView::of(s.qv.data(), {0}),
      TensorView::of(s.absmax_m.data(), {B}), TensorView::of(s.absmax_v.data(), {B}), h.step,
      lr_of(h), options_of(h));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("qmapM"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("fp8"), std::string::npos) << st.message();
  // A format that does not exist.
  ApplyAdamWQuantOptions o = options_of(h);
  o.state_format = static_cast<QuantStateFormat>(7);
  st = run_api(s, h, o);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("state_format = 7"), std::string::npos) << st.message();
  // The dynamic format without its maps.
  h.format = QuantStateFormat::kDynamicMap;
  st = fusekit::apply_adam_w_quant_step(
      s.var.view(), s.grad.view(), TensorView::of(s.m.data(), {n}), TensorView::of(s.v.data(), {n}),
      TensorView::of(s.qm.data(), {0}), TensorView::of(s.qv.data(), {0}),
      TensorView::of(s.absmax_m.data(), {B}), TensorView::of(s.absmax_v.data(), {B}), h.step,
      lr_of(h), options_of(h));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("qmapM must be float32 [256]"), std::string::npos) << st.message();
  expect_same(s, start);
}

}  // namespace
