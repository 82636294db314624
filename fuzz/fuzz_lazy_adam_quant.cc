// libFuzzer target: aclnnLazyAdamQuantGetWorkspaceSize + aclnnLazyAdamQuant (docs/fuzzing.md).
//
// Besides the invariants of fuzz_common.h: a successful step writes only the m, v and var rows and
// the absmax rows that a valid index names; a row whose summed gradient (float32, in order of
// occurrence) is not finite is left bit for bit unchanged; every touched row is either bit for bit
// unchanged or has finite var and absmax values (the guard on what the step produces); and the
// result equals, bit for bit (any NaN for any NaN), the C++ API's reference implementation run on
// copies of the inputs.
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "aclnnop/aclnn_lazy_adam_quant.h"
#include "fusekit/lazy_adam_quant.h"
#include "fuzz_common.h"

namespace {

using fz::Fill;

enum Arg { kGrad, kIdx, kM, kV, kVar, kQm, kQv, kAm, kAv, kLr, kNumArgs };

struct Case {
  fz::TensorSpec t[kNumArgs];
  double beta1 = 0, beta2 = 0, eps = 0;
  uint8_t format = 0;  // the C++ API's pass: even, the FP8 format; odd, the guarded dynamic maps
  fz::Phases ph;
};

void decode_into(fz::Input &in, Case *c) {
  const int64_t n = in.u8("N"), d = in.u16("D") % 601, rows = in.u8("R");
  // flags: bit 0 int64 indices; bit 1 indices [N, 1]; bits 2-3 the table's dtype (float32,
  // float16, bfloat16); bit 4 a float32 gradient with a 16-bit table.
  const uint8_t flags = in.u8("flags");
  static const int32_t kTypes[] = {ACL_FLOAT, ACL_FLOAT16, ACL_BF16, ACL_FLOAT};
  const int32_t table = kTypes[(flags >> 2) & 3];
  const int32_t grad = (flags & 16) != 0 ? ACL_FLOAT : table;
  const int64_t blocks = (d + 255) / 256;
  c->t[kGrad] = fz::decode_tensor(in, "gradient", {grad, 2, {n, d}}, kGrad);
  c->t[kIdx] = fz::decode_tensor(
      in, "indices", {(flags & 1) ? ACL_INT64 : ACL_INT32, (flags & 2) ? 2 : 1, {n, 1}}, kIdx);
  c->t[kM] = fz::decode_tensor(in, "inputM", {ACL_UINT8, 2, {rows, d}}, kM);
  c->t[kV] = fz::decode_tensor(in, "inputV", {ACL_UINT8, 2, {rows, d}}, kV);
  c->t[kVar] = fz::decode_tensor(in, "inputVar", {table, 2, {rows, d}}, kVar);
  c->t[kQm] = fz::decode_tensor(in, "qmapM", {ACL_FLOAT, 1, {256}}, kQm);
  c->t[kQv] = fz::decode_tensor(in, "qmapV", {ACL_FLOAT, 1, {256}}, kQv);
  c->t[kAm] = fz::decode_tensor(in, "absmaxM", {ACL_FLOAT, 2, {rows, blocks}}, kAm);
  c->t[kAv] = fz::decode_tensor(in, "absmaxV", {ACL_FLOAT, 2, {rows, blocks}}, kAv);
  c->t[kLr] = fz::decode_tensor(in, "lr", {ACL_FLOAT, 1, {1}}, kLr);
  c->beta1 = fz::decode_double(in, "beta1", 0.9);
  c->beta2 = fz::decode_double(in, "beta2", 0.999);
  c->eps = fz::decode_double(in, "epsilon", 1e-7);
  c->ph = fz::decode_phases(in);
  c->format = in.u8("stateFormat");
}
void decode_only(fz::Input &in) {
  Case c;
  decode_into(in, &c);
}

void run_one(const uint8_t *data, size_t size) {
  const Case c = fz::begin_case<Case>(data, size, decode_into);
  fz::World w(c.ph.seed);
  static const Fill kFills[kNumArgs] = {
      Fill::kFloat,      Fill::kIndex,        Fill::kCodes,  Fill::kCodes,  Fill::kFloat,
      Fill::kQmapSigned, Fill::kQmapUnsigned, Fill::kAbsmax, Fill::kAbsmax, Fill::kLr};
  aclTensor *t[kNumArgs];
  for (int i = 0; i < kNumArgs; ++i) {
    t[i] = w.add(c.t[i], kFills[i], i == kIdx ? c.t[kM].dims[0] : 0);
  }
  w.snapshot();
  uint64_t ws = 0;
  aclOpExecutor *ex = nullptr;
  fz::poison();
  const int st = aclnnLazyAdamQuantGetWorkspaceSize(
      t[kGrad], t[kIdx], t[kM], t[kV], t[kVar], t[kQm], t[kQv], t[kAm], t[kAv], t[kLr], c.beta1,
      c.beta2, c.eps,
      c.ph.p1 >= fz::kP1NullWorkspaceSize && c.ph.p1 < fz::kP1NullExecutor ? nullptr : &ws,
      c.ph.p1 >= fz::kP1NullExecutor ? nullptr : &ex);
  fz::TouchedRows rows;
  std::vector<std::pair<int, int64_t>> outputs;
  const bool ran =
      fz::run_phases(w, c.ph, st, ws, ex, "aclnnLazyAdamQuant", aclnnLazyAdamQuant, [&] {
        rows = fz::touched_rows(w, kIdx, kM);
        const int64_t d = w.tensor(kM).spec.dims[1], blocks = w.tensor(kAm).spec.dims[1];
        for (int64_t row : rows.order) {
          for (int i : {kM, kV, kVar}) {
            for (int64_t j = 0; j < d; ++j) {
              const int64_t e = fz::elem2(w, i, row, j);
              w.allow_element(i, e, w.tensor(i).esize);
              outputs.emplace_back(i, e);
            }
          }
          for (int i : {kAm, kAv}) {
            for (int64_t b = 0; b < blocks; ++b) {
              const int64_t e = fz::elem2(w, i, row, b);
              w.allow_element(i, e, 4);
              outputs.emplace_back(i, e);
            }
          }
        }
      });
  if (!ran) return;

  // Per touched row: unchanged when its summed gradient is not finite; else unchanged or finite.
  const fz::Created &gc = w.tensor(kGrad);
  const int32_t gdt = gc.spec.dtype, vdt = w.tensor(kVar).spec.dtype;
  const int64_t d = w.tensor(kM).spec.dims[1], blocks = w.tensor(kAm).spec.dims[1];
  for (int64_t row : rows.order) {
    bool grad_finite = true;
    for (int64_t j = 0; j < d && grad_finite; ++j) {
      float sum = 0.0f;
      bool first = true;
      for (int64_t k : rows.occurrences[row]) {
        const float g = fz::load_float(
            w.before_at(kGrad, gc.spec.offset + k * gc.spec.strides[0] + j * gc.spec.strides[1]),
            gdt);
        sum = first ? g : sum + g;
        first = false;
      }
      grad_finite = std::isfinite(sum);
    }
    bool changed = false, finite = true;
    for (int i : {kM, kV, kVar}) {
      const size_t es = fz::real_esize(w.tensor(i).spec.dtype);
      for (int64_t j = 0; j < d; ++j) {
        const int64_t e = fz::elem2(w, i, row, j);
        changed = changed || std::memcmp(w.now_at(i, e), w.before_at(i, e), es) != 0;
        if (i == kVar) finite = finite && std::isfinite(fz::load_float(w.now_at(i, e), vdt));
      }
    }
    for (int i : {kAm, kAv}) {
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t e = fz::elem2(w, i, row, b);
        changed = changed || std::memcmp(w.now_at(i, e), w.before_at(i, e), 4) != 0;
        finite = finite && std::isfinite(fz::load_float(w.now_at(i, e), ACL_FLOAT));
      }
    }
    FZ_CHECK(grad_finite || !changed,
             "aclnnLazyAdamQuant changed row %lld although its summed gradient is not finite",
             static_cast<long long>(row));
    FZ_CHECK(!changed || finite,
             "aclnnLazyAdamQuant wrote non-finite var or absmax values in row %lld; the spec "
             "leaves such a row unchanged",
             static_cast<long long>(row));
  }

  // The C++ API's reference implementation on copies of the inputs gives the same bits.
  auto copies = w.copies();
  const fusekit::LazyAdamQuantTensors tensors{
      w.view(kGrad, copies), w.view(kIdx, copies), w.view(kM, copies),
      w.view(kV, copies),    w.view(kVar, copies), w.view(kQm, copies),
      w.view(kQv, copies),   w.view(kAm, copies),  w.view(kAv, copies)};
  fusekit::LazyAdamQuantOptions o;
  o.beta1 = c.beta1;
  o.beta2 = c.beta2;
  o.epsilon = c.eps;
  fusekit::LazyAdamQuantScalars scalars;
  scalars.lr_tensor = w.view(kLr, copies);
  fz::expect_reference<fusekit::LazyAdamQuant, fusekit::LazyAdamQuantProblem>(
      w, copies, tensors, o, scalars, outputs, "aclnnLazyAdamQuant");

  // The FP8 state format (the maps as empty views; codes and scales as drawn, NaN codes and
  // non-finite scales included) or the dynamic maps with the lost-v guard, through the C++ API:
  // the plan's implementation and the reference agree.
  o.state_format =
      c.format % 2 == 0 ? fusekit::QuantStateFormat::kFp8 : fusekit::QuantStateFormat::kDynamicMap;
  o.guard_lost_v = true;
  const bool fp8 = o.state_format == fusekit::QuantStateFormat::kFp8;
  fz::expect_implementations_agree<fusekit::LazyAdamQuant, fusekit::LazyAdamQuantProblem>(
      w, o,
      [&](std::vector<std::unique_ptr<fz::Buffer>> &b) {
        fusekit::TensorView qm = w.view(kQm, b), qv = w.view(kQv, b);
        if (fp8) qm.shape[0] = qv.shape[0] = 0;
        fusekit::LazyAdamQuantScalars sc;
        sc.lr_tensor = w.view(kLr, b);
        return std::pair{fusekit::LazyAdamQuantTensors{
                             w.view(kGrad, b), w.view(kIdx, b), w.view(kM, b), w.view(kV, b),
                             w.view(kVar, b), qm, qv, w.view(kAm, b), w.view(kAv, b)},
                         sc};
      },
      fp8 ? "LazyAdamQuant (fp8)" : "LazyAdamQuant (dynamic maps, guard_lost_v)");
}

std::vector<fz::Seed> seeds() {
  using fz::Expect;
  const fz::Values base = {{"N", 8}, {"D", 5}, {"R", 20}, {"seed", 1}};
  auto with = [&](const fz::Values &extra) { return fz::with(base, extra); };
  return {
      {"valid_small", Expect::kSucceeds, base},
      {"valid_int64_n1", Expect::kSucceeds, with({{"flags", 3}})},
      {"valid_d32", Expect::kSucceeds, with({{"D", 32}, {"N", 64}, {"R", 100}})},
      {"valid_d300_two_blocks", Expect::kSucceeds, with({{"D", 300}, {"N", 12}, {"R", 30}})},
      {"valid_d600_three_blocks_bf16", Expect::kSucceeds,
       with({{"D", 600}, {"N", 6}, {"R", 9}, {"flags", 8}})},
      {"valid_f16", Expect::kSucceeds, with({{"flags", 4}, {"D", 40}})},
      {"valid_bf16_f32_gradient", Expect::kSucceeds, with({{"flags", 8 + 16}, {"D", 33}})},
      {"duplicates", Expect::kSucceeds, with({{"indices.fill", 4}, {"D", 17}})},
      {"padding", Expect::kSucceeds, with({{"indices.fill", 2}})},
      {"nan_gradient", Expect::kSucceeds, with({{"gradient.fill", 7}})},
      {"special_gradient", Expect::kSucceeds, with({{"gradient.fill", 2}, {"indices.fill", 7}})},
      {"huge_gradient", Expect::kSucceeds, with({{"gradient.fill", 5}, {"indices.fill", 4}})},
      {"special_var_f16", Expect::kSucceeds, with({{"inputVar.fill", 2}, {"flags", 4}})},
      {"absmax_specials", Expect::kSucceeds, with({{"absmaxM.fill", 2}, {"absmaxV.fill", 3}})},
      {"zero_state", Expect::kSucceeds, with({{"absmaxM.fill", 1}, {"absmaxV.fill", 1}})},
      {"qmap_unsorted", Expect::kPhaseTwoFails, with({{"qmapM.fill", 3}})},
      {"qmap_nan", Expect::kPhaseTwoFails, with({{"qmapV.fill", 4}})},
      {"qmap_zeros", Expect::kSucceeds, with({{"qmapM.fill", 2}, {"qmapV.fill", 2}})},
      {"qmap_signed_zero", Expect::kSucceeds, with({{"qmapM.fill", 7}})},
      {"index_out_of_range", Expect::kPhaseTwoFails, with({{"indices.fill", 3}})},
      {"index_specials", Expect::kAny, with({{"indices.fill", 5}, {"flags", 1}})},
      {"lr_nan", Expect::kPhaseTwoFails, with({{"lr.fill", 1}})},
      {"lr_int32", Expect::kPhaseOneFails, with({{"lr.dtype", fz::dtype_code(ACL_INT32)}})},
      {"beta1_one", Expect::kPhaseOneFails, with({{"beta1", fz::double_code(1.0)}})},
      {"epsilon_tiny", Expect::kPhaseOneFails, with({{"epsilon", fz::double_code(1e-46)}})},
      {"null_gradient", Expect::kPhaseOneFails, with({{"gradient.mode", fz::kModeNullTensor}})},
      {"null_data_absmax", Expect::kPhaseOneFails, with({{"absmaxV.mode", fz::kModeNullData}})},
      {"codes_int8", Expect::kPhaseOneFails, with({{"inputM.dtype", fz::dtype_code(ACL_INT8)}})},
      {"absmax_wrong_blocks", Expect::kPhaseOneFails,
       with({{"absmaxM.dim[1]", fz::dim_code(fz::kNomPlus1)}})},
      {"gradient_bf16_table_f16", Expect::kPhaseOneFails,
       with({{"flags", 4}, {"gradient.dtype", fz::dtype_code(ACL_BF16)}})},
      {"broadcast_1000_rows", Expect::kSucceeds,
       with({{"gradient.dim[0]", fz::dim_code(1000)},
             {"gradient.stride", fz::kStrideZero},
             {"indices.dim[0]", fz::dim_code(1000)},
             {"indices.stride", fz::kStrideZero}})},
      {"alias_m_v", Expect::kPhaseOneFails, with({{"inputV.alias", 224 + kM}})},
      {"alias_absmax_qmap", Expect::kPhaseOneFails, with({{"absmaxV.alias", 224 + kQm}})},
      {"alias_lr_var", Expect::kPhaseOneFails, with({{"lr.alias", 224 + kVar}})},
      {"rows_overlap", Expect::kPhaseOneFails, with({{"inputVar.stride", fz::kStrideOverlap}})},
      {"padded_rows", Expect::kSucceeds,
       with({{"inputVar.stride", fz::kStridePadded},
             {"inputVar.pad", 3},
             {"inputM.stride", fz::kStridePadded},
             {"inputM.pad", 7}})},
      {"absmax_padded_rows", Expect::kSucceeds,
       with({{"absmaxM.stride", fz::kStridePadded}, {"absmaxM.pad", 2}})},
      {"transposed", Expect::kPhaseOneFails, with({{"inputV.stride", fz::kStrideTransposed}})},
      {"misaligned", Expect::kPhaseOneFails, with({{"inputVar.misalign", 241}})},
      {"short_workspace", Expect::kPhaseTwoFails, with({{"ws", fz::kWsShort}})},
      {"misaligned_workspace", Expect::kSucceeds, with({{"ws", fz::kWsMisaligned + 5}})},
      {"dead_stream", Expect::kPhaseTwoFails, with({{"stream", fz::kStreamDestroyed}})},
      {"live_stream_3_threads", Expect::kSucceeds,
       with({{"stream", fz::kStreamLive}, {"threads", 194}, {"N", 200}, {"R", 40}, {"D", 48}})},
      {"run_twice", Expect::kSucceeds, with({{"exmode", fz::kExTwice}})},
      {"destroy_executor", Expect::kAny, with({{"exmode", fz::kExDestroy}})},
      {"empty_batch", Expect::kSucceeds, with({{"N", 0}})},
      {"zero_columns", Expect::kSucceeds, with({{"D", 0}})},
      {"lr_misaligned", Expect::kSucceeds, with({{"lr.misalign", 241}})},
  };
}

}  // namespace

FZ_FUZZ_TARGET(seeds, decode_only, run_one)
