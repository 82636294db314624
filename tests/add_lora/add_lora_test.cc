// AddLora: every output element against an independent float64 oracle written here (one ulp of
// the output type at the oracle's magnitude, plus the float32-cancellation bound of
// spec/add_lora.md), elements outside the update bitwise equal to y, y untouched out of place,
// unwritten elements caught by poison, every refusal with its code and nothing written, and
// bitwise equality over thread counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_add_lora.h"
#include "common/simd_targets.h"
#include "common/test_util.h"
#include "fusekit/add_lora.h"
#include "fusekit/float16.h"

namespace fusekit {
namespace {

using fusekit::testing::rng_for;

// ---- element access by dtype, on raw bytes ----
double get(DType dt, const std::vector<uint8_t> &buf, int64_t i) {
  switch (dt) {
    case DType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, buf.data() + 2 * i, 2);
      return half_bits_to_float(h);
    }
    case DType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, buf.data() + 2 * i, 2);
      return bf16_bits_to_float(h);
    }
    default: {
      float f;
      std::memcpy(&f, buf.data() + 4 * i, 4);
      return f;
    }
  }
}
void set(DType dt, std::vector<uint8_t> &buf, int64_t i, float v) {
  switch (dt) {
    case DType::kFloat16: {
      uint16_t h = float_to_half_bits(v);
      std::memcpy(buf.data() + 2 * i, &h, 2);
      break;
    }
    case DType::kBFloat16: {
      uint16_t h = float_to_bf16_bits(v);
      std::memcpy(buf.data() + 2 * i, &h, 2);
      break;
    }
    default:
      std::memcpy(buf.data() + 4 * i, &v, 4);
      break;
  }
}
bool same_bits(DType dt, const std::vector<uint8_t> &a, int64_t i, const std::vector<uint8_t> &b,
               int64_t j) {
  const size_t es = dtype_size(dt);
  return std::memcmp(a.data() + es * i, b.data() + es * j, es) == 0;
}

// One ulp of the output type at magnitude |v| (float32: the relative 1e-5 of the spec).
double ulp_at(DType dt, double v) {
  const double a = std::fabs(v);
  if (dt == DType::kFloat32) return 1e-5 * a;
  const int mant = dt == DType::kFloat16 ? 10 : 7;
  const int emin = dt == DType::kFloat16 ? -14 : -126;
  int e = a > 0 ? static_cast<int>(std::floor(std::log2(a))) : emin;
  e = std::max(e, emin);
  return std::ldexp(1.0, e - mant);
}

struct Problem {
  DType dt = DType::kFloat16;
  int64_t B = 4, H1 = 16, H2 = 16, H3 = 16, R = 16, W = 2, L = 1, layer = 0, y_offset = 0;
  double scale = 1.0;
  bool has_a = true, in_place = false;
  int64_t x_pad = 0, y_pad = 0, out_pad = 0;  // extra elements per row (row-strided views)
  std::vector<int32_t> indices;               // filled by make() when empty: random in [0, W)
  uint64_t seed = 1;
};

struct Data {
  Problem p;
  std::vector<uint8_t> x, y, y0, wa, wb, out;
  std::vector<int32_t> idx;
  int64_t xs = 0, ys = 0, os = 0;
  TensorView vx, vy, va, vb, vi, vo;
};

// Random inputs (recorded seed) in [-1, 1], rounded to the dtype; out poisoned (0xFF bytes: NaN).
Data make(const Problem &p) {
  Data d;
  d.p = p;
  auto rng = rng_for(p.seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const size_t es = dtype_size(p.dt);
  d.xs = p.H1 + p.x_pad;
  d.ys = p.H3 + p.y_pad;
  d.os = p.in_place ? d.ys : p.H3 + p.out_pad;
  auto fill = [&](std::vector<uint8_t> &buf, int64_t n) {
    buf.assign(static_cast<size_t>(n) * es, 0);
    for (int64_t i = 0; i < n; ++i) set(p.dt, buf, i, u(rng));
  };
  fill(d.x, p.B * d.xs);
  fill(d.y, p.B * d.ys);
  if (p.has_a) fill(d.wa, p.W * p.L * p.R * p.H1);
  fill(d.wb, p.W * p.L * p.H2 * p.R);
  d.idx = p.indices;
  if (d.idx.empty()) {
    std::uniform_int_distribution<int32_t> ui(0, static_cast<int32_t>(p.W - 1));
    for (int64_t i = 0; i < p.B; ++i) d.idx.push_back(ui(rng));
  }
  d.y0 = d.y;
  if (!p.in_place) d.out.assign(static_cast<size_t>(p.B * d.os) * es, 0xFF);
  d.vx = TensorView::strided(d.x.data(), p.dt, {p.B, p.H1}, {d.xs, 1});
  d.vy = TensorView::strided(d.y.data(), p.dt, {p.B, p.H3}, {d.ys, 1});
  d.vo = p.in_place ? d.vy : TensorView::strided(d.out.data(), p.dt, {p.B, p.H3}, {d.os, 1});
  if (p.has_a) d.va = TensorView::contiguous(d.wa.data(), p.dt, {p.W, p.L, p.R, p.H1});
  d.vb = TensorView::contiguous(d.wb.data(), p.dt, {p.W, p.L, p.H2, p.R});
  d.vi = TensorView::of(d.idx.data(), {p.B});
  return d;
}

AddLoraOptions options_for(const Problem &p, KernelChoice k = KernelChoice::kAuto,
                           int threads = 0) {
  AddLoraOptions o;
  o.layer_idx = p.layer;
  o.scale = p.scale;
  o.y_offset = p.y_offset;
  o.kernel = k;
  o.num_threads = threads;
  return o;
}

// An implementation, by name (cpu_hwy's variants cpu_hwy_prefill and cpu_hwy_decode put every
// group on one path).
struct KernelPath {
  std::string impl;  // a name from AddLora::implementations()
  std::string name;  // for messages
};

AddLoraOptions options_for(const Problem &p, const KernelPath &k, int threads = 0) {
  AddLoraOptions o = options_for(p, KernelChoice::kAuto, threads);
  o.implementation = k.impl.c_str();
  return o;
}

// Every implementation built into the library that this machine runs (a plan for it can be made).
const std::vector<KernelPath> &kernels() {
  static const std::vector<KernelPath> list = [] {
    std::vector<KernelPath> v;
    std::vector<uint16_t> y(4), x(2), wb(2);
    int32_t idx = 0;
    for (const std::string &impl : AddLora::implementations()) {
      AddLoraOptions o;
      o.implementation = impl.c_str();
      AddLora plan;
      const Status s =
          AddLora::plan(TensorView::contiguous(y.data(), DType::kFloat16, {1, 2}),
                        TensorView::contiguous(x.data(), DType::kFloat16, {1, 2}),
                        TensorView::contiguous(wb.data(), DType::kFloat16, {1, 1, 1, 2}),
                        TensorView::of(&idx, {1}), TensorView(),
                        TensorView::contiguous(y.data() + 2, DType::kFloat16, {1, 2}), o, &plan);
      if (s.code() == StatusCode::kNoImplementation) continue;  // built, not for this machine
      EXPECT_TRUE(s.ok()) << impl << ": " << s.message();
      v.push_back({impl, impl});
    }
    return v;
  }();
  return list;
}

Status run(Data &d, const AddLoraOptions &o, AddLoraStats *st = nullptr) {
  return add_lora(d.vy, d.vx, d.vb, d.vi, d.va, d.vo, o, st);
}

const std::vector<uint8_t> &out_buf(const Data &d) {
  return d.p.in_place ? d.y : d.out;
}

// The float64 oracle and the checks. Returns the number of bad elements.
int64_t check(const Data &d, const char *what, bool report = true) {
  const Problem &p = d.p;
  const auto &out = out_buf(d);
  int64_t bad = 0;
  auto fail = [&](const std::string &msg) {
    if (report && bad < 5) ADD_FAILURE() << what << ": " << msg;
    ++bad;
  };
  std::vector<double> t(static_cast<size_t>(p.R)), tabs(static_cast<size_t>(p.R));
  for (int64_t b = 0; b < p.B; ++b) {
    const int32_t a = d.idx[static_cast<size_t>(b)];
    const bool upd = a >= 0 && a < p.W;
    for (int64_t r = 0; r < p.R && upd; ++r) {
      double s = 0, sa = 0;
      if (!p.has_a) {
        s = get(p.dt, d.x, b * d.xs + r);
        sa = std::fabs(s);
      } else {
        const int64_t base = ((a * p.L + p.layer) * p.R + r) * p.H1;
        for (int64_t k = 0; k < p.H1; ++k) {
          const double term = get(p.dt, d.x, b * d.xs + k) * get(p.dt, d.wa, base + k);
          s += term;
          sa += std::fabs(term);
        }
      }
      t[static_cast<size_t>(r)] = s;
      tabs[static_cast<size_t>(r)] = sa;
    }
    for (int64_t c = 0; c < p.H3; ++c) {
      const int64_t oi = b * d.os + c, yi = b * d.ys + c;
      if (!upd || c < p.y_offset || c >= p.y_offset + p.H2) {
        if (!same_bits(p.dt, out, oi, d.y0, yi)) {
          fail("row " + std::to_string(b) + " col " + std::to_string(c) +
               " (no update) differs from y: " + std::to_string(get(p.dt, out, oi)) + " vs " +
               std::to_string(get(p.dt, d.y0, yi)));
        }
        continue;
      }
      const int64_t o = c - p.y_offset;
      const int64_t bbase = ((a * p.L + p.layer) * p.H2 + o) * p.R;
      double z = 0, za = 0;
      for (int64_t r = 0; r < p.R; ++r) {
        const double bv = get(p.dt, d.wb, bbase + r);
        z += t[static_cast<size_t>(r)] * bv;
        za += tabs[static_cast<size_t>(r)] * std::fabs(bv);
      }
      const double yv = get(p.dt, d.y0, yi);
      const double ref = yv + p.scale * z;
      const double sum_abs = std::fabs(yv) + std::fabs(p.scale) * za;
      const double bound = ulp_at(p.dt, ref) + 2.0 *
                                                   std::sqrt(static_cast<double>(p.H1 + p.R + 2)) *
                                                   std::ldexp(sum_abs, -24);
      const double got = get(p.dt, out, oi);
      if (!(std::fabs(got - ref) <= bound)) {
        fail("row " + std::to_string(b) + " col " + std::to_string(c) + ": got " +
             std::to_string(got) + ", float64 reference " + std::to_string(ref) + ", bound " +
             std::to_string(bound));
      }
    }
  }
  // Out of place: y untouched, and the gaps between out's rows never written.
  if (!p.in_place) {
    if (d.y != d.y0) fail("y was modified");
    const size_t es = dtype_size(p.dt);
    for (int64_t b = 0; b < p.B; ++b) {
      for (int64_t c = p.H3; c < d.os; ++c) {
        for (size_t k = 0; k < es; ++k) {
          if (d.out[static_cast<size_t>(b * d.os + c) * es + k] != 0xFF) {
            fail("the gap after row " + std::to_string(b) + " was written");
          }
        }
      }
    }
  }
  return bad;
}

const DType kDtypes[] = {DType::kFloat16, DType::kBFloat16, DType::kFloat32};

// Runs a problem on every kernel and path, in place and out of place, for every dtype.
void check_all(Problem p, const char *what) {
  for (DType dt : kDtypes) {
    for (const KernelPath &k : kernels()) {
      for (bool in_place : {false, true}) {
        p.dt = dt;
        p.in_place = in_place;
        Data d = make(p);
        const std::string label = std::string(what) + " " + dtype_name(dt) + " " + k.name +
                                  (in_place ? " in place" : " out of place") + " seed " +
                                  std::to_string(p.seed);
        SCOPED_TRACE(label);
        const Status s = run(d, options_for(p, k));
        ASSERT_TRUE(s.ok()) << s.message();
        EXPECT_EQ(check(d, label.c_str()), 0);
      }
    }
  }
}

TEST(AddLora, SeedShapeOneRowOneAdapter) {
  Problem p;
  p.B = 1;
  p.W = 1;
  check_all(p, "seed shape");
}

TEST(AddLora, OddSizesStridedMixedNoAdapter) {
  Problem p;
  p.B = 37;
  p.H1 = 67;
  p.H2 = 45;
  p.H3 = 100;
  p.R = 8;
  p.W = 3;
  p.L = 2;
  p.layer = 1;
  p.y_offset = 30;
  p.scale = 0.37;
  p.x_pad = 5;
  p.y_pad = 3;
  p.out_pad = 7;
  p.seed = 2;
  for (int i = 0; i < 37; ++i) p.indices.push_back(i % 5 == 0 ? -1 : i % 7 == 0 ? 3 : i % 3);
  check_all(p, "odd sizes");
}

TEST(AddLora, RanksAndTileEdges) {
  const int64_t ranks[] = {1, 8, 16, 64, 128};
  uint64_t seed = 10;
  for (int64_t r : ranks) {
    Problem p;
    p.R = r;
    p.B = 13;  // two row tiles and a remainder
    p.H1 = 70;
    p.H2 = 129;  // past two 64-column tiles
    p.H3 = 150;
    p.W = 2;
    p.y_offset = 150 - 129;  // the slice at the right end
    p.scale = -1.5;
    p.seed = seed++;
    check_all(p, ("rank " + std::to_string(r)).c_str());
  }
}

// H1 longer than the prefill shrink's k-chunk (512 columns at R = 128, 1024 at R = 64), so the
// partial sums are carried through t between chunks, with a ragged last chunk.
TEST(AddLora, LongRowsAcrossShrinkChunks) {
  for (int64_t r : {64, 128}) {
    Problem p;
    p.R = r;
    p.B = 14;
    p.H1 = r == 64 ? 2100 : 1100;
    p.H2 = 70;
    p.H3 = 70;
    p.W = 1;
    p.scale = 0.25;
    p.seed = static_cast<uint64_t>(200 + r);
    check_all(p, ("long rows, rank " + std::to_string(r)).c_str());
  }
}

TEST(AddLora, ThousandsOfRowsFewAdapters) {
  Problem p;
  p.B = 2000;
  p.H1 = 48;
  p.H2 = 40;
  p.H3 = 40;
  p.R = 16;
  p.W = 4;
  p.seed = 20;
  for (DType dt : kDtypes) {
    for (const KernelPath &k : kernels()) {
      p.dt = dt;
      Data d = make(p);
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + k.name);
      ASSERT_TRUE(run(d, options_for(p, k)).ok());
      EXPECT_EQ(check(d, k.name.c_str()), 0);
    }
  }
}

TEST(AddLora, DecodeThirtyTwoAdaptersAndUnusedSlots) {
  Problem p;
  p.B = 40;
  p.H1 = 33;
  p.H2 = 300;
  p.H3 = 310;
  p.y_offset = 0;  // the slice at the left end
  p.R = 16;
  p.W = 32;
  p.L = 3;
  p.layer = 2;
  p.seed = 30;
  // Slots 0..19 used once or twice, 20..31 never.
  for (int i = 0; i < 40; ++i) p.indices.push_back(i % 20);
  check_all(p, "W = 32");
  AddLoraStats st;
  Data d = make(p);
  ASSERT_TRUE(run(d, options_for(p), &st).ok());
  EXPECT_EQ(st.decode_groups, 20);
  EXPECT_EQ(st.prefill_groups, 0);
  EXPECT_EQ(st.rows_with_adapter, 40);
}

TEST(AddLora, EveryRowOnOneAdapter) {
  Problem p;
  p.B = 257;
  p.H1 = 31;
  p.H2 = 77;
  p.H3 = 77;
  p.R = 16;
  p.W = 4;
  p.seed = 40;
  p.indices.assign(257, 2);  // slots 0, 1 and 3 unused
  check_all(p, "one adapter");
  AddLoraStats st;
  Data d = make(p);
  ASSERT_TRUE(run(d, options_for(p), &st).ok());
  EXPECT_EQ(st.prefill_groups, 1);
  EXPECT_EQ(st.decode_groups, 0);
}

TEST(AddLora, AllRowsWithoutAdapter) {
  Problem p;
  p.B = 9;
  p.W = 3;
  p.seed = 50;
  p.indices = {-1, -1, -1, -1, -1, -1, -1, -1, -1};
  check_all(p, "all -1");
  p.indices = {-1, 3, -7, 3, 3, -1, 3, -2147483647 - 1, 3};
  check_all(p, "mixed -1 and W");
}

TEST(AddLora, WithoutWeightA) {
  Problem p;
  p.has_a = false;
  p.B = 23;
  p.R = 24;
  p.H1 = 24;
  p.H2 = 70;
  p.H3 = 90;
  p.y_offset = 9;
  p.W = 3;
  p.scale = 0.5;
  p.seed = 60;
  check_all(p, "no weightA");
  p.B = 1;
  p.R = p.H1 = 5;
  check_all(p, "no weightA, B = 1");
}

// Weights with padded rows (each weight matrix a slice of a wider buffer): any outer strides work.
TEST(AddLora, RowStridedWeights) {
  Problem p;
  p.B = 20;
  p.H1 = 40;
  p.H2 = 50;
  p.H3 = 50;
  p.R = 16;
  p.W = 3;
  p.L = 2;
  p.layer = 1;
  p.seed = 65;
  for (DType dt : kDtypes) {
    for (const KernelPath &k : kernels()) {
      p.dt = dt;
      Data d = make(p);
      const size_t es = dtype_size(dt);
      const int64_t pa = p.H1 + 5, pb = p.R + 3;
      std::vector<uint8_t> wa(static_cast<size_t>(p.W * p.L * p.R * pa) * es),
          wb(static_cast<size_t>(p.W * p.L * p.H2 * pb) * es);
      for (int64_t i = 0; i < p.W * p.L * p.R; ++i)
        std::memcpy(wa.data() + i * pa * es, d.wa.data() + i * p.H1 * es, p.H1 * es);
      for (int64_t i = 0; i < p.W * p.L * p.H2; ++i)
        std::memcpy(wb.data() + i * pb * es, d.wb.data() + i * p.R * es, p.R * es);
      const TensorView va = TensorView::strided(wa.data(), dt, {p.W, p.L, p.R, p.H1},
                                                {p.L * p.R * pa, p.R * pa, pa, 1});
      const TensorView vb = TensorView::strided(wb.data(), dt, {p.W, p.L, p.H2, p.R},
                                                {p.L * p.H2 * pb, p.H2 * pb, pb, 1});
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + k.name);
      const Status st = add_lora(d.vy, d.vx, vb, d.vi, va, d.vo, options_for(p, k));
      ASSERT_TRUE(st.ok()) << st.message();
      EXPECT_EQ(check(d, k.name.c_str()), 0);
    }
  }
}

// A kernel that rounds t and scale*z to float16 (CANN's way) must fail the bound: the bound is
// not vacuous.
TEST(AddLora, BoundCatchesFloat16Intermediates) {
  Problem p;
  p.B = 8;
  p.H1 = 256;
  p.H2 = 64;
  p.H3 = 64;
  p.R = 16;
  p.W = 1;
  p.seed = 70;
  Data d = make(p);
  ASSERT_TRUE(run(d, options_for(p)).ok());
  ASSERT_EQ(check(d, "float32 intermediates"), 0);
  // Overwrite out with the float16-intermediate computation.
  for (int64_t b = 0; b < p.B; ++b) {
    std::vector<float> t(16);
    for (int64_t r = 0; r < p.R; ++r) {
      float s = 0;
      for (int64_t k = 0; k < p.H1; ++k) {
        s += static_cast<float>(get(p.dt, d.x, b * d.xs + k) * get(p.dt, d.wa, r * p.H1 + k));
      }
      t[static_cast<size_t>(r)] = half_bits_to_float(float_to_half_bits(s));
    }
    for (int64_t o = 0; o < p.H2; ++o) {
      float z = 0;
      for (int64_t r = 0; r < p.R; ++r)
        z += t[static_cast<size_t>(r)] * static_cast<float>(get(p.dt, d.wb, o * p.R + r));
      const float sz = half_bits_to_float(float_to_half_bits(static_cast<float>(p.scale) * z));
      set(p.dt, d.out, b * d.os + o, static_cast<float>(get(p.dt, d.y0, b * d.ys + o)) + sz);
    }
  }
  EXPECT_GT(check(d, "float16 intermediates", /*report=*/false), 0);
}

// bfloat16 results are rounded to nearest even (Highway 1.0.3 truncates on AVX2): y + x * 1 with
// sums on ties and just above half an ulp, in the vector body and the tail of both paths.
TEST(AddLora, BFloat16RoundsToNearestEven) {
  fusekit::testing::for_each_simd_target([](const char *) {
    const int64_t H = 70;
    for (const char *path : {"cpu_hwy_prefill", "cpu_hwy_decode"}) {
      for (int64_t rows : {1, 9}) {
        std::vector<uint16_t> y(static_cast<size_t>(rows * H)), x(static_cast<size_t>(rows)),
            out(y.size());
        std::vector<uint16_t> wb(static_cast<size_t>(H), float_to_bf16_bits(1.0f));
        std::vector<int32_t> idx(static_cast<size_t>(rows), 0);
        const float ys[] = {1.0f, 1.0078125f, 1.0f, -1.0078125f};
        const float xs[] = {0x1p-8f, 0x1p-8f, 0x1.4p-8f, -0x1p-8f};
        for (int64_t b = 0; b < rows; ++b) {
          x[static_cast<size_t>(b)] = float_to_bf16_bits(xs[b % 4]);
          for (int64_t j = 0; j < H; ++j)
            y[static_cast<size_t>(b * H + j)] = float_to_bf16_bits(ys[(b + j) % 4]);
        }
        AddLoraOptions o;
        o.implementation = path;
        const Status s =
            add_lora(TensorView::contiguous(y.data(), DType::kBFloat16, {rows, H}),
                     TensorView::contiguous(x.data(), DType::kBFloat16, {rows, 1}),
                     TensorView::contiguous(wb.data(), DType::kBFloat16, {1, 1, H, 1}),
                     TensorView::of(idx.data(), {rows}), TensorView(),
                     TensorView::contiguous(out.data(), DType::kBFloat16, {rows, H}), o);
        ASSERT_TRUE(s.ok()) << s.message();
        for (int64_t b = 0; b < rows; ++b) {
          for (int64_t j = 0; j < H; ++j) {
            const float sum = bf16_bits_to_float(y[static_cast<size_t>(b * H + j)]) +
                              bf16_bits_to_float(x[static_cast<size_t>(b)]);
            ASSERT_EQ(out[static_cast<size_t>(b * H + j)], float_to_bf16_bits(sum))
                << "row " << b << " col " << j;
          }
        }
      }
    }
  });
}

// Every SIMD target Highway compiled and this CPU runs (AVX2 and AVX-512 tiles differ) against the
// oracle, on odd sizes, tile edges and both paths.
TEST(AddLora, EverySimdTarget) {
  fusekit::testing::for_each_simd_target([](const char *target) {
    Problem p;
    p.B = 29;
    p.H1 = 67;
    p.H2 = 83;
    p.H3 = 100;
    p.R = 24;
    p.W = 3;
    p.y_offset = 17;
    p.x_pad = 3;
    p.scale = 0.75;
    p.seed = 95;
    for (int i = 0; i < 29; ++i)
      p.indices.push_back(i < 20 ? 1 : i % 5 - 1);  // a big group, small ones, -1
    check_all(p, target);
    p.R = 64;
    p.H2 = 129;
    p.H3 = 129;
    p.y_offset = 0;
    p.seed = 96;
    check_all(p, target);
  });
}

// Without weightA both paths expand the same t (x itself), and the decode path's expand (weightB
// transposed in registers, N x N blocks) does the prefill expand's operations in its order: the two
// must agree bit for bit. On every SIMD target, every dtype, ranks below, at and above a vector
// (partial and several rank chunks), column counts around a vector (partial column blocks), groups
// of 1 to 9 and 17 rows (every row-tile size and more than one tile) among rows with no adapter.
TEST(AddLora, DecodeAndPrefillExpandsGiveTheSameBits) {
  const int64_t sizes[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 17};
  std::vector<int32_t> indices;
  for (int64_t round = 0; round < 17; ++round) {
    for (int32_t g = 0; g < 10; ++g) {
      if (round < sizes[g]) indices.push_back(g);
    }
    if (round % 4 == 0) indices.push_back(-1);
  }
  fusekit::testing::for_each_simd_target([&](const char *target) {
    for (DType dt : kDtypes) {
      for (const auto &[r, h2] :
           {std::pair<int64_t, int64_t>{1, 17}, {7, 1}, {16, 16}, {16, 83}, {17, 15}, {40, 33}}) {
        Problem p;
        p.dt = dt;
        p.has_a = false;
        p.B = static_cast<int64_t>(indices.size());
        p.R = p.H1 = r;
        p.H2 = h2;
        p.H3 = h2 + 5;
        p.y_offset = 3;
        p.W = 11;  // slot 10 unused
        p.scale = 0.75;
        p.seed = static_cast<uint64_t>(700 + r * 100 + h2);
        p.indices = indices;
        Data dec = make(p), pre = make(p);
        const std::string label = std::string(target) + " " + dtype_name(dt) + " R " +
                                  std::to_string(r) + " H2 " + std::to_string(h2);
        AddLoraStats st_dec, st_pre;
        ASSERT_TRUE(run(dec, options_for(p, KernelPath{"cpu_hwy_decode", "decode"}), &st_dec).ok());
        ASSERT_TRUE(
            run(pre, options_for(p, KernelPath{"cpu_hwy_prefill", "prefill"}), &st_pre).ok());
        EXPECT_EQ(st_dec.decode_groups, 10) << label;
        EXPECT_EQ(st_pre.prefill_groups, 10) << label;
        EXPECT_EQ(check(dec, label.c_str()), 0) << label;
        EXPECT_TRUE(dec.out == pre.out) << label << ": the paths differ";
      }
    }
  });
}

// Thread counts 1, 2 and 4 give bitwise identical results, on both paths.
TEST(AddLora, BitwiseEqualOverThreadCounts) {
  Problem p;
  p.B = 150;
  p.H1 = 1100;  // two shrink k-chunks at R = 64
  p.H2 = 300;
  p.H3 = 310;
  p.y_offset = 5;
  p.R = 64;
  p.W = 5;
  p.seed = 80;
  for (int i = 0; i < 150; ++i)
    p.indices.push_back(i < 120 ? i % 2 : 2 + i % 3);  // two big groups, three small
  for (DType dt : kDtypes) {
    for (const KernelPath &k : kernels()) {
      if (k.impl == "cpu_reference") continue;
      p.dt = dt;
      std::vector<std::vector<uint8_t>> results;
      for (int threads : {1, 2, 4}) {
        Data d = make(p);
        ASSERT_TRUE(run(d, options_for(p, k, threads)).ok());
        if (threads == 1) {
          EXPECT_EQ(check(d, k.name.c_str()), 0);
        }
        results.push_back(d.out);
      }
      EXPECT_TRUE(results[0] == results[1])
          << dtype_name(dt) << " " << k.name << ": 1 vs 2 threads";
      EXPECT_TRUE(results[0] == results[2])
          << dtype_name(dt) << " " << k.name << ": 1 vs 4 threads";
    }
  }
}

// int64 indices (torch's and vLLM's type) are read as they are: bitwise the int32 result for
// every implementation, with -1 and W for "no adapter"; values that an int32 narrowing would wrap
// into a valid slot (2^32, 2^32 + 1) are refused by name, nothing written; any negative value,
// INT64_MIN included, means "no adapter".
TEST(AddLora, Int64IndicesAreReadAsTheyAre) {
  Problem p;
  p.B = 40;
  p.H1 = 33;
  p.H2 = 17;
  p.H3 = 21;
  p.y_offset = 3;
  p.R = 8;
  p.W = 4;
  p.seed = 85;
  for (int i = 0; i < 40; ++i) p.indices.push_back(i % 6 - 1);  // -1, 0..3, 4 (== W)
  for (DType dt : kDtypes) {
    for (const KernelPath &k : kernels()) {
      p.dt = dt;
      Data d32 = make(p);
      ASSERT_TRUE(run(d32, options_for(p, k)).ok());
      EXPECT_EQ(check(d32, k.name.c_str()), 0);
      Data d64 = make(p);
      std::vector<int64_t> idx64(d64.idx.begin(), d64.idx.end());
      idx64[0] = std::numeric_limits<int64_t>::min();  // negative: no adapter, as -1 is
      d64.vi = TensorView::of(idx64.data(), {p.B});
      ASSERT_TRUE(run(d64, options_for(p, k)).ok());
      EXPECT_TRUE(d64.out == d32.out) << dtype_name(dt) << " " << k.name;
      // A strided int64 view (every other element of a [B, 2] buffer).
      std::vector<int64_t> wide(static_cast<size_t>(2 * p.B), 99);
      for (int64_t i = 0; i < p.B; ++i) wide[static_cast<size_t>(2 * i)] = d64.idx[i];
      Data ds = make(p);
      ds.vi = TensorView::strided(wide.data(), DType::kInt64, {p.B}, {2});
      const Status sst = run(ds, options_for(p, k));
      ASSERT_TRUE(sst.ok()) << sst.message();
      EXPECT_TRUE(ds.out == d32.out) << dtype_name(dt) << " " << k.name << " strided";
      for (int64_t bad : {int64_t{1} << 32, (int64_t{1} << 32) + 1, int64_t{5}}) {
        Data dr = make(p);
        std::vector<int64_t> idxr(dr.idx.begin(), dr.idx.end());
        idxr[7] = bad;
        dr.vi = TensorView::of(idxr.data(), {p.B});
        const std::vector<uint8_t> before = dr.out;
        const Status s = run(dr, options_for(p, k));
        EXPECT_EQ(s.code(), StatusCode::kShapeMismatch) << s.message();
        EXPECT_NE(s.message().find("indices[7] = " + std::to_string(bad)), std::string::npos)
            << s.message();
        EXPECT_TRUE(dr.out == before) << "written after refusing " << bad;
      }
    }
  }
}

// Two calls at the same time from two threads (two executors on two streams) give what each
// gives alone.
TEST(AddLora, ConcurrentCallsFromTwoThreads) {
  Problem p;
  p.B = 64;
  p.H1 = 96;
  p.H2 = 80;
  p.H3 = 80;
  p.R = 16;
  p.W = 3;
  Data alone[2] = {make(p), make(p)};
  p.seed = 2;
  alone[1] = make(p);
  p.seed = 1;
  Data together[2] = {make(p), make(p)};
  p.seed = 2;
  together[1] = make(p);
  for (int i = 0; i < 2; ++i)
    ASSERT_TRUE(run(alone[i], options_for(alone[i].p, KernelChoice::kAuto, 2)).ok());
  Status st[2];
  std::thread t0(
      [&] { st[0] = run(together[0], options_for(together[0].p, KernelChoice::kAuto, 2)); });
  std::thread t1(
      [&] { st[1] = run(together[1], options_for(together[1].p, KernelChoice::kAuto, 2)); });
  t0.join();
  t1.join();
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(st[i].ok()) << st[i].message();
    EXPECT_TRUE(together[i].out == alone[i].out) << "call " << i;
    EXPECT_EQ(check(together[i], "concurrent"), 0);
  }
}

// ---- refusals: the code, a message naming the argument, nothing written ----

struct Refusal {
  const char *name;
  StatusCode code;
  const char *needle;  // in the message
};

void expect_refused(Data &d, const AddLoraOptions &o, StatusCode code, const char *needle) {
  const std::vector<uint8_t> out_before = out_buf(d), y_before = d.y;
  const Status s = run(d, o);
  EXPECT_EQ(s.code(), code) << s.message();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  EXPECT_EQ(s.message().rfind("AddLora: ", 0), 0u) << s.message();
  EXPECT_TRUE(out_buf(d) == out_before) << "out was written";
  EXPECT_TRUE(d.y == y_before) << "y was written";
}

TEST(AddLoraRefusals, ShapesAttributesAndIndices) {
  Problem p;
  p.B = 6;
  p.H1 = 20;
  p.H2 = 12;
  p.H3 = 16;
  p.R = 4;
  p.W = 3;
  p.L = 2;
  p.seed = 90;
  for (bool in_place : {false, true}) {
    p.in_place = in_place;
    {
      p.indices = {0, 1, 2, 3, 4, 1};  // 4 > W
      Data d = make(p);
      expect_refused(d, options_for(p), StatusCode::kShapeMismatch, "indices[4] = 4");
    }
    p.indices = {0, 1, 2, 3, -1, 1};
    Data d = make(p);
    AddLoraOptions o = options_for(p);
    o.y_offset = 5;  // 5 + 12 > 16
    expect_refused(d, o, StatusCode::kShapeMismatch, "yOffset = 5");
    o = options_for(p);
    o.y_offset = -1;
    expect_refused(d, o, StatusCode::kShapeMismatch, "yOffset = -1");
    o = options_for(p);
    o.y_slice_size = 11;
    expect_refused(d, o, StatusCode::kShapeMismatch, "ySliceSize = 11");
    o = options_for(p);
    o.layer_idx = 2;
    expect_refused(d, o, StatusCode::kShapeMismatch, "layerIdx = 2");
    o = options_for(p);
    o.layer_idx = -1;
    expect_refused(d, o, StatusCode::kShapeMismatch, "layerIdx = -1");
    o = options_for(p);
    o.scale = 1e300;
    expect_refused(d, o, StatusCode::kInvalidArgument, "scale");
    o = options_for(p);
    o.y_slice_size = 12;
    EXPECT_TRUE(run(d, o).ok());
  }
}

TEST(AddLoraRefusals, TensorsDtypesLayoutsOverlap) {
  Problem p;
  p.B = 6;
  p.H1 = 20;
  p.H2 = 12;
  p.H3 = 16;
  p.R = 4;
  p.W = 3;
  p.seed = 91;
  Data d = make(p);
  const AddLoraOptions o = options_for(p);
  auto refuse = [&](TensorView y, TensorView x, TensorView wb, TensorView idx, TensorView wa,
                    TensorView out, StatusCode code, const char *needle) {
    const std::vector<uint8_t> out_before = d.out, y_before = d.y;
    const Status s = add_lora(y, x, wb, idx, wa, out, o);
    EXPECT_EQ(s.code(), code) << s.message();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
    EXPECT_TRUE(d.out == out_before && d.y == y_before) << needle;
  };
  refuse(TensorView(), d.vx, d.vb, d.vi, d.va, d.vo, StatusCode::kNullPointer, "y is null");
  refuse(d.vy, d.vx, TensorView(), d.vi, d.va, d.vo, StatusCode::kNullPointer, "weightB is null");
  refuse(d.vy, d.vx, d.vb, d.vi, d.va, TensorView(), StatusCode::kNullPointer, "out is null");
  TensorView bad = d.vx;
  bad.dtype = DType::kBFloat16;
  refuse(d.vy, bad, d.vb, d.vi, d.va, d.vo, StatusCode::kInvalidArgument, "x has dtype bfloat16");
  bad = d.vy;
  bad.dtype = DType::kInt32;
  refuse(bad, d.vx, d.vb, d.vi, d.va, d.vo, StatusCode::kInvalidArgument, "y has dtype int32");
  std::vector<float> idxf(6, 0.0f);
  refuse(d.vy, d.vx, d.vb, TensorView::of(idxf.data(), {6}), d.va, d.vo,
         StatusCode::kInvalidArgument, "indices has dtype float32; int32 (CANN's) or int64");
  // Shapes (561002).
  refuse(d.vy, TensorView::contiguous(d.x.data(), p.dt, {5, 20}), d.vb, d.vi, d.va, d.vo,
         StatusCode::kShapeMismatch, "x has 5 rows");
  refuse(d.vy, d.vx, d.vb, TensorView::of(d.idx.data(), {5}), d.va, d.vo,
         StatusCode::kShapeMismatch, "indices has 5 entries");
  refuse(d.vy, d.vx, d.vb, d.vi, TensorView::contiguous(d.wa.data(), p.dt, {3, 1, 4, 19}), d.vo,
         StatusCode::kShapeMismatch, "H1 = 19");
  refuse(d.vy, d.vx, d.vb, d.vi, TensorView::contiguous(d.wa.data(), p.dt, {3, 1, 2, 20}), d.vo,
         StatusCode::kShapeMismatch, "rank 2");
  refuse(d.vy, d.vx, d.vb, d.vi, TensorView::contiguous(d.wa.data(), p.dt, {2, 1, 4, 20}), d.vo,
         StatusCode::kShapeMismatch, "must agree on [W, L]");
  refuse(d.vy, d.vx, d.vb, d.vi, TensorView(), d.vo, StatusCode::kShapeMismatch,
         "without weightAOptional");
  refuse(d.vy, d.vx, TensorView::contiguous(d.wb.data(), p.dt, {3, 12, 4}), d.vi, d.va, d.vo,
         StatusCode::kShapeMismatch, "weightB must be 4-D");
  refuse(d.vy, d.vx, d.vb, d.vi, d.va, TensorView::contiguous(d.out.data(), p.dt, {6, 15}),
         StatusCode::kShapeMismatch, "out has shape [6, 15]");
  refuse(d.vy, d.vx, TensorView::contiguous(d.wb.data(), p.dt, {3, 1, 17, 4}), d.vi, d.va, d.vo,
         StatusCode::kShapeMismatch, "yOffset");
  refuse(TensorView::contiguous(d.y.data(), p.dt, {0, 16}),
         TensorView::contiguous(d.x.data(), p.dt, {0, 20}), d.vb, TensorView::of(d.idx.data(), {0}),
         d.va, TensorView::contiguous(d.out.data(), p.dt, {0, 16}), StatusCode::kShapeMismatch,
         "positive");
  // Layouts and overlap (161002).
  refuse(d.vy, TensorView::strided(d.x.data(), p.dt, {6, 10}, {20, 2}), d.vb, d.vi, d.va, d.vo,
         StatusCode::kInvalidArgument, "contiguous innermost");
  refuse(d.vy, d.vx, d.vb, d.vi, d.va, TensorView::strided(d.out.data(), p.dt, {6, 16}, {8, 1}),
         StatusCode::kInvalidArgument, "rows overlap");
  refuse(d.vy, d.vx, d.vb, d.vi, d.va,
         TensorView::strided(d.y.data() + dtype_size(p.dt), p.dt, {6, 16}, {16, 1}),
         StatusCode::kInvalidArgument, "out overlaps y");
  refuse(d.vy, d.vx, d.vb, d.vi, d.va, TensorView::contiguous(d.x.data(), p.dt, {6, 16}),
         StatusCode::kInvalidArgument, "out overlaps x");
  // A slice of a wider buffer next to y's columns is not an overlap.
  std::vector<uint8_t> wide(static_cast<size_t>(6 * 40) * dtype_size(p.dt));
  const Problem q = p;
  for (int64_t i = 0; i < 6 * 16; ++i)
    set(q.dt, wide, (i / 16) * 40 + i % 16, static_cast<float>(get(q.dt, d.y, i)));
  const TensorView wy = TensorView::strided(wide.data(), p.dt, {6, 16}, {40, 1});
  const TensorView wo =
      TensorView::strided(wide.data() + 20 * dtype_size(p.dt), p.dt, {6, 16}, {40, 1});
  EXPECT_TRUE(add_lora(wy, d.vx, d.vb, d.vi, d.va, wo, o).ok());
}

// ---- the plan: one problem, an implementation from the list, reused over many runs ----

AddLoraTensors tensors_of(const Data &d) {
  return {d.vy, d.vx, d.vb, d.vi, d.va, d.vo};
}

TensorView without_data(TensorView t) {
  t.data = nullptr;
  return t;
}

// A plan made from descriptions only; each run binds other buffers (new pointers, new indices,
// in place or not) and equals a fresh one-call add_lora bit for bit, and the oracle.
TEST(AddLoraPlan, OnePlanManyRunsWithNewPointersAndIndices) {
  Problem p;
  p.B = 37;
  p.H1 = 67;
  p.H2 = 45;
  p.H3 = 100;
  p.R = 8;
  p.W = 9;
  p.L = 2;
  p.layer = 1;
  p.y_offset = 30;
  p.scale = 0.37;
  p.x_pad = 5;
  p.y_pad = 3;
  p.out_pad = 3;  // out and y share a layout: the same plan runs in place and out of place
  for (DType dt : kDtypes) {
    for (const KernelPath &k : kernels()) {
      p.dt = dt;
      p.seed = 300;
      p.in_place = false;
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + k.name);
      const Data shape = make(p);
      AddLoraTensors desc = tensors_of(shape);
      for (TensorView *t : {&desc.y, &desc.x, &desc.weight_b, &desc.indices, &desc.out})
        *t = without_data(*t);
      desc.weight_a = without_data(desc.weight_a);
      const AddLoraOptions o = options_for(p, k, 2);
      AddLoraProblem problem;
      ASSERT_TRUE(AddLoraProblem::make(desc, o, &problem).ok());
      EXPECT_TRUE(problem.out_like_y);
      EXPECT_EQ(problem.desc.y.data, nullptr);
      AddLora plan;
      ASSERT_TRUE(AddLora::plan(problem, o, &plan).ok());
      EXPECT_EQ(plan.implementation(), k.impl);
      std::vector<char> ws(plan.workspace_size());
      std::vector<Data> runs;  // all kept alive: every run binds new pointers
      runs.reserve(8);
      auto rng = rng_for(301);
      for (int step = 0; step < 8; ++step) {
        Problem q = p;
        q.seed = 310 + static_cast<uint64_t>(step);
        q.in_place = step % 2 == 1;
        // Step 2: every row on one adapter (a prefill group); others: random, with -1 and W.
        std::uniform_int_distribution<int32_t> ui(-1, static_cast<int32_t>(q.W));
        for (int64_t i = 0; i < q.B; ++i) q.indices.push_back(step == 2 ? 4 : ui(rng));
        runs.push_back(make(q));
        Data &got = runs.back();
        Data fresh = make(q);
        AddLoraStats st, fresh_st;
        const Status s = plan.run(tensors_of(got), ws.data(), ws.size(), &st);
        ASSERT_TRUE(s.ok()) << s.message();
        ASSERT_TRUE(run(fresh, o, &fresh_st).ok());
        EXPECT_TRUE(out_buf(got) == out_buf(fresh)) << "step " << step;
        EXPECT_EQ(check(got, "reused plan"), 0) << "step " << step;
        EXPECT_EQ(st.rows_with_adapter, fresh_st.rows_with_adapter);
        EXPECT_EQ(st.rows_without_adapter, fresh_st.rows_without_adapter);
        EXPECT_EQ(st.prefill_groups, fresh_st.prefill_groups);
        EXPECT_EQ(st.decode_groups, fresh_st.decode_groups);
      }
    }
  }
}

// A binding that does not match the problem is refused before anything is written (out keeps
// its poison, y its bits), and the plan still runs afterwards.
TEST(AddLoraPlan, ABindingOfAnotherLayoutIsRefusedAndNothingIsWritten) {
  Problem p;
  p.B = 6;
  p.H1 = 20;
  p.H2 = 12;
  p.H3 = 16;
  p.R = 4;
  p.W = 3;
  p.L = 2;
  p.out_pad = 2;  // out's layout is not y's: this plan never runs in place
  p.seed = 320;
  Data d = make(p);
  AddLora plan;
  ASSERT_TRUE(AddLora::plan(d.vy, d.vx, d.vb, d.vi, d.va, d.vo, options_for(p), &plan).ok());
  EXPECT_FALSE(plan.problem().out_like_y);
  std::vector<char> ws(plan.workspace_size());
  std::vector<uint8_t> other(d.x.size() * 4, 0);
  std::vector<int32_t> idx7(7, 0);
  struct Case {
    const char *what, *needle;
    StatusCode code;
    AddLoraTensors t;
  };
  const AddLoraTensors t = tensors_of(d);
  std::vector<Case> cases;
  auto add = [&](const char *what, const char *needle, StatusCode code) -> AddLoraTensors & {
    cases.push_back({what, needle, code, t});
    return cases.back().t;
  };
  add("x of another shape", "x is", StatusCode::kInvalidArgument).x =
      TensorView::contiguous(other.data(), p.dt, {p.B, p.H1 - 1});
  add("y of another row stride", "y is", StatusCode::kInvalidArgument).y =
      TensorView::strided(other.data(), p.dt, {p.B, p.H3}, {p.H3 + 1, 1});
  add("out of another dtype", "out is", StatusCode::kInvalidArgument).out =
      TensorView::strided(d.out.data(), DType::kBFloat16, {p.B, p.H3}, {d.os, 1});
  add("weightB of another layer count", "weightB is", StatusCode::kInvalidArgument).weight_b =
      TensorView::contiguous(other.data(), p.dt, {p.W, 1, p.H2, p.R});
  add("indices of another length", "indices is", StatusCode::kInvalidArgument).indices =
      TensorView::of(idx7.data(), {7});
  add("x on another device", "on cuda", StatusCode::kInvalidArgument).x.device = Device::kCuda;
  add("weightA absent", "weightAOptional is null", StatusCode::kNullPointer).weight_a =
      TensorView();
  add("x without data", "x has no data", StatusCode::kNullPointer).x.data = nullptr;
  add("out over y, another layout", "out overlaps y", StatusCode::kInvalidArgument).out =
      TensorView::strided(d.y.data(), p.dt, {p.B, p.H3}, {d.os, 1});
  add("out over x", "out overlaps x", StatusCode::kInvalidArgument).out =
      TensorView::strided(d.x.data(), p.dt, {p.B, p.H3}, {d.os, 1});
  for (const Case &c : cases) {
    SCOPED_TRACE(c.what);
    const std::vector<uint8_t> out_before = d.out, y_before = d.y, x_before = d.x;
    AddLoraStats st;
    st.rows_with_adapter = 99;
    const Status s = plan.run(c.t, ws.data(), ws.size(), &st);
    EXPECT_EQ(s.code(), c.code) << s.message();
    EXPECT_NE(s.message().find(c.needle), std::string::npos) << s.message();
    EXPECT_EQ(s.message().rfind("AddLora: ", 0), 0u) << s.message();
    EXPECT_EQ(st.rows_with_adapter, 0);
    EXPECT_TRUE(d.out == out_before && d.y == y_before && d.x == x_before) << "written";
  }
  // A plan made with weightA refuses a binding without it; one made without refuses one with it.
  // The workspace: too small, or null.
  {
    const std::vector<uint8_t> out_before = d.out;
    EXPECT_EQ(plan.run(t, ws.data(), ws.size() - 1).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(plan.run(t, nullptr, ws.size()).code(), StatusCode::kNullPointer);
    EXPECT_TRUE(d.out == out_before);
  }
  // The same plan still runs on the right tensors afterwards.
  ASSERT_TRUE(plan.run(t, ws.data(), ws.size()).ok());
  EXPECT_EQ(check(d, "after the refusals"), 0);
}

TEST(AddLoraPlan, APlanWithoutWeightARefusesOneAndIndicesAreCheckedEachRun) {
  Problem p;
  p.has_a = false;
  p.B = 9;
  p.R = p.H1 = 8;
  p.H2 = 20;
  p.H3 = 24;
  p.W = 3;
  p.seed = 330;
  p.in_place = true;
  p.indices = {0, 1, 2, 3, -1, 1, 0, 2, 2};
  Data d = make(p);
  for (const KernelPath &k : kernels()) {
    SCOPED_TRACE(k.name);
    AddLoraProblem problem;
    ASSERT_TRUE(AddLoraProblem::make(tensors_of(d), options_for(p, k), &problem).ok());
    EXPECT_FALSE(problem.has_a);
    AddLora plan;
    ASSERT_TRUE(AddLora::plan(problem, options_for(p, k), &plan).ok());
    std::vector<char> ws(plan.workspace_size());
    std::vector<uint8_t> wa(static_cast<size_t>(p.W * p.L * p.R * p.H1) * 2);
    AddLoraTensors t = tensors_of(d);
    t.weight_a = TensorView::contiguous(wa.data(), p.dt, {p.W, p.L, p.R, p.H1});
    const std::vector<uint8_t> y_before = d.y;
    Status s = plan.run(t, ws.data(), ws.size());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.message();
    EXPECT_NE(s.message().find("weightAOptional is given"), std::string::npos) << s.message();
    // An index above W in the second run of a plan: refused, the row named, y untouched.
    Data bad = d;
    bad.idx[5] = 4;
    bad.vi = TensorView::of(bad.idx.data(), {p.B});
    bad.vy = TensorView::contiguous(bad.y.data(), p.dt, {p.B, p.H3});
    bad.vo = bad.vy;
    bad.vx = TensorView::contiguous(bad.x.data(), p.dt, {p.B, p.H1});
    bad.vb = TensorView::contiguous(bad.wb.data(), p.dt, {p.W, p.L, p.H2, p.R});
    ASSERT_TRUE(plan.run(tensors_of(d), ws.data(), ws.size()).ok());
    EXPECT_EQ(check(d, "in place without weightA"), 0);
    d.y = y_before;
    s = plan.run(tensors_of(bad), ws.data(), ws.size());
    EXPECT_EQ(s.code(), StatusCode::kShapeMismatch) << s.message();
    EXPECT_NE(s.message().find("indices[5] = 4"), std::string::npos) << s.message();
    EXPECT_TRUE(bad.y == y_before);
  }
}

// Many decode groups: with at least 4 per thread one chunk is a whole group (shrink then
// expand), with fewer (10 threads here) the shrink items, then the expand items. Bitwise
// identical over thread counts, so both ways give the same bits.
TEST(AddLoraPlan, DecodeGroupsBitwiseEqualOverThreadCounts) {
  Problem p;
  p.B = 40;
  p.H1 = 2000;
  p.H2 = 2100;
  p.H3 = 2100;
  p.R = 16;
  p.W = 32;
  p.seed = 350;
  for (int i = 0; i < 40; ++i) p.indices.push_back(i % 32);  // 32 groups of 1 or 2 rows
  for (DType dt : kDtypes) {
    p.dt = dt;
    std::vector<uint8_t> first;
    for (int threads : {1, 2, 3, 4, 10}) {
      Data d = make(p);
      AddLoraStats st;
      ASSERT_TRUE(run(d, options_for(p, KernelChoice::kOptimized, threads), &st).ok());
      EXPECT_EQ(st.decode_groups, 32);
      if (first.empty()) {
        EXPECT_EQ(check(d, "decode"), 0);
        first = d.out;
      }
      EXPECT_TRUE(d.out == first) << dtype_name(dt) << ": " << threads << " threads";
    }
  }
}

TEST(AddLoraPlan, VerboseNamesTheImplementation) {
  // FUSEKIT_VERBOSE is read once per process: this checks the line when the variable is set for
  // the test binary (ctest sets it for this test; see CMakeLists.txt), and passes trivially
  // otherwise.
  if (std::getenv("FUSEKIT_VERBOSE") == nullptr) GTEST_SKIP() << "FUSEKIT_VERBOSE not set";
  Problem p;
  p.B = 4;
  p.seed = 360;
  for (const KernelPath &k : kernels()) {
    Data d = make(p);
    ::testing::internal::CaptureStderr();
    ASSERT_TRUE(run(d, options_for(p, k)).ok());
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("fusekit_verbose,AddLora,"), std::string::npos) << err;
    const std::string isa = k.impl == "cpu_reference" ? std::string("scalar")
                                                      : std::string(AddLora::optimized_target());
    EXPECT_NE(err.find("impl=" + k.impl + ",isa=" + isa), std::string::npos) << err;
    EXPECT_NE(err.find("check="), std::string::npos) << err;
    EXPECT_NE(err.find("compute="), std::string::npos) << err;
  }
}

// ---- the aclnn face ----

aclTensor *acl_tensor(std::vector<int64_t> shape, aclDataType dt, void *data,
                      const int64_t *strides = nullptr) {
  return aclCreateTensor(shape.data(), shape.size(), dt, strides, 0, ACL_FORMAT_ND, shape.data(),
                         shape.size(), data);
}

TEST(AclnnAddLora, RunsAndRefuses) {
  Problem p;
  p.B = 5;
  p.H1 = 32;
  p.H2 = 16;
  p.H3 = 48;
  p.R = 16;
  p.W = 2;
  p.in_place = true;
  p.seed = 100;
  p.indices = {0, 1, 2, -1, 1};
  Data d = make(p);
  aclTensor *y = acl_tensor({5, 48}, ACL_FLOAT16, d.y.data());
  aclTensor *x = acl_tensor({5, 32}, ACL_FLOAT16, d.x.data());
  aclTensor *wb = acl_tensor({2, 1, 16, 16}, ACL_FLOAT16, d.wb.data());
  aclTensor *wa = acl_tensor({2, 1, 16, 32}, ACL_FLOAT16, d.wa.data());
  aclTensor *idx = acl_tensor({5}, ACL_INT32, d.idx.data());
  uint64_t ws = 0;
  aclOpExecutor *ex = nullptr;
  // Phase one refusals.
  EXPECT_EQ(aclnnAddLoraGetWorkspaceSize(y, x, wb, idx, wa, 0, 1.0, 40, -1, y, &ws, &ex), 561002);
  EXPECT_EQ(std::string(aclGetRecentErrMsg()).rfind("aclnnAddLora: yOffset = 40", 0), 0u)
      << aclGetRecentErrMsg();
  EXPECT_EQ(aclnnAddLoraGetWorkspaceSize(y, x, wb, idx, wa, 0, 1.0, 0, 15, y, &ws, &ex), 561002);
  EXPECT_EQ(aclnnAddLoraGetWorkspaceSize(y, x, wb, idx, wa, 1, 1.0, 0, 16, y, &ws, &ex), 561002);
  EXPECT_EQ(aclnnAddLoraGetWorkspaceSize(nullptr, x, wb, idx, wa, 0, 1.0, 0, 16, y, &ws, &ex),
            161001);
  EXPECT_EQ(aclnnAddLoraGetWorkspaceSize(y, x, wb, idx, wa, 0, 1.0, 0, 16, nullptr, &ws, &ex),
            161001);
  EXPECT_EQ(aclnnAddLoraGetWorkspaceSize(y, x, wb, idx, wa, 0, 1.0, 0, 16, y, nullptr, &ex),
            161001);
  // weightA absent with H1 != R.
  EXPECT_EQ(aclnnAddLoraGetWorkspaceSize(y, x, wb, idx, nullptr, 0, 1.0, 0, 16, y, &ws, &ex),
            561002);
  // Phase two: index 2 == W is "no adapter"; in place, slice at 32.
  ASSERT_EQ(aclnnAddLoraGetWorkspaceSize(y, x, wb, idx, wa, 0, 1.0, 32, 16, y, &ws, &ex), 0)
      << aclGetRecentErrMsg();
  std::vector<char> workspace(ws);
  EXPECT_EQ(aclnnAddLora(workspace.data(), ws, ex, nullptr), 0) << aclGetRecentErrMsg();
  p.y_offset = 32;
  d.p.y_offset = 32;
  EXPECT_EQ(check(d, "aclnn in place"), 0);
  // An index above W in phase two: 561002, the row named, nothing written.
  d.idx[3] = 7;
  const std::vector<uint8_t> before = d.y;
  ASSERT_EQ(aclnnAddLoraGetWorkspaceSize(y, x, wb, idx, wa, 0, 1.0, 0, -1, y, &ws, &ex), 0);
  EXPECT_EQ(aclnnAddLora(workspace.data(), ws, ex, nullptr), 561002);
  EXPECT_NE(std::string(aclGetRecentErrMsg())
                .find("aclnnAddLora: indices[3] = 7 but weightB has 2 adapters"),
            std::string::npos)
      << aclGetRecentErrMsg();
  EXPECT_TRUE(d.y == before);
  // CANN's indices are int32: the aclnn face refuses int64 (the C++ API takes it).
  std::vector<int64_t> idx64(d.idx.begin(), d.idx.end());
  aclTensor *i64 = acl_tensor({5}, ACL_INT64, idx64.data());
  EXPECT_EQ(aclnnAddLoraGetWorkspaceSize(y, x, wb, i64, wa, 0, 1.0, 0, -1, y, &ws, &ex), 161002);
  EXPECT_NE(std::string(aclGetRecentErrMsg()).find("indices has dtype int64; int32 is required"),
            std::string::npos)
      << aclGetRecentErrMsg();
  aclDestroyTensor(i64);
  // An executor that is never run is dropped with aclDestroyAclOpExecutor.
  ASSERT_EQ(aclnnAddLoraGetWorkspaceSize(y, x, wb, idx, wa, 0, 1.0, 0, -1, y, &ws, &ex), 0);
  EXPECT_EQ(aclDestroyAclOpExecutor(ex), 0);
  for (aclTensor *t : {y, x, wb, wa, idx}) aclDestroyTensor(t);
}

// A data pointer that is not a multiple of its element size is refused (the kernels would make
// misaligned loads), naming the tensor, and nothing is written.
TEST(AddLoraEdges, MisalignedPointersAreRefused) {
  const int64_t b = 4, h = 16, r = 8, w = 2;
  std::vector<float> y(b * h, 0.5f), wa(w * r * h, 0.01f), wb(w * h * r, 0.02f);
  std::vector<char> raw(b * h * 4 + 4, 0);
  std::vector<int32_t> idx = {0, 1, 0, -1};
  const std::vector<float> before = y;
  for (DType dt : {DType::kFloat32, DType::kFloat16}) {
    const size_t es = dtype_size(dt);
    void *x = raw.data() + (es == 4 ? 2 : 1);  // not a multiple of the element size
    const Status st = add_lora(
        TensorView::contiguous(y.data(), dt, {b, h}), TensorView::contiguous(x, dt, {b, h}),
        TensorView::contiguous(wb.data(), dt, {w, 1, h, r}), TensorView::of(idx.data(), {b}),
        TensorView::contiguous(wa.data(), dt, {w, 1, r, h}),
        TensorView::contiguous(y.data(), dt, {b, h}));
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << dtype_name(dt);
    EXPECT_NE(st.message().find("x's data pointer"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("not aligned"), std::string::npos) << st.message();
    EXPECT_TRUE(y == before);
  }
}

// Dimensions of size 1 may have any stride (nothing steps by it), even 2^61 or 2^62 - 1 elements:
// weightB of one adapter, one layer and one output column (W = L = H2 = 1), weightA of one adapter
// and layer, y and out of one column, with such strides on every size-1 dimension. The decode
// expand stepped a pointer into weightB by its H2 stride for every lane of a vector, past the one
// column that exists (an address outside weightB, wrapping around the address space at these
// strides: undefined behaviour, which UBSan reports in the sanitizer builds). Every
// implementation, SIMD target and dtype, in place and not, against the float64 oracle.
TEST(AddLoraEdges, HugeStridesOfSizeOneDimensionsFormNoAddressOutsideTheTensors) {
  for (const int64_t huge : {int64_t{1} << 61, (int64_t{1} << 62) - 1}) {
    SCOPED_TRACE(huge);
    fusekit::testing::for_each_simd_target([&](const char *target) {
      for (DType dt : kDtypes) {
        for (const KernelPath &k : kernels()) {
          for (bool in_place : {false, true}) {
            Problem p;
            p.dt = dt;
            p.B = 5;
            p.H1 = 8;
            p.H2 = p.H3 = 1;
            p.R = 4;
            p.W = p.L = 1;
            p.in_place = in_place;
            p.indices = {0, -1, 0, 0, 1};  // 1 = W: no adapter
            p.seed = 1300;
            Data d = make(p);
            const TensorView vb =
                TensorView::strided(d.wb.data(), dt, {1, 1, 1, p.R}, {huge, huge, huge, 1});
            const TensorView va =
                TensorView::strided(d.wa.data(), dt, {1, 1, p.R, p.H1}, {huge, huge, p.H1, 1});
            const TensorView vy = TensorView::strided(d.y.data(), dt, {p.B, 1}, {d.ys, huge});
            const TensorView vo =
                in_place ? vy : TensorView::strided(d.out.data(), dt, {p.B, 1}, {d.os, huge});
            const std::string label = std::string(target) + " " + dtype_name(dt) + " " + k.name +
                                      (in_place ? " in place" : "");
            SCOPED_TRACE(label);
            const Status st = add_lora(vy, d.vx, vb, d.vi, va, vo, options_for(p, k));
            ASSERT_TRUE(st.ok()) << st.message();
            EXPECT_EQ(check(d, label.c_str()), 0);
          }
        }
      }
    });
  }
}

}  // namespace
}  // namespace fusekit
