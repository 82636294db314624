// libFuzzer target: EmbeddingBagLazyAdam and its 8-bit twin EmbeddingBagLazyAdamQuant through
// their C++ API (no aclnn face: CANN has no such operator). The input decodes to a small table, its
// state (float32 m and v, or 8-bit codes and block scales in the dynamic-map format, with or
// without the lost-v guard, or the FP8 format) and a batch whose every part can deviate: ids
// negative, >= R or huge; offsets not starting at 0, decreasing, past L, not ending at L, of the
// wrong length; weights and gradients NaN, Inf, huge or subnormal; int32 or int64 ids and offsets;
// sum or mean; weighted or not; strided tables; 1 to 3 threads. Invariants (a violation traps, see
// fuzz_common.h):
//   - the plan's implementation (cpu_hwy or cpu_avx512vbmi, any thread count) and the reference
//     (one thread) give the same status code and the same bytes of every state tensor;
//   - a refused run changes no byte of the state (nor the gap columns of a strided table);
//   - a run that passes changes no row that no lookup names, and no gap column;
//   - every refusal has a message that starts with the operator's name;
//   - no run writes outside its buffers (ASan).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "fusekit/embedding_bag_lazy_adam.h"
#include "fusekit/embedding_bag_lazy_adam_quant.h"
#include "fuzz_common.h"

namespace {

using fusekit::DType;
using fusekit::TensorView;

// Bytes front to back; past the end they read as 0 (the nominal choice).
struct Bytes {
  const uint8_t *data;
  size_t size, pos = 0;
  uint8_t u8() { return pos < size ? data[pos++] : 0; }
  uint16_t u16() { return static_cast<uint16_t>(u8() | (u8() << 8)); }
};

float special_float(Bytes &in) {
  const uint8_t code = in.u8();
  static const float kSpecial[] = {std::numeric_limits<float>::quiet_NaN(),
                                   std::numeric_limits<float>::infinity(),
                                   -std::numeric_limits<float>::infinity(),
                                   3e38f,
                                   -3e38f,
                                   1e-42f,
                                   0.0f,
                                   -0.0f};
  if (code >= 248) return kSpecial[code - 248];
  return (static_cast<float>(code) - 124.0f) / 64.0f;  // [-1.94, 1.94]
}

// The state: float32 m and v (EmbeddingBagLazyAdam), or EmbeddingBagLazyAdamQuant's 8-bit state.
enum class State { kFloat32, kDynamicMap, kDynamicMapGuarded, kFp8 };

struct Case {
  int64_t rows = 0, dim = 0, stride = 0, bags = 0, blocks = 0;
  std::vector<int64_t> idx, off;
  std::vector<float> grad, weights;
  bool weighted = false, mean = false, wide_idx = true, wide_off = true;
  int threads = 1;
  State state = State::kFloat32;
  std::vector<float> m, v, var;         // [rows, stride] (m, v: float32 state only)
  std::vector<uint8_t> mc, vc;          // [rows, stride]: 8-bit codes
  std::vector<float> scale_m, scale_v;  // [rows, blocks]: absmax or FP8 scales
};

Case decode(Bytes &in) {
  Case c;
  c.rows = 1 + in.u8() % 48;
  const uint8_t d = in.u8();
  c.dim = d >= 250 ? 250 + (d - 250) * 17 : d % 40;  // up to 352 columns
  c.stride = c.dim + (in.u8() % 4 == 3 ? 5 : 0);
  c.bags = in.u8() % 24;
  const uint8_t flags = in.u8();
  c.weighted = flags & 1;
  c.mean = flags & 2;
  c.wide_idx = !(flags & 4);
  c.wide_off = !(flags & 8);
  c.threads = 1 + (flags >> 4) % 3;
  c.state = static_cast<State>(flags >> 6);
  c.off.push_back(0);
  for (int64_t b = 0; b < c.bags; ++b) {
    const int len = in.u8() % 7;
    for (int k = 0; k < len; ++k) {
      const uint8_t code = in.u8();
      int64_t id = code % c.rows;
      if (code == 255) id = -1;
      if (code == 254) id = c.rows;
      if (code == 253) id = std::numeric_limits<int32_t>::max();
      if (code == 252) id = std::numeric_limits<int64_t>::min();
      c.idx.push_back(id);
    }
    c.off.push_back(static_cast<int64_t>(c.idx.size()));
  }
  // Offsets that deviate: a first offset not 0, a decrease, an offset past L, a last offset not L.
  const uint8_t dev = in.u8();
  const auto at = static_cast<size_t>(in.u8()) % c.off.size();
  if (dev == 255) c.off[0] = 1;
  if (dev == 254) c.off[at] -= 1;
  if (dev == 253) c.off[at] = static_cast<int64_t>(c.idx.size()) + 3;
  if (dev == 252) c.off.back() += 1;
  if (dev == 251 && c.off.size() > 1) c.off.pop_back();  // B entries: one too few
  // The values the operator sees (an int32 id is the low 32 bits of the one drawn).
  if (!c.wide_idx) {
    for (int64_t &id : c.idx) id = static_cast<int32_t>(static_cast<uint32_t>(id));
  }
  c.grad.resize(static_cast<size_t>(std::max<int64_t>(c.bags * c.dim, 1)));
  for (float &g : c.grad) g = special_float(in);
  c.weights.resize(c.idx.size() + 1);
  for (float &w : c.weights) w = special_float(in);
  const size_t table = static_cast<size_t>(std::max<int64_t>(c.rows * c.stride, 1));
  c.m.resize(table);
  c.v.resize(table);
  c.var.resize(table);
  c.mc.resize(table);
  c.vc.resize(table);
  for (size_t i = 0; i < table; ++i) {
    c.m[i] = static_cast<float>(i % 7) * 0.01f - 0.03f;
    c.v[i] = static_cast<float>(i % 5) * 0.001f;
    c.var[i] = static_cast<float>(i % 11) * 0.1f - 0.5f;
    c.mc[i] = static_cast<uint8_t>(i * 37 + 11);  // every code, FP8's NaN codes among them
    c.vc[i] = static_cast<uint8_t>(i * 53 + 3);
  }
  // Block scales: a few from the input (NaN, Inf, 0, huge among them), the rest a pattern.
  c.blocks = (c.dim + 255) / 256;
  c.scale_m.resize(static_cast<size_t>(std::max<int64_t>(c.rows * c.blocks, 1)));
  c.scale_v.resize(c.scale_m.size());
  for (size_t i = 0; i < c.scale_m.size(); ++i) {
    c.scale_m[i] = i < 4 ? std::fabs(special_float(in)) : static_cast<float>(i % 3) * 0.02f;
    c.scale_v[i] = i < 4 ? std::fabs(special_float(in)) : static_cast<float>(i % 4) * 1e-4f;
  }
  return c;
}

// EmbeddingBagLazyAdamQuant's plan and run on the case's 8-bit state.
fusekit::Status run_quant(Case &c, const fusekit::EmbeddingBagLazyAdamQuantTensors &batch,
                          bool reference) {
  static const auto qm = fusekit::create_dynamic_map(true), qv = fusekit::create_dynamic_map(false);
  const bool fp8 = c.state == State::kFp8;
  fusekit::EmbeddingBagLazyAdamQuantTensors t = batch;
  t.m = TensorView::strided(c.mc.data(), DType::kUInt8, {c.rows, c.dim}, {c.stride, 1});
  t.v = TensorView::strided(c.vc.data(), DType::kUInt8, {c.rows, c.dim}, {c.stride, 1});
  t.var = TensorView::strided(c.var.data(), DType::kFloat32, {c.rows, c.dim}, {c.stride, 1});
  t.qmap_m = TensorView::of(qm.data(), {fp8 ? 0 : 256});
  t.qmap_v = TensorView::of(qv.data(), {fp8 ? 0 : 256});
  t.absmax_m = TensorView::of(c.scale_m.data(), {c.rows, c.blocks});
  t.absmax_v = TensorView::of(c.scale_v.data(), {c.rows, c.blocks});
  fusekit::EmbeddingBagLazyAdamQuantOptions o;
  o.pooling = c.mean ? fusekit::PoolingMode::kMean : fusekit::PoolingMode::kSum;
  o.state_format = fp8 ? fusekit::QuantStateFormat::kFp8 : fusekit::QuantStateFormat::kDynamicMap;
  o.guard_lost_v = c.state == State::kDynamicMapGuarded;
  o.num_threads = reference ? 1 : c.threads;
  o.kernel = reference ? fusekit::KernelChoice::kReference : fusekit::KernelChoice::kAuto;
  return fz::plan_and_run<fusekit::EmbeddingBagLazyAdamQuant,
                          fusekit::EmbeddingBagLazyAdamQuantProblem>(
      t, o, fusekit::EmbeddingBagLazyAdamQuantScalars{.lr = 0.01f, .lr_tensor = {}});
}

fusekit::Status run(Case &c, bool reference) {
  std::vector<int32_t> idx32(c.idx.begin(), c.idx.end()), off32(c.off.begin(), c.off.end());
  const auto l = static_cast<int64_t>(c.idx.size());
  fusekit::EmbeddingBagLazyAdamTensors t;
  t.grad_output = TensorView::of(c.grad.data(), {c.bags, c.dim});
  t.indices = c.wide_idx ? TensorView::of(c.idx.data(), {l}) : TensorView::of(idx32.data(), {l});
  const auto no = static_cast<int64_t>(c.off.size());
  t.offsets = c.wide_off ? TensorView::of(c.off.data(), {no}) : TensorView::of(off32.data(), {no});
  if (c.weighted) t.per_sample_weights = TensorView::of(c.weights.data(), {l});
  if (c.state != State::kFloat32) {
    fusekit::EmbeddingBagLazyAdamQuantTensors q;
    q.grad_output = t.grad_output;
    q.indices = t.indices;
    q.offsets = t.offsets;
    q.per_sample_weights = t.per_sample_weights;
    return run_quant(c, q, reference);
  }
  t.m = TensorView::strided(c.m.data(), DType::kFloat32, {c.rows, c.dim}, {c.stride, 1});
  t.v = TensorView::strided(c.v.data(), DType::kFloat32, {c.rows, c.dim}, {c.stride, 1});
  t.var = TensorView::strided(c.var.data(), DType::kFloat32, {c.rows, c.dim}, {c.stride, 1});
  fusekit::EmbeddingBagLazyAdamOptions o;
  o.pooling = c.mean ? fusekit::PoolingMode::kMean : fusekit::PoolingMode::kSum;
  o.num_threads = reference ? 1 : c.threads;
  o.kernel = reference ? fusekit::KernelChoice::kReference : fusekit::KernelChoice::kAuto;
  return fz::plan_and_run<fusekit::EmbeddingBagLazyAdam, fusekit::EmbeddingBagLazyAdamProblem>(
      t, o, fusekit::EmbeddingBagLazyAdamScalars{.lr = 0.01f, .lr_tensor = {}});
}

template <class T>
bool same_bytes(const std::vector<T> &a, const std::vector<T> &b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}
// Every state tensor of the two cases has the same bytes.
bool same_state(const Case &a, const Case &b) {
  return same_bytes(a.m, b.m) && same_bytes(a.v, b.v) && same_bytes(a.var, b.var) &&
         same_bytes(a.mc, b.mc) && same_bytes(a.vc, b.vc) && same_bytes(a.scale_m, b.scale_m) &&
         same_bytes(a.scale_v, b.scale_v);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Bytes in{data, size};
  const Case start = decode(in);
  Case fast = start, ref = start;
  const fusekit::Status a = run(fast, false);
  const fusekit::Status b = run(ref, true);
  FZ_CHECK(a.code() == b.code(), "cpu_hwy says \"%s\", the reference \"%s\"", a.message().c_str(),
           b.message().c_str());
  FZ_CHECK(same_state(fast, ref),
           "the tables differ between the plan's implementation and the reference");
  if (!a.ok()) {
    const char *op =
        start.state == State::kFloat32 ? "EmbeddingBagLazyAdam: " : "EmbeddingBagLazyAdamQuant: ";
    FZ_CHECK(a.message().rfind(op, 0) == 0, "a refusal's message: \"%s\"", a.message().c_str());
    FZ_CHECK(same_state(fast, start), "a refused run (\"%s\") changed the tables",
             a.message().c_str());
    return 0;
  }
  // Passed: every row no lookup names, and every gap column, keeps its bytes.
  std::vector<bool> named(static_cast<size_t>(start.rows), false);
  for (int64_t id : start.idx) named[static_cast<size_t>(id)] = true;
  for (int64_t r = 0; r < start.rows; ++r) {
    for (int64_t j = 0; j < start.stride; ++j) {
      if (named[static_cast<size_t>(r)] && j < start.dim) continue;
      const auto k = static_cast<size_t>(r * start.stride + j);
      FZ_CHECK(std::memcmp(&fast.var[k], &start.var[k], 4) == 0 &&
                   std::memcmp(&fast.m[k], &start.m[k], 4) == 0 &&
                   std::memcmp(&fast.v[k], &start.v[k], 4) == 0 && fast.mc[k] == start.mc[k] &&
                   fast.vc[k] == start.vc[k],
               "row %lld column %lld changed, though no lookup names it (or it is a gap column)",
               static_cast<long long>(r), static_cast<long long>(j));
    }
    if (!named[static_cast<size_t>(r)]) {
      for (int64_t blk = 0; blk < start.blocks; ++blk) {
        const auto k = static_cast<size_t>(r * start.blocks + blk);
        FZ_CHECK(std::memcmp(&fast.scale_m[k], &start.scale_m[k], 4) == 0 &&
                     std::memcmp(&fast.scale_v[k], &start.scale_v[k], 4) == 0,
                 "the block scales of row %lld changed, though no lookup names it",
                 static_cast<long long>(r));
      }
    }
  }
  return 0;
}
