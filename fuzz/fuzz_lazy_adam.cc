// libFuzzer target: aclnnLazyAdamGetWorkspaceSize + aclnnLazyAdam (docs/fuzzing.md).
//
// Besides the invariants of fuzz_common.h: a successful step writes only the m, v and var rows
// that a valid index names; a row whose summed gradient (float32, in order of occurrence) is not
// finite is left unchanged; and the result equals, bit for bit (any NaN for any NaN), the C++
// API's reference implementation run on copies of the inputs.
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "aclnnop/aclnn_lazy_adam.h"
#include "fusekit/lazy_adam.h"
#include "fuzz_common.h"

namespace {

using fz::Fill;

enum Arg { kGrad, kIdx, kM, kV, kVar, kLr };

struct Case {
  fz::TensorSpec t[6];
  double beta1 = 0, beta2 = 0, eps = 0;
  fz::Phases ph;
};

void decode_into(fz::Input &in, Case *c) {
  const int64_t n = in.u8("N"), d = in.u8("D") % 64;
  int64_t rows = in.u8("R");
  // flags: bit 0 int64 indices; bit 1 indices [N, 1]; bits 2-4 all set: a one-row table.
  const uint8_t flags = in.u8("flags");
  if ((flags & 0x1c) == 0x1c) rows = 1;
  c->t[kGrad] = fz::decode_tensor(in, "gradient", {ACL_FLOAT, 2, {n, d}}, kGrad);
  c->t[kIdx] = fz::decode_tensor(
      in, "indices", {(flags & 1) ? ACL_INT64 : ACL_INT32, (flags & 2) ? 2 : 1, {n, 1}}, kIdx);
  c->t[kM] = fz::decode_tensor(in, "inputM", {ACL_FLOAT, 2, {rows, d}}, kM);
  c->t[kV] = fz::decode_tensor(in, "inputV", {ACL_FLOAT, 2, {rows, d}}, kV);
  c->t[kVar] = fz::decode_tensor(in, "inputVar", {ACL_FLOAT, 2, {rows, d}}, kVar);
  c->t[kLr] = fz::decode_tensor(in, "lr", {ACL_FLOAT, 1, {1}}, kLr);
  c->beta1 = fz::decode_double(in, "beta1", 0.9);
  c->beta2 = fz::decode_double(in, "beta2", 0.999);
  c->eps = fz::decode_double(in, "epsilon", 1e-7);
  c->ph = fz::decode_phases(in);
}
void decode_only(fz::Input &in) {
  Case c;
  decode_into(in, &c);
}

void run_one(const uint8_t *data, size_t size) {
  const Case c = fz::begin_case<Case>(data, size, decode_into);
  fz::World w(c.ph.seed);
  aclTensor *g = w.add(c.t[kGrad], Fill::kFloat);
  aclTensor *i = w.add(c.t[kIdx], Fill::kIndex, c.t[kM].dims[0]);
  aclTensor *m = w.add(c.t[kM], Fill::kFloat);
  aclTensor *v = w.add(c.t[kV], Fill::kFloat);
  aclTensor *var = w.add(c.t[kVar], Fill::kFloat);
  aclTensor *lr = w.add(c.t[kLr], Fill::kLr);
  w.snapshot();
  uint64_t ws = 0;
  aclOpExecutor *ex = nullptr;
  fz::poison();
  const int st = aclnnLazyAdamGetWorkspaceSize(
      g, i, m, v, var, lr, c.beta1, c.beta2, c.eps,
      c.ph.p1 >= fz::kP1NullWorkspaceSize && c.ph.p1 < fz::kP1NullExecutor ? nullptr : &ws,
      c.ph.p1 >= fz::kP1NullExecutor ? nullptr : &ex);
  fz::TouchedRows rows;
  std::vector<std::pair<int, int64_t>> outputs;
  const bool ran = fz::run_phases(w, c.ph, st, ws, ex, "aclnnLazyAdam", aclnnLazyAdam, [&] {
    rows = fz::touched_rows(w, kIdx, kM);
    const int64_t d = w.tensor(kM).spec.dims[1];
    for (int64_t row : rows.order) {
      for (int t : {kM, kV, kVar}) {
        for (int64_t j = 0; j < d; ++j) {
          const int64_t e = fz::elem2(w, t, row, j);
          w.allow_element(t, e, 4);
          outputs.emplace_back(t, e);
        }
      }
    }
  });
  if (!ran) return;

  // A row whose summed gradient is not finite is left unchanged.
  const fz::Created &gc = w.tensor(kGrad);
  const int64_t d = w.tensor(kM).spec.dims[1];
  for (int64_t row : rows.order) {
    bool finite = true;
    for (int64_t j = 0; j < d && finite; ++j) {
      float sum = 0.0f;
      for (int64_t k : rows.occurrences[row]) {
        float gv;
        std::memcpy(
            &gv,
            w.before_at(kGrad, gc.spec.offset + k * gc.spec.strides[0] + j * gc.spec.strides[1]),
            4);
        sum += gv;
      }
      finite = std::isfinite(sum);
    }
    if (finite) continue;
    for (int t : {kM, kV, kVar}) {
      for (int64_t j = 0; j < d; ++j) {
        const int64_t e = fz::elem2(w, t, row, j);
        FZ_CHECK(std::memcmp(w.now_at(t, e), w.before_at(t, e), 4) == 0,
                 "aclnnLazyAdam changed %s[%lld, %lld] although the row's gradient is not finite",
                 w.tensor(t).spec.name, static_cast<long long>(row), static_cast<long long>(j));
      }
    }
  }

  // The C++ API's reference implementation on copies of the inputs gives the same bits.
  auto copies = w.copies();
  const fusekit::LazyAdamTensors tensors{w.view(kGrad, copies), w.view(kIdx, copies),
                                         w.view(kM, copies), w.view(kV, copies),
                                         w.view(kVar, copies)};
  fusekit::LazyAdamOptions o;
  o.beta1 = c.beta1;
  o.beta2 = c.beta2;
  o.epsilon = c.eps;
  fusekit::LazyAdamScalars scalars;
  scalars.lr_tensor = w.view(kLr, copies);
  fz::expect_reference<fusekit::LazyAdam, fusekit::LazyAdamProblem>(w, copies, tensors, o, scalars,
                                                                    outputs, "aclnnLazyAdam");
}

std::vector<fz::Seed> seeds() {
  using fz::Expect;
  const fz::Values base = {{"N", 8}, {"D", 5}, {"R", 20}, {"seed", 1}};
  auto with = [&](const fz::Values &extra) { return fz::with(base, extra); };
  return {
      {"valid_small", Expect::kSucceeds, base},
      {"valid_int64_n1", Expect::kSucceeds, with({{"flags", 3}})},
      {"valid_d17_r300", Expect::kSucceeds, with({{"D", 17}, {"R", 255}, {"N", 64}})},
      {"duplicates", Expect::kSucceeds, with({{"indices.fill", 4}})},
      {"padding", Expect::kSucceeds, with({{"indices.fill", 2}})},
      {"nan_gradient", Expect::kSucceeds, with({{"gradient.fill", 7}})},
      {"special_gradient", Expect::kSucceeds, with({{"gradient.fill", 2}, {"indices.fill", 7}})},
      {"huge_gradient", Expect::kSucceeds, with({{"gradient.fill", 5}, {"indices.fill", 4}})},
      {"index_out_of_range", Expect::kPhaseTwoFails, with({{"indices.fill", 3}})},
      {"index_specials", Expect::kAny, with({{"indices.fill", 5}, {"flags", 1}})},
      {"lr_nan", Expect::kPhaseTwoFails, with({{"lr.fill", 1}})},
      {"lr_int32", Expect::kPhaseOneFails, with({{"lr.dtype", fz::dtype_code(ACL_INT32)}})},
      {"beta1_one", Expect::kPhaseOneFails, with({{"beta1", fz::double_code(1.0)}})},
      {"beta2_nan", Expect::kPhaseOneFails,
       with({{"beta2", fz::double_code(std::numeric_limits<double>::quiet_NaN())}})},
      {"epsilon_tiny", Expect::kPhaseOneFails, with({{"epsilon", fz::double_code(1e-46)}})},
      {"null_gradient", Expect::kPhaseOneFails, with({{"gradient.mode", fz::kModeNullTensor}})},
      {"null_data_m", Expect::kPhaseOneFails, with({{"inputM.mode", fz::kModeNullData}})},
      {"broadcast_1000_rows", Expect::kSucceeds,
       with({{"gradient.dim[0]", fz::dim_code(1000)},
             {"gradient.stride", fz::kStrideZero},
             {"indices.dim[0]", fz::dim_code(1000)},
             {"indices.stride", fz::kStrideZero}})},
      {"view_past_storage", Expect::kPhaseOneFails,
       with({{"inputM.dim[0]", fz::dim_code(int64_t{1} << 40)}})},
      {"offset_near_max", Expect::kPhaseOneFails,
       with({{"inputV.offset", fz::offset_code(fz::kI64Max)}})},
      {"alias_m_v", Expect::kPhaseOneFails, with({{"inputV.alias", 224 + kM}})},
      {"alias_grad_idx", Expect::kAny, with({{"indices.alias", 224 + kGrad}})},
      {"rows_overlap", Expect::kPhaseOneFails, with({{"inputM.stride", fz::kStrideOverlap}})},
      {"negative_stride", Expect::kPhaseOneFails,
       with({{"inputVar.stride", fz::kStrideNegative}, {"inputVar.sdim", 0}})},
      {"padded_rows", Expect::kSucceeds,
       with({{"inputVar.stride", fz::kStridePadded}, {"inputVar.pad", 3}})},
      {"transposed", Expect::kPhaseOneFails, with({{"gradient.stride", fz::kStrideTransposed}})},
      {"misaligned", Expect::kPhaseOneFails, with({{"gradient.misalign", 241}})},
      {"format_nz", Expect::kPhaseOneFails,
       with({{"gradient.format", fz::format_code(ACL_FORMAT_FRACTAL_NZ)}})},
      {"short_workspace", Expect::kPhaseTwoFails, with({{"ws", fz::kWsShort}})},
      {"misaligned_workspace", Expect::kSucceeds, with({{"ws", fz::kWsMisaligned + 5}})},
      {"dead_stream", Expect::kPhaseTwoFails, with({{"stream", fz::kStreamDestroyed}})},
      {"live_stream_3_threads", Expect::kSucceeds,
       with({{"stream", fz::kStreamLive}, {"threads", 194}, {"N", 200}, {"R", 40}})},
      {"run_twice", Expect::kSucceeds, with({{"exmode", fz::kExTwice}})},
      {"null_executor_first", Expect::kSucceeds, with({{"exmode", fz::kExNullFirst}})},
      {"destroy_tensors_first", Expect::kSucceeds, with({{"exmode", fz::kExDestroyTensors}})},
      {"destroy_executor", Expect::kAny, with({{"exmode", fz::kExDestroy}})},
      {"null_workspace_size", Expect::kPhaseOneFails, with({{"p1", fz::kP1NullWorkspaceSize}})},
      {"empty_batch", Expect::kSucceeds, with({{"N", 0}})},
      {"zero_columns", Expect::kSucceeds, with({{"D", 0}})},
      {"rank3_table", Expect::kPhaseOneFails, with({{"inputM.rank", 243}})},
      // Found by this fuzzer (an lr pointer that is not 4-byte aligned was loaded as a float,
      // a misaligned load), fixed in de516a6: scalar tensors are read at any alignment.
      {"regress_lr_misaligned", Expect::kSucceeds, with({{"lr.misalign", 241}})},
      // Issue #31: one-row tables of row stride 2^62 - 1, 29 padding indices of 30; cpu_hwy
      // prefetched row R = 1 at m + stride (a pointer overflow), fixed in the cxx branch.
      {"regress_one_row_huge_stride", Expect::kSucceeds,
       with({{"N", 30},
             {"D", 36},
             {"flags", 0x1c},
             {"indices.fill", 9},
             {"inputM.stride", fz::kStrideHuge},
             {"inputM.huge", 128},
             {"inputV.stride", fz::kStrideHuge},
             {"inputV.huge", 128},
             {"inputVar.stride", fz::kStrideHuge},
             {"inputVar.huge", 128}})},
  };
}

}  // namespace

FZ_FUZZ_TARGET(seeds, decode_only, run_one)
