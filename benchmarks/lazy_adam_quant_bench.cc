// LazyAdamQuant benchmark: one 8-bit step against one float32 LazyAdam step on the same rows, in
// the same run, and against the indexed read-modify-write floor of the bytes the 8-bit step moves.
//
// BM_LazyAdamQuant/<dtype>/D: the seed's batch (R = 2,000,000 rows, N = 564,096 unique indices, a
// permutation of the rows cut, as Rec SDK's gen_data.py) at D = 32 and D = 128, with a float32 or
// a bfloat16 table (the gradient in the table's dtype). Each iteration times, back to back:
//   - floor: the rows the 8-bit step touches, read and written with no arithmetic (gradient row
//     read; var, m codes, v codes and both absmax rows read and written), in batch order, with the
//     kernel's prefetch distance and threads;
//   - lazy_adam: one float32 LazyAdam step (fusekit/lazy_adam.h: float32 m, v, var) on the same
//     indices and a float32 gradient;
//   - the 8-bit step;
// so that load from elsewhere on this shared machine hits all three alike; the counters are
// medians. Counters: ms (the 8-bit step), lazy_adam_ms, vs_lazy_adam (8-bit time / float32 time:
// at most 1 is the target), GB/s (bytes the 8-bit step moves / its time), floor_GB/s, of_floor,
// state_B/row and state_B/elem for both (8-bit: 2 D + 8 ceil(D / 256); float32: 8 D).
// BM_LazyAdamQuant/<dtype>/<layout>/fp8/D: the same with the FP8 state format (docs/fp8_state.md)
// as the 8-bit step, and the dynamic-map step on its own state timed too, in the same iterations
// (dynamic_map_ms; vs_dynamic_map: FP8 time / dynamic-map time).
// BM_LazyAdamQuantInCacheGuard/<impl>/D: the lost-v guard's cost in the dynamic-map format, in
// cache (the arithmetic alone), guard off and on timed in turn: off_ns/row, on_ns/row, on_over_off.
// Tables come from aclrtMalloc(HUGE_FIRST), as in the seed's programs.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "common/ceilings.h"
#include "common/fill.h"
#include "common/parallel.h"
#include "common/plan_overhead.h"
#include "fusekit/float16.h"
#include "fusekit/lazy_adam_quant.h"
#include "fusekit/memory.h"
#include "fusekit/threading.h"
#if FUSEKIT_BENCH_WITH_LAZY_ADAM
#include "fusekit/lazy_adam.h"
#endif

namespace {

using fusekit::DType;
using fusekit::QuantStateFormat;
using fusekit::TensorView;
using fusekit::bench::DeviceBuffer;

constexpr int64_t kRows = 2'000'000, kN = 564'096;

// Uniform in [lo, hi) from a per-thread xorshift stream.
void fill_uniform(float *p, int64_t n, uint64_t seed, float lo, float hi) {
  fusekit::bench::xorshift_fill(n, seed, [&](int64_t i, uint64_t x) {
    p[i] = lo + (hi - lo) * fusekit::bench::unit_float(x);
  });
}
void fill_bf16(uint16_t *p, int64_t n, uint64_t seed) {
  fusekit::bench::xorshift_fill(n, seed, [&](int64_t i, uint64_t x) {
    p[i] = fusekit::float_to_bf16_bits(1.0f + fusekit::bench::unit_float(x));
  });
}
void fill_bytes(uint8_t *p, int64_t n, uint64_t seed) {
  fusekit::bench::xorshift_fill(
      n, seed, [&](int64_t i, uint64_t x) { p[i] = static_cast<uint8_t>(x >> 56); });
}

// A permutation of the rows, cut (gen_data.py): unique indices.
std::vector<int32_t> unique_indices(int64_t rows, int64_t n) {
  std::vector<int32_t> perm(static_cast<size_t>(rows));
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(5);
  for (int64_t i = 0; i < n; ++i) {
    std::uniform_int_distribution<int64_t> d(i, rows - 1);
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(d(rng))]);
  }
  perm.resize(static_cast<size_t>(n));
  return perm;
}

// The 8-bit state and its step's inputs. In the FP8 format (docs/fp8_state.md) m's codes are
// random E4M3 codes other than the two NaN codes, v's random UE4M4 codes, the scales those of
// blocks whose largest |m| (sqrt(v)) is 1e-3 to 0.05; the maps are not used (empty views).
struct QuantData {
  int64_t rows, n, dim, blocks;
  DType dtype;
  QuantStateFormat format = QuantStateFormat::kDynamicMap;
  size_t es;    // bytes per var / gradient element
  bool packed;  // m and v codes interleaved per row ([R, 2 D]), absmax m and v too ([R, 2 B])
  DeviceBuffer var, grad, m, v, am, av, idx;
  std::array<float, 256> qm = fusekit::create_dynamic_map(true),
                         qv = fusekit::create_dynamic_map(false);
  // Where the state lives: separate tables (m, v, am, av), or packed (m's codes and v's in the
  // rows of one [R, 2 D] table, the two absmax in one [R, 2 B] table).
  uint8_t *mp, *vp;
  float *amp, *avp;
  int64_t code_stride, absmax_stride;
  QuantData(int64_t r, int64_t nn, int64_t d, DType t, const std::vector<int32_t> &indices,
            bool pack = false, QuantStateFormat f = QuantStateFormat::kDynamicMap)
      : rows(r),
        n(nn),
        dim(d),
        blocks((d + 255) / 256),
        dtype(t),
        format(f),
        es(t == DType::kFloat32 ? 4 : 2),
        packed(pack),
        var(static_cast<size_t>(r * d) * es),
        grad(static_cast<size_t>(nn * d) * es),
        m(static_cast<size_t>(r * d) * (pack ? 2 : 1)),
        v(pack ? 64 : static_cast<size_t>(r * d)),
        am(static_cast<size_t>(r * blocks) * 4 * (pack ? 2 : 1)),
        av(pack ? 64 : static_cast<size_t>(r * blocks) * 4),
        idx(static_cast<size_t>(nn) * 4) {
    mp = m.as<uint8_t>();
    vp = pack ? mp + d : v.as<uint8_t>();
    amp = am.as<float>();
    avp = pack ? amp + blocks : av.as<float>();
    code_stride = pack ? 2 * d : d;
    absmax_stride = pack ? 2 * blocks : blocks;
    if (t == DType::kFloat32) {
      fill_uniform(var.as<float>(), r * d, 3, 1.0f, 2.0f);
      fill_uniform(grad.as<float>(), nn * d, 4, 1.0f, 2.0f);
    } else {
      fill_bf16(var.as<uint16_t>(), r * d, 3);
      fill_bf16(grad.as<uint16_t>(), nn * d, 4);
    }
    if (pack) {
      fill_bytes(m.as<uint8_t>(), 2 * r * d, 1);
      fill_uniform(am.as<float>(), 2 * r * blocks, 5, 1e-6f, 0.05f);
    } else {
      fill_bytes(m.as<uint8_t>(), r * d, 1);
      fill_bytes(v.as<uint8_t>(), r * d, 2);
      fill_uniform(am.as<float>(), r * blocks, 5, 0.001f, 0.05f);
      fill_uniform(av.as<float>(), r * blocks, 6, 1e-6f, 1e-3f);
    }
    std::memcpy(idx.ptr, indices.data(), static_cast<size_t>(nn) * 4);
    if (f == QuantStateFormat::kFp8) {
      // m's codes without the NaN codes 0x7f, 0xff (packed: v's codes too, where it does not
      // matter: every UE4M4 code is finite); the scales of blocks whose max is 1e-3 to 0.05.
      const int64_t code_bytes = pack ? 2 * r * d : r * d;
      uint8_t *mc = m.as<uint8_t>();
#pragma omp parallel for
      for (int64_t i = 0; i < code_bytes; ++i) mc[i] ^= (mc[i] & 0x7f) == 0x7f ? 1 : 0;
      fill_uniform(am.as<float>(), r * blocks * (pack ? 2 : 1), 5, 0.001f / 448.0f, 0.05f / 448.0f);
      if (!pack) fill_uniform(av.as<float>(), r * blocks, 6, 0.001f / 496.0f, 0.05f / 496.0f);
    }
  }
  fusekit::LazyAdamQuantTensors tensors() {
    const int64_t map_size = format == QuantStateFormat::kFp8 ? 0 : 256;
    return {TensorView::contiguous(grad.ptr, dtype, {n, dim}),
            TensorView::of(idx.as<int32_t>(), {n}),
            TensorView::strided(mp, DType::kUInt8, {rows, dim}, {code_stride, 1}),
            TensorView::strided(vp, DType::kUInt8, {rows, dim}, {code_stride, 1}),
            TensorView::contiguous(var.ptr, dtype, {rows, dim}),
            TensorView::of(qm.data(), {map_size}),
            TensorView::of(qv.data(), {map_size}),
            TensorView::strided(amp, DType::kFloat32, {rows, blocks}, {absmax_stride, 1}),
            TensorView::strided(avp, DType::kFloat32, {rows, blocks}, {absmax_stride, 1})};
  }
  // Bytes one step moves: the index, the gradient row read; var, both code rows and both absmax
  // rows read and written.
  double bytes() const {
    const auto d = static_cast<double>(dim), e = static_cast<double>(es);
    return static_cast<double>(n) *
           (4.0 + d * e + 2.0 * d * e + 4.0 * d + 16.0 * static_cast<double>(blocks));
  }
  double state_bytes_per_row() const {
    return 2.0 * static_cast<double>(dim) + 8.0 * static_cast<double>(blocks);
  }
};

// The floor: the 8-bit step's bytes moved with nothing else: per entry the gradient row read and
// the var row, both code rows and both absmax rows read and written back, 16 bytes at a time, in
// batch order, with the kernel's prefetch distance and threads. The values written are the values
// read (the state stays valid for the steps after it), each combined with a zero drawn from the
// row's gradient that the compiler cannot see through, so that nothing is left out and the stores
// wait on the loads as in a step.
//
// Chunks of 16 bytes: an SSE2 vector where there is one, else two words.
#if defined(__SSE2__)
using Chunk = __m128i;
Chunk load_chunk(const char *p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i *>(p));
}
void store_chunk(char *p, Chunk x) {
  _mm_storeu_si128(reinterpret_cast<__m128i *>(p), x);
}
Chunk mix(Chunk a, Chunk b) {
  return _mm_xor_si128(a, b);
}
Chunk both(Chunk a, Chunk b) {
  return _mm_and_si128(a, b);
}
uint32_t low_word(Chunk x) {
  return static_cast<uint32_t>(_mm_cvtsi128_si32(x));
}
Chunk with_low_word(uint32_t w) {
  return _mm_cvtsi32_si128(static_cast<int>(w));
}
Chunk opaque_zero() {
  Chunk z = _mm_setzero_si128();
  asm volatile("" : "+x"(z));
  return z;
}
#else
struct Chunk {
  uint64_t w[2];
};
Chunk load_chunk(const char *p) {
  Chunk x;
  std::memcpy(&x, p, 16);
  return x;
}
void store_chunk(char *p, Chunk x) {
  std::memcpy(p, &x, 16);
}
Chunk mix(Chunk a, Chunk b) {
  return {{a.w[0] ^ b.w[0], a.w[1] ^ b.w[1]}};
}
Chunk both(Chunk a, Chunk b) {
  return {{a.w[0] & b.w[0], a.w[1] & b.w[1]}};
}
uint32_t low_word(Chunk x) {
  return static_cast<uint32_t>(x.w[0]);
}
Chunk with_low_word(uint32_t w) {
  return {{w, 0}};
}
Chunk opaque_zero() {
  Chunk z{{0, 0}};
  asm volatile("" : "+r"(z.w[0]), "+r"(z.w[1]));
  return z;
}
#endif

// The XOR of bytes [p, p + n) as chunks (a tail of under 16 bytes folded into the low word).
Chunk fold_bytes(const char *p, int64_t n) {
  Chunk acc = opaque_zero();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) acc = mix(acc, load_chunk(p + j));
  uint32_t w = 0;  // the tail as words, then bytes, into the low word
  for (; j + 4 <= n; j += 4) {
    uint32_t x;
    std::memcpy(&x, p + j, 4);
    w ^= x;
  }
  for (; j < n; ++j) w ^= static_cast<uint8_t>(p[j]);
  return mix(acc, with_low_word(w));
}
// Zero, from x (the stores that use it wait for x's loads), in a way the compiler cannot fold.
Chunk only_zero(Chunk x) {
  return both(x, opaque_zero());
}

// Bytes [p, p + n) read and written back, each chunk XORed with `zero`.
void rewrite_bytes(char *p, int64_t n, Chunk zero) {
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) store_chunk(p + j, mix(load_chunk(p + j), zero));
  // The tail (absmax rows, rows of codes not a multiple of 16) as words, then bytes.
  const uint32_t zw = low_word(zero);
  for (; j + 4 <= n; j += 4) {
    uint32_t w;
    std::memcpy(&w, p + j, 4);
    w ^= zw;
    std::memcpy(p + j, &w, 4);
  }
  for (; j < n; ++j) p[j] = static_cast<char>(p[j] ^ static_cast<char>(zw));
}

void rmw_floor(QuantData &q) {
  const int64_t n = q.n, D = q.dim, B = q.blocks;
  const int64_t row_bytes = D * static_cast<int64_t>(q.es), code_bytes = D, absmax_bytes = 4 * B;
  const int32_t *order = q.idx.as<const int32_t>();
  const char *g = static_cast<const char *>(q.grad.ptr);
  char *var = static_cast<char *>(q.var.ptr);
  char *m = reinterpret_cast<char *>(q.mp), *v = reinterpret_cast<char *>(q.vp);
  char *am = reinterpret_cast<char *>(q.amp), *av = reinterpret_cast<char *>(q.avp);
  const int64_t cs = q.code_stride, as = 4 * q.absmax_stride;
  const int64_t ahead = std::clamp<int64_t>(2048 / row_bytes, 2, 16);
  auto prefetch = [](const char *p, int64_t bytes) {  // each cache line of the range once
    const auto first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
    const auto last =
        (reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes) - 1) & ~uintptr_t{63};
    for (uintptr_t line = first; line <= last; line += 64)
      __builtin_prefetch(reinterpret_cast<const char *>(line));
  };
  fusekit::parallel_for(n, fusekit::num_threads(), 4096, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      if (i + ahead < n) {
        const int64_t r = order[i + ahead];
        prefetch(g + (i + ahead) * row_bytes, row_bytes);
        prefetch(var + r * row_bytes, row_bytes);
        prefetch(m + r * cs, code_bytes);
        prefetch(v + r * cs, code_bytes);
        prefetch(am + r * as, absmax_bytes);
        prefetch(av + r * as, absmax_bytes);
      }
      const int64_t r = order[i];
      const Chunk z = only_zero(fold_bytes(g + i * row_bytes, row_bytes));
      rewrite_bytes(var + r * row_bytes, row_bytes, z);
      rewrite_bytes(m + r * cs, code_bytes, z);
      rewrite_bytes(v + r * cs, code_bytes, z);
      rewrite_bytes(am + r * as, absmax_bytes, z);
      rewrite_bytes(av + r * as, absmax_bytes, z);
    }
  });
}

double seconds_of(const std::function<void()> &fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

#if FUSEKIT_BENCH_WITH_LAZY_ADAM
// float32 LazyAdam on the same indices: m, v, var float32 [R, D], a float32 gradient.
struct Float32Data {
  DeviceBuffer m, v, var, grad;
  fusekit::LazyAdam plan;
  fusekit::Status status;
  Float32Data(int64_t rows, int64_t n, int64_t d, const DeviceBuffer &idx)
      : m(static_cast<size_t>(rows * d) * 4),
        v(static_cast<size_t>(rows * d) * 4),
        var(static_cast<size_t>(rows * d) * 4),
        grad(static_cast<size_t>(n * d) * 4) {
    fill_uniform(m.as<float>(), rows * d, 11, 1.0f, 2.0f);
    fill_uniform(v.as<float>(), rows * d, 12, 1.0f, 2.0f);
    fill_uniform(var.as<float>(), rows * d, 13, 1.0f, 2.0f);
    fill_uniform(grad.as<float>(), n * d, 14, 1.0f, 2.0f);
    status = fusekit::LazyAdam::plan(
        TensorView::of(grad.as<float>(), {n, d}), TensorView::of(idx.as<int32_t>(), {n}),
        TensorView::of(m.as<float>(), {rows, d}), TensorView::of(v.as<float>(), {rows, d}),
        TensorView::of(var.as<float>(), {rows, d}), {}, &plan);
  }
};
#endif

fusekit::LazyAdamQuantOptions format_options(QuantStateFormat f, bool guard_lost_v = false,
                                             const char *implementation = nullptr) {
  fusekit::LazyAdamQuantOptions o;
  o.state_format = f;
  o.guard_lost_v = guard_lost_v;
  o.implementation = implementation;
  return o;
}

// The dynamic-map step beside an FP8 one (BM_LazyAdamQuant/.../fp8): its own state, the same
// indices, layout and dtype.
struct DynamicMapPeer {
  QuantData q;
  fusekit::LazyAdamQuant plan;
  fusekit::Status status;
  std::unique_ptr<DeviceBuffer> ws;
  DynamicMapPeer(int64_t dim, DType dtype, bool packed, const std::vector<int32_t> &indices)
      : q(kRows, kN, dim, dtype, indices, packed) {
    status = fusekit::LazyAdamQuant::plan(q.tensors(), {}, &plan);
    ws = std::make_unique<DeviceBuffer>(std::max<size_t>(plan.workspace_size(), 64));
  }
};

void BM_LazyAdamQuant(benchmark::State &state, DType dtype, bool packed,
                      QuantStateFormat format = QuantStateFormat::kDynamicMap) {
  const int64_t dim = state.range(0);
  const std::vector<int32_t> indices = unique_indices(kRows, kN);
  QuantData q(kRows, kN, dim, dtype, indices, packed, format);
  fusekit::LazyAdamQuant plan;
  const fusekit::Status st =
      fusekit::LazyAdamQuant::plan(q.tensors(), format_options(format), &plan);
  if (!st.ok()) {
    state.SkipWithError(st.message().c_str());
    return;
  }
  DeviceBuffer ws(std::max<size_t>(plan.workspace_size(), 64));
  const bool fp8 = format == QuantStateFormat::kFp8;
  std::unique_ptr<DynamicMapPeer> dyn;
  if (fp8) {
    dyn = std::make_unique<DynamicMapPeer>(dim, dtype, packed, indices);
    if (!dyn->status.ok()) {
      state.SkipWithError(dyn->status.message().c_str());
      return;
    }
  }
#if FUSEKIT_BENCH_WITH_LAZY_ADAM
  Float32Data f(kRows, kN, dim, q.idx);
  if (!f.status.ok()) {
    state.SkipWithError(f.status.message().c_str());
    return;
  }
  DeviceBuffer ws32(std::max<size_t>(f.plan.workspace_size(), 64));
#endif
  std::vector<double> t_op, t_floor, t_f32, t_dyn;
  for (auto _ : state) {
    t_floor.push_back(seconds_of([&] { rmw_floor(q); }));
#if FUSEKIT_BENCH_WITH_LAZY_ADAM
    t_f32.push_back(seconds_of([&] {
      benchmark::DoNotOptimize(f.plan.run(1e-3f, ws32.ptr, f.plan.workspace_size()).ok());
    }));
#endif
    if (dyn) {
      t_dyn.push_back(seconds_of([&] {
        benchmark::DoNotOptimize(
            dyn->plan.run(1e-3f, dyn->ws->ptr, dyn->plan.workspace_size()).ok());
      }));
    }
    const double t = seconds_of(
        [&] { benchmark::DoNotOptimize(plan.run(1e-3f, ws.ptr, plan.workspace_size()).ok()); });
    t_op.push_back(t);
    state.SetIterationTime(t);
  }
  using fusekit::bench::median_of;
  const double op = median_of(t_op), fl = median_of(t_floor);
  fusekit::bench::report_bandwidth_seconds(state, q.bytes(), op);
  state.counters["ms"] = op * 1e3;
  state.counters["floor_GB/s"] = q.bytes() / fl * 1e-9;
  state.counters["of_floor"] = fl / op;  // 1.0: as fast as the floor
  // How much of the 8-bit tables huge pages back (random rows over small pages miss the TLB).
  double huge = 0, total = 0;
  for (const DeviceBuffer *b : {&q.var, &q.m, &q.v, &q.am, &q.av}) {
    huge +=
        static_cast<double>(std::max<int64_t>(0, fusekit::huge_page_backed_bytes(b->ptr, b->size)));
    total += static_cast<double>(b->size);
  }
  state.counters["huge_pages"] = huge / total;
  state.counters["state_B/row"] = q.state_bytes_per_row();
  state.counters["state_B/elem"] = q.state_bytes_per_row() / static_cast<double>(dim);
#if FUSEKIT_BENCH_WITH_LAZY_ADAM
  const double f32 = median_of(t_f32);
  state.counters["lazy_adam_ms"] = f32 * 1e3;
  state.counters["vs_lazy_adam"] = op / f32;  // <= 1: the 8-bit step is no slower
  state.counters["lazy_adam_state_B/row"] = 8.0 * static_cast<double>(dim);
#endif
  if (dyn) {
    const double dm = median_of(t_dyn);
    state.counters["dynamic_map_ms"] = dm * 1e3;
    state.counters["vs_dynamic_map"] = op / dm;  // FP8 time / dynamic-map time
  }
  state.SetLabel(std::string(fusekit::dtype_name(dtype)) + " R=" + std::to_string(kRows) +
                 " N=" + std::to_string(kN) + " D=" + std::to_string(dim) + " " +
                 fusekit::quant_state_format_name(format) + " " + plan.implementation() +
                 (dyn ? std::string(" (dynamic map: ") + dyn->plan.implementation() + ")" : ""));
}

// The arithmetic alone: a 4,096-row table that fits in L2 (every row once per step, in a random
// order), one thread; the counter is ns per row (the 8-bit step, and float32 LazyAdam on the same
// rows): what a row costs when memory is not in the way.
constexpr int64_t kSmallRows = 4096;

void BM_LazyAdamQuantInCache(benchmark::State &state, bool packed,
                             QuantStateFormat format = QuantStateFormat::kDynamicMap) {
  const int64_t dim = state.range(0);
  QuantData q(kSmallRows, kSmallRows, dim, DType::kFloat32, unique_indices(kSmallRows, kSmallRows),
              packed, format);
  const int threads = fusekit::num_threads();
  fusekit::set_num_threads(1);
  fusekit::LazyAdamQuant plan;
  const fusekit::Status st =
      fusekit::LazyAdamQuant::plan(q.tensors(), format_options(format), &plan);
  if (!st.ok()) {
    state.SkipWithError(st.message().c_str());
    fusekit::set_num_threads(threads);
    return;
  }
  DeviceBuffer ws(std::max<size_t>(plan.workspace_size(), 64));
#if FUSEKIT_BENCH_WITH_LAZY_ADAM
  Float32Data f(kSmallRows, kSmallRows, dim, q.idx);
  DeviceBuffer ws32(std::max<size_t>(f.plan.workspace_size(), 64));
#endif
  std::vector<double> t_op, t_f32;
  for (auto _ : state) {
    // Small lr: the state stays in range over many steps.
    const double t = seconds_of(
        [&] { benchmark::DoNotOptimize(plan.run(1e-6f, ws.ptr, plan.workspace_size()).ok()); });
    t_op.push_back(t);
#if FUSEKIT_BENCH_WITH_LAZY_ADAM
    t_f32.push_back(seconds_of([&] {
      benchmark::DoNotOptimize(f.plan.run(1e-6f, ws32.ptr, f.plan.workspace_size()).ok());
    }));
#endif
    state.SetIterationTime(t);
  }
  fusekit::set_num_threads(threads);
  const double per_row = 1e9 / static_cast<double>(kSmallRows);
  state.counters["ns/row"] = fusekit::bench::median_of(t_op) * per_row;
#if FUSEKIT_BENCH_WITH_LAZY_ADAM
  state.counters["lazy_adam_ns/row"] = fusekit::bench::median_of(t_f32) * per_row;
#endif
  state.SetLabel(std::string(packed ? "packed " : "separate ") +
                 fusekit::quant_state_format_name(format) + " " + plan.implementation());
}

// The lost-v guard's cost in the dynamic-map format, in cache (one thread, the 4,096-row table of
// BM_LazyAdamQuantInCache, packed): the step with the guard off and on, each on its own state,
// timed in turn.
void BM_LazyAdamQuantInCacheGuard(benchmark::State &state, const std::string &impl) {
  const int64_t dim = state.range(0);
  const std::vector<int32_t> indices = unique_indices(kSmallRows, kSmallRows);
  QuantData q_off(kSmallRows, kSmallRows, dim, DType::kFloat32, indices, true);
  QuantData q_on(kSmallRows, kSmallRows, dim, DType::kFloat32, indices, true);
  const int threads = fusekit::num_threads();
  fusekit::set_num_threads(1);
  fusekit::LazyAdamQuant off, on;
  fusekit::Status st = fusekit::LazyAdamQuant::plan(
      q_off.tensors(), format_options(QuantStateFormat::kDynamicMap, false, impl.c_str()), &off);
  if (st.ok()) {
    st = fusekit::LazyAdamQuant::plan(
        q_on.tensors(), format_options(QuantStateFormat::kDynamicMap, true, impl.c_str()), &on);
  }
  if (!st.ok()) {
    state.SkipWithError(st.message().c_str());
    fusekit::set_num_threads(threads);
    return;
  }
  DeviceBuffer ws(std::max<size_t>(std::max(off.workspace_size(), on.workspace_size()), 64));
  std::vector<double> t_off, t_on;
  for (auto _ : state) {
    t_off.push_back(seconds_of(
        [&] { benchmark::DoNotOptimize(off.run(1e-6f, ws.ptr, off.workspace_size()).ok()); }));
    const double t = seconds_of(
        [&] { benchmark::DoNotOptimize(on.run(1e-6f, ws.ptr, on.workspace_size()).ok()); });
    t_on.push_back(t);
    state.SetIterationTime(t);
  }
  fusekit::set_num_threads(threads);
  const double per_row = 1e9 / static_cast<double>(kSmallRows);
  using fusekit::bench::median_of;
  state.counters["off_ns/row"] = median_of(t_off) * per_row;
  state.counters["on_ns/row"] = median_of(t_on) * per_row;
  state.counters["on_over_off"] = median_of(t_on) / median_of(t_off);
  state.SetLabel(on.implementation());
}

// The seed shape (float32 table) on each implementation of the list.
void BM_LazyAdamQuantImplementation(benchmark::State &state, const std::string &impl) {
  QuantData q(kRows, kN, 32, DType::kFloat32, unique_indices(kRows, kN));
  fusekit::LazyAdamQuantOptions o;
  o.implementation = impl.c_str();
  fusekit::LazyAdamQuant plan;
  const fusekit::Status st = fusekit::LazyAdamQuant::plan(q.tensors(), o, &plan);
  if (!st.ok()) {
    state.SkipWithError(st.message().c_str());
    return;
  }
  DeviceBuffer ws(std::max<size_t>(plan.workspace_size(), 64));
  std::vector<double> t_op;
  for (auto _ : state) {
    const double t = seconds_of(
        [&] { benchmark::DoNotOptimize(plan.run(1e-3f, ws.ptr, plan.workspace_size()).ok()); });
    t_op.push_back(t);
    state.SetIterationTime(t);
  }
  const double op = fusekit::bench::median_of(t_op);
  fusekit::bench::report_bandwidth_seconds(state, q.bytes(), op);
  state.counters["ms"] = op * 1e3;
  state.SetLabel(impl);
}

const bool registered = [] {
  for (QuantStateFormat f : {QuantStateFormat::kDynamicMap, QuantStateFormat::kFp8}) {
    const std::string suffix = f == QuantStateFormat::kFp8 ? "/fp8" : "";
    for (bool packed : {false, true}) {
      for (DType t : {DType::kFloat32, DType::kBFloat16}) {
        benchmark::RegisterBenchmark((std::string("BM_LazyAdamQuant/") + fusekit::dtype_name(t) +
                                      (packed ? "/packed" : "/separate") + suffix)
                                         .c_str(),
                                     BM_LazyAdamQuant, t, packed, f)
            ->ArgName("D")
            ->Arg(32)
            ->Arg(128)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond)
            ->Iterations(9);
      }
    }
    for (bool packed : {false, true}) {
      benchmark::RegisterBenchmark(
          (std::string("BM_LazyAdamQuantInCache/") + (packed ? "packed" : "separate") + suffix)
              .c_str(),
          BM_LazyAdamQuantInCache, packed, f)
          ->ArgName("D")
          ->Arg(32)
          ->Arg(128)
          ->UseManualTime()
          ->Unit(benchmark::kMicrosecond)
          ->Iterations(300);
    }
  }
  for (const std::string &impl : fusekit::LazyAdamQuant::implementations()) {
    if (impl != "cpu_avx512vbmi" && impl != "cpu_hwy") continue;  // the two kernels
    benchmark::RegisterBenchmark(("BM_LazyAdamQuantInCacheGuard/" + impl).c_str(),
                                 BM_LazyAdamQuantInCacheGuard, impl)
        ->ArgName("D")
        ->Arg(32)
        ->Arg(128)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond)
        ->Iterations(300);
  }
  for (const std::string &impl : fusekit::LazyAdamQuant::implementations()) {
    benchmark::RegisterBenchmark(("BM_LazyAdamQuantImplementation/" + impl).c_str(),
                                 BM_LazyAdamQuantImplementation, impl)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(3);
  }
  return true;
}();

// Per-step overhead on a tiny problem (1 index into a 1-row table, D = 8): a plan made once and
// run with bindings each step, against a fresh problem + plan + run each step.
struct Tiny {
  std::vector<float> g = std::vector<float>(8, 0.5f), var = std::vector<float>(8, 1.0f),
                     am = std::vector<float>(1, 0.01f), av = std::vector<float>(1, 0.001f);
  std::vector<uint8_t> m = std::vector<uint8_t>(8, 130), v = std::vector<uint8_t>(8, 100);
  std::array<float, 256> qm = fusekit::create_dynamic_map(true),
                         qv = fusekit::create_dynamic_map(false);
  int32_t idx = 0;
  fusekit::LazyAdamQuantTensors tensors() {
    return {TensorView::of(g.data(), {1, 8}),   TensorView::of(&idx, {1}),
            TensorView::of(m.data(), {1, 8}),   TensorView::of(v.data(), {1, 8}),
            TensorView::of(var.data(), {1, 8}), TensorView::of(qm.data(), {256}),
            TensorView::of(qv.data(), {256}),   TensorView::of(am.data(), {1, 1}),
            TensorView::of(av.data(), {1, 1})};
  }
};

fusekit::Status lazy_adam_quant_run(const fusekit::LazyAdamQuant &plan,
                                    const fusekit::LazyAdamQuantTensors &t, void *ws, size_t size,
                                    int64_t /*iteration*/) {
  fusekit::LazyAdamQuantScalars scalars;
  scalars.lr = 1e-3f;
  return plan.run(t, scalars, ws, size);
}
void BM_LazyAdamQuantPlanReuse(benchmark::State &state) {
  Tiny t;
  fusekit::bench::plan_reuse<fusekit::LazyAdamQuant, fusekit::LazyAdamQuantProblem>(
      state, t.tensors(), fusekit::LazyAdamQuantOptions{}, lazy_adam_quant_run);
}
void BM_LazyAdamQuantFreshPlan(benchmark::State &state) {
  Tiny t;
  fusekit::bench::fresh_plan<fusekit::LazyAdamQuant, fusekit::LazyAdamQuantProblem>(
      state, t.tensors(), fusekit::LazyAdamQuantOptions{}, lazy_adam_quant_run);
}

void BM_CopyBandwidth(benchmark::State &state) {
  for (auto _ : state) benchmark::DoNotOptimize(fusekit::bench::copy_bandwidth());
  state.counters["copy_GB/s"] = fusekit::bench::copy_bandwidth() * 1e-9;
}

}  // namespace

BENCHMARK(BM_CopyBandwidth)->Iterations(1);
BENCHMARK(BM_LazyAdamQuantPlanReuse)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LazyAdamQuantFreshPlan)->Unit(benchmark::kMicrosecond);
