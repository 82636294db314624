// EmbeddingBagLazyAdamQuant: every expected value comes from the oracle below, written from the
// definition (docs/embedding_bag_lazy_adam_quant.md) independently of the library: the row's
// gradient as EmbeddingBagLazyAdam's oracle forms it (the bag of a lookup found by searching the
// offsets, std::map grouping, plain float32 loops), then LazyAdamQuant's row step as
// tests/common/lazy_adam_quant_oracle.h computes it (lower_bound nearest codes, the FP8 codes of
// fp8_oracle.h). The docs fix every float32 operation, so var and absmax must match bit for bit and
// codes exactly, on every implementation, SIMD target and thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/embedding_bag_oracle.h"
#include "common/half_floats.h"
#include "common/lazy_adam_quant_oracle.h"
#include "common/row_groups.h"
#include "common/simd_targets.h"
#include "common/test_util.h"
#include "fusekit/embedding_bag_lazy_adam_quant.h"
#include "fusekit/quant_map.h"

namespace {

using namespace fusekit;           // the library under test
using namespace fusekit::testing;  // tests/common

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// The state of a case: the dynamic maps (with or without the lost-v guard), linspace maps (m's sign
// fix acts), or the FP8 format.
enum class State { kDynamic, kDynamicGuarded, kLinspace, kFp8 };
constexpr State kStates[] = {State::kDynamic, State::kDynamicGuarded, State::kLinspace,
                             State::kFp8};
const char *state_name(State s) {
  switch (s) {
    case State::kDynamic:
      return "dynamic";
    case State::kDynamicGuarded:
      return "dynamic+guard_lost_v";
    case State::kLinspace:
      return "linspace";
    default:
      return "fp8";
  }
}
QuantMap linspace_map(float lo, float hi) {
  QuantMap q;
  for (int i = 0; i < 256; ++i) q[i] = static_cast<float>(lo + (hi - lo) * i / 255.0);
  return q;
}

struct Case {
  int64_t bags = 0, lookups = 0, rows = 0, dim = 0, stride = 0, blocks = 0, bstride = 0;
  int64_t grad_stride = 0;
  std::vector<float> grad;  // [bags, grad_stride]
  std::vector<int64_t> idx, off;
  std::vector<int32_t> idx32, off32;
  std::vector<float> weights;  // empty: unweighted
  FloatBuf var;                // [rows, stride]
  std::vector<uint8_t> m, v;   // [rows, stride]
  std::vector<float> am, av;   // [rows, bstride]
  QuantMap qm{}, qv{};
  State state = State::kDynamic;
  PoolingMode pooling = PoolingMode::kSum;
  bool weighted = false;
  float lr = 0.01f;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  DType index_type = DType::kInt64, offset_type = DType::kInt64;

  bool fp8() const { return state == State::kFp8; }
  bool guard() const { return state == State::kFp8 || state == State::kDynamicGuarded; }
  size_t at(int64_t r, int64_t j) const { return static_cast<size_t>(r * stride + j); }
  size_t bat(int64_t r, int64_t b) const { return static_cast<size_t>(r * bstride + b); }

  EmbeddingBagLazyAdamQuantTensors tensors() {
    idx32.assign(idx.begin(), idx.end());
    off32.assign(off.begin(), off.end());
    EmbeddingBagLazyAdamQuantTensors t;
    t.grad_output =
        TensorView::strided(grad.data(), DType::kFloat32, {bags, dim}, {grad_stride, 1});
    t.indices = index_type == DType::kInt64 ? TensorView::of(idx.data(), {lookups})
                                            : TensorView::of(idx32.data(), {lookups});
    t.offsets = offset_type == DType::kInt64 ? TensorView::of(off.data(), {bags + 1})
                                             : TensorView::of(off32.data(), {bags + 1});
    if (weighted) t.per_sample_weights = TensorView::of(weights.data(), {lookups});
    t.m = TensorView::strided(m.data(), DType::kUInt8, {rows, dim}, {stride, 1});
    t.v = TensorView::strided(v.data(), DType::kUInt8, {rows, dim}, {stride, 1});
    t.var = TensorView::strided(var.data(), var.dtype, {rows, dim}, {stride, 1});
    t.qmap_m = TensorView::of(qm.data(), {fp8() ? 0 : 256});
    t.qmap_v = TensorView::of(qv.data(), {fp8() ? 0 : 256});
    t.absmax_m = TensorView::strided(am.data(), DType::kFloat32, {rows, blocks}, {bstride, 1});
    t.absmax_v = TensorView::strided(av.data(), DType::kFloat32, {rows, blocks}, {bstride, 1});
    return t;
  }
  EmbeddingBagLazyAdamQuantOptions options(const char *impl = nullptr, int threads = 2) const {
    EmbeddingBagLazyAdamQuantOptions o;
    o.beta1 = beta1;
    o.beta2 = beta2;
    o.epsilon = eps;
    o.pooling = pooling;
    o.state_format = fp8() ? QuantStateFormat::kFp8 : QuantStateFormat::kDynamicMap;
    o.guard_lost_v = state == State::kDynamicGuarded;
    o.implementation = impl;
    o.num_threads = threads;
    return o;
  }
};

using Mode = BagMode;
constexpr const BagMode (&kModes)[4] = kBagModes;

struct Shape {
  int64_t bags;
  int max_bag;  // bags of 0 .. max_bag lookups
  int64_t rows, id_range, dim;
  int64_t stride_pad = 0, bstride_pad = 0, grad_pad = 0;
};

// Random bags (some empty), ids in [0, id_range) (a small range: duplicates within and across
// bags), random codes and block scales (some zero: the lost-v guard's case), var in dtype t.
Case make_case(uint64_t salt, const Shape &sh, State state, Mode mode, DType t = DType::kFloat32) {
  auto rng = rng_for(salt);
  Case c;
  c.bags = sh.bags;
  c.rows = sh.rows;
  c.dim = sh.dim;
  c.stride = sh.dim + sh.stride_pad;
  c.blocks = (sh.dim + 255) / 256;
  c.bstride = c.blocks + sh.bstride_pad;
  c.grad_stride = sh.dim + sh.grad_pad;
  c.state = state;
  c.pooling = mode.pooling;
  c.weighted = mode.weighted;
  std::uniform_int_distribution<int> len(0, sh.max_bag);
  std::uniform_int_distribution<int64_t> id(0, std::max<int64_t>(sh.id_range - 1, 0));
  c.off = {0};
  for (int64_t b = 0; b < sh.bags; ++b) {
    const int n = len(rng);
    for (int k = 0; k < n; ++k) c.idx.push_back(id(rng));
    c.off.push_back(static_cast<int64_t>(c.idx.size()));
  }
  c.lookups = static_cast<int64_t>(c.idx.size());
  c.grad =
      uniform(rng, static_cast<size_t>(std::max<int64_t>(c.bags * c.grad_stride, 1)), -1.f, 1.f);
  if (mode.weighted) c.weights = uniform(rng, static_cast<size_t>(c.lookups), -1.5f, 1.5f);
  const auto cells = static_cast<size_t>(std::max<int64_t>(c.rows * c.stride, 1));
  c.var = FloatBuf(t, uniform(rng, cells, -2.f, 2.f));
  fill_random_quant_state(c, rng, cells);
  if (state == State::kLinspace) {
    c.qm = linspace_map(-1, 1);
    c.qv = linspace_map(0, 1);
  } else {
    c.qm = create_dynamic_map(true);
    c.qv = create_dynamic_map(false);
  }
  return c;
}

// ---- the oracle --------------------------------------------------------------------------------
struct OracleResult {
  int64_t updated = 0, skipped = 0;
};
OracleResult oracle(Case &c) {
  const QuantStepOracle o{&c.qm,
                          &c.qv,
                          c.fp8(),
                          c.guard(),
                          c.var.dtype,
                          static_cast<float>(c.beta1),
                          static_cast<float>(c.beta2),
                          static_cast<float>(c.eps),
                          c.lr};
  OracleResult res;
  for (auto &[row, g] :
       oracle_bag_gradients(c.grad, c.grad_stride, c.idx, c.off, c.weights, c.pooling, c.dim)) {
    const int64_t r = row;
    const bool updated = quant_step_oracle_row(
        o, g.data(), c.dim, [&](int64_t j) { return c.var.get(c.at(r, j)); },
        [&](int64_t j, float w) { c.var.set(c.at(r, j), w); }, &c.m[c.at(r, 0)], &c.v[c.at(r, 0)],
        &c.am[c.bat(r, 0)], &c.av[c.bat(r, 0)]);
    ++(updated ? res.updated : res.skipped);
  }
  return res;
}

// Bitwise var and absmax, exact codes, everywhere (padding columns and untouched rows included).
void expect_same(const Case &got, const Case &want) {
  expect_same_quant_state(got.var, want.var, got.m, want.m, got.v, want.v, got.am, want.am, got.av,
                          want.av);
}

// A plan for the case's tensors, run once with a workspace of the size it asks for (filled with
// a poison pattern: the run must not read what it did not write).
Status run_cpp(Case &c, const char *impl, int threads, EmbeddingBagLazyAdamQuantStats *stats) {
  const EmbeddingBagLazyAdamQuantTensors t = c.tensors();
  EmbeddingBagLazyAdamQuantProblem problem;
  FUSEKIT_RETURN_IF_ERROR(
      EmbeddingBagLazyAdamQuantProblem::make(t, c.options(impl, threads), &problem));
  EmbeddingBagLazyAdamQuant plan;
  FUSEKIT_RETURN_IF_ERROR(
      EmbeddingBagLazyAdamQuant::plan(problem, c.options(impl, threads), &plan));
  std::vector<char> ws(plan.workspace_size(t), static_cast<char>(0xff));
  return plan.run(t, {.lr = c.lr, .lr_tensor = {}}, ws.data(), ws.size(), stats);
}

// Whether this machine runs the implementation for the case's state format.
bool runs(const std::string &impl, const Case &c) {
  Case probe = c;
  EmbeddingBagLazyAdamQuantProblem problem;
  EmbeddingBagLazyAdamQuant plan;
  return EmbeddingBagLazyAdamQuantProblem::make(probe.tensors(), probe.options(), &problem).ok() &&
         EmbeddingBagLazyAdamQuant::plan(problem, probe.options(impl.c_str()), &plan).ok();
}

// Every implementation (the by-name ones too) that runs the case here.
std::vector<std::string> implementations_for(const Case &c) {
  std::vector<std::string> out;
  for (const std::string &impl : EmbeddingBagLazyAdamQuant::implementations()) {
    if (runs(impl, c)) out.push_back(impl);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Results against the oracle
// ---------------------------------------------------------------------------------------------

TEST(EmbeddingBagLazyAdamQuantImplementations, LazyAdamQuantsListWithTheReferenceLast) {
  const std::vector<std::string> impls = EmbeddingBagLazyAdamQuant::implementations();
  ASSERT_EQ(impls.size(), 5u);
  EXPECT_EQ(impls.front(), "cpu_avx512vbmi");
  EXPECT_EQ(impls.back(), "cpu_reference");
  Case c = make_case(1, {4, 2, 8, 8, 8}, State::kFp8, kModes[0]);
  const Status st = run_cpp(c, "cpu_avx512vbmi", 1, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kNoImplementation) << st.message();
}

class EmbeddingBagLazyAdamQuantDims : public ::testing::TestWithParam<int64_t> {};

TEST_P(EmbeddingBagLazyAdamQuantDims, EveryModeStateImplementationTargetAndThreadCount) {
  const int64_t dim = GetParam();
  for (State state : kStates) {
    SCOPED_TRACE(state_name(state));
    for (const Mode &mode : kModes) {
      SCOPED_TRACE(mode_name(mode));
      const uint64_t salt = 100 + static_cast<uint64_t>(dim) * 16 +
                            static_cast<uint64_t>(state) * 4 + (mode.weighted ? 1 : 0) +
                            (mode.pooling == PoolingMode::kMean ? 2 : 0);
      // 40 bags of 0 .. 6 ids from 60 of 80 rows: duplicates within and across bags, empty bags,
      // untouched rows.
      const Shape sh{40, 6, 80, 60, dim};
      Case want = make_case(salt, sh, state, mode);
      const OracleResult expected = oracle(want);
      ASSERT_GT(expected.updated, 30);
      ASSERT_EQ(expected.skipped, 0);
      for (const std::string &impl : implementations_for(want)) {
        SCOPED_TRACE(impl);
        const auto one = [&](int threads) {
          SCOPED_TRACE(threads);
          Case got = make_case(salt, sh, state, mode);
          got.index_type = threads == 2 ? DType::kInt32 : DType::kInt64;
          got.offset_type = threads == 3 ? DType::kInt32 : DType::kInt64;
          EmbeddingBagLazyAdamQuantStats stats;
          const Status st = run_cpp(got, impl.c_str(), threads, &stats);
          ASSERT_TRUE(st.ok()) << st.message();
          expect_same(got, want);
          EXPECT_EQ(stats.rows_updated, expected.updated);
          EXPECT_EQ(stats.rows_skipped_nonfinite, 0);
        };
        if (impl.starts_with("cpu_hwy")) {
          for_each_simd_target([&](const char *target) {
            EXPECT_STREQ(hwy_dispatched_target(), target);
            one(1);
          });
        }
        for (int threads : {1, 2, 3}) one(threads);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(BlockAndVectorEdges, EmbeddingBagLazyAdamQuantDims,
                         ::testing::Values(1, 3, 4, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 100, 255,
                                           256, 257, 600));

TEST(EmbeddingBagLazyAdamQuant, ALargeBatchGroupedBySortingOrByTheBitmap) {
  // ~20k lookups into 3000 rows (many repeats), D = 32, every mode and state (the lookup tables
  // from 65,536 elements on); then the same with the duplicate bitmap off.
  for (const bool bitmap : {true, false}) {
    SCOPED_TRACE(bitmap ? "bitmap" : "sorted");
    set_row_groups_bitmap_limit_for_testing(bitmap ? (int64_t{64} << 20) : -1);
    for (State state : kStates) {
      SCOPED_TRACE(state_name(state));
      for (const Mode &mode : kModes) {
        SCOPED_TRACE(mode_name(mode));
        const Shape sh{8192, 4, 3000, 3000, 32};
        Case want = make_case(7, sh, state, mode);
        oracle(want);
        for (const std::string &impl : implementations_for(want)) {
          SCOPED_TRACE(impl);
          Case got = make_case(7, sh, state, mode);
          ASSERT_TRUE(run_cpp(got, impl.c_str(), 3, nullptr).ok());
          expect_same(got, want);
        }
      }
    }
  }
  set_row_groups_bitmap_limit_for_testing(int64_t{64} << 20);
}

TEST(EmbeddingBagLazyAdamQuant, ThreadCountsAreBitwiseIdentical) {
  const int machine = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (State state : {State::kDynamic, State::kFp8}) {
    SCOPED_TRACE(state_name(state));
    const Shape sh{6000, 5, 20000, 12000, 24};
    Case want = make_case(8, sh, state, kModes[3]);
    oracle(want);
    for (int threads : {1, 2, 3, 4, machine}) {
      SCOPED_TRACE(threads);
      Case got = make_case(8, sh, state, kModes[3]);
      ASSERT_TRUE(run_cpp(got, nullptr, threads, nullptr).ok());
      expect_same(got, want);
    }
  }
}

TEST(EmbeddingBagLazyAdamQuant, SixteenBitTablesAndPaddedLayouts) {
  // var in bfloat16 and float16 (stored rounded to nearest-even), row strides past D for var and
  // the codes, absmax and grad_output: the padding survives.
  for (DType t : {DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(dtype_name(t));
    for (State state : {State::kDynamic, State::kFp8}) {
      SCOPED_TRACE(state_name(state));
      const Shape sh{50, 5, 90, 70, 33, 12, 2, 5};
      Case want = make_case(9, sh, state, kModes[1], t);
      oracle(want);
      for (const std::string &impl : implementations_for(want)) {
        SCOPED_TRACE(impl);
        Case got = make_case(9, sh, state, kModes[1], t);
        ASSERT_TRUE(run_cpp(got, impl.c_str(), 2, nullptr).ok());
        expect_same(got, want);
      }
    }
  }
}

TEST(EmbeddingBagLazyAdamQuant, PackedStateAsSparseAdam8bitAllocatesIt) {
  // codes [R, 2, D] and absmax [R, 2, B] (fusekit.torch.SparseAdam8bit's layout): m and v
  // interleaved by rows of one allocation give the bits of separate tensors.
  for (State state : {State::kDynamicGuarded, State::kFp8}) {
    SCOPED_TRACE(state_name(state));
    const Shape sh{64, 4, 100, 90, 32};
    Case want = make_case(10, sh, state, kModes[0]);
    oracle(want);
    for (const std::string &impl : implementations_for(want)) {
      SCOPED_TRACE(impl);
      Case got = make_case(10, sh, state, kModes[0]);
      std::vector<uint8_t> codes(static_cast<size_t>(got.rows * 2 * got.dim));
      std::vector<float> scales(static_cast<size_t>(got.rows * 2));
      for (int64_t r = 0; r < got.rows; ++r) {
        std::memcpy(&codes[static_cast<size_t>(r * 2 * got.dim)], &got.m[got.at(r, 0)],
                    static_cast<size_t>(got.dim));
        std::memcpy(&codes[static_cast<size_t>((r * 2 + 1) * got.dim)], &got.v[got.at(r, 0)],
                    static_cast<size_t>(got.dim));
        scales[static_cast<size_t>(r * 2)] = got.am[got.bat(r, 0)];
        scales[static_cast<size_t>(r * 2 + 1)] = got.av[got.bat(r, 0)];
      }
      EmbeddingBagLazyAdamQuantTensors t = got.tensors();
      t.m = TensorView::strided(codes.data(), DType::kUInt8, {got.rows, got.dim}, {2 * got.dim, 1});
      t.v = TensorView::strided(codes.data() + got.dim, DType::kUInt8, {got.rows, got.dim},
                                {2 * got.dim, 1});
      t.absmax_m = TensorView::strided(scales.data(), DType::kFloat32, {got.rows, 1}, {2, 1});
      t.absmax_v = TensorView::strided(scales.data() + 1, DType::kFloat32, {got.rows, 1}, {2, 1});
      const Status st = embedding_bag_lazy_adam_quant_step(t, got.lr, got.options(impl.c_str()));
      ASSERT_TRUE(st.ok()) << st.message();
      for (int64_t r = 0; r < got.rows; ++r) {
        std::memcpy(&got.m[got.at(r, 0)], &codes[static_cast<size_t>(r * 2 * got.dim)],
                    static_cast<size_t>(got.dim));
        std::memcpy(&got.v[got.at(r, 0)], &codes[static_cast<size_t>((r * 2 + 1) * got.dim)],
                    static_cast<size_t>(got.dim));
        got.am[got.bat(r, 0)] = scales[static_cast<size_t>(r * 2)];
        got.av[got.bat(r, 0)] = scales[static_cast<size_t>(r * 2 + 1)];
      }
      expect_same(got, want);
    }
  }
}

TEST(EmbeddingBagLazyAdamQuant, UntouchedRowsAreNeverReadNorWritten) {
  // Every row no lookup names holds a poison NaN in var and both absmax and poison codes: a kernel
  // that read one would skip or spread NaN; each must keep its bits.
  for (State state : kStates) {
    SCOPED_TRACE(state_name(state));
    const Shape sh{50, 5, 400, 400, 19};
    Case c = make_case(11, sh, state, kModes[2]);
    std::vector<bool> touched(400, false);
    for (int64_t r : c.idx) touched[static_cast<size_t>(r)] = true;
    for (int64_t r = 0; r < 400; ++r) {
      if (touched[static_cast<size_t>(r)]) continue;
      for (int64_t j = 0; j < 19; ++j) {
        c.var.set(c.at(r, j), poison_float());
        c.m[c.at(r, j)] = c.v[c.at(r, j)] = 0x7f;
      }
      c.am[c.bat(r, 0)] = c.av[c.bat(r, 0)] = poison_float();
    }
    Case want = c;
    const OracleResult expected = oracle(want);
    for (const std::string &impl : implementations_for(c)) {
      SCOPED_TRACE(impl);
      Case got = c;
      EmbeddingBagLazyAdamQuantStats stats;
      ASSERT_TRUE(run_cpp(got, impl.c_str(), 2, &stats).ok());
      expect_same(got, want);
      EXPECT_EQ(stats.rows_skipped_nonfinite, 0);
      EXPECT_EQ(stats.rows_updated, expected.updated);
      for (int64_t r = 0; r < 400; ++r) {
        EXPECT_EQ(is_poison(got.am[got.bat(r, 0)]), !touched[static_cast<size_t>(r)]) << r;
      }
    }
  }
}

TEST(EmbeddingBagLazyAdamQuant, EmptyBatchAndEmptyBagsChangeNothing) {
  for (State state : {State::kDynamic, State::kFp8}) {
    for (const Mode &mode : kModes) {
      SCOPED_TRACE(mode_name(mode));
      for (int64_t bags : {0, 1, 5}) {
        Case c = make_case(12, {bags, 0, 30, 30, 8}, state, mode);  // bags of 0 ids
        ASSERT_EQ(c.lookups, 0);
        Case before = c;
        EmbeddingBagLazyAdamQuantStats stats;
        const Status st = run_cpp(c, nullptr, 2, &stats);
        ASSERT_TRUE(st.ok()) << st.message();
        expect_same(c, before);
        EXPECT_EQ(stats.rows_updated, 0);
      }
    }
  }
}

TEST(EmbeddingBagLazyAdamQuant, AllLookupsOfOneRow) {
  for (State state : kStates) {
    SCOPED_TRACE(state_name(state));
    for (const Mode &mode : kModes) {
      SCOPED_TRACE(mode_name(mode));
      for (int64_t bags : {1, 3, 257, 2000}) {
        Case want = make_case(13, {bags, 3, 20, 1, 33}, state, mode);
        for (auto &g : want.grad) g *= 1e-3f;
        Case got = want;
        const OracleResult expected = oracle(want);
        EmbeddingBagLazyAdamQuantStats stats;
        ASSERT_TRUE(run_cpp(got, "cpu_hwy", 2, &stats).ok());
        expect_same(got, want);
        EXPECT_EQ(stats.rows_updated, expected.updated);
      }
    }
  }
}

TEST(EmbeddingBagLazyAdamQuant, NonFiniteRowsAreLeftBitwiseUnchangedAndCounted) {
  for (State state : kStates) {
    SCOPED_TRACE(state_name(state));
    for (const Mode &mode : kModes) {
      SCOPED_TRACE(mode_name(mode));
      Case want = make_case(14, {60, 4, 100, 90, 19}, state, mode);
      // A NaN and an Inf in two bags' gradients (every row they look up is skipped), a gradient
      // whose square overflows, an infinite weight when weighted, a NaN absmax and an infinite
      // var of rows the batch touches.
      want.grad[static_cast<size_t>(3 * 19 + 5)] = kNaN;
      want.grad[static_cast<size_t>(17 * 19 + 18)] = kInf;
      want.grad[static_cast<size_t>(30 * 19 + 2)] = 2e19f;
      if (mode.weighted && want.lookups > 40) want.weights[40] = -kInf;
      want.am[want.bat(want.idx[10], 0)] = kNaN;
      want.var.set(want.at(want.idx[20], 7), -kInf);
      Case start = want;
      const OracleResult expected = oracle(want);
      ASSERT_GT(expected.skipped, 3);
      for (const std::string &impl : implementations_for(want)) {
        SCOPED_TRACE(impl);
        Case got = start;
        EmbeddingBagLazyAdamQuantStats stats;
        ASSERT_TRUE(run_cpp(got, impl.c_str(), 2, &stats).ok());
        expect_same(got, want);
        EXPECT_EQ(stats.rows_skipped_nonfinite, expected.skipped);
        EXPECT_EQ(stats.rows_updated, expected.updated);
      }
    }
  }
}

TEST(EmbeddingBagLazyAdamQuant, TenStepsInARow) {
  for (State state : {State::kDynamicGuarded, State::kFp8}) {
    SCOPED_TRACE(state_name(state));
    Case want = make_case(15, {30, 4, 50, 40, 20}, state, kModes[3]);
    Case got = want;
    for (int step = 0; step < 10; ++step) {
      auto rng = rng_for(1000 + static_cast<uint64_t>(step));
      want.grad = uniform(rng, want.grad.size(), -1.f, 1.f);
      got.grad = want.grad;
      oracle(want);
      ASSERT_TRUE(run_cpp(got, nullptr, 2, nullptr).ok());
    }
    expect_same(got, want);
  }
}

// ---------------------------------------------------------------------------------------------
// The batch is bound per run
// ---------------------------------------------------------------------------------------------

TEST(EmbeddingBagLazyAdamQuantPlan, APlanForTheTableRunsBatchesOfAnySize) {
  for (State state : {State::kDynamic, State::kFp8}) {
    SCOPED_TRACE(state_name(state));
    Case first = make_case(20, {0, 0, 500, 500, 24}, state, kModes[3]);
    const EmbeddingBagLazyAdamQuantTensors t0 = first.tensors();
    EmbeddingBagLazyAdamQuantProblem problem;
    ASSERT_TRUE(EmbeddingBagLazyAdamQuantProblem::make(t0, first.options(), &problem).ok());
    EmbeddingBagLazyAdamQuant plan;
    ASSERT_TRUE(EmbeddingBagLazyAdamQuant::plan(problem, first.options(), &plan).ok());
    EXPECT_EQ(plan.workspace_size(0, 0), 0u);
    uint64_t salt = 21;
    for (int64_t bags : {1, 100, 7, 4096, 0, 33}) {
      SCOPED_TRACE(bags);
      Case want = make_case(salt, {bags, 20, 500, 400, 24}, state, kModes[3]);
      Case got = make_case(salt++, {bags, 20, 500, 400, 24}, state, kModes[3]);
      oracle(want);
      const EmbeddingBagLazyAdamQuantTensors t = got.tensors();
      EXPECT_EQ(plan.workspace_size(t), plan.workspace_size(got.bags, got.lookups));
      std::vector<char> ws(plan.workspace_size(t));
      const Status st = plan.run(t, {.lr = got.lr, .lr_tensor = {}}, ws.data(), ws.size());
      ASSERT_TRUE(st.ok()) << st.message();
      expect_same(got, want);
      if (got.lookups > 0) {
        const Status small = plan.run(t, {.lr = got.lr, .lr_tensor = {}}, ws.data(), ws.size() - 1);
        EXPECT_NE(small.message().find("workspace"), std::string::npos) << small.message();
      }
    }
  }
}

TEST(EmbeddingBagLazyAdamQuantPlan, LrFromATensorAndTheBoundPlan) {
  Case want = make_case(22, {64, 4, 100, 90, 16}, State::kDynamic, kModes[1]);
  Case got1 = want, got2 = want;
  oracle(want);
  const float lr = got1.lr;
  const EmbeddingBagLazyAdamQuantTensors t1 = got1.tensors();
  got1.lr = 123.0f;  // not used: lr comes from the tensor
  EmbeddingBagLazyAdamQuant plan1;
  ASSERT_TRUE(EmbeddingBagLazyAdamQuant::plan(t1, got1.options(), &plan1).ok());
  std::vector<char> ws(plan1.workspace_size(t1));
  ASSERT_TRUE(
      plan1.run(t1, {.lr = 123.0f, .lr_tensor = TensorView::of(&lr, {1})}, ws.data(), ws.size())
          .ok());
  expect_same(got1, want);
  EmbeddingBagLazyAdamQuant plan2;
  const EmbeddingBagLazyAdamQuantTensors t2 = got2.tensors();
  ASSERT_TRUE(EmbeddingBagLazyAdamQuant::plan(t2, got2.options(), &plan2).ok());
  ASSERT_TRUE(plan2.run(got2.lr, ws.data(), ws.size()).ok());
  expect_same(got2, want);
}

// ---------------------------------------------------------------------------------------------
// Refusals: nothing is written
// ---------------------------------------------------------------------------------------------

template <class Edit>
void expect_refused(Case c, const std::string &needle, Edit &&edit) {
  SCOPED_TRACE(needle);
  const Case before = c;
  EmbeddingBagLazyAdamQuantTensors t = c.tensors();
  EmbeddingBagLazyAdamQuantOptions o = c.options();
  float lr = c.lr;
  edit(c, t, o, lr);
  const Status st = embedding_bag_lazy_adam_quant_step(t, lr, o, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.message();
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  expect_same(c, before);
}

TEST(EmbeddingBagLazyAdamQuantRefusals, DataRefusedBeforeAnythingIsWritten) {
  for (State state : {State::kDynamic, State::kFp8}) {
    SCOPED_TRACE(state_name(state));
    Case c = make_case(30, {20, 4, 50, 50, 8}, state, kModes[3]);
    ASSERT_GT(c.lookups, 20);
    const auto none = [](auto &, auto &, auto &, auto &) {};
    Case hi = c;
    hi.idx[17] = 50;
    expect_refused(hi,
                   "EmbeddingBagLazyAdamQuant: indices[17] = 50 but the table has 50 rows; "
                   "nothing was modified",
                   none);
    Case neg = c;
    neg.idx[19] = 50;
    neg.idx[11] = -1;
    expect_refused(neg, "indices[11] = -1 is negative", none);
    Case first = c;
    first.off[0] = 1;
    expect_refused(first, "offsets[0] = 1 but the first bag must start at 0", none);
    Case down = c;
    down.off[5] = down.off[6] + 1;
    expect_refused(down, "offsets must be non-decreasing", none);
    Case last = c;
    last.off.back() = c.lookups - 1;
    expect_refused(last, "the last offset must be the number of lookups", none);
    expect_refused(c, "lr = inf is not finite",
                   [](auto &, auto &, auto &, float &lr) { lr = kInf; });
  }
  Case c = make_case(31, {20, 4, 50, 50, 8}, State::kDynamic, kModes[0]);
  // (The maps are checked by LazyAdamQuant's code, which names them as its aclnn call does.)
  expect_refused(
      c, "qmapV[41] = ", [](Case &cc, auto &, auto &, auto &) { cc.qv[41] = cc.qv[40] - 0.01f; });
  expect_refused(c, "qmapM[3] = nan is not finite",
                 [](Case &cc, auto &, auto &, auto &) { cc.qm[3] = kNaN; });
}

TEST(EmbeddingBagLazyAdamQuantRefusals, ShapesDtypesAndStateFormats) {
  Case c = make_case(32, {20, 4, 50, 50, 8}, State::kDynamic, kModes[1]);
  expect_refused(c, "offsets has 20 entries but grad_output has 20 bags",
                 [](auto &, auto &t, auto &, auto &) { t.offsets.shape[0] -= 1; });
  expect_refused(c, "per_sample_weights has",
                 [](auto &, auto &t, auto &, auto &) { t.per_sample_weights.shape[0] -= 1; });
  expect_refused(c, "absmax_m must be float32 [50, 1]",
                 [](auto &, auto &t, auto &, auto &) { t.absmax_m.shape[1] = 2; });
  expect_refused(c, "m has dtype float32; uint8 is required",
                 [](auto &, auto &t, auto &, auto &) { t.m = t.absmax_m; });
  expect_refused(
      c, "grad_output has 8 columns but the table has 7",
      [](auto &, auto &t, auto &, auto &) { t.m.shape[1] = t.v.shape[1] = t.var.shape[1] = 7; });
  expect_refused(c, "pooling = 2",
                 [](auto &, auto &, auto &o, auto &) { o.pooling = static_cast<PoolingMode>(2); });
  expect_refused(c, "m and v overlap in memory",
                 [](auto &, auto &t, auto &, auto &) { t.v = t.m; });
  expect_refused(c, "qmapM is float32 [256] but the fp8 state format has no map",
                 [](auto &, auto &, auto &o, auto &) {
                   o.state_format =
                       QuantStateFormat::kFp8;  // with maps given: the fp8 format has none
                 });
}

}  // namespace
