// libFuzzer target: aclnnAddLoraGetWorkspaceSize + aclnnAddLora (docs/fuzzing.md).
//
// Besides the invariants of fuzz_common.h: a successful call writes only `out` (which may be y
// itself); no index above W is accepted; every element of a row without an adapter (index < 0 or
// == W), and every element outside [yOffset, yOffset + H2), is y's element bit for bit; and every
// updated element is within the spec's bound of a float64 oracle computed here (one ulp of the
// output type plus float32 accumulation error proportional to the sum of the absolute terms).
#include <cmath>
#include <cstring>
#include <vector>

#include "aclnnop/aclnn_add_lora.h"
#include "fuzz_common.h"

namespace {

using fz::Fill;

enum Arg { kY, kX, kB, kIdx, kA, kOut, kNumArgs };

struct Case {
  fz::TensorSpec t[kNumArgs];
  int64_t layer = 0, y_offset = 0, slice = 0;
  double scale = 0;
  fz::Phases ph;
};

void decode_into(fz::Input &in, Case *c) {
  const int64_t b = in.u8("B") % 33, h1 = in.u8("H1") % 48, r = in.u8("Rk") % 17,
                h2 = in.u8("H2") % 48, h3 = h2 + in.u8("H3x") % 8, w = in.u8("W") % 6,
                l = in.u8("L") % 4;
  const bool has_a = in.u8("noA") < 192;
  const bool in_place = in.u8("inplace") >= 128;
  static const int32_t kTypes[] = {ACL_FLOAT16, ACL_BF16, ACL_FLOAT};
  const int32_t dt = kTypes[in.u8("dtype") % 3];
  c->layer = fz::decode_int(in, "layerIdx", in.u8("layer") % std::max<int64_t>(l, 1));
  c->y_offset = fz::decode_int(in, "yOffset", in.u8("yoff") % (h3 - h2 + 1));
  c->slice = fz::decode_int(in, "ySliceSize", (in.u8("slice") & 1) ? h2 : -1);
  c->scale = fz::decode_double(in, "scale", 0.5);
  c->t[kY] = fz::decode_tensor(in, "y", {dt, 2, {b, h3}}, kY);
  c->t[kX] = fz::decode_tensor(in, "x", {dt, 2, {b, has_a ? h1 : r}}, kX);
  c->t[kB] = fz::decode_tensor(in, "weightB", {dt, 4, {w, l, h2, r}}, kB);
  c->t[kIdx] = fz::decode_tensor(in, "indices", {ACL_INT32, 1, {b}}, kIdx);
  c->t[kA] = fz::decode_tensor(in, "weightA", {dt, 4, {w, l, r, h1}}, kA);
  if (!has_a) c->t[kA].present = false;
  c->t[kOut] = fz::decode_tensor(in, "out", {dt, 2, {b, h3}}, kOut);
  if (in_place) {  // out is y: the same description over the same buffer
    c->t[kOut] = c->t[kY];
    c->t[kOut].name = "out";
    c->t[kOut].alias = kY;
  }
  c->ph = fz::decode_phases(in);
}
void decode_only(fz::Input &in) {
  Case c;
  decode_into(in, &c);
}

int64_t at(const fz::Created &c, std::initializer_list<int64_t> idx) {
  int64_t e = c.spec.offset, d = 0;
  for (int64_t i : idx) e += i * c.spec.strides[d++];
  return e;
}

// One ulp of the output type at magnitude |v|.
double ulp_of(double v, int32_t dt) {
  const double a = std::fabs(v);
  if (dt == ACL_FLOAT16) return std::max(a * 0x1p-10, 0x1p-24);
  if (dt == ACL_BF16) return std::max(a * 0x1p-7, 0x1p-133);
  return std::max(a * 0x1p-23, 0x1p-149);
}
double max_of(int32_t dt) {
  return dt == ACL_FLOAT16 ? 65504.0 : 3.3895313892515355e38;
}

void run_one(const uint8_t *data, size_t size) {
  const Case c = fz::begin_case<Case>(data, size, decode_into);
  fz::World w(c.ph.seed);
  aclTensor *t[kNumArgs];
  for (int i = 0; i < kNumArgs; ++i) {
    // Index contents up to W + 1: W itself means "no adapter", W + 1 (fill mode 3) is an error.
    t[i] = w.add(c.t[i], i == kIdx ? Fill::kIndex : Fill::kFloat, fz::wrap_add(c.t[kB].dims[0], 1));
  }
  w.snapshot();
  uint64_t ws = 0;
  aclOpExecutor *ex = nullptr;
  fz::poison();
  const int st = aclnnAddLoraGetWorkspaceSize(
      t[kY], t[kX], t[kB], t[kIdx], t[kA], c.layer, c.scale, c.y_offset, c.slice, t[kOut],
      c.ph.p1 >= fz::kP1NullWorkspaceSize && c.ph.p1 < fz::kP1NullExecutor ? nullptr : &ws,
      c.ph.p1 >= fz::kP1NullExecutor ? nullptr : &ex);
  const bool ran =
      fz::run_phases(w, c.ph, st, ws, ex, "aclnnAddLora", aclnnAddLora, [&] { w.allow_all(kOut); });
  if (!ran) return;

  const fz::Created &y = w.tensor(kY), &x = w.tensor(kX), &wb = w.tensor(kB), &idx = w.tensor(kIdx),
                    &wa = w.tensor(kA), &out = w.tensor(kOut);
  const bool has_a = wa.created;
  const int32_t dt = y.spec.dtype;
  const size_t es = fz::real_esize(dt);
  const int64_t nb = y.spec.dims[0], h3 = y.spec.dims[1], h1 = x.spec.dims[1];
  const int64_t nw = wb.spec.dims[0], h2 = wb.spec.dims[2], r = wb.spec.dims[3];
  const double scale = static_cast<float>(c.scale);
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t a = w.index_before(kIdx, at(idx, {b}));
    FZ_CHECK(a <= nw, "aclnnAddLora accepted indices[%lld] = %lld with %lld adapters",
             static_cast<long long>(b), static_cast<long long>(a), static_cast<long long>(nw));
    const bool adapter = a >= 0 && a < nw;
    // The low-rank intermediate of this row, in float64, with the sums of absolute terms.
    std::vector<double> tr(static_cast<size_t>(r)), ta(static_cast<size_t>(r));
    bool finite = true;
    for (int64_t k = 0; adapter && k < r; ++k) {
      if (!has_a) {
        tr[k] = fz::load_float(w.before_at(kX, at(x, {b, k})), dt);
        ta[k] = std::fabs(tr[k]);
        continue;
      }
      for (int64_t q = 0; q < h1; ++q) {
        const double p = static_cast<double>(fz::load_float(w.before_at(kX, at(x, {b, q})), dt)) *
                         fz::load_float(w.before_at(kA, at(wa, {a, c.layer, k, q})), dt);
        tr[k] += p;
        ta[k] += std::fabs(p);
      }
    }
    // The intermediate t is float32 by design: past float32's range it overflows legitimately.
    for (int64_t k = 0; k < r; ++k) finite = finite && ta[k] < 1e38;
    for (int64_t j = 0; j < h3; ++j) {
      const uint8_t *now = w.now_at(kOut, at(out, {b, j}));
      const uint8_t *yb = w.before_at(kY, at(y, {b, j}));
      if (!adapter || j < c.y_offset || j >= c.y_offset + h2) {
        FZ_CHECK(std::memcmp(now, yb, es) == 0,
                 "aclnnAddLora: out[%lld, %lld] is not y's element (index %lld, yOffset %lld, "
                 "H2 %lld)",
                 static_cast<long long>(b), static_cast<long long>(j), static_cast<long long>(a),
                 static_cast<long long>(c.y_offset), static_cast<long long>(h2));
        continue;
      }
      const double yv = fz::load_float(yb, dt);
      double z = 0, s = 0, sum_b = 0;
      bool ok = finite && std::isfinite(yv);
      for (int64_t k = 0; ok && k < r; ++k) {
        const double bv =
            fz::load_float(w.before_at(kB, at(wb, {a, c.layer, j - c.y_offset, k})), dt);
        ok = std::isfinite(bv);
        z += tr[k] * bv;
        s += ta[k] * std::fabs(bv);
        sum_b += std::fabs(bv);
      }
      const double exact = yv + scale * z;
      const double sum_abs = std::fabs(yv) + std::fabs(scale) * s;
      // Past the range of float32 or of the output type the result is Inf or NaN by design.
      // So does z = t . B^T (float32) before it is scaled.
      if (!ok || !(s < 1e38) || !(sum_abs < 1e38) || std::fabs(exact) > max_of(dt) / 2) {
        continue;
      }
      // One ulp of the output, float32 accumulation relative to the terms, and float32's
      // absolute rounding of subnormal intermediates (2^-150 per operation, carried through B).
      const double bound =
          ulp_of(exact, dt) + 2.0 * static_cast<double>(h1 + r + 8) * 0x1p-24 * sum_abs +
          0x1p-149 * (static_cast<double>(h1 + 2) * std::fabs(scale) * (sum_b + 1) +
                      static_cast<double>(r + 4));
      const double got = fz::load_float(now, dt);
      FZ_CHECK(std::fabs(got - exact) <= bound,
               "aclnnAddLora: out[%lld, %lld] = %.9g but the float64 oracle gives %.9g (bound "
               "%.3g, sum of |terms| %.3g)",
               static_cast<long long>(b), static_cast<long long>(j), got, exact, bound, sum_abs);
    }
  }
}

std::vector<fz::Seed> seeds() {
  using fz::Expect;
  const fz::Values base = {{"B", 4}, {"H1", 16}, {"Rk", 8},    {"H2", 16},  {"H3x", 4},
                           {"W", 3}, {"L", 2},   {"layer", 1}, {"yoff", 2}, {"seed", 3}};
  auto with = [&](const fz::Values &extra) { return fz::with(base, extra); };
  return {
      {"valid_f16", Expect::kSucceeds, base},
      {"valid_bf16", Expect::kSucceeds, with({{"dtype", 1}})},
      {"valid_f32", Expect::kSucceeds, with({{"dtype", 2}})},
      {"valid_without_a", Expect::kSucceeds, with({{"noA", 200}})},
      {"valid_in_place", Expect::kSucceeds, with({{"inplace", 200}})},
      {"valid_slice_h2", Expect::kSucceeds, with({{"slice", 1}})},
      {"seed_example_shape", Expect::kSucceeds,
       with({{"B", 1},
             {"H1", 16},
             {"Rk", 16},
             {"H2", 16},
             {"H3x", 0},
             {"W", 1},
             {"L", 1},
             {"layer", 0},
             {"yoff", 0}})},
      {"no_adapter_rows", Expect::kSucceeds, with({{"W", 1}})},
      {"negative_indices", Expect::kSucceeds, with({{"indices.fill", 2}})},
      {"index_above_w", Expect::kPhaseTwoFails, with({{"indices.fill", 3}})},
      {"index_specials", Expect::kAny, with({{"indices.fill", 5}})},
      {"one_adapter_prefill", Expect::kSucceeds,
       with({{"B", 32}, {"W", 5}, {"indices.fill", 4}, {"threads", 193}})},
      {"decode_many_adapters", Expect::kSucceeds, with({{"B", 32}, {"W", 5}, {"Rk", 16}})},
      {"special_values", Expect::kSucceeds, with({{"x.fill", 2}, {"weightB.fill", 2}})},
      {"huge_values", Expect::kSucceeds, with({{"x.fill", 5}, {"dtype", 2}})},
      {"cancellation", Expect::kSucceeds, with({{"dtype", 2}, {"y.fill", 5}})},
      {"slice_wrong", Expect::kPhaseOneFails, with({{"ySliceSize", fz::int_code(fz::kNomPlus1)}})},
      {"y_offset_past_end", Expect::kPhaseOneFails,
       with({{"H3x", 0}, {"yoff", 0}, {"yOffset", fz::int_code(fz::kNomPlus1)}})},
      {"y_offset_huge", Expect::kPhaseOneFails, with({{"yOffset", fz::int_code(fz::kI64Max)}})},
      {"layer_negative", Expect::kPhaseOneFails, with({{"layerIdx", fz::int_code(-1)}})},
      {"layer_past_end", Expect::kPhaseOneFails, with({{"layerIdx", fz::int_code(2)}})},
      {"scale_nan", Expect::kPhaseOneFails,
       with({{"scale", fz::double_code(std::numeric_limits<double>::quiet_NaN())}})},
      {"scale_past_float", Expect::kPhaseOneFails, with({{"scale", fz::double_code(3.5e38)}})},
      {"scale_tiny", Expect::kSucceeds, with({{"scale", fz::double_code(1e-45)}})},
      {"out_aliases_x", Expect::kPhaseOneFails, with({{"out.alias", 224 + kX}, {"H1", 30}})},
      {"out_overlaps_y", Expect::kPhaseOneFails,
       with({{"out.alias", 224 + kY}, {"out.offset", 129}, {"y.slack", 200}})},
      {"out_rows_overlap", Expect::kPhaseOneFails, with({{"out.stride", fz::kStrideOverlap}})},
      {"y_padded_rows", Expect::kSucceeds, with({{"y.stride", fz::kStridePadded}, {"y.pad", 9}})},
      {"out_padded_rows", Expect::kSucceeds,
       with({{"out.stride", fz::kStridePadded}, {"out.pad", 1}})},
      {"weight_b_strided", Expect::kSucceeds,
       with({{"weightB.stride", fz::kStridePadded}, {"weightB.pad", 2}})},
      {"weight_a_broadcast", Expect::kSucceeds,
       with({{"weightA.stride", fz::kStrideZero}, {"weightA.sdim", 0}})},
      {"x_transposed", Expect::kPhaseOneFails, with({{"x.stride", fz::kStrideTransposed}})},
      {"weight_b_dtype", Expect::kPhaseOneFails,
       with({{"weightB.dtype", fz::dtype_code(ACL_FLOAT)}})},
      {"indices_int64", Expect::kPhaseOneFails,
       with({{"indices.dtype", fz::dtype_code(ACL_INT64)}})},
      {"empty_batch", Expect::kPhaseOneFails, with({{"B", 0}})},
      {"no_adapters", Expect::kPhaseOneFails, with({{"W", 0}})},
      {"rank_mismatch", Expect::kPhaseOneFails,
       with({{"H1", 5}, {"noA", 200}, {"x.dim[1]", fz::dim_code(7)}})},
      {"null_out", Expect::kPhaseOneFails, with({{"out.mode", fz::kModeNullTensor}})},
      {"null_data_weight_b", Expect::kPhaseOneFails, with({{"weightB.mode", fz::kModeNullData}})},
      {"huge_w_broadcast", Expect::kAny,
       with({{"weightB.dim[0]", fz::dim_code(fz::kP31)},
             {"weightB.stride", fz::kStrideZero},
             {"weightB.sdim", 0},
             {"weightA.dim[0]", fz::dim_code(fz::kP31)},
             {"weightA.stride", fz::kStrideZero},
             {"weightA.sdim", 0}})},
      {"short_workspace", Expect::kPhaseTwoFails, with({{"ws", fz::kWsShort}})},
      {"null_workspace", Expect::kPhaseTwoFails, with({{"ws", fz::kWsNull}})},
      {"larger_workspace_live_stream", Expect::kSucceeds,
       with({{"ws", fz::kWsLarger}, {"stream", fz::kStreamLive}})},
      {"destroy_tensors_first", Expect::kSucceeds, with({{"exmode", fz::kExDestroyTensors}})},
      {"null_executor_out", Expect::kPhaseOneFails, with({{"p1", fz::kP1NullExecutor}})},
  };
}

}  // namespace

FZ_FUZZ_TARGET(seeds, decode_only, run_one)
