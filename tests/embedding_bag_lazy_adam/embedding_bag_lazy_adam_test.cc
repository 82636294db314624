// EmbeddingBagLazyAdam: every expected value comes from the oracle below, a plain float32 scalar
// implementation of docs/embedding_bag_lazy_adam.md written independently of the library (the bag
// of a lookup found by searching the offsets, std::map grouping, no sorting, no SIMD, no
// workspace). The doc fixes every float32 operation, so results must match it bit for bit, on
// every SIMD target, implementation and thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "common/embedding_bag_oracle.h"
#include "common/row_groups.h"
#include "common/simd_targets.h"
#include "common/test_util.h"
#include "fusekit/embedding_bag_lazy_adam.h"

namespace {

using namespace fusekit;           // the library under test
using namespace fusekit::testing;  // tests/common

// A table of R rows with D columns stored with row stride S >= D; the columns past D hold values
// that must survive every step.
struct Table {
  int64_t rows = 0, dim = 0, stride = 0;
  std::vector<float> data;
  Table(int64_t r, int64_t d, int64_t s, std::mt19937_64 &rng, float lo, float hi)
      : rows(r),
        dim(d),
        stride(s),
        data(uniform(rng, static_cast<size_t>(std::max<int64_t>(r * s, 1)), lo, hi)) {}
  float &at(int64_t r, int64_t c) { return data[static_cast<size_t>(r * stride + c)]; }
  TensorView view() {
    return TensorView::strided(data.data(), DType::kFloat32, {rows, dim}, {stride, 1});
  }
};

struct Case {
  int64_t bags, lookups, rows, dim;
  int64_t grad_stride;
  std::vector<float> grad;  // [bags, grad_stride]
  std::vector<int64_t> idx, off;
  std::vector<int32_t> idx32, off32;
  std::vector<float> weights;  // empty: unweighted
  Table m, v, var;
  PoolingMode pooling = PoolingMode::kSum;
  bool weighted = false;
  float lr = 0.01f;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  DType index_type = DType::kInt64, offset_type = DType::kInt64;

  EmbeddingBagLazyAdamTensors tensors() {
    idx32.assign(idx.begin(), idx.end());
    off32.assign(off.begin(), off.end());
    EmbeddingBagLazyAdamTensors t;
    t.grad_output =
        TensorView::strided(grad.data(), DType::kFloat32, {bags, dim}, {grad_stride, 1});
    t.indices = index_type == DType::kInt64 ? TensorView::of(idx.data(), {lookups})
                                            : TensorView::of(idx32.data(), {lookups});
    t.offsets = offset_type == DType::kInt64 ? TensorView::of(off.data(), {bags + 1})
                                             : TensorView::of(off32.data(), {bags + 1});
    if (weighted) t.per_sample_weights = TensorView::of(weights.data(), {lookups});
    t.m = m.view();
    t.v = v.view();
    t.var = var.view();
    return t;
  }
  EmbeddingBagLazyAdamOptions options(const char *impl = nullptr, int threads = 2) const {
    EmbeddingBagLazyAdamOptions o;
    o.beta1 = beta1;
    o.beta2 = beta2;
    o.epsilon = eps;
    o.pooling = pooling;
    o.implementation = impl;
    o.num_threads = threads;
    return o;
  }
};

// B bags of 0 .. max_bag lookups each (some empty), ids in [0, id_range) (a small range: many
// duplicates within and across bags), table stride S (>= D), gradient row stride G (>= D).
Case make_case(uint64_t salt, int64_t bags, int max_bag, int64_t rows, int64_t id_range,
               int64_t dim, bool weighted, PoolingMode pooling, int64_t stride = -1,
               int64_t grad_stride = -1) {
  auto rng = rng_for(salt);
  if (stride < 0) stride = dim;
  if (grad_stride < 0) grad_stride = dim;
  std::uniform_int_distribution<int> len(0, max_bag);
  std::uniform_int_distribution<int64_t> id(0, std::max<int64_t>(id_range - 1, 0));
  std::vector<int64_t> off{0}, idx;
  for (int64_t b = 0; b < bags; ++b) {
    const int n = len(rng);
    for (int k = 0; k < n; ++k) idx.push_back(id(rng));
    off.push_back(static_cast<int64_t>(idx.size()));
  }
  const auto lookups = static_cast<int64_t>(idx.size());
  Case c{bags,
         lookups,
         rows,
         dim,
         grad_stride,
         uniform(rng, static_cast<size_t>(std::max<int64_t>(bags * grad_stride, 1)), -2.f, 2.f),
         idx,
         off,
         {},
         {},
         weighted ? uniform(rng, static_cast<size_t>(lookups), -1.5f, 1.5f) : std::vector<float>{},
         Table(rows, dim, stride, rng, -1.f, 1.f),
         Table(rows, dim, stride, rng, 0.f, 1.f),
         Table(rows, dim, stride, rng, -3.f, 3.f)};
  c.pooling = pooling;
  c.weighted = weighted;
  return c;
}

// The oracle: docs/embedding_bag_lazy_adam.md in plain float32 scalar code.
struct OracleResult {
  int64_t updated = 0, skipped = 0;
};
OracleResult oracle(Case &c) {
  const float b1 = static_cast<float>(c.beta1), b2 = static_cast<float>(c.beta2);
  const float e = static_cast<float>(c.eps);
  const float omb1 = 1.0f - b1, omb2 = 1.0f - b2;
  OracleResult res;
  for (auto &[row, g] :
       oracle_bag_gradients(c.grad, c.grad_stride, c.idx, c.off, c.weights, c.pooling, c.dim)) {
    if (!std::all_of(g.begin(), g.end(), [](float x) { return std::isfinite(x); })) {
      ++res.skipped;
      continue;
    }
    ++res.updated;
    for (int64_t j = 0; j < c.dim; ++j) {
      const float gj = g[static_cast<size_t>(j)];
      float &m = c.m.at(row, j);
      float &v = c.v.at(row, j);
      float &w = c.var.at(row, j);
      m = m * b1 + gj * omb1;
      v = std::fabs(v * b2 + (gj * gj) * omb2);
      w = w + (m * -c.lr) / (std::sqrt(v) + e);
    }
  }
  return res;
}

// A plan for the case's tensors, run once with a workspace of the size it asks for.
Status run_cpp(Case &c, const char *impl, int threads, EmbeddingBagLazyAdamStats *stats) {
  const EmbeddingBagLazyAdamTensors t = c.tensors();
  EmbeddingBagLazyAdamProblem problem;
  FUSEKIT_RETURN_IF_ERROR(EmbeddingBagLazyAdamProblem::make(t, c.options(impl, threads), &problem));
  EmbeddingBagLazyAdam plan;
  FUSEKIT_RETURN_IF_ERROR(EmbeddingBagLazyAdam::plan(problem, c.options(impl, threads), &plan));
  std::vector<char> ws(plan.workspace_size(t));
  return plan.run(t, {.lr = c.lr, .lr_tensor = {}}, ws.data(), ws.size(), stats);
}

void expect_tables_equal(Case &got, Case &want) {
  EXPECT_EQ(count_bit_mismatches(got.m.data.data(), want.m.data.data(), got.m.data.size(), "m"),
            0u);
  EXPECT_EQ(count_bit_mismatches(got.v.data.data(), want.v.data.data(), got.v.data.size(), "v"),
            0u);
  EXPECT_EQ(
      count_bit_mismatches(got.var.data.data(), want.var.data.data(), got.var.data.size(), "var"),
      0u);
}

using Mode = BagMode;
constexpr const BagMode (&kModes)[4] = kBagModes;

// ---------------------------------------------------------------------------------------------
// Results against the oracle
// ---------------------------------------------------------------------------------------------

class EmbeddingBagLazyAdamDims : public ::testing::TestWithParam<int64_t> {};

TEST_P(EmbeddingBagLazyAdamDims, EveryModeImplementationTargetAndThreadCountMatchesTheOracle) {
  const int64_t dim = GetParam();
  const std::vector<std::string> impls = EmbeddingBagLazyAdam::implementations();
  ASSERT_EQ(impls.back(), "cpu_reference");
  for (const Mode &mode : kModes) {
    SCOPED_TRACE(mode_name(mode));
    const uint64_t salt = 100 + static_cast<uint64_t>(dim) * 4 + (mode.weighted ? 1 : 0) +
                          (mode.pooling == PoolingMode::kMean ? 2 : 0);
    // 40 bags of 0 .. 6 ids from 60 of 80 rows: duplicates within and across bags, empty bags,
    // untouched rows.
    Case want = make_case(salt, 40, 6, 80, 60, dim, mode.weighted, mode.pooling);
    const OracleResult expected = oracle(want);
    ASSERT_GT(expected.updated, 30);
    for_each_simd_target([&](const char *target) {
      EXPECT_STREQ(hwy_dispatched_target(), target);
      for (const std::string &impl : impls) {
        SCOPED_TRACE(impl);
        for (int threads : {1, 2, 3}) {
          SCOPED_TRACE(threads);
          Case got = make_case(salt, 40, 6, 80, 60, dim, mode.weighted, mode.pooling);
          got.index_type = threads == 2 ? DType::kInt32 : DType::kInt64;
          got.offset_type = threads == 3 ? DType::kInt32 : DType::kInt64;
          EmbeddingBagLazyAdamStats stats;
          const Status st = run_cpp(got, impl.c_str(), threads, &stats);
          ASSERT_TRUE(st.ok()) << st.message();
          expect_tables_equal(got, want);
          EXPECT_EQ(stats.rows_updated, expected.updated);
          EXPECT_EQ(stats.rows_skipped_nonfinite, 0);
        }
      }
    });
  }
}

INSTANTIATE_TEST_SUITE_P(VectorWidthEdges, EmbeddingBagLazyAdamDims,
                         ::testing::Values(1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 31, 32, 33, 63,
                                           64, 65, 100, 255, 256, 257, 600));

TEST(EmbeddingBagLazyAdam, ALargeBatchGroupedBySortingOrByTheBitmapMatchesTheOracle) {
  // ~20k lookups into 3000 rows (many repeats), D = 32, every mode; then the same with the
  // duplicate bitmap off (every batch grouped by the radix sort, as for a huge table).
  for (const bool bitmap : {true, false}) {
    SCOPED_TRACE(bitmap ? "bitmap" : "sorted");
    set_row_groups_bitmap_limit_for_testing(bitmap ? (int64_t{64} << 20) : -1);
    for (const Mode &mode : kModes) {
      SCOPED_TRACE(mode_name(mode));
      Case want = make_case(7, 8192, 4, 3000, 3000, 32, mode.weighted, mode.pooling);
      oracle(want);
      for (const char *impl : {"cpu_hwy", "cpu_reference"}) {
        Case got = make_case(7, 8192, 4, 3000, 3000, 32, mode.weighted, mode.pooling);
        ASSERT_TRUE(run_cpp(got, impl, 3, nullptr).ok());
        expect_tables_equal(got, want);
      }
    }
  }
  set_row_groups_bitmap_limit_for_testing(int64_t{64} << 20);
}

TEST(EmbeddingBagLazyAdam, MultiHotBagsOfFiftyMatchTheOracle) {
  for (const Mode &mode : kModes) {
    SCOPED_TRACE(mode_name(mode));
    Case want = make_case(8, 300, 100, 20000, 20000, 16, mode.weighted, mode.pooling);
    oracle(want);
    Case got = make_case(8, 300, 100, 20000, 20000, 16, mode.weighted, mode.pooling);
    ASSERT_TRUE(run_cpp(got, nullptr, 2, nullptr).ok());
    expect_tables_equal(got, want);
  }
}

TEST(EmbeddingBagLazyAdam, UntouchedRowsAreNeverReadNorWritten) {
  // Every row no lookup names holds a poison NaN in m, v and var: it would make any row that
  // read it non-finite (counted as skipped), and must keep its bits.
  for (const Mode &mode : kModes) {
    SCOPED_TRACE(mode_name(mode));
    Case c = make_case(9, 50, 5, 400, 400, 19, mode.weighted, mode.pooling);
    std::vector<bool> touched(400, false);
    for (int64_t r : c.idx) touched[static_cast<size_t>(r)] = true;
    for (int64_t r = 0; r < 400; ++r) {
      if (touched[static_cast<size_t>(r)]) continue;
      for (int64_t j = 0; j < 19; ++j)
        c.m.at(r, j) = c.v.at(r, j) = c.var.at(r, j) = poison_float();
    }
    Case want = c;
    const OracleResult expected = oracle(want);
    for (const char *impl : {"cpu_hwy", "cpu_reference"}) {
      Case got = c;
      EmbeddingBagLazyAdamStats stats;
      ASSERT_TRUE(run_cpp(got, impl, 2, &stats).ok());
      expect_tables_equal(got, want);
      EXPECT_EQ(stats.rows_skipped_nonfinite, 0);
      EXPECT_EQ(stats.rows_updated, expected.updated);
      for (int64_t r = 0; r < 400; ++r) {
        EXPECT_EQ(is_poison(got.var.at(r, 0)), !touched[static_cast<size_t>(r)]) << r;
      }
    }
  }
}

TEST(EmbeddingBagLazyAdam, EmptyBatchAndEmptyBagsChangeNothing) {
  for (const Mode &mode : kModes) {
    SCOPED_TRACE(mode_name(mode));
    for (int64_t bags : {0, 1, 5}) {
      Case c = make_case(10, bags, 0, 30, 30, 8, mode.weighted, mode.pooling);  // bags of 0 ids
      ASSERT_EQ(c.lookups, 0);
      Case before = c;
      EmbeddingBagLazyAdamStats stats;
      const Status st = run_cpp(c, nullptr, 2, &stats);
      ASSERT_TRUE(st.ok()) << st.message();
      expect_tables_equal(c, before);
      EXPECT_EQ(stats.rows_updated, 0);
    }
  }
}

TEST(EmbeddingBagLazyAdam, AllLookupsOfOneRow) {
  for (const Mode &mode : kModes) {
    SCOPED_TRACE(mode_name(mode));
    for (int64_t bags : {1, 3, 257, 2000}) {
      Case want = make_case(11, bags, 3, 20, 1, 33, mode.weighted, mode.pooling);
      for (auto &g : want.grad) g *= 1e-3f;
      Case got = want;
      const OracleResult expected = oracle(want);
      EmbeddingBagLazyAdamStats stats;
      ASSERT_TRUE(run_cpp(got, "cpu_hwy", 2, &stats).ok());
      expect_tables_equal(got, want);
      EXPECT_EQ(stats.rows_updated, expected.updated);
    }
  }
}

TEST(EmbeddingBagLazyAdam, NonFiniteRowsAreSkippedAndCounted) {
  for (const char *impl : {"cpu_hwy", "cpu_reference"}) {
    SCOPED_TRACE(impl);
    for (const Mode &mode : kModes) {
      SCOPED_TRACE(mode_name(mode));
      Case want = make_case(12, 60, 4, 100, 90, 19, mode.weighted, mode.pooling);
      // A NaN and an Inf in two bags' gradients (every row they look up is skipped), and, when
      // weighted, an infinite weight.
      want.grad[static_cast<size_t>(3 * 19 + 5)] = std::numeric_limits<float>::quiet_NaN();
      want.grad[static_cast<size_t>(17 * 19 + 18)] = std::numeric_limits<float>::infinity();
      if (mode.weighted && want.lookups > 40) {
        want.weights[40] = -std::numeric_limits<float>::infinity();
      }
      Case got = want;
      const OracleResult expected = oracle(want);
      EmbeddingBagLazyAdamStats stats;
      ASSERT_TRUE(run_cpp(got, impl, 2, &stats).ok());
      expect_tables_equal(got, want);
      EXPECT_EQ(stats.rows_skipped_nonfinite, expected.skipped);
      EXPECT_EQ(stats.rows_updated, expected.updated);
    }
  }
  // Two huge finite contributions whose sum overflows: skipped too.
  Case want = make_case(13, 2, 1, 10, 1, 8, false, PoolingMode::kSum);
  std::fill(want.grad.begin(), want.grad.end(), 3e38f);
  want.idx = {0, 0};  // row 0 once in each bag
  want.off = {0, 1, 2};
  want.lookups = 2;
  Case got = want;
  EXPECT_EQ(oracle(want).skipped, 1);
  EmbeddingBagLazyAdamStats stats;
  ASSERT_TRUE(run_cpp(got, nullptr, 1, &stats).ok());
  expect_tables_equal(got, want);
  EXPECT_EQ(stats.rows_skipped_nonfinite, 1);
}

TEST(EmbeddingBagLazyAdam, StridedTablesGradientAndBatchVectors) {
  // Tables with row stride 40 > D = 33 and a gradient with row stride 37: the gap columns survive.
  Case want = make_case(14, 30, 5, 60, 60, 33, true, PoolingMode::kMean, 40, 37);
  Case got = want;
  oracle(want);
  ASSERT_TRUE(run_cpp(got, nullptr, 2, nullptr).ok());
  expect_tables_equal(got, want);

  // indices, offsets and per_sample_weights as strided views.
  Case c = make_case(15, 20, 4, 50, 50, 8, true, PoolingMode::kSum);
  Case ref = c;
  oracle(ref);
  std::vector<int64_t> idx3(static_cast<size_t>(c.lookups * 3), 999999);
  std::vector<int32_t> off2(static_cast<size_t>((c.bags + 1) * 2), -7);
  std::vector<float> w5(static_cast<size_t>(c.lookups * 5), std::nanf(""));
  for (int64_t i = 0; i < c.lookups; ++i) {
    idx3[static_cast<size_t>(i * 3)] = c.idx[static_cast<size_t>(i)];
    w5[static_cast<size_t>(i * 5)] = c.weights[static_cast<size_t>(i)];
  }
  for (int64_t b = 0; b <= c.bags; ++b) {
    off2[static_cast<size_t>(b * 2)] = static_cast<int32_t>(c.off[static_cast<size_t>(b)]);
  }
  EmbeddingBagLazyAdamTensors t = c.tensors();
  t.indices = TensorView::strided(idx3.data(), DType::kInt64, {c.lookups}, {3});
  t.offsets = TensorView::strided(off2.data(), DType::kInt32, {c.bags + 1}, {2});
  t.per_sample_weights = TensorView::strided(w5.data(), DType::kFloat32, {c.lookups}, {5});
  const Status st = embedding_bag_lazy_adam_step(t, c.lr, c.options(), nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
  expect_tables_equal(c, ref);
}

// ---------------------------------------------------------------------------------------------
// The batch is bound per run
// ---------------------------------------------------------------------------------------------

TEST(EmbeddingBagLazyAdamPlan, APlanForTheTableRunsBatchesOfAnySize) {
  for (const Mode &mode : kModes) {
    SCOPED_TRACE(mode_name(mode));
    // The plan is made from an empty batch: only the table, dtypes and attributes count.
    Case first = make_case(20, 0, 0, 500, 500, 24, mode.weighted, mode.pooling);
    const EmbeddingBagLazyAdamTensors t0 = first.tensors();
    EmbeddingBagLazyAdamProblem problem;
    ASSERT_TRUE(EmbeddingBagLazyAdamProblem::make(t0, first.options(), &problem).ok());
    EmbeddingBagLazyAdam plan;
    ASSERT_TRUE(EmbeddingBagLazyAdam::plan(problem, first.options(), &plan).ok());
    EXPECT_EQ(plan.workspace_size(0, 0), 0u);
    uint64_t salt = 21;
    for (int64_t bags : {1, 100, 7, 2048, 0, 33}) {
      SCOPED_TRACE(bags);
      Case want = make_case(salt, bags, 4, 500, 400, 24, mode.weighted, mode.pooling);
      Case got = make_case(salt++, bags, 4, 500, 400, 24, mode.weighted, mode.pooling);
      oracle(want);
      const EmbeddingBagLazyAdamTensors t = got.tensors();
      EXPECT_EQ(plan.workspace_size(t), plan.workspace_size(got.bags, got.lookups));
      std::vector<char> ws(plan.workspace_size(t));
      const Status st = plan.run(t, {.lr = got.lr, .lr_tensor = {}}, ws.data(), ws.size());
      ASSERT_TRUE(st.ok()) << st.message();
      expect_tables_equal(got, want);
      if (got.lookups > 0) {
        // A workspace one byte short of this batch's is refused.
        const Status small = plan.run(t, {.lr = got.lr, .lr_tensor = {}}, ws.data(), ws.size() - 1);
        EXPECT_FALSE(small.ok());
        EXPECT_NE(small.message().find("workspace"), std::string::npos) << small.message();
      }
    }
  }
}

TEST(EmbeddingBagLazyAdamPlan, TheOneCallAndTheBoundPlanGiveTheSameBits) {
  Case want = make_case(22, 64, 4, 100, 90, 16, true, PoolingMode::kMean);
  Case got1 = want, got2 = want;
  oracle(want);
  ASSERT_TRUE(embedding_bag_lazy_adam_step(got1.tensors(), got1.lr, got1.options(), nullptr).ok());
  expect_tables_equal(got1, want);
  EmbeddingBagLazyAdam plan;
  const EmbeddingBagLazyAdamTensors t = got2.tensors();
  ASSERT_TRUE(EmbeddingBagLazyAdam::plan(t, got2.options(), &plan).ok());
  std::vector<char> ws(plan.workspace_size(t));
  ASSERT_TRUE(plan.run(got2.lr, ws.data(), ws.size()).ok());
  expect_tables_equal(got2, want);
}

// ---------------------------------------------------------------------------------------------
// Refusals: nothing is written
// ---------------------------------------------------------------------------------------------

// Runs `c` after `edit` changed its tensors and expects a refusal whose message holds `needle`,
// with the tables unchanged.
template <class Edit>
void expect_refused(Case c, const std::string &needle, Edit &&edit) {
  SCOPED_TRACE(needle);
  const Case before = c;
  EmbeddingBagLazyAdamTensors t = c.tensors();
  EmbeddingBagLazyAdamOptions o = c.options();
  float lr = c.lr;
  edit(t, o, lr);
  const Status st = embedding_bag_lazy_adam_step(t, lr, o, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  EXPECT_EQ(std::memcmp(c.m.data.data(), before.m.data.data(), c.m.data.size() * 4), 0);
  EXPECT_EQ(std::memcmp(c.v.data.data(), before.v.data.data(), c.v.data.size() * 4), 0);
  EXPECT_EQ(std::memcmp(c.var.data.data(), before.var.data.data(), c.var.data.size() * 4), 0);
}

TEST(EmbeddingBagLazyAdamRefusals, BadIdsAndOffsetsAreRefusedBeforeAnythingIsWritten) {
  Case c = make_case(30, 20, 4, 50, 50, 8, true, PoolingMode::kMean);
  ASSERT_GT(c.lookups, 20);
  const auto none = [](auto &, auto &, auto &) {};
  Case hi = c;
  hi.idx[17] = 50;
  expect_refused(hi, "indices[17] = 50 but the table has 50 rows; nothing was modified", none);
  Case neg = c;
  neg.idx[19] = 50;  // a later id out of range: the first bad position is named
  neg.idx[11] = -1;
  expect_refused(neg, "indices[11] = -1 is negative", none);
  Case first = c;
  first.off[0] = 1;
  expect_refused(first, "offsets[0] = 1 but the first bag must start at 0", none);
  Case down = c;
  down.off[5] = down.off[6] + 1;
  expect_refused(down,
                 "offsets[6] = " + std::to_string(c.off[6]) + " < offsets[5] = " +
                     std::to_string(c.off[6] + 1) + ": offsets must be non-decreasing",
                 none);
  Case past = c;  // an offset past L, then back: the decrease is named
  past.off[3] = c.lookups + 5;
  expect_refused(past, "offsets[4] = ", none);
  Case last = c;
  last.off.back() = c.lookups - 1;
  expect_refused(last, "the last offset must be the number of lookups", none);
  expect_refused(c, "lr = inf is not finite",
                 [](auto &, auto &, float &lr) { lr = std::numeric_limits<float>::infinity(); });
}

TEST(EmbeddingBagLazyAdamRefusals, ShapesThatDoNotFitAreRefused) {
  Case c = make_case(31, 20, 4, 50, 50, 8, true, PoolingMode::kSum);
  expect_refused(c, "offsets has 20 entries but grad_output has 20 bags",
                 [](auto &t, auto &, auto &) { t.offsets.shape[0] -= 1; });
  expect_refused(c, "per_sample_weights has",
                 [](auto &t, auto &, auto &) { t.per_sample_weights.shape[0] -= 1; });
  expect_refused(c, "grad_output has 8 columns but the table has 7",
                 [](auto &t, auto &, auto &) { t.m.shape[1] = t.v.shape[1] = t.var.shape[1] = 7; });
  expect_refused(c, "indices has dtype float32",
                 [](auto &t, auto &, auto &) { t.indices = t.per_sample_weights; });
  expect_refused(c, "pooling = 2",
                 [](auto &, auto &o, auto &) { o.pooling = static_cast<PoolingMode>(2); });
  expect_refused(c, "beta1 = 1", [](auto &, auto &o, auto &) { o.beta1 = 1.0; });
  expect_refused(c, "m and v overlap in memory", [](auto &t, auto &, auto &) { t.v = t.m; });
  expect_refused(c, "var and grad_output overlap in memory", [&](auto &t, auto &, auto &) {
    t.grad_output = TensorView::strided(t.var.data, DType::kFloat32, {20, 8}, {8, 1});
  });
}

TEST(EmbeddingBagLazyAdamRefusals, ABindingThatDoesNotMatchThePlanIsRefused) {
  Case c = make_case(32, 20, 4, 50, 50, 8, false, PoolingMode::kSum);
  EmbeddingBagLazyAdam plan;
  ASSERT_TRUE(EmbeddingBagLazyAdam::plan(c.tensors(), c.options(), &plan).ok());
  Case before = c;
  // Weights bound to an unweighted plan; another table; another index dtype.
  EmbeddingBagLazyAdamTensors t = c.tensors();
  std::vector<float> w(static_cast<size_t>(c.lookups), 1.0f);
  t.per_sample_weights = TensorView::of(w.data(), {c.lookups});
  std::vector<char> ws(1 << 16);
  Status st = plan.run(t, {.lr = 0.1f, .lr_tensor = {}}, ws.data(), ws.size());
  EXPECT_NE(st.message().find("per_sample_weights is float32"), std::string::npos) << st.message();
  t = c.tensors();
  t.m.shape[0] = 49;
  st = plan.run(t, {.lr = 0.1f, .lr_tensor = {}}, ws.data(), ws.size());
  EXPECT_NE(st.message().find("m is float32 [49, 8]"), std::string::npos) << st.message();
  c.index_type = DType::kInt32;
  st = plan.run(c.tensors(), {.lr = 0.1f, .lr_tensor = {}}, ws.data(), ws.size());
  EXPECT_NE(st.message().find("indices is int32"), std::string::npos) << st.message();
  expect_tables_equal(c, before);
}

}  // namespace
