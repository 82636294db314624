// The seam, tested once for every operator and every implementation this machine runs: the tests
// come from each operator's description (src/<op>/<op>_impl.h: its tensors by role, its
// implementation list) and a small random case per operator (Seam<Op> below), not from copies in
// each operator's test file. What is checked here is the plan layer's contract; each operator's
// own tests check its numbers against an independent oracle.
//
//   - a plan made once runs on new tensors (new addresses, new data) and gives the bits of a plan
//     made afresh for them;
//   - the bits do not depend on the thread count (1, 2, 3);
//   - a binding that differs from the plan in one role (another dtype, no data) is refused, and
//     every written tensor keeps its poisoned bytes;
//   - a tensor on another device is kNoImplementation when planned, naming every implementation;
//   - an unknown implementation name is kInvalidArgument; a plan that was not made refuses to run;
//     the kernel choice picks the reference or the others.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "adam_w/adam_w_impl.h"
#include "add_lora/add_lora_impl.h"
#include "apply_adam_w_quant/apply_adam_w_quant_impl.h"
#include "common/test_util.h"
#include "embedding_bag_lazy_adam/embedding_bag_lazy_adam_impl.h"
#include "embedding_bag_lazy_adam_quant/embedding_bag_lazy_adam_quant_impl.h"
#include "fusekit/quant_map.h"
#include "lazy_adam/lazy_adam_impl.h"
#include "lazy_adam_quant/lazy_adam_quant_impl.h"

namespace fusekit {
namespace {

std::vector<float> floats(std::mt19937_64 &rng, size_t n, float lo, float hi) {
  return testing::uniform(rng, n, lo, hi);
}
std::vector<uint8_t> codes(std::mt19937_64 &rng, size_t n) {
  std::vector<uint8_t> c(n);
  for (auto &x : c) x = static_cast<uint8_t>(rng() & 0xff);
  return c;
}
template <typename I>
std::vector<I> indices(std::mt19937_64 &rng, size_t n, int64_t lo, int64_t hi) {
  std::uniform_int_distribution<int64_t> d(lo, hi);
  std::vector<I> v(n);
  for (auto &x : v) x = static_cast<I>(d(rng));
  return v;
}

// One operator's random case: its buffers, the views of one run, its scalars and its run call.
template <class Op>
struct Seam;

template <>
struct Seam<LazyAdamOp> {
  using Plan = LazyAdam;
  static constexpr int64_t N = 40, R = 50, D = 37;
  struct Data {
    std::vector<float> grad, m, v, var;
    std::vector<int64_t> idx;
    LazyAdamTensors tensors() {
      return {TensorView::of(grad.data(), {N, D}), TensorView::of(idx.data(), {N}),
              TensorView::of(m.data(), {R, D}), TensorView::of(v.data(), {R, D}),
              TensorView::of(var.data(), {R, D})};
    }
  };
  static Data make(std::mt19937_64 &rng) {
    return {floats(rng, N * D, -1, 1), floats(rng, R * D, -0.1f, 0.1f),
            floats(rng, R * D, 0, 0.01f), floats(rng, R * D, -1, 1),
            indices<int64_t>(rng, N, -2, R - 1)};
  }
  static Status run(const Plan &p, const LazyAdamTensors &t, void *ws, size_t n) {
    return p.run(t, LazyAdamScalars{.lr = 0.01f, .lr_tensor = {}}, ws, n);
  }
};

template <>
struct Seam<LazyAdamQuantOp> {
  using Plan = LazyAdamQuant;
  static constexpr int64_t N = 12, R = 20, D = 300, B = 2;  // two absmax blocks per row
  struct Data {
    std::vector<float> grad, var, am, av;
    std::vector<uint8_t> m, v;
    std::vector<int64_t> idx;
    std::array<float, kQuantMapSize> qm = create_dynamic_map(true), qv = create_dynamic_map(false);
    LazyAdamQuantTensors tensors() {
      return {
          TensorView::of(grad.data(), {N, D}),        TensorView::of(idx.data(), {N}),
          TensorView::of(m.data(), {R, D}),           TensorView::of(v.data(), {R, D}),
          TensorView::of(var.data(), {R, D}),         TensorView::of(qm.data(), {kQuantMapSize}),
          TensorView::of(qv.data(), {kQuantMapSize}), TensorView::of(am.data(), {R, B}),
          TensorView::of(av.data(), {R, B})};
    }
  };
  static Data make(std::mt19937_64 &rng) {
    Data d;
    d.grad = floats(rng, N * D, -1, 1);
    d.var = floats(rng, R * D, -1, 1);
    d.am = floats(rng, R * B, 0.01f, 0.1f);
    d.av = floats(rng, R * B, 1e-4f, 1e-3f);
    d.m = codes(rng, R * D);
    d.v = codes(rng, R * D);
    d.idx = indices<int64_t>(rng, N, -1, R - 1);
    return d;
  }
  static Status run(const Plan &p, const LazyAdamQuantTensors &t, void *ws, size_t n) {
    return p.run(t, LazyAdamQuantScalars{.lr = 0.01f, .lr_tensor = {}}, ws, n);
  }
};

// The embedding-bag optimizers: the batch is bound per run, so every case has its own number of
// bags and lookups (a plan made for one batch runs the others); weighted mean pooling, duplicates
// within and across bags, empty bags.
struct BagCase {
  int64_t bags = 0, lookups = 0;
  std::vector<float> grad, w;
  std::vector<int64_t> idx, off;
  static BagCase make(std::mt19937_64 &rng, int64_t rows, int64_t dim) {
    BagCase d;
    d.bags = 5 + static_cast<int64_t>(rng() % 20);
    d.off.push_back(0);
    for (int64_t b = 0; b < d.bags; ++b) {
      const auto n = static_cast<int64_t>(rng() % 5);  // 0 .. 4 ids
      const auto ids = indices<int64_t>(rng, static_cast<size_t>(n), 0, rows - 1);
      d.idx.insert(d.idx.end(), ids.begin(), ids.end());
      d.off.push_back(static_cast<int64_t>(d.idx.size()));
    }
    d.lookups = static_cast<int64_t>(d.idx.size());
    d.grad = floats(rng, static_cast<size_t>(d.bags * dim), -1, 1);
    d.w = floats(rng, static_cast<size_t>(d.lookups), -1, 1);
    return d;
  }
  // grad_output, indices, offsets, per_sample_weights.
  std::array<TensorView, 4> views(int64_t dim) {
    return {TensorView::of(grad.data(), {bags, dim}), TensorView::of(idx.data(), {lookups}),
            TensorView::of(off.data(), {bags + 1}), TensorView::of(w.data(), {lookups})};
  }
};
template <class Options>
Options mean_pooling() {
  Options o;
  o.pooling = PoolingMode::kMean;
  return o;
}

template <>
struct Seam<EmbeddingBagLazyAdamOp> {
  using Plan = EmbeddingBagLazyAdam;
  static constexpr int64_t R = 30, D = 37;
  struct Data : BagCase {
    std::vector<float> m, v, var;
    EmbeddingBagLazyAdamTensors tensors() {
      const auto [go, ids, offs, psw] = views(D);
      return {go,
              ids,
              offs,
              psw,
              TensorView::of(m.data(), {R, D}),
              TensorView::of(v.data(), {R, D}),
              TensorView::of(var.data(), {R, D})};
    }
  };
  static Data make(std::mt19937_64 &rng) {
    Data d;
    static_cast<BagCase &>(d) = BagCase::make(rng, R, D);
    d.m = floats(rng, R * D, -0.1f, 0.1f);
    d.v = floats(rng, R * D, 0, 0.01f);
    d.var = floats(rng, R * D, -1, 1);
    return d;
  }
  static EmbeddingBagLazyAdamOptions options() {
    return mean_pooling<EmbeddingBagLazyAdamOptions>();
  }
  static Status run(const Plan &p, const EmbeddingBagLazyAdamTensors &t, void *ws, size_t n) {
    return p.run(t, EmbeddingBagLazyAdamScalars{.lr = 0.01f, .lr_tensor = {}}, ws, n);
  }
};

// EmbeddingBagLazyAdamQuant: the bags of EmbeddingBagLazyAdam's case on LazyAdamQuant's state (two
// absmax blocks per row); in the FP8 format below too.
template <>
struct Seam<EmbeddingBagLazyAdamQuantOp> {
  using Plan = EmbeddingBagLazyAdamQuant;
  static constexpr int64_t R = 30, D = 300, B = 2;
  struct Data : BagCase {
    std::vector<float> var, am, av;
    std::vector<uint8_t> m, v;
    std::array<float, kQuantMapSize> qm = create_dynamic_map(true), qv = create_dynamic_map(false);
    EmbeddingBagLazyAdamQuantTensors tensors() {
      const auto [go, ids, offs, psw] = views(D);
      return {go,
              ids,
              offs,
              psw,
              TensorView::of(m.data(), {R, D}),
              TensorView::of(v.data(), {R, D}),
              TensorView::of(var.data(), {R, D}),
              TensorView::of(qm.data(), {kQuantMapSize}),
              TensorView::of(qv.data(), {kQuantMapSize}),
              TensorView::of(am.data(), {R, B}),
              TensorView::of(av.data(), {R, B})};
    }
  };
  static Data make(std::mt19937_64 &rng) {
    Data d;
    static_cast<BagCase &>(d) = BagCase::make(rng, R, D);
    d.var = floats(rng, R * D, -1, 1);
    d.am = floats(rng, R * B, 0.01f, 0.1f);
    d.av = floats(rng, R * B, 1e-4f, 1e-3f);
    d.m = codes(rng, R * D);
    d.v = codes(rng, R * D);
    return d;
  }
  static EmbeddingBagLazyAdamQuantOptions options() {
    return mean_pooling<EmbeddingBagLazyAdamQuantOptions>();
  }
  static Status run(const Plan &p, const EmbeddingBagLazyAdamQuantTensors &t, void *ws, size_t n) {
    return p.run(t, EmbeddingBagLazyAdamQuantScalars{.lr = 0.01f, .lr_tensor = {}}, ws, n);
  }
};

template <>
struct Seam<AdamWOp> {
  using Plan = AdamW;
  static constexpr int64_t N = 1000;
  struct Data {
    std::vector<float> var, grad, m, v;
    AdamWTensors tensors() {
      return {TensorView::of(var.data(), {N}), TensorView::of(grad.data(), {N}),
              TensorView::of(m.data(), {N}), TensorView::of(v.data(), {N})};
    }
  };
  static Data make(std::mt19937_64 &rng) {
    return {floats(rng, N, -1, 1), floats(rng, N, -1, 1), floats(rng, N, -0.1f, 0.1f),
            floats(rng, N, 0, 0.01f)};
  }
  static Status run(const Plan &p, const AdamWTensors &t, void *, size_t) {
    AdamWScalars s;
    s.step = 7;
    s.lr = 0.01f;
    return p.run(t, s);
  }
};

template <>
struct Seam<ApplyAdamWQuantOp> {
  using Plan = ApplyAdamWQuant;
  static constexpr int64_t N = 1000, B = 4;
  struct Data {
    std::vector<float> var, grad, am, av;
    std::vector<uint8_t> m, v;
    std::array<float, kQuantMapSize> qm = create_dynamic_map(true), qv = create_dynamic_map(false);
    ApplyAdamWQuantTensors tensors() {
      return {TensorView::of(var.data(), {N}),
              TensorView::of(grad.data(), {N}),
              TensorView::of(m.data(), {N}),
              TensorView::of(v.data(), {N}),
              TensorView::of(qm.data(), {kQuantMapSize}),
              TensorView::of(qv.data(), {kQuantMapSize}),
              TensorView::of(am.data(), {B}),
              TensorView::of(av.data(), {B})};
    }
  };
  static Data make(std::mt19937_64 &rng) {
    Data d;
    d.var = floats(rng, N, -1, 1);
    d.grad = floats(rng, N, -1, 1);
    d.am = floats(rng, B, 0.01f, 0.1f);
    d.av = floats(rng, B, 1e-4f, 1e-3f);
    d.m = codes(rng, N);
    d.v = codes(rng, N);
    return d;
  }
  static Status run(const Plan &p, const ApplyAdamWQuantTensors &t, void *ws, size_t n) {
    ApplyAdamWQuantScalars s;
    s.step = 7;
    s.lr = 0.01f;
    return p.run(t, s, ws, n);
  }
};

// The 8-bit optimizers in the FP8 state format (docs/fp8_state.md): the same operators and roles,
// the maps empty, the codes and scales of the FP8 format; a plan made with options() below.
struct LazyAdamQuantFp8Op : LazyAdamQuantOp {
  static constexpr const char *kName = "LazyAdamQuantFp8";
};
struct ApplyAdamWQuantFp8Op : ApplyAdamWQuantOp {
  static constexpr const char *kName = "ApplyAdamWQuantFp8";
};
struct EmbeddingBagLazyAdamQuantFp8Op : EmbeddingBagLazyAdamQuantOp {
  static constexpr const char *kName = "EmbeddingBagLazyAdamQuantFp8";
};
template <class Base>
struct SeamFp8 : Seam<Base> {
  struct Data : Seam<Base>::Data {
    auto tensors() {
      auto t = Seam<Base>::Data::tensors();
      t.qmap_m.shape[0] = t.qmap_v.shape[0] = 0;  // no maps
      return t;
    }
  };
  static Data make(std::mt19937_64 &rng) {
    Data d{Seam<Base>::make(rng)};
    for (auto &c : d.m) c = (c & 0x7f) == 0x7f ? 0x3c : c;  // finite E4M3 codes
    return d;
  }
  static typename Base::Options options() {
    typename Base::Options o;
    o.state_format = QuantStateFormat::kFp8;
    return o;
  }
};
template <>
struct Seam<LazyAdamQuantFp8Op> : SeamFp8<LazyAdamQuantOp> {};
template <>
struct Seam<ApplyAdamWQuantFp8Op> : SeamFp8<ApplyAdamWQuantOp> {};
template <>
struct Seam<EmbeddingBagLazyAdamQuantFp8Op> : SeamFp8<EmbeddingBagLazyAdamQuantOp> {};

// The options a case's plans start from: the operator's defaults, or its Seam's options().
template <class Op>
typename Op::Options seam_options() {
  if constexpr (requires { Seam<Op>::options(); }) {
    return Seam<Op>::options();
  } else {
    return {};
  }
}

template <>
struct Seam<AddLoraOp> {
  using Plan = AddLora;
  static constexpr int64_t B = 9, H1 = 32, H2 = 48, R = 8, W = 3, L = 2;
  struct Data {
    std::vector<float> y, x, wb, wa, out;
    std::vector<int32_t> idx;
    AddLoraTensors tensors() {
      return {TensorView::of(y.data(), {B, H2}),        TensorView::of(x.data(), {B, H1}),
              TensorView::of(wb.data(), {W, L, H2, R}), TensorView::of(idx.data(), {B}),
              TensorView::of(wa.data(), {W, L, R, H1}), TensorView::of(out.data(), {B, H2})};
    }
  };
  static Data make(std::mt19937_64 &rng) {
    return {floats(rng, B * H2, -1, 1),         floats(rng, B * H1, -1, 1),
            floats(rng, W * L * H2 * R, -1, 1), floats(rng, W * L * R * H1, -1, 1),
            floats(rng, B * H2, -1, 1),         indices<int32_t>(rng, B, -1, W - 1)};
  }
  static Status run(const Plan &p, const AddLoraTensors &t, void *ws, size_t n) {
    return p.run(t, ws, n);
  }
};

// The bytes a view reaches (its first to its last element).
std::vector<uint8_t> bytes_of(const TensorView &t) {
  if (t.data == nullptr || t.numel() == 0) return {};
  int64_t last = 0;
  for (int i = 0; i < t.ndim; ++i) last += (t.shape[i] - 1) * t.strides[i];
  const auto n = static_cast<size_t>((last + 1) * static_cast<int64_t>(dtype_size(t.dtype)));
  const auto *p = static_cast<const uint8_t *>(t.data);
  return std::vector<uint8_t>(p, p + n);
}

// The written tensors' bytes, role by role.
template <class Op>
std::vector<std::vector<uint8_t>> outputs(const typename Op::Tensors &t) {
  std::vector<std::vector<uint8_t>> out;
  size_t i = 0;
  for (const TensorView *v : Op::views(t)) {
    if (Op::kRoles[i++].written) out.push_back(bytes_of(*v));
  }
  return out;
}
template <class Op>
void poison_outputs(typename Op::Tensors &t) {
  size_t i = 0;
  for (TensorView *v : Op::views(t)) {
    if (Op::kRoles[i++].written) std::memset(v->data, 0xa5, bytes_of(*v).size());
  }
}

// Bytes of workspace a run of a plan on tensors t needs (AdamW needs none and has no
// workspace_size(); EmbeddingBagLazyAdam's depends on the batch bound to the run).
template <class Plan, class Tensors>
size_t workspace_of(const Plan &plan, const Tensors &t) {
  if constexpr (requires { plan.workspace_size(t); }) {
    return plan.workspace_size(t);
  } else if constexpr (requires { plan.workspace_size(); }) {
    return plan.workspace_size();
  } else {
    return 0;
  }
}

template <class Op>
class SeamTest : public ::testing::Test {
 protected:
  using Plan = typename Seam<Op>::Plan;

  // The implementations this machine runs for the case's problem (a VBMI kernel is skipped where
  // the CPU has no VBMI; CTest runs them where it does).
  std::vector<std::string> runnable() {
    auto rng = testing::rng_for(1);
    typename Seam<Op>::Data d = Seam<Op>::make(rng);
    typename Op::Problem problem;
    EXPECT_TRUE(Op::Problem::make(d.tensors(), seam_options<Op>(), &problem).ok());
    std::vector<std::string> names;
    for (const std::string &name : Plan::implementations()) {
      typename Op::Options o = seam_options<Op>();
      o.implementation = name.c_str();
      Plan plan;
      const Status st = Plan::plan(problem, o, &plan);
      EXPECT_TRUE(st.ok() || st.code() == StatusCode::kNoImplementation) << st.message();
      if (st.ok()) names.push_back(name);
    }
    EXPECT_FALSE(names.empty());
    EXPECT_EQ(names.back(), kReferenceName);
    return names;
  }

  // A plan for the tensors of `d`, by implementation name and thread count.
  static Plan plan_for(typename Seam<Op>::Data &d, const std::string &name, int threads) {
    typename Op::Options o = seam_options<Op>();
    o.implementation = name.c_str();
    o.num_threads = threads;
    typename Op::Problem problem;
    EXPECT_TRUE(Op::Problem::make(d.tensors(), o, &problem).ok());
    Plan plan;
    EXPECT_TRUE(Plan::plan(problem, o, &plan).ok());
    return plan;
  }

  static Status run(const Plan &plan, typename Seam<Op>::Data &d) {
    std::vector<char> ws(workspace_of(plan, d.tensors()) + 64);
    return Seam<Op>::run(plan, d.tensors(), ws.data(), ws.size());
  }
};

using Operators =
    ::testing::Types<LazyAdamOp, LazyAdamQuantOp, AdamWOp, ApplyAdamWQuantOp, AddLoraOp,
                     LazyAdamQuantFp8Op, ApplyAdamWQuantFp8Op, EmbeddingBagLazyAdamOp,
                     EmbeddingBagLazyAdamQuantOp, EmbeddingBagLazyAdamQuantFp8Op>;
class OperatorNames {
 public:
  template <class Op>
  static std::string GetName(int) {
    return Op::kName;
  }
};
TYPED_TEST_SUITE(SeamTest, Operators, OperatorNames);

TYPED_TEST(SeamTest, APlanRunsOnNewTensorsAsAFreshPlanDoes) {
  using S = Seam<TypeParam>;
  for (const std::string &impl : this->runnable()) {
    SCOPED_TRACE(impl);
    auto rng = testing::rng_for(2);
    typename S::Data first = S::make(rng);
    const auto plan = this->plan_for(first, impl, 2);
    for (int k = 0; k < 3; ++k) {
      SCOPED_TRACE(k);
      typename S::Data got = S::make(rng);  // new addresses and new data for every run
      typename S::Data fresh = got;
      ASSERT_TRUE(this->run(plan, got).ok());
      ASSERT_TRUE(this->run(this->plan_for(fresh, impl, 2), fresh).ok());
      EXPECT_EQ(outputs<TypeParam>(got.tensors()), outputs<TypeParam>(fresh.tensors()));
    }
  }
}

TYPED_TEST(SeamTest, BitsDoNotDependOnTheThreadCount) {
  using S = Seam<TypeParam>;
  for (const std::string &impl : this->runnable()) {
    SCOPED_TRACE(impl);
    auto rng = testing::rng_for(3);
    const typename S::Data start = S::make(rng);
    std::vector<std::vector<uint8_t>> want;
    for (int threads : {1, 2, 3}) {
      SCOPED_TRACE(threads);
      typename S::Data d = start;
      ASSERT_TRUE(this->run(this->plan_for(d, impl, threads), d).ok());
      const auto got = outputs<TypeParam>(d.tensors());
      if (threads == 1) {
        want = got;
        EXPECT_NE(got, outputs<TypeParam>(typename S::Data(start).tensors()));  // it wrote
      } else {
        EXPECT_EQ(got, want);
      }
    }
  }
}

TYPED_TEST(SeamTest, ABindingThatDiffersInOneRoleIsRefusedAndWritesNothing) {
  using S = Seam<TypeParam>;
  using Op = TypeParam;
  auto rng = testing::rng_for(4);
  typename S::Data d = S::make(rng);
  const auto plan = this->plan_for(d, kReferenceName, 2);
  typename Op::Tensors poisoned = d.tensors();
  poison_outputs<Op>(poisoned);
  const auto before = outputs<Op>(poisoned);
  constexpr size_t n = std::size(Op::kRoles);
  for (size_t role = 0; role < n; ++role) {
    SCOPED_TRACE(Op::kRoles[role].name);
    for (int how = 0; how < 2; ++how) {
      typename Op::Tensors t = poisoned;
      TensorView &v = *Op::views(t)[role];
      if (how == 0) {
        v.dtype = v.dtype == DType::kInt64 ? DType::kInt32 : DType::kInt64;  // another dtype
      } else if (v.numel() == 0) {
        continue;  // a role with no elements (the FP8 format's maps) needs no data
      } else {
        v.data = nullptr;  // no data
      }
      std::vector<char> ws(workspace_of(plan, poisoned) + 64);
      const Status st = S::run(plan, t, ws.data(), ws.size());
      EXPECT_FALSE(st.ok()) << (how == 0 ? "another dtype" : "no data");
      EXPECT_NE(st.message().find(Op::kRoles[role].name), std::string::npos) << st.message();
      EXPECT_EQ(outputs<Op>(poisoned), before);
    }
  }
}

TYPED_TEST(SeamTest, ATensorOnAnotherDeviceHasNoImplementation) {
  using S = Seam<TypeParam>;
  using Op = TypeParam;
  auto rng = testing::rng_for(5);
  typename S::Data d = S::make(rng);
  typename Op::Tensors t = d.tensors();
  Op::views(t)[0]->device = Device::kCuda;
  typename Op::Problem problem;
  ASSERT_TRUE(Op::Problem::make(t, seam_options<Op>(), &problem).ok());
  typename S::Plan plan;
  const Status st = S::Plan::plan(problem, seam_options<Op>(), &plan);
  EXPECT_EQ(st.code(), StatusCode::kNoImplementation);
  for (const std::string &name : S::Plan::implementations()) {
    EXPECT_NE(st.message().find(name), std::string::npos) << st.message();
  }
}

TYPED_TEST(SeamTest, AnUnknownNameAndAnUnmadePlanAreRefused) {
  using S = Seam<TypeParam>;
  using Op = TypeParam;
  auto rng = testing::rng_for(6);
  typename S::Data d = S::make(rng);
  typename Op::Problem problem;
  ASSERT_TRUE(Op::Problem::make(d.tensors(), seam_options<Op>(), &problem).ok());
  typename Op::Options o = seam_options<Op>();
  o.implementation = "cpu_nonesuch";
  typename S::Plan plan;
  Status st = S::Plan::plan(problem, o, &plan);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("no implementation is named \"cpu_nonesuch\""), std::string::npos);
  EXPECT_STREQ(plan.implementation(), "none");
  st = S::run(plan, d.tensors(), nullptr, 0);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("run on a plan that was not made"), std::string::npos);
  // The kernel choice: kReference picks the reference, kOptimized anything else.
  o = seam_options<Op>();
  o.kernel = KernelChoice::kReference;
  ASSERT_TRUE(S::Plan::plan(problem, o, &plan).ok());
  EXPECT_STREQ(plan.implementation(), kReferenceName);
  o.kernel = KernelChoice::kOptimized;
  ASSERT_TRUE(S::Plan::plan(problem, o, &plan).ok());
  EXPECT_STRNE(plan.implementation(), kReferenceName);
}

}  // namespace
}  // namespace fusekit
