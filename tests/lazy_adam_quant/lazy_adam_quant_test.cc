// LazyAdamQuant: every expected value comes from the oracle below, a plain float32 scalar
// implementation of docs/lazy_adam_quant.md written independently of the library (not its
// reference kernel): rows grouped with std::map (no sorting, no entries), the nearest code by
// std::lower_bound over the map and a float32 comparison of the two bracketing distances (no
// thresholds, no tables), 16-bit conversions from tests/common/half_floats.h (_Float16 and integer
// rounding written for the tests). The spec fixes every float32 operation, so var and absmax must
// match bit for bit and codes exactly, for every implementation this machine runs
// (cpu_avx512vbmi, cpu_hwy on every SIMD target with both searches, cpu_reference), every table
// dtype, both gradient dtypes and every thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_lazy_adam_quant.h"
#include "common/aclnn_test_util.h"
#include "common/fp8_oracle.h"
#include "common/half_floats.h"
#include "common/lazy_adam_quant_oracle.h"
#include "common/row_groups.h"
#include "common/simd_targets.h"
#include "common/test_util.h"
#include "fusekit/lazy_adam_quant.h"
#include "fusekit/threading.h"
#include "lazy_adam_quant/lazy_adam_quant_kernels.h"

namespace {

using namespace fusekit;           // the library under test
using namespace fusekit::testing;  // tests/common
using Map = QuantMap;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- maps --------------------------------------------------------------------------------------
Map linspace_map(float lo, float hi) {
  Map q;
  for (int i = 0; i < 256; ++i) q[i] = static_cast<float>(lo + (hi - lo) * i / 255.0);
  return q;
}
// Each value twice (ties in the map: first[] is not the identity, and thresholds share buckets,
// which sends the VBMI kernel to its 32-bit search).
Map doubled_map(float lo, float hi) {
  Map q;
  for (int i = 0; i < 256; ++i) q[i] = static_cast<float>(lo + (hi - lo) * (i / 2) / 127.0);
  return q;
}

// The state of a case: codes into one of three kinds of maps, or the FP8 format (no maps;
// docs/fp8_state.md); kDynamicGuarded is the dynamic maps with the lost-v guard.
enum class Maps { kDynamic, kLinspace, kDoubled, kDynamicGuarded, kFp8 };
const char *maps_name(Maps m) {
  switch (m) {
    case Maps::kDynamic:
      return "dynamic";
    case Maps::kLinspace:
      return "linspace";
    case Maps::kDoubled:
      return "doubled";
    case Maps::kDynamicGuarded:
      return "dynamic+guard_lost_v";
    default:
      return "fp8";
  }
}
std::pair<Map, Map> maps_of(Maps m) {
  switch (m) {
    case Maps::kLinspace:  // the sign fix acts for m
      return {linspace_map(-1, 1), linspace_map(0, 1)};
    case Maps::kDoubled:
      return {doubled_map(-1, 1), doubled_map(0, 1)};
    default:
      return {fusekit::create_dynamic_map(true), fusekit::create_dynamic_map(false)};
  }
}

// ---- the oracle: tests/common/lazy_adam_quant_oracle.h's row step ----------------------------
// One problem: a table of R rows, D columns (row stride S >= D for var, m and v; the columns past
// D hold values that must survive), absmax [R, B] with row stride SB >= B, a batch of N indices.
struct Case {
  int64_t rows = 0, dim = 0, n = 0, stride = 0, blocks = 0, bstride = 0;
  DType dtype = DType::kFloat32, gdtype = DType::kFloat32;
  FloatBuf var, grad;  // var [R, S]; grad [N, D]
  std::vector<int64_t> idx;
  std::vector<uint8_t> m, v;  // [R, S]
  std::vector<float> am, av;  // [R, SB]
  Map qm, qv;
  float lr = 0.01f;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-7;
  QuantStateFormat format = QuantStateFormat::kDynamicMap;
  bool guard = false;  // the lost-v guard (always on in the FP8 format)

  bool fp8() const { return format == QuantStateFormat::kFp8; }
  size_t at(int64_t r, int64_t j) const { return static_cast<size_t>(r * stride + j); }
  size_t bat(int64_t r, int64_t b) const { return static_cast<size_t>(r * bstride + b); }

  TensorView var_view() { return TensorView::strided(var.data(), dtype, {rows, dim}, {stride, 1}); }
  LazyAdamQuantTensors tensors(std::vector<int32_t> *idx32 = nullptr) {
    const TensorView indices =
        idx32 != nullptr ? TensorView::of(idx32->data(), {n}) : TensorView::of(idx.data(), {n});
    return {TensorView::contiguous(grad.data(), gdtype, {n, dim}),
            indices,
            TensorView::strided(m.data(), DType::kUInt8, {rows, dim}, {stride, 1}),
            TensorView::strided(v.data(), DType::kUInt8, {rows, dim}, {stride, 1}),
            var_view(),
            TensorView::of(qm.data(), {fp8() ? 0 : 256}),
            TensorView::of(qv.data(), {fp8() ? 0 : 256}),
            TensorView::strided(am.data(), DType::kFloat32, {rows, blocks}, {bstride, 1}),
            TensorView::strided(av.data(), DType::kFloat32, {rows, blocks}, {bstride, 1})};
  }
};

struct Shape {
  int64_t rows, n, dim;
  double dup = 0.0, pad = 0.0;
  int64_t stride_pad = 0, bstride_pad = 0;
};

Case make_case(uint64_t salt, Shape sh, DType t = DType::kFloat32, DType gt = DType::kFloat32,
               Maps maps = Maps::kDynamic, float gmax = 1.0f) {
  auto rng = rng_for(salt);
  Case c;
  c.rows = sh.rows;
  c.dim = sh.dim;
  c.n = sh.n;
  c.stride = sh.dim + sh.stride_pad;
  c.blocks = (sh.dim + 255) / 256;
  c.bstride = c.blocks + sh.bstride_pad;
  c.dtype = t;
  c.gdtype = gt;
  const auto cells = static_cast<size_t>(std::max<int64_t>(c.rows * c.stride, 1));
  c.var = FloatBuf(t, uniform(rng, cells, -2.f, 2.f));
  c.grad = FloatBuf(
      gt, uniform(rng, static_cast<size_t>(std::max<int64_t>(c.n * c.dim, 1)), -gmax, gmax));
  c.format = maps == Maps::kFp8 ? QuantStateFormat::kFp8 : QuantStateFormat::kDynamicMap;
  c.guard = maps == Maps::kFp8 || maps == Maps::kDynamicGuarded;
  fill_random_quant_state(c, rng, cells);
  if (c.fp8()) {  // the FP8 codes' extremes: below the first normal, saturated, near 2^-96
    for (int64_t j = 0; j < std::min<int64_t>(c.dim, 8) && c.rows > 6; ++j) {
      c.m[c.at(5, j)] = static_cast<uint8_t>(j);  // 0..7: E4M3 below its first normal
      c.v[c.at(5, j)] = static_cast<uint8_t>(j);
      c.m[c.at(6, j)] = static_cast<uint8_t>(0x7e | (j & 1) << 7);  // +-448
    }
    if (c.rows > 7 && c.blocks > 0) c.am[c.bat(7, 0)] = 0x1p-100f;  // m dequantized ~2^-92
    // Scales that the SIMD decode cannot fold with its 256 (fp8_scale_folds: a finite scale above
    // FLT_MAX / 256), over codes +-0: 0 * scale is +-0, where a folded scale (Inf) would give NaN.
    // Row 8's m scale 2e36 (m codes 0x00 and 0x80), row 9's v scale FLT_MAX (v codes 0: then the
    // lost-v guard).
    if (c.rows > 9 && c.blocks > 0) {
      c.am[c.bat(8, 0)] = 2e36f;
      for (int64_t j = 0; j < std::min<int64_t>(c.dim, 256); ++j) {
        c.m[c.at(8, j)] = static_cast<uint8_t>((j & 1) << 7);
        c.v[c.at(9, j)] = 0;
      }
      c.av[c.bat(9, 0)] = std::numeric_limits<float>::max();
    }
  }
  std::tie(c.qm, c.qv) = maps_of(maps);
  std::uniform_int_distribution<int64_t> row_dist(0, std::max<int64_t>(c.rows - 1, 0));
  std::uniform_real_distribution<double> coin(0, 1);
  for (int64_t i = 0; i < c.n; ++i) {
    if (coin(rng) < sh.pad) {
      c.idx.push_back(-1 - static_cast<int64_t>(rng() % 5));  // any negative value is padding
    } else if (i > 0 && coin(rng) < sh.dup) {
      const int64_t prev = c.idx[rng() % static_cast<uint64_t>(i)];
      c.idx.push_back(prev >= 0 ? prev : row_dist(rng));
    } else {
      c.idx.push_back(row_dist(rng));
    }
  }
  return c;
}

struct OracleResult {
  int64_t updated = 0, skipped = 0, padding = 0;
};

OracleResult oracle(Case &c) {
  const float b1 = static_cast<float>(c.beta1), b2 = static_cast<float>(c.beta2);
  const QuantStepOracle o{
      &c.qm, &c.qv, c.fp8(), c.guard, c.dtype, b1, b2, static_cast<float>(c.eps), c.lr};
  const int64_t D = c.dim;
  std::map<int64_t, std::vector<int64_t>> occurrences;  // row -> positions in order
  OracleResult res;
  for (int64_t i = 0; i < c.n; ++i) {
    if (c.idx[static_cast<size_t>(i)] < 0) {
      ++res.padding;
      continue;
    }
    occurrences[c.idx[static_cast<size_t>(i)]].push_back(i);
  }
  for (auto &[row, pos] : occurrences) {
    std::vector<float> g(static_cast<size_t>(D));
    for (size_t k = 0; k < pos.size(); ++k) {
      for (int64_t j = 0; j < D; ++j) {
        const float x = c.grad.get(static_cast<size_t>(pos[k] * D + j));
        g[static_cast<size_t>(j)] = k == 0 ? x : g[static_cast<size_t>(j)] + x;
      }
    }
    const int64_t r = row;
    const bool updated = quant_step_oracle_row(
        o, g.data(), D, [&](int64_t j) { return c.var.get(c.at(r, j)); },
        [&](int64_t j, float w) { c.var.set(c.at(r, j), w); }, &c.m[c.at(r, 0)], &c.v[c.at(r, 0)],
        &c.am[c.bat(r, 0)], &c.av[c.bat(r, 0)]);
    ++(updated ? res.updated : res.skipped);
  }
  return res;
}

// Bitwise var and absmax, exact codes, everywhere (padding columns and untouched rows included).
void expect_same(const Case &got, const Case &want) {
  size_t bad = 0;
  for (size_t i = 0; i < got.var.size() && bad < 5; ++i) {
    if (got.var.bits(i) != want.var.bits(i)) {
      ADD_FAILURE() << "var[" << i / static_cast<size_t>(got.stride) << ", "
                    << i % static_cast<size_t>(got.stride) << "]: got " << got.var.get(i)
                    << " want " << want.var.get(i);
      ++bad;
    }
  }
  for (size_t i = 0; i < got.m.size() && bad < 10; ++i) {
    if (got.m[i] != want.m[i] || got.v[i] != want.v[i]) {
      ADD_FAILURE() << "codes[" << i / static_cast<size_t>(got.stride) << ", "
                    << i % static_cast<size_t>(got.stride) << "]: got m " << int{got.m[i]} << " v "
                    << int{got.v[i]} << ", want m " << int{want.m[i]} << " v " << int{want.v[i]};
      ++bad;
    }
  }
  for (size_t b = 0; b < got.am.size() && bad < 15; ++b) {
    if (!fusekit::testing::bits_equal(got.am[b], want.am[b]) ||
        !fusekit::testing::bits_equal(got.av[b], want.av[b])) {
      ADD_FAILURE() << "absmax[" << b << "]: got " << got.am[b] << ", " << got.av[b] << " want "
                    << want.am[b] << ", " << want.av[b];
      ++bad;
    }
  }
}

// Whether this machine runs the implementation (planned for a small problem by name).
bool supported(const std::string &name) {
  Case c = make_case(1, {4, 2, 8});
  LazyAdamQuantOptions o;
  o.implementation = name.c_str();
  LazyAdamQuantProblem problem;
  EXPECT_TRUE(LazyAdamQuantProblem::make(c.tensors(), o, &problem).ok());
  LazyAdamQuant plan;
  const Status st = LazyAdamQuant::plan(problem, o, &plan);
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
    for (const std::string &name : LazyAdamQuant::implementations()) {
      if (supported(name)) w.push_back({name});
    }
    return w;
  }();
  return all;
}
const std::string &way_name(const Way &w) {
  return w.impl;
}

LazyAdamQuantOptions options_of(const Case &c, const Way *w = nullptr, int threads = 2) {
  LazyAdamQuantOptions o;
  o.beta1 = c.beta1;
  o.beta2 = c.beta2;
  o.epsilon = c.eps;
  o.num_threads = threads;
  o.state_format = c.format;
  o.guard_lost_v = c.guard;
  if (w != nullptr) {
    o.implementation = w->impl.c_str();
  }
  return o;
}

Status run_cpp(Case &c, const LazyAdamQuantOptions &o, LazyAdamQuantStats *stats = nullptr,
               DType index_type = DType::kInt64) {
  std::vector<int32_t> idx32(c.idx.begin(), c.idx.end());
  return fusekit::lazy_adam_quant_step(c.tensors(index_type == DType::kInt32 ? &idx32 : nullptr),
                                       c.lr, o, stats);
}

void expect_stats(const LazyAdamQuantStats &s, const OracleResult &r) {
  EXPECT_EQ(s.rows_updated, r.updated);
  EXPECT_EQ(s.rows_skipped_nonfinite, r.skipped);
  EXPECT_EQ(s.indices_padding, r.padding);
}

// ================================================================================================
// Results against the oracle
// ================================================================================================

TEST(LazyAdamQuantImplementations, ListEndsWithTheReferenceAndVbmiRunsWhereTheCpuHasIt) {
  const std::vector<std::string> impls = LazyAdamQuant::implementations();
  ASSERT_GE(impls.size(), 3u);
  EXPECT_EQ(impls.front(), "cpu_avx512vbmi");
  EXPECT_EQ(impls.back(), "cpu_reference");
  EXPECT_TRUE(supported("cpu_hwy"));
  EXPECT_TRUE(supported("cpu_reference"));
  if (fusekit::avx512vbmi_cpu_why_not() == nullptr) {
    // This CPU has VBMI: the build must have the kernel, and plans must pick it.
    EXPECT_TRUE(supported("cpu_avx512vbmi"))
        << fusekit::avx512vbmi_why_not(fusekit::lazy_adam_quant_avx512vbmi());
    Case c = make_case(2, {4, 2, 8});
    LazyAdamQuant plan;
    ASSERT_TRUE(LazyAdamQuant::plan(c.tensors(), {}, &plan).ok());
    EXPECT_STREQ(plan.implementation(), "cpu_avx512vbmi");
  }
}

class LazyAdamQuantDims : public ::testing::TestWithParam<int64_t> {};

// Every implementation, every table dtype with its own and a float32 gradient, both index types,
// the three kinds of maps, cpu_hwy on every SIMD target: the oracle's bits.
TEST_P(LazyAdamQuantDims, EveryImplementationDtypeMapAndTargetMatchesTheOracleBitwise) {
  const int64_t dim = GetParam();
  const Shape sh{120, 90, dim, 0.2, 0.05};
  struct Types {
    DType t, g;
  };
  const Types types[] = {{DType::kFloat32, DType::kFloat32},
                         {DType::kBFloat16, DType::kBFloat16},
                         {DType::kBFloat16, DType::kFloat32},
                         {DType::kFloat16, DType::kFloat16},
                         {DType::kFloat16, DType::kFloat32}};
  for (Maps maps :
       {Maps::kDynamic, Maps::kLinspace, Maps::kDoubled, Maps::kDynamicGuarded, Maps::kFp8}) {
    SCOPED_TRACE(maps_name(maps));
    for (const Types &ty : types) {
      SCOPED_TRACE(std::string(fusekit::dtype_name(ty.t)) + " table, " + fusekit::dtype_name(ty.g) +
                   " gradient");
      const uint64_t salt = 1000 + static_cast<uint64_t>(dim) * 10;
      Case want = make_case(salt, sh, ty.t, ty.g, maps);
      const OracleResult expected = oracle(want);
      ASSERT_GT(expected.updated, 40);
      ASSERT_EQ(expected.skipped, 0);
      for (const Way &w : ways()) {
        SCOPED_TRACE(way_name(w));
        if (maps == Maps::kFp8 && w.impl == "cpu_avx512vbmi") {  // its kernel is for maps only
          Case got = make_case(salt, sh, ty.t, ty.g, maps);
          const Status st = run_cpp(got, options_of(got, &w));
          EXPECT_EQ(st.code(), StatusCode::kNoImplementation) << st.message();
          EXPECT_NE(st.message().find("fp8"), std::string::npos) << st.message();
          continue;
        }
        auto one = [&](DType it) {
          Case got = make_case(salt, sh, ty.t, ty.g, maps);
          LazyAdamQuantStats stats;
          ASSERT_TRUE(run_cpp(got, options_of(got, &w), &stats, it).ok());
          expect_same(got, want);
          expect_stats(stats, expected);
        };
        if (w.impl.starts_with("cpu_hwy_")) {  // both searches on every SIMD target
          fusekit::testing::for_each_simd_target([&](const char *target) {
            EXPECT_STREQ(fusekit::hwy_dispatched_target(), target);
            one(DType::kInt64);
          });
        } else {
          one(DType::kInt64);
        }
        one(DType::kInt32);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(BlockAndVectorEdges, LazyAdamQuantDims,
                         ::testing::Values(1, 3, 7, 8, 16, 17, 32, 100, 200, 255, 256, 257, 512,
                                           600));

TEST(LazyAdamQuant, StridedTablesAndAbsmaxKeepTheirPaddingColumns) {
  // Row stride 45 > D = 33 for var and the codes, absmax row stride 3 > 1 block; the columns past
  // D and past the blocks hold values that must survive.
  const Shape sh{80, 70, 33, 0.3, 0.0, 12, 2};
  for (DType t : {DType::kFloat32, DType::kBFloat16}) {
    Case want = make_case(21, sh, t, t);
    oracle(want);
    for (const Way &w : ways()) {
      SCOPED_TRACE(way_name(w));
      Case got = make_case(21, sh, t, t);
      ASSERT_TRUE(run_cpp(got, options_of(got, &w)).ok());
      expect_same(got, want);
    }
  }
}

// The packed layout (docs/lazy_adam_quant.md#the-packed-state-layout): m's and v's codes of a row
// side by side in one [R, 2, D] table and their absmax in one [R, 2, B] table, the four tensors
// views of the two: the same bits as the separate tensors (the oracle's), on both kernel paths of
// the VBMI kernel (D <= 32 in tiles, D > 32 staged), every map kind and table dtype.
TEST(LazyAdamQuant, PackedStateGivesTheSameBitsAsSeparateTensors) {
  for (int64_t dim : {1, 16, 17, 32, 33, 300}) {
    for (Maps maps : {Maps::kDynamic, Maps::kLinspace, Maps::kDoubled}) {
      for (DType t : {DType::kFloat32, DType::kBFloat16}) {
        SCOPED_TRACE("D = " + std::to_string(dim) + ", " + maps_name(maps) + ", " +
                     fusekit::dtype_name(t));
        const Shape sh{90, 80, dim, 0.2, 0.05};
        const uint64_t salt = 7000 + static_cast<uint64_t>(dim);
        Case want = make_case(salt, sh, t, t, maps);
        const OracleResult expected = oracle(want);
        ASSERT_GT(expected.updated, 30);
        for (const Way &w : ways()) {
          SCOPED_TRACE(way_name(w));
          Case got = make_case(salt, sh, t, t, maps);
          const int64_t R = got.rows, D = got.dim, B = got.blocks;
          std::vector<uint8_t> codes(static_cast<size_t>(R * 2 * D));
          std::vector<float> absmax(static_cast<size_t>(R * 2 * B));
          for (int64_t r = 0; r < R; ++r) {
            for (int64_t j = 0; j < D; ++j) {
              codes[static_cast<size_t>(r * 2 * D + j)] = got.m[got.at(r, j)];
              codes[static_cast<size_t>(r * 2 * D + D + j)] = got.v[got.at(r, j)];
            }
            for (int64_t b = 0; b < B; ++b) {
              absmax[static_cast<size_t>(r * 2 * B + b)] = got.am[got.bat(r, b)];
              absmax[static_cast<size_t>(r * 2 * B + B + b)] = got.av[got.bat(r, b)];
            }
          }
          LazyAdamQuantTensors tv = got.tensors();
          tv.m = TensorView::strided(codes.data(), DType::kUInt8, {R, D}, {2 * D, 1});
          tv.v = TensorView::strided(codes.data() + D, DType::kUInt8, {R, D}, {2 * D, 1});
          tv.absmax_m = TensorView::strided(absmax.data(), DType::kFloat32, {R, B}, {2 * B, 1});
          tv.absmax_v = TensorView::strided(absmax.data() + B, DType::kFloat32, {R, B}, {2 * B, 1});
          LazyAdamQuantStats stats;
          ASSERT_TRUE(fusekit::lazy_adam_quant_step(tv, got.lr, options_of(got, &w), &stats).ok());
          for (int64_t r = 0; r < R; ++r) {
            for (int64_t j = 0; j < D; ++j) {
              got.m[got.at(r, j)] = codes[static_cast<size_t>(r * 2 * D + j)];
              got.v[got.at(r, j)] = codes[static_cast<size_t>(r * 2 * D + D + j)];
            }
            for (int64_t b = 0; b < B; ++b) {
              got.am[got.bat(r, b)] = absmax[static_cast<size_t>(r * 2 * B + b)];
              got.av[got.bat(r, b)] = absmax[static_cast<size_t>(r * 2 * B + B + b)];
            }
          }
          expect_same(got, want);
          expect_stats(stats, expected);
        }
      }
    }
  }
}

TEST(LazyAdamQuant, DuplicatesAreSummedInOrderAndAppliedOnce) {
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    for (DType t : {DType::kFloat32, DType::kFloat16}) {
      Case want = make_case(22, {40, 1500, 24, 0.9}, t, DType::kFloat32);
      const OracleResult expected = oracle(want);
      Case got = make_case(22, {40, 1500, 24, 0.9}, t, DType::kFloat32);
      LazyAdamQuantStats stats;
      ASSERT_TRUE(run_cpp(got, options_of(got, &w), &stats).ok());
      expect_same(got, want);
      expect_stats(stats, expected);
      EXPECT_LE(stats.rows_updated, 40);
    }
  }
}

TEST(LazyAdamQuant, AllIndicesEqual) {
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    for (int64_t n : {1, 2, 257, 3000}) {
      Case want =
          make_case(23, {20, n, 40}, DType::kFloat32, DType::kFloat32, Maps::kDynamic, 1e-3f);
      std::fill(want.idx.begin(), want.idx.end(), 13);
      Case got = want;
      const OracleResult expected = oracle(want);
      EXPECT_EQ(expected.updated, 1);
      LazyAdamQuantStats stats;
      ASSERT_TRUE(run_cpp(got, options_of(got, &w), &stats).ok());
      expect_same(got, want);
      expect_stats(stats, expected);
    }
  }
}

TEST(LazyAdamQuant, NegativeIndicesArePaddingAndAllPaddingChangesNothing) {
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    Case want = make_case(24, {100, 500, 9, 0.1, 0.5});
    want.idx[0] = std::numeric_limits<int64_t>::min();
    Case got = want;
    const OracleResult expected = oracle(want);
    LazyAdamQuantStats stats;
    ASSERT_TRUE(run_cpp(got, options_of(got, &w), &stats).ok());
    expect_same(got, want);
    expect_stats(stats, expected);
    EXPECT_GT(stats.indices_padding, 200);

    Case pad = make_case(25, {10, 40, 9});
    std::fill(pad.idx.begin(), pad.idx.end(), -1);
    const Case before = pad;
    ASSERT_TRUE(run_cpp(pad, options_of(pad, &w), &stats).ok());
    expect_same(pad, before);
    EXPECT_EQ(stats.rows_updated, 0);
    EXPECT_EQ(stats.indices_padding, 40);
  }
}

TEST(LazyAdamQuant, PoisonedUntouchedRowsStayBitwiseUnchanged) {
  // Untouched rows hold NaN var, NaN absmax and any codes: a kernel that read them would skip or
  // spread NaN; one that wrote them would change their bits.
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    for (DType t : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      auto make = [&] {
        Case c = make_case(26, {300, 60, 40, 0.2, 0.1}, t, t);
        std::vector<bool> touched(300, false);
        for (int64_t r : c.idx)
          if (r >= 0) touched[static_cast<size_t>(r)] = true;
        for (int64_t r = 0; r < 300; ++r) {
          if (touched[static_cast<size_t>(r)]) continue;
          for (int64_t j = 0; j < c.stride; ++j)
            c.var.set(c.at(r, j), fusekit::testing::poison_float());
          for (int64_t b = 0; b < c.bstride; ++b) {
            c.am[c.bat(r, b)] = fusekit::testing::poison_float();
            c.av[c.bat(r, b)] = fusekit::testing::poison_float();
          }
        }
        return c;
      };
      Case want = make();
      const OracleResult expected = oracle(want);
      EXPECT_EQ(expected.skipped, 0);
      Case got = make();
      LazyAdamQuantStats stats;
      ASSERT_TRUE(run_cpp(got, options_of(got, &w), &stats).ok());
      expect_same(got, want);
      expect_stats(stats, expected);
    }
  }
}

TEST(LazyAdamQuant, NonFiniteRowsAreLeftBitwiseUnchangedAndCounted) {
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    for (DType t : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      SCOPED_TRACE(fusekit::dtype_name(t));
      // 5, 16, 20, 32: the row-pair kernel with its tile (32: without masks); 40, 300: staged.
      for (int64_t dim : {5, 16, 20, 32, 40, 300}) {
        SCOPED_TRACE(dim);
        Case want = make_case(27, {200, 300, dim, 0.3}, t, DType::kFloat32);
        const float bad[] = {kNaN, kInf, -kInf};
        // NaN and Inf gradients in different lanes (one occurrence of a repeated row is enough).
        for (int i = 0; i < 9; ++i) {
          want.grad.set(static_cast<size_t>((i * 23) * dim + (i * 7) % dim), bad[i % 3]);
        }
        // A finite gradient whose square overflows: v would be +Inf.
        want.grad.set(static_cast<size_t>(250 * dim + dim - 1), 3e20f);
        // Two huge finite gradients of one row whose sum overflows.
        want.idx[280] = want.idx[281] = 199;
        want.grad.set(static_cast<size_t>(280 * dim), 3e38f);
        want.grad.set(static_cast<size_t>(281 * dim), 3e38f);
        // Non-finite state: an infinite var and a NaN absmax of touched rows.
        want.var.set(want.at(want.idx[100], dim / 2), -kInf);
        want.am[want.bat(want.idx[150], 0)] = kNaN;
        Case got = want;
        const OracleResult expected = oracle(want);
        ASSERT_GE(expected.skipped, 8);
        LazyAdamQuantStats stats;
        ASSERT_TRUE(run_cpp(got, options_of(got, &w), &stats).ok());
        expect_same(got, want);
        expect_stats(stats, expected);
      }
    }
  }
}

TEST(LazyAdamQuant, AVarPushedPastWhatItsDtypeStoresIsSkipped) {
  // A huge lr pushes var past its dtype's range: float16 from 65520 (rounds to Inf), bfloat16 from
  // 3.3961776e38, float32 past FLT_MAX. Rows at the largest finite value of the dtype, both
  // signs, are sure to overflow in some column; others may too: the oracle decides which.
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    for (DType t : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      SCOPED_TRACE(fusekit::dtype_name(t));
      for (int64_t dim : {16, 32, 40}) {
        SCOPED_TRACE(dim);
        Case want = make_case(34, {50, 40, dim}, t, t);
        want.lr = t == DType::kFloat16 ? 1e4f : 1e37f;
        const float big = t == DType::kFloat16    ? 65504.0f
                          : t == DType::kBFloat16 ? 3.3895314e38f
                                                  : std::numeric_limits<float>::max();
        for (int64_t j = 0; j < want.dim; ++j) {
          want.var.set(want.at(want.idx[0], j), big);
          want.var.set(want.at(want.idx[1], j), -big);
        }
        Case got = want;
        const OracleResult expected = oracle(want);
        ASSERT_GE(expected.skipped, 2);
        ASSERT_GE(expected.updated, 1);
        LazyAdamQuantStats stats;
        ASSERT_TRUE(run_cpp(got, options_of(got, &w), &stats).ok());
        expect_same(got, want);
        expect_stats(stats, expected);
      }
    }
  }
}

TEST(LazyAdamQuant, ThreadCountsAreBitwiseIdentical) {
  // Large enough that the index sort and the row kernel both split over threads.
  const Shape sh{40000, 70000, 24, 0.3, 0.01};
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    Case want = make_case(28, sh, DType::kBFloat16, DType::kBFloat16);
    const OracleResult expected = oracle(want);
    for (int threads : {1, 2, 3, fusekit::num_threads()}) {
      SCOPED_TRACE(threads);
      Case got = make_case(28, sh, DType::kBFloat16, DType::kBFloat16);
      LazyAdamQuantStats stats;
      ASSERT_TRUE(run_cpp(got, options_of(got, &w, threads), &stats).ok());
      expect_same(got, want);
      expect_stats(stats, expected);
    }
  }
}

TEST(LazyAdamQuant, UniqueIndicesInBatchOrderAndTheSortingPath) {
  // No row repeats (the kernel walks the table in batch order), and the path for tables too large
  // for the duplicate bitmap (every batch grouped by sorting); both over threads.
  const int64_t rows = 50000, n = 30000, dim = 32;
  auto make = [&] {
    Case c = make_case(29, {rows, n, dim});
    std::vector<int64_t> perm(static_cast<size_t>(rows));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng_for(30));
    for (int64_t i = 0; i < n; ++i)
      c.idx[static_cast<size_t>(i)] = i % 97 == 5 ? -1 : perm[static_cast<size_t>(i)];
    return c;
  };
  Case want = make();
  const OracleResult expected = oracle(want);
  for (bool bitmap : {true, false}) {
    fusekit::set_row_groups_bitmap_limit_for_testing(bitmap ? int64_t{64} << 20 : -1);
    for (int threads : {1, 2, 3}) {
      Case got = make();
      LazyAdamQuantStats stats;
      ASSERT_TRUE(run_cpp(got, options_of(got, nullptr, threads), &stats).ok());
      expect_same(got, want);
      expect_stats(stats, expected);
    }
  }
  fusekit::set_row_groups_bitmap_limit_for_testing(int64_t{64} << 20);
}

TEST(LazyAdamQuant, TenStepsInARow) {
  // The codes and absmax one step writes are the next step's state.
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    Case want = make_case(31, {64, 48, 40, 0.2}, DType::kBFloat16, DType::kFloat32);
    Case got = want;
    for (int step = 0; step < 10; ++step) {
      auto rng = rng_for(500 + static_cast<uint64_t>(step));
      for (size_t i = 0; i < want.grad.size(); ++i) {
        const float g = std::uniform_real_distribution<float>(-1, 1)(rng);
        want.grad.set(i, g);
        got.grad.set(i, g);
      }
      oracle(want);
      ASSERT_TRUE(run_cpp(got, options_of(got, &w)).ok());
      expect_same(got, want);
    }
  }
}

TEST(LazyAdamQuant, EmptyBatchAndZeroColumnsAreNoOps) {
  Case c = make_case(32, {10, 0, 8});
  const Case before = c;
  LazyAdamQuant plan;
  ASSERT_TRUE(LazyAdamQuant::plan(c.tensors(), {}, &plan).ok());
  EXPECT_EQ(plan.workspace_size(), 0u);
  ASSERT_TRUE(plan.run(0.1f, nullptr, 0).ok());
  expect_same(c, before);

  // D = 0: absmax [R, 0]; the indices are still checked.
  Case z = make_case(33, {10, 4, 0});
  LazyAdamQuantStats stats;
  ASSERT_TRUE(run_cpp(z, {}, &stats).ok());
  EXPECT_EQ(stats.rows_updated, 0);
  z.idx[2] = 10;
  const Status s = run_cpp(z, {});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("indices[2] = 10"), std::string::npos) << s.message();
}

// Tables of one row may have any row stride (a one-row table never steps by it), even 2^61 or
// 2^62 - 1: var, the codes and both absmax tables so, 30 indices of which one names the row and
// the others are padding (no row repeats, so the padding stays in the kernels' walk, where the
// prefetch ahead must not form the address of row R = 1: it would lie outside the tables and wrap
// around the address space, which UBSan reports in the sanitizer builds). Every implementation
// and SIMD target, D of 8 (the VBMI kernel's small rows), 36 and 300 (two absmax blocks), against
// the oracle.
TEST(LazyAdamQuant, AOneRowTableWithAHugeRowStrideFormsNoAddressOutsideIt) {
  for (const int64_t huge : {int64_t{1} << 61, (int64_t{1} << 62) - 1}) {
    for (const int64_t dim : {int64_t{8}, int64_t{36}, int64_t{300}}) {
      for (DType t : {DType::kFloat32, DType::kBFloat16}) {
        SCOPED_TRACE(::testing::Message()
                     << "stride " << huge << " D " << dim << " " << fusekit::dtype_name(t));
        Case start = make_case(340 + static_cast<uint64_t>(dim), {1, 30, dim}, t, t);
        for (int64_t i = 0; i < start.n; ++i) {
          start.idx[static_cast<size_t>(i)] = i == 17 ? 0 : -1 - i % 3;
        }
        Case want = start;
        const OracleResult expected = oracle(want);
        ASSERT_EQ(expected.updated, 1);
        auto check = [&](const Way &w) {
          SCOPED_TRACE(way_name(w));
          Case got = start;
          LazyAdamQuantTensors tt = got.tensors();
          for (TensorView *x : {&tt.m, &tt.v, &tt.var, &tt.absmax_m, &tt.absmax_v}) {
            x->strides[0] = huge;
          }
          LazyAdamQuantStats stats;
          const Status st = fusekit::lazy_adam_quant_step(tt, got.lr, options_of(got, &w), &stats);
          ASSERT_TRUE(st.ok()) << st.message();
          expect_stats(stats, expected);
          expect_same(got, want);
        };
        for (const Way &w : ways()) check(w);
        fusekit::testing::for_each_simd_target([&](const char *) {
          for (const Way &w : ways()) {
            if (w.impl.rfind("cpu_hwy", 0) == 0) check(w);
          }
        });
      }
    }
  }
}

// ================================================================================================
// The plan: one problem, an implementation from the list, reused over many runs
// ================================================================================================

TEST(LazyAdamQuantPlan, OnePlanManyRunsWithNewPointersAndData) {
  const Shape sh{500, 300, 40, 0.0, 0.05};
  Case shape = make_case(40, sh, DType::kFloat16, DType::kFloat16);
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    const LazyAdamQuantOptions o = options_of(shape, &w);
    LazyAdamQuantProblem problem;
    ASSERT_TRUE(LazyAdamQuantProblem::make(shape.tensors(), o, &problem).ok());
    EXPECT_EQ(problem.desc.var.data, nullptr);  // descriptions only
    EXPECT_EQ(problem.blocks, 1);
    LazyAdamQuant plan;
    ASSERT_TRUE(LazyAdamQuant::plan(problem, o, &plan).ok());
    EXPECT_EQ(plan.implementation(), w.impl);
    std::vector<char> ws(plan.workspace_size());
    for (int step = 0; step < 5; ++step) {
      Shape s2 = sh;
      s2.dup = step % 2 == 0 ? 0.0 : 0.5;
      Case got = make_case(41 + static_cast<uint64_t>(step), s2, DType::kFloat16, DType::kFloat16,
                           step == 3 ? Maps::kLinspace : Maps::kDynamic);
      got.lr = 0.01f * static_cast<float>(step + 1);
      Case want = got;
      const OracleResult expected = oracle(want);
      LazyAdamQuantScalars scalars;
      scalars.lr = got.lr;
      LazyAdamQuantStats stats;
      ASSERT_TRUE(plan.run(got.tensors(), scalars, ws.data(), ws.size(), &stats).ok());
      expect_same(got, want);
      expect_stats(stats, expected);
    }
  }
}

TEST(LazyAdamQuantPlan, LrFromATensorIsReadAtRunTime) {
  Case got = make_case(42, {100, 50, 8});
  Case want = got;
  float lr = 0.0f;
  LazyAdamQuantProblem problem;
  ASSERT_TRUE(LazyAdamQuantProblem::make(got.tensors(), {}, &problem).ok());
  LazyAdamQuant plan;
  ASSERT_TRUE(LazyAdamQuant::plan(problem, {}, &plan).ok());
  LazyAdamQuantScalars scalars;
  scalars.lr = 1e30f;  // not used: the tensor wins
  scalars.lr_tensor = TensorView::of(&lr, {1});
  lr = want.lr = 0.125f;  // set after the plan, before the run
  oracle(want);
  std::vector<char> ws(plan.workspace_size());
  ASSERT_TRUE(plan.run(got.tensors(), scalars, ws.data(), ws.size()).ok());
  expect_same(got, want);
}

TEST(LazyAdamQuantPlan, ABindingOfAnotherLayoutIsRefusedAndNothingIsWritten) {
  Case c = make_case(43, {100, 40, 8});
  LazyAdamQuantProblem problem;
  ASSERT_TRUE(LazyAdamQuantProblem::make(c.tensors(), {}, &problem).ok());
  LazyAdamQuant plan;
  ASSERT_TRUE(LazyAdamQuant::plan(problem, {}, &plan).ok());
  std::vector<char> ws(plan.workspace_size());
  LazyAdamQuantScalars scalars;
  scalars.lr = 0.1f;
  const Case before = c;
  std::vector<int32_t> idx32(c.idx.begin(), c.idx.end());
  std::vector<uint16_t> half(100 * 8);
  struct Bad {
    const char *name;
    LazyAdamQuantTensors t;
  };
  std::vector<Bad> cases;
  auto t = c.tensors();
  cases.push_back({"indices", t});
  cases.back().t.indices = TensorView::of(idx32.data(), {40});
  cases.push_back({"inputVar", t});
  cases.back().t.var = TensorView::contiguous(half.data(), DType::kBFloat16, {100, 8});
  cases.push_back({"absmaxM", t});
  cases.back().t.absmax_m = TensorView::strided(c.am.data(), DType::kFloat32, {50, 1}, {2, 1});
  for (auto &b : cases) {
    const Status s = plan.run(b.t, scalars, ws.data(), ws.size());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << b.name;
    EXPECT_NE(s.message().find(b.name), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("make a new plan"), std::string::npos) << s.message();
  }
  expect_same(c, before);
  // A plan that was not made, and run(lr) on a plan made without tensors.
  LazyAdamQuant empty;
  EXPECT_EQ(empty.run(c.tensors(), scalars, nullptr, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.run(0.1f, ws.data(), ws.size()).code(), StatusCode::kInvalidArgument);
}

TEST(LazyAdamQuantPlan, VerboseNamesTheImplementation) {
  // FUSEKIT_VERBOSE is read once per process: ctest sets it for this test (CMakeLists.txt).
  if (std::getenv("FUSEKIT_VERBOSE") == nullptr) GTEST_SKIP() << "FUSEKIT_VERBOSE not set";
  Case c = make_case(45, {10, 4, 8});
  LazyAdamQuantOptions o;
  o.kernel = KernelChoice::kReference;
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(run_cpp(c, o).ok());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("fusekit_verbose,LazyAdamQuant,"), std::string::npos) << err;
  EXPECT_NE(err.find("impl=cpu_reference,isa=scalar"), std::string::npos) << err;
  EXPECT_NE(err.find("tables"), std::string::npos) << err;
}

// ================================================================================================
// Refusals: the C++ API
// ================================================================================================

void expect_invalid(const Status &s, const std::vector<std::string> &needles) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
  EXPECT_EQ(s.message().rfind("LazyAdamQuant: ", 0), 0u) << s.message();
  for (const auto &n : needles)
    EXPECT_NE(s.message().find(n), std::string::npos) << "'" << n << "' not in: " << s.message();
}

TEST(LazyAdamQuantRefusals, ShapesDtypesAndAttributes) {
  Case c = make_case(50, {64, 16, 300});
  LazyAdamQuantProblem p;
  std::vector<uint16_t> half(16 * 300);
  std::vector<float> small(64 * 1);
  auto with = [&](auto edit) {
    LazyAdamQuantTensors t = c.tensors();
    edit(t);
    return LazyAdamQuantProblem::make(t, {}, &p);
  };
  expect_invalid(with([&](auto &t) { t.var.dtype = DType::kInt32; }), {"inputVar", "int32"});
  expect_invalid(with([&](auto &t) {
                   t.gradient = TensorView::contiguous(half.data(), DType::kBFloat16, {16, 300});
                 }),
                 {"gradient", "bfloat16", "float32"});
  expect_invalid(with([&](auto &t) { t.m.dtype = DType::kInt32; }), {"inputM", "uint8"});
  expect_invalid(with([&](auto &t) { t.v.shape[1] = 299; }), {"inputV", "same shape"});
  expect_invalid(with([&](auto &t) { t.gradient.shape[0] = 15; }), {"gradient", "16 entries"});
  expect_invalid(with([&](auto &t) {
                   t.absmax_m = TensorView::of(small.data(), {64, 1});
                 }),
                 {"absmaxM", "[64, 2]", "ceil(300 / 256)"});
  expect_invalid(with([&](auto &t) { t.absmax_v.shape[0] = 63; }), {"absmaxV", "[64, 2]"});
  expect_invalid(with([&](auto &t) { t.qmap_m.shape[0] = 255; }), {"qmapM", "float32 [256]"});
  expect_invalid(with([&](auto &t) { t.qmap_v.dtype = DType::kInt32; }), {"qmapV", "int32"});
  expect_invalid(with([&](auto &t) { t.indices.dtype = DType::kFloat32; }), {"indices", "int32"});
  expect_invalid(with([&](auto &t) { t.var.strides[0] = 299; }), {"inputVar", "overlap"});
  expect_invalid(with([&](auto &t) {
                   t.m.strides[0] = 1;
                   t.m.strides[1] = 64;
                 }),
                 {"inputM", "contiguous last dimension"});
  LazyAdamQuantOptions o;
  for (auto [b1, b2, eps, needle] : {std::tuple{1.0, 0.999, 1e-7, "beta1 = 1"},
                                     {0.9, 1.0 - 1e-9, 1e-7, "beta2"},
                                     {0.9, 0.999, 1e-60, "epsilon = 1e-60"},
                                     {0.9, 0.999, 0.0, "epsilon = 0"},
                                     {-0.1, 0.999, 1e-7, "beta1 = -0.1"}}) {
    o.beta1 = b1;
    o.beta2 = b2;
    o.epsilon = eps;
    expect_invalid(LazyAdamQuantProblem::make(c.tensors(), o, &p), {needle});
  }
  // UE3M5's v (fp8_ue3m5) is ApplyAdamWQuant's: refused here, naming the formats this one takes.
  o = LazyAdamQuantOptions{};
  o.state_format = QuantStateFormat::kFp8Ue3m5;
  LazyAdamQuantTensors t = c.tensors();
  t.qmap_m.shape[0] = 0;
  t.qmap_v.shape[0] = 0;
  expect_invalid(LazyAdamQuantProblem::make(t, o, &p),
                 {"state_format = 2 (fp8_ue3m5)", "ApplyAdamWQuant", "1 (fp8)"});
  o.state_format = static_cast<QuantStateFormat>(3);
  expect_invalid(LazyAdamQuantProblem::make(t, o, &p), {"state_format = 3", "1: fp8)"});
}

TEST(LazyAdamQuantRefusals, OverlapsAndMissingData) {
  Case c = make_case(51, {300, 16, 8});  // absmax holds more than a map's 256 floats
  LazyAdamQuantProblem p;
  ASSERT_TRUE(LazyAdamQuantProblem::make(c.tensors(), {}, &p).ok());
  LazyAdamQuantTensors t = c.tensors();
  t.v.data = c.m.data();
  expect_invalid(p.check(t), {"inputM and inputV overlap"});
  t = c.tensors();
  t.absmax_v.data = c.am.data();
  expect_invalid(p.check(t), {"absmaxM and absmaxV overlap"});
  t = c.tensors();
  t.qmap_m.data = c.am.data();
  expect_invalid(p.check(t), {"absmaxM and qmapM overlap"});
  t = c.tensors();
  t.qmap_v.data = nullptr;
  EXPECT_EQ(p.check(t).code(), StatusCode::kNullPointer);
}

TEST(LazyAdamQuantRefusals, DataCheckedInPhaseTwoBeforeAnythingIsWritten) {
  for (const Way &w : ways()) {
    SCOPED_TRACE(way_name(w));
    const LazyAdamQuantOptions o = options_of(make_case(52, {64, 40, 8}), &w);
    {  // an index out of range: the first bad position named, nothing written
      Case c = make_case(52, {64, 40, 8});
      c.idx[7] = 64;
      c.idx[20] = int64_t{1} << 40;
      const Case before = c;
      for (DType it : {DType::kInt32, DType::kInt64}) {
        if (it == DType::kInt32) c.idx[20] = 1000;
        const Status s = run_cpp(c, o, nullptr, it);
        expect_invalid(s, {"indices[7] = 64", "64 rows", "nothing was modified"});
      }
      c.idx[20] = int64_t{1} << 40;
      expect_same(c, before);
    }
    {  // a map that is not ascending, one that is not finite
      Case c = make_case(53, {64, 40, 8});
      const Case before = c;
      std::swap(c.qv[40], c.qv[41]);
      expect_invalid(run_cpp(c, o), {"qmapV[41]", "is less than qmapV[40]", "ascending"});
      c.qv = before.qv;
      c.qm[3] = kNaN;
      expect_invalid(run_cpp(c, o), {"qmapM[3] = nan", "not finite"});
      c.qm = before.qm;
      expect_same(c, before);
    }
    {  // lr
      Case c = make_case(54, {64, 40, 8});
      const Case before = c;
      c.lr = kInf;
      expect_invalid(run_cpp(c, o), {"lr = inf"});
      expect_same(c, before);
    }
  }
}

// ================================================================================================
// The aclnn face
// ================================================================================================

struct Acl : fusekit::testing::AclTensors {
  Case c;
  float lr_value = 0.01f;
  aclTensor *grad = nullptr, *idx = nullptr, *m = nullptr, *v = nullptr, *var = nullptr,
            *qm = nullptr, *qv = nullptr, *am = nullptr, *av = nullptr, *lr = nullptr;

  explicit Acl(uint64_t salt, Shape sh = {64, 32, 40}, DType t = DType::kFloat32)
      : c(make_case(salt, sh, t, t)) {
    const aclDataType dt = t == DType::kFloat32   ? ACL_FLOAT
                           : t == DType::kFloat16 ? ACL_FLOAT16
                                                  : ACL_BF16;
    grad = make({c.n, c.dim}, dt, c.grad.data());
    idx = make({c.n}, ACL_INT64, c.idx.data());
    m = make({c.rows, c.dim}, ACL_UINT8, c.m.data());
    v = make({c.rows, c.dim}, ACL_UINT8, c.v.data());
    var = make({c.rows, c.dim}, dt, c.var.data());
    qm = make({256}, ACL_FLOAT, c.qm.data());
    qv = make({256}, ACL_FLOAT, c.qv.data());
    am = make({c.rows, c.blocks}, ACL_FLOAT, c.am.data());
    av = make({c.rows, c.blocks}, ACL_FLOAT, c.av.data());
    lr = make({1}, ACL_FLOAT, &lr_value);
    c.lr = lr_value;
  }
  aclnnStatus phase_one(uint64_t *ws, aclOpExecutor **ex, double b1 = 0.9, double b2 = 0.999,
                        double eps = 1e-7) {
    return aclnnLazyAdamQuantGetWorkspaceSize(grad, idx, m, v, var, qm, qv, am, av, lr, b1, b2, eps,
                                              ws, ex);
  }
  aclnnStatus both_phases() {
    return fusekit::testing::both_phases(
        [&](uint64_t *ws, aclOpExecutor **ex) { return phase_one(ws, ex); }, aclnnLazyAdamQuant);
  }
};

void expect_refused(aclnnStatus got, aclnnStatus code, const std::vector<std::string> &needles) {
  fusekit::testing::expect_aclnn_refused(got, code, "aclnnLazyAdamQuant: ", needles);
}

TEST(LazyAdamQuantAclnn, RunsAndMatchesTheOracle) {
  for (DType t : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    Acl a(60, {64, 32, 300, 0.2}, t);
    Case want = a.c;
    oracle(want);
    ASSERT_EQ(a.both_phases(), ACLNN_SUCCESS) << last_message();
    expect_same(a.c, want);
  }
}

TEST(LazyAdamQuantAclnn, LrIsReadWhenPhaseTwoRuns) {
  Acl a(61);
  uint64_t ws = 0;
  aclOpExecutor *ex = nullptr;
  ASSERT_EQ(a.phase_one(&ws, &ex), ACLNN_SUCCESS);
  a.lr_value = 0.25f;  // changed between the phases
  Case want = a.c;
  want.lr = 0.25f;
  oracle(want);
  std::vector<char> buf(ws);
  ASSERT_EQ(aclnnLazyAdamQuant(buf.data(), ws, ex, nullptr), ACLNN_SUCCESS);
  expect_same(a.c, want);
}

TEST(LazyAdamQuantAclnn, NullArgumentsAndRefusalsInPhaseOne) {
  Acl a(62);
  const Case before = a.c;
  uint64_t ws = 0;
  aclOpExecutor *ex = nullptr;
  const char *names[] = {"gradient", "indices", "inputM",  "inputV",  "inputVar",
                         "qmapM",    "qmapV",   "absmaxM", "absmaxV", "lr"};
  for (int k = 0; k < 10; ++k) {
    aclTensor *t[10] = {a.grad, a.idx, a.m, a.v, a.var, a.qm, a.qv, a.am, a.av, a.lr};
    t[k] = nullptr;
    expect_refused(aclnnLazyAdamQuantGetWorkspaceSize(t[0], t[1], t[2], t[3], t[4], t[5], t[6],
                                                      t[7], t[8], t[9], 0.9, 0.999, 1e-7, &ws, &ex),
                   ACLNN_ERR_PARAM_NULLPTR, {names[k], "null"});
    EXPECT_EQ(ex, nullptr);
  }
  expect_refused(a.phase_one(nullptr, &ex), ACLNN_ERR_PARAM_NULLPTR, {"workspaceSize"});
  expect_refused(a.phase_one(&ws, nullptr), ACLNN_ERR_PARAM_NULLPTR, {"executor"});
  expect_refused(a.phase_one(&ws, &ex, 1.0), ACLNN_ERR_PARAM_INVALID, {"beta1 = 1"});
  expect_refused(a.phase_one(&ws, &ex, 0.9, 0.999, 1e-60), ACLNN_ERR_PARAM_INVALID,
                 {"epsilon = 1e-60", "float32"});
  std::vector<float> small(64);
  aclTensor *am_bad = a.make({32, 1}, ACL_FLOAT, small.data());
  expect_refused(aclnnLazyAdamQuantGetWorkspaceSize(a.grad, a.idx, a.m, a.v, a.var, a.qm, a.qv,
                                                    am_bad, a.av, a.lr, 0.9, 0.999, 1e-7, &ws, &ex),
                 ACLNN_ERR_PARAM_INVALID,
                 {"absmaxM must be float32 [64, 1]", "got float32 [32, 1]"});
  aclTensor *var_i32 = a.make({64, 40}, ACL_INT32, a.c.var.data());
  expect_refused(aclnnLazyAdamQuantGetWorkspaceSize(a.grad, a.idx, a.m, a.v, var_i32, a.qm, a.qv,
                                                    a.am, a.av, a.lr, 0.9, 0.999, 1e-7, &ws, &ex),
                 ACLNN_ERR_PARAM_INVALID, {"inputVar has dtype int32"});
  aclTensor *lr_i32 = a.make({1}, ACL_INT32, &a.lr_value);
  expect_refused(aclnnLazyAdamQuantGetWorkspaceSize(a.grad, a.idx, a.m, a.v, a.var, a.qm, a.qv,
                                                    a.am, a.av, lr_i32, 0.9, 0.999, 1e-7, &ws, &ex),
                 ACLNN_ERR_PARAM_INVALID, {"lr must be one float32 element"});
  // inputV over inputM's memory.
  aclTensor *v_alias = a.make({64, 40}, ACL_UINT8, a.c.m.data());
  expect_refused(aclnnLazyAdamQuantGetWorkspaceSize(a.grad, a.idx, a.m, v_alias, a.var, a.qm, a.qv,
                                                    a.am, a.av, a.lr, 0.9, 0.999, 1e-7, &ws, &ex),
                 ACLNN_ERR_PARAM_INVALID, {"inputM and inputV overlap"});
  expect_same(a.c, before);
}

TEST(LazyAdamQuantAclnn, DataRefusedInPhaseTwoModifiesNothing) {
  {
    Acl a(63);
    a.c.idx[7] = 64;
    const Case before = a.c;
    uint64_t ws = 0;
    aclOpExecutor *ex = nullptr;
    ASSERT_EQ(a.phase_one(&ws, &ex), ACLNN_SUCCESS);  // index values are data: phase two
    std::vector<char> buf(ws);
    expect_refused(aclnnLazyAdamQuant(buf.data(), ws, ex, nullptr), ACLNN_ERR_PARAM_INVALID,
                   {"indices[7] = 64", "64 rows", "nothing was modified"});
    expect_same(a.c, before);
  }
  {
    Acl a(64);
    const Case before = a.c;
    uint64_t ws = 0;
    aclOpExecutor *ex = nullptr;
    ASSERT_EQ(a.phase_one(&ws, &ex), ACLNN_SUCCESS);
    a.c.qm[200] = a.c.qm[100];  // not ascending any more
    std::vector<char> buf(ws);
    expect_refused(aclnnLazyAdamQuant(buf.data(), ws, ex, nullptr), ACLNN_ERR_PARAM_INVALID,
                   {"qmapM[200]", "ascending", "nothing was modified"});
    a.c.qm = before.qm;
    expect_same(a.c, before);
  }
  {
    Acl a(65);
    const Case before = a.c;
    uint64_t ws = 0;
    aclOpExecutor *ex = nullptr;
    ASSERT_EQ(a.phase_one(&ws, &ex), ACLNN_SUCCESS);
    a.lr_value = kNaN;
    std::vector<char> buf(ws);
    expect_refused(aclnnLazyAdamQuant(buf.data(), ws, ex, nullptr), ACLNN_ERR_PARAM_INVALID,
                   {"lr = nan"});
    ASSERT_EQ(a.phase_one(&ws, &ex), ACLNN_SUCCESS);
    a.lr_value = 0.01f;
    expect_refused(aclnnLazyAdamQuant(buf.data(), ws - 1, ex, nullptr), ACLNN_ERR_PARAM_INVALID,
                   {"workspaceSize = " + std::to_string(ws - 1)});
    expect_same(a.c, before);
    // An executor that is never run is dropped with aclDestroyAclOpExecutor.
    ASSERT_EQ(a.phase_one(&ws, &ex), ACLNN_SUCCESS);
    EXPECT_EQ(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
  }
}

TEST(LazyAdamQuantAclnn, NonFiniteRowsLeaveAWarning) {
  Acl a(66);
  a.c.grad.set(3 * 40 + 2, kInf);
  Case want = a.c;
  const OracleResult expected = oracle(want);
  ASSERT_EQ(expected.skipped, 1);
  ASSERT_EQ(a.both_phases(), ACLNN_SUCCESS);
  expect_same(a.c, want);
  EXPECT_NE(last_message().find("1 rows were left unchanged"), std::string::npos) << last_message();
}

TEST(LazyAdamQuantAclnn, TwoStreamsFromTwoThreads) {
  Acl a(67, {500, 400, 24}), b(68, {500, 400, 24}, DType::kBFloat16);
  Case wa = a.c, wb = b.c;
  oracle(wa);
  oracle(wb);
  aclnnStatus sa = -1, sb = -1;
  std::thread ta([&] { sa = a.both_phases(); });
  std::thread tb([&] { sb = b.both_phases(); });
  ta.join();
  tb.join();
  EXPECT_EQ(sa, ACLNN_SUCCESS);
  EXPECT_EQ(sb, ACLNN_SUCCESS);
  expect_same(a.c, wa);
  expect_same(b.c, wb);
}

}  // namespace
