// The LazyAdamQuant op runner of the golden flow: reads <dir>/input/*.bin and <dir>/params.txt,
// runs aclnnLazyAdamQuant on "device" memory from aclrtMalloc(HUGE_FIRST), writes
// <dir>/output/*.bin (inputM, inputV, inputVar, absmaxM, absmaxV) and its time.
//
// params.txt's state_format (absent: dynamic_map) names the state format (docs/fp8_state.md).
// The aclnn face has no FP8 format, so "fp8" runs the C++ API instead (fusekit::LazyAdamQuant,
// options.state_format = kFp8) on the same device buffers; there are no maps (the plan gets empty
// views), and absmaxM, absmaxV hold the blocks' scales.
#include <cstdio>
#include <string>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_lazy_adam_quant.h"
#include "bin_io.h"
#include "fusekit/lazy_adam_quant.h"

using fusekit::tools::DeviceTensor;

namespace {

fusekit::DType dtype_named(const std::string &name) {
  return name == "float16"    ? fusekit::DType::kFloat16
         : name == "bfloat16" ? fusekit::DType::kBFloat16
                              : fusekit::DType::kFloat32;
}

}  // namespace

int main(int argc, char **argv) {
  const fusekit::tools::Runner run(argc, argv, "run_lazy_adam_quant");
  const std::string &dir = run.dir;
  const fusekit::tools::Params &p = run.params;
  const int64_t rows = p.integer("rows"), n = p.integer("n"), dim = p.integer("dim");
  const int64_t blocks = (dim + 255) / 256;
  const std::string dtype = p.str("dtype"), grad_dtype = p.str("grad_dtype");
  const double es = dtype == "float32" ? 4.0 : 2.0, gs = grad_dtype == "float32" ? 4.0 : 2.0;
  aclrtStream stream = run.stream;

  DeviceTensor grad = run.input("gradient", {n, dim}, fusekit::tools::acl_dtype_named(grad_dtype));
  DeviceTensor idx = run.input("indices", {n}, ACL_INT32);
  DeviceTensor m = run.input("inputM", {rows, dim}, ACL_UINT8);
  DeviceTensor v = run.input("inputV", {rows, dim}, ACL_UINT8);
  DeviceTensor var = run.input("inputVar", {rows, dim}, fusekit::tools::acl_dtype_named(dtype));
  const bool fp8 = p.has("state_format") && p.str("state_format") == "fp8";
  if (p.has("state_format") && !fp8 && p.str("state_format") != "dynamic_map") {
    fusekit::tools::die("state_format = " + p.str("state_format") +
                        ": expected dynamic_map or fp8");
  }
  DeviceTensor qm, qv;  // no maps in the FP8 format
  if (!fp8) {
    qm = run.input("qmapM", {256}, ACL_FLOAT);
    qv = run.input("qmapV", {256}, ACL_FLOAT);
  }
  DeviceTensor am = run.input("absmaxM", {rows, blocks}, ACL_FLOAT);
  DeviceTensor av = run.input("absmaxV", {rows, blocks}, ACL_FLOAT);
  DeviceTensor lr = run.input("lr", {1}, ACL_FLOAT);

  // The FP8 format through the C++ API: the plan of these tensors (made on each call, as phase one
  // is), run with lr read from its tensor as the aclnn face does; the skipped-row count worded as
  // a warning.
  using fusekit::TensorView;
  fusekit::LazyAdamQuantOptions o;
  o.beta1 = p.num("beta1");
  o.beta2 = p.num("beta2");
  o.epsilon = p.num("epsilon");
  o.state_format = fusekit::QuantStateFormat::kFp8;
  const float empty_map[1] = {0.0f};
  const fusekit::LazyAdamQuantTensors tensors{
      TensorView::contiguous(grad.ptr, dtype_named(grad_dtype), {n, dim}),
      TensorView::contiguous(idx.ptr, fusekit::DType::kInt32, {n}),
      TensorView::contiguous(m.ptr, fusekit::DType::kUInt8, {rows, dim}),
      TensorView::contiguous(v.ptr, fusekit::DType::kUInt8, {rows, dim}),
      TensorView::contiguous(var.ptr, dtype_named(dtype), {rows, dim}),
      TensorView::of(empty_map, {0}),
      TensorView::of(empty_map, {0}),
      TensorView::contiguous(am.ptr, fusekit::DType::kFloat32, {rows, blocks}),
      TensorView::contiguous(av.ptr, fusekit::DType::kFloat32, {rows, blocks})};
  fusekit::LazyAdamQuantScalars scalars;
  scalars.lr_tensor = TensorView::contiguous(lr.ptr, fusekit::DType::kFloat32, {1});
  fusekit::LazyAdamQuant plan;
  fusekit::LazyAdamQuantStats fp8_stats;
  auto fp8_plan = [&](uint64_t *ws_size) {
    const fusekit::Status s = fusekit::LazyAdamQuant::plan(tensors, o, &plan);
    *ws_size = plan.workspace_size();
    return s;
  };
  auto fp8_run = [&](void *ws, uint64_t ws_size) {
    return plan.run(tensors, scalars, ws, ws_size, &fp8_stats);
  };
  // One call (tools/bin_io.h): the first one's outputs are checked; the steady time comes from
  // repeated calls after they are written.
  fusekit::tools::OpCall call =
      fp8 ? fusekit::tools::OpCall(fp8_plan, fp8_run)
          : fusekit::tools::OpCall(
                stream,
                [&](uint64_t *ws_size, aclOpExecutor **executor) {
                  return aclnnLazyAdamQuantGetWorkspaceSize(
                      grad.tensor, idx.tensor, m.tensor, v.tensor, var.tensor, qm.tensor, qv.tensor,
                      am.tensor, av.tensor, lr.tensor, p.num("beta1"), p.num("beta2"),
                      p.num("epsilon"), ws_size, executor);
                },
                aclnnLazyAdamQuant);
  const fusekit::tools::CallSeconds first = call();
  // the skipped-row count, if any
  const std::string warning =
      !fp8 ? std::string(aclGetRecentErrMsg())
      : fp8_stats.rows_skipped_nonfinite > 0
          ? "LazyAdamQuant (fp8): " + std::to_string(fp8_stats.rows_skipped_nonfinite) +
                " rows were left unchanged (a non-finite gradient, state or result)"
          : std::string();

  // Per index: the index, the gradient row read; var, both code rows and both absmax rows read and
  // written.
  const double d = static_cast<double>(dim), b = static_cast<double>(blocks);
  const double bytes = static_cast<double>(n) * (4.0 + d * gs + 2.0 * d * es + 4.0 * d + 16.0 * b);
  fusekit::tools::write_outputs(
      dir,
      {{&m, "inputM"}, {&v, "inputV"}, {&var, "inputVar"}, {&am, "absmaxM"}, {&av, "absmaxV"}});
  const fusekit::tools::SteadySeconds steady = call.steady();
  char shape[128];
  std::snprintf(shape, sizeof shape, "R=%lld N=%lld D=%lld %s%s", static_cast<long long>(rows),
                static_cast<long long>(n), static_cast<long long>(dim), dtype.c_str(),
                fp8 ? " fp8" : "");
  fusekit::tools::write_run_stats(dir, call, first, steady, bytes, "GB/s", shape, warning);
  for (auto *t : {&grad, &idx, &m, &v, &var, &qm, &qv, &am, &av, &lr}) {
    fusekit::tools::release(*t);
  }
  fusekit::tools::finish_acl(stream);
  return 0;
}
