// libFuzzer target: aclnnApplyAdamWQuantGetWorkspaceSize + aclnnApplyAdamWQuant
// (docs/fuzzing.md).
//
// Besides the invariants of fuzz_common.h: a successful step writes only var, mRef, vRef and the
// two absmax tensors; a block whose gradient holds NaN or Inf is left bit for bit unchanged; every
// block is either bit for bit unchanged or has finite new var and absmax values (spec: "guard what
// the step produces"); and the result equals, bit for bit, the C++ API's reference implementation
// run on copies of the inputs.
#include <cmath>
#include <cstring>
#include <vector>

#include "aclnnop/aclnn_apply_adam_w_quant.h"
#include "fusekit/apply_adam_w_quant.h"
#include "fuzz_common.h"

namespace {

using fz::Fill;

enum Arg { kVar, kGrad, kM, kV, kQm, kQv, kAm, kAv, kStep, kNumArgs };

struct Case {
  fz::TensorSpec t[kNumArgs];
  double lr = 0, beta1 = 0, beta2 = 0, weight_decay = 0, eps = 0, gnorm = 0;
  uint8_t qmode = 0;
  uint8_t format = 0;  // the C++ API's pass, mod 3: fp8, the guarded dynamic maps, fp8_ue3m5
  int64_t block = 0;
  fz::Phases ph;
};

char kModeBlockwise[] = "BLOCKWISE";
char kModeLower[] = "blockwise";
char kModeEmpty[] = "";
char kModeTrailing[] = "BLOCKWISE ";
char kModeTwice[] = "BLOCKWISEBLOCKWISE";

char *quant_mode(uint8_t c) {
  if (c < 192) return nullptr;
  if (c < 224) return kModeBlockwise;
  if (c < 236) return kModeLower;
  if (c < 244) return kModeEmpty;
  if (c < 250) return kModeTrailing;
  return kModeTwice;
}

void decode_into(fz::Input &in, Case *c) {
  const int rank = 1 + in.u8("ndim") % 3;
  fz::Nominal shape;
  static const int32_t kTypes[] = {ACL_FLOAT, ACL_FLOAT16, ACL_BF16};
  shape.dtype = kTypes[in.u8("dtype") % 3];
  shape.rank = rank;
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) {
    shape.dims[i] = in.u16("shape", nullptr, i) % (rank == 1 ? 2049 : rank == 2 ? 257 : 33);
    n *= shape.dims[i];
  }
  const int64_t blocks = (n + 255) / 256;
  fz::Nominal codes = shape;
  codes.dtype = ACL_UINT8;
  c->t[kVar] = fz::decode_tensor(in, "varRef", shape, kVar);
  c->t[kGrad] = fz::decode_tensor(in, "grad", shape, kGrad);
  c->t[kM] = fz::decode_tensor(in, "mRef", codes, kM);
  c->t[kV] = fz::decode_tensor(in, "vRef", codes, kV);
  c->t[kQm] = fz::decode_tensor(in, "qmapM", {ACL_FLOAT, 1, {256}}, kQm);
  c->t[kQv] = fz::decode_tensor(in, "qmapV", {ACL_FLOAT, 1, {256}}, kQv);
  c->t[kAm] = fz::decode_tensor(in, "absmaxMRef", {ACL_FLOAT, 1, {blocks}}, kAm);
  c->t[kAv] = fz::decode_tensor(in, "absmaxVRef", {ACL_FLOAT, 1, {blocks}}, kAv);
  c->t[kStep] = fz::decode_tensor(in, "step", {ACL_INT64, 1, {1}}, kStep);
  c->lr = fz::decode_double(in, "lr", 1e-3);
  c->beta1 = fz::decode_double(in, "beta1", 0.9);
  c->beta2 = fz::decode_double(in, "beta2", 0.999);
  c->weight_decay = fz::decode_double(in, "weightDecay", 0.01);
  c->eps = fz::decode_double(in, "eps", 1e-8);
  c->gnorm = fz::decode_double(in, "gnormScale", 1.0);
  c->qmode = in.u8("quantMode");
  c->block = fz::decode_int(in, "blockSize", 256);
  c->ph = fz::decode_phases(in);
  c->format = in.u8("stateFormat");
}
void decode_only(fz::Input &in) {
  Case c;
  decode_into(in, &c);
}

bool is_finite_elem(const uint8_t *p, int32_t dtype) {
  return std::isfinite(fz::load_float(p, dtype));
}

void run_one(const uint8_t *data, size_t size) {
  const Case c = fz::begin_case<Case>(data, size, decode_into);
  fz::World w(c.ph.seed);
  static const Fill kFills[kNumArgs] = {Fill::kFloat,  Fill::kFloat,      Fill::kCodes,
                                        Fill::kCodes,  Fill::kQmapSigned, Fill::kQmapUnsigned,
                                        Fill::kAbsmax, Fill::kAbsmax,     Fill::kStep};
  aclTensor *t[kNumArgs];
  for (int i = 0; i < kNumArgs; ++i) t[i] = w.add(c.t[i], kFills[i]);
  w.snapshot();
  uint64_t ws = 0;
  aclOpExecutor *ex = nullptr;
  fz::poison();
  const int st = aclnnApplyAdamWQuantGetWorkspaceSize(
      t[kVar], t[kGrad], t[kM], t[kV], t[kQm], t[kQv], t[kAm], t[kAv], t[kStep], c.lr, c.beta1,
      c.beta2, c.weight_decay, c.eps, c.gnorm, quant_mode(c.qmode), c.block,
      c.ph.p1 >= fz::kP1NullWorkspaceSize && c.ph.p1 < fz::kP1NullExecutor ? nullptr : &ws,
      c.ph.p1 >= fz::kP1NullExecutor ? nullptr : &ex);
  std::vector<std::pair<int, int64_t>> outputs;
  const bool ran =
      fz::run_phases(w, c.ph, st, ws, ex, "aclnnApplyAdamWQuant", aclnnApplyAdamWQuant, [&] {
        for (int i : {kVar, kM, kV, kAm, kAv}) {
          const size_t es = w.tensor(i).esize;
          w.for_each_element(i, [&](int64_t, int64_t e) {
            w.allow_element(i, e, es);
            outputs.emplace_back(i, e);
          });
        }
      });
  if (!ran) return;

  // Per block: untouched when its gradient is not finite; else untouched or finite.
  std::vector<int64_t> elems[kNumArgs];
  for (int i : {kVar, kGrad, kM, kV}) {
    w.for_each_element(i, [&](int64_t, int64_t e) { elems[i].push_back(e); });
  }
  const int32_t dt = w.tensor(kVar).spec.dtype;
  const size_t es = fz::real_esize(dt);
  const int64_t n = static_cast<int64_t>(elems[kVar].size());
  const fz::Created &am = w.tensor(kAm), &av = w.tensor(kAv);
  for (int64_t b = 0; b * 256 < n; ++b) {
    const int64_t lo = b * 256, hi = std::min<int64_t>(n, lo + 256);
    bool grad_finite = true, changed = false, new_finite = true;
    for (int64_t k = lo; k < hi; ++k) {
      grad_finite = grad_finite && is_finite_elem(w.before_at(kGrad, elems[kGrad][k]), dt);
      const uint8_t *now = w.now_at(kVar, elems[kVar][k]);
      changed = changed || std::memcmp(now, w.before_at(kVar, elems[kVar][k]), es) != 0;
      new_finite = new_finite && is_finite_elem(now, dt);
      for (int i : {kM, kV}) {
        changed = changed || *w.now_at(i, elems[i][k]) != *w.before_at(i, elems[i][k]);
      }
    }
    for (const fz::Created *a : {&am, &av}) {
      const int i = a == &am ? kAm : kAv;
      const int64_t e = a->spec.offset + b * a->spec.strides[0];
      changed = changed || std::memcmp(w.now_at(i, e), w.before_at(i, e), 4) != 0;
      new_finite = new_finite && is_finite_elem(w.now_at(i, e), ACL_FLOAT);
    }
    FZ_CHECK(grad_finite || !changed,
             "aclnnApplyAdamWQuant changed block %lld although its gradient is not finite",
             static_cast<long long>(b));
    FZ_CHECK(!changed || new_finite,
             "aclnnApplyAdamWQuant wrote non-finite var or absmax values in block %lld (finite "
             "gradient); the spec leaves such a block unchanged",
             static_cast<long long>(b));
  }

  // The C++ API's reference implementation on copies of the inputs gives the same bits.
  auto copies = w.copies();
  const fusekit::ApplyAdamWQuantTensors tensors{
      w.view(kVar, copies), w.view(kGrad, copies), w.view(kM, copies),  w.view(kV, copies),
      w.view(kQm, copies),  w.view(kQv, copies),   w.view(kAm, copies), w.view(kAv, copies)};
  fusekit::ApplyAdamWQuantOptions o;
  o.beta1 = c.beta1;
  o.beta2 = c.beta2;
  o.weight_decay = c.weight_decay;
  o.eps = c.eps;
  o.gnorm_scale = c.gnorm;
  o.block_size = c.block;
  fusekit::ApplyAdamWQuantScalars scalars;
  scalars.step_tensor = w.view(kStep, copies);
  scalars.lr = static_cast<float>(c.lr);
  fz::expect_reference<fusekit::ApplyAdamWQuant, fusekit::ApplyAdamWQuantProblem>(
      w, copies, tensors, o, scalars, outputs, "aclnnApplyAdamWQuant");

  // An FP8 state format, sqrt(v) as UE4M4 or UE3M5 (the maps as empty views; the codes, absmax
  // and step as drawn, NaN codes and non-finite scales included) or the dynamic maps with the
  // lost-v guard, through the C++ API: the plan's implementation and the reference agree.
  constexpr fusekit::QuantStateFormat kFormats[] = {fusekit::QuantStateFormat::kFp8,
                                                    fusekit::QuantStateFormat::kDynamicMap,
                                                    fusekit::QuantStateFormat::kFp8Ue3m5};
  o.state_format = kFormats[static_cast<size_t>(c.format) % 3];
  o.guard_lost_v = true;
  const bool fp8 = fusekit::is_fp8_state(o.state_format);
  fz::expect_implementations_agree<fusekit::ApplyAdamWQuant, fusekit::ApplyAdamWQuantProblem>(
      w, o,
      [&](std::vector<std::unique_ptr<fz::Buffer>> &b) {
        fusekit::TensorView qm = w.view(kQm, b), qv = w.view(kQv, b);
        if (fp8) qm.shape[0] = qv.shape[0] = 0;
        fusekit::ApplyAdamWQuantScalars sc = scalars;
        sc.step_tensor = w.view(kStep, b);
        return std::pair{
            fusekit::ApplyAdamWQuantTensors{w.view(kVar, b), w.view(kGrad, b), w.view(kM, b),
                                            w.view(kV, b), qm, qv, w.view(kAm, b), w.view(kAv, b)},
            sc};
      },
      o.state_format == fusekit::QuantStateFormat::kFp8Ue3m5 ? "ApplyAdamWQuant (fp8_ue3m5)"
      : fp8                                                  ? "ApplyAdamWQuant (fp8)"
            : "ApplyAdamWQuant (dynamic maps, guard_lost_v)");
}

std::vector<fz::Seed> seeds() {
  using fz::Expect;
  const fz::Values base = {{"ndim", 0}, {"shape[0]", 300}, {"seed", 7}};
  auto with = [&](const fz::Values &extra) { return fz::with(base, extra); };
  return {
      {"valid_f32_300", Expect::kSucceeds, base},
      {"valid_f16_512", Expect::kSucceeds, with({{"dtype", 1}, {"shape[0]", 512}})},
      {"valid_bf16_2d", Expect::kSucceeds,
       with({{"dtype", 2}, {"ndim", 1}, {"shape[0]", 17}, {"shape[1]", 33}})},
      {"valid_3d", Expect::kSucceeds,
       with({{"ndim", 2}, {"shape[0]", 5}, {"shape[1]", 7}, {"shape[2]", 9}})},
      {"valid_blockwise_mode", Expect::kSucceeds, with({{"quantMode", 200}})},
      {"nan_gradient_block", Expect::kSucceeds, with({{"grad.fill", 7}, {"shape[0]", 1000}})},
      {"special_gradients", Expect::kSucceeds, with({{"grad.fill", 2}})},
      // Found by this fuzzer (a finite gradient whose square overflows float32 updated its block
      // and stored absmaxV = Inf), fixed in de516a6: such a block is left unchanged.
      {"regress_huge_gradients", Expect::kSucceeds, with({{"grad.fill", 5}})},
      {"zero_state", Expect::kSucceeds,
       with({{"grad.fill", 3}, {"mRef.fill", 1}, {"vRef.fill", 1}, {"absmaxMRef.fill", 1}})},
      {"eps_tiny", Expect::kAny,
       with({{"eps", fz::double_code(1e-45)},
             {"grad.fill", 3},
             {"absmaxMRef.fill", 1},
             {"absmaxVRef.fill", 1}})},
      {"gnorm_huge", Expect::kAny, with({{"gnormScale", fz::double_code(1e20)}})},
      {"qmap_unsorted", Expect::kPhaseTwoFails, with({{"qmapM.fill", 3}})},
      {"qmap_nan", Expect::kPhaseTwoFails, with({{"qmapV.fill", 4}})},
      {"qmap_inf", Expect::kPhaseTwoFails, with({{"qmapV.fill", 5}})},
      {"qmap_zeros", Expect::kSucceeds, with({{"qmapM.fill", 2}, {"qmapV.fill", 2}})},
      {"qmap_signed_zero", Expect::kSucceeds, with({{"qmapM.fill", 7}})},
      {"step_specials", Expect::kAny, with({{"step.fill", 2}})},
      {"step_random", Expect::kAny, with({{"step.fill", 3}})},
      {"absmax_specials", Expect::kAny, with({{"absmaxMRef.fill", 2}, {"absmaxVRef.fill", 3}})},
      {"block_size_128", Expect::kPhaseOneFails, with({{"blockSize", fz::int_code(128)}})},
      {"quant_mode_lower", Expect::kPhaseOneFails, with({{"quantMode", 230}})},
      {"absmax_wrong_size", Expect::kPhaseOneFails,
       with({{"absmaxMRef.dim[0]", fz::dim_code(fz::kNomPlus1)}})},
      {"var_padded_rows", Expect::kSucceeds,
       with({{"ndim", 1},
             {"shape[0]", 20},
             {"shape[1]", 30},
             {"varRef.stride", fz::kStridePadded},
             {"varRef.pad", 5}})},
      {"var_transposed", Expect::kSucceeds,
       with({{"ndim", 1},
             {"shape[0]", 20},
             {"shape[1]", 30},
             {"varRef.stride", fz::kStrideTransposed}})},
      {"m_stride_zero", Expect::kPhaseOneFails, with({{"mRef.stride", fz::kStrideZero}})},
      {"absmax_strided", Expect::kSucceeds,
       with({{"absmaxVRef.stride", fz::kStridePerDimension}, {"absmaxVRef.sval[0]", 4}})},
      {"alias_var_grad", Expect::kPhaseOneFails, with({{"grad.alias", 224 + kVar}})},
      {"alias_qmaps", Expect::kSucceeds, with({{"qmapV.alias", 224 + kQm}, {"qmapV.fill", 0}})},
      {"alias_step_absmax", Expect::kPhaseOneFails, with({{"step.alias", 224 + kAm}})},
      {"grad_bf16_var_f32", Expect::kPhaseOneFails,
       with({{"grad.dtype", fz::dtype_code(ACL_BF16)}})},
      {"empty", Expect::kSucceeds, with({{"shape[0]", 0}})},
      {"negative_decay", Expect::kSucceeds, with({{"weightDecay", fz::double_code(-0.5)}})},
      {"lr_negative", Expect::kPhaseOneFails, with({{"lr", fz::double_code(-1.0)}})},
      {"beta2_nan", Expect::kPhaseOneFails,
       with({{"beta2", fz::double_code(std::numeric_limits<double>::quiet_NaN())}})},
      {"null_step", Expect::kPhaseOneFails, with({{"step.mode", fz::kModeNullTensor}})},
      {"null_data_var", Expect::kPhaseOneFails, with({{"varRef.mode", fz::kModeNullData}})},
      {"huge_broadcast_grad", Expect::kAny,
       with({{"shape[0]", 1},
             {"grad.dim[0]", fz::dim_code(int64_t{1} << 40)},
             {"grad.stride", fz::kStrideZero}})},
      {"short_workspace", Expect::kPhaseTwoFails, with({{"ws", fz::kWsShort}})},
      {"misaligned_workspace_2_threads", Expect::kSucceeds,
       with({{"ws", fz::kWsMisaligned + 9}, {"threads", 193}, {"shape[0]", 2000}})},
      {"run_twice", Expect::kSucceeds, with({{"exmode", fz::kExTwice}})},
      {"garbage_stream", Expect::kPhaseTwoFails, with({{"stream", fz::kStreamGarbage}})},
      // Found by this fuzzer (a step pointer that is not 8-byte aligned was loaded as an int64),
      // fixed in de516a6: scalar tensors are read at any alignment.
      {"regress_step_misaligned", Expect::kSucceeds, with({{"step.misalign", 243}})},
  };
}

}  // namespace

FZ_FUZZ_TARGET(seeds, decode_only, run_one)
