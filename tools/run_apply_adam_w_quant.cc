// The ApplyAdamWQuant op runner of the golden flow: reads <dir>/input/*.bin and <dir>/params.txt,
// runs aclnnApplyAdamWQuant on "device" memory from aclrtMalloc(HUGE_FIRST), writes
// <dir>/output/*.bin (var, m, v, absmax_m, absmax_v) and its time.
//
// params.txt's state_format (absent: dynamic_map) names the state format (docs/fp8_state.md).
// The aclnn face keeps CANN's arithmetic and has no FP8 format, so "fp8" runs the C++ API instead
// (fusekit::ApplyAdamWQuant, options.state_format = kFp8) on the same device buffers; there are
// no maps (the plan gets empty views), and absmax_m, absmax_v hold the blocks' scales.
#include <cstdio>
#include <string>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_apply_adam_w_quant.h"
#include "bin_io.h"
#include "fusekit/apply_adam_w_quant.h"

using fusekit::tools::DeviceTensor;

namespace {

fusekit::TensorView view(const DeviceTensor &t, fusekit::DType dtype, int64_t n) {
  return fusekit::TensorView::contiguous(t.ptr, dtype, &n, 1);
}

fusekit::DType dtype_named(const std::string &name) {
  return name == "float16"    ? fusekit::DType::kFloat16
         : name == "bfloat16" ? fusekit::DType::kBFloat16
                              : fusekit::DType::kFloat32;
}

}  // namespace

int main(int argc, char **argv) {
  const fusekit::tools::Runner run(argc, argv, "run_apply_adam_w_quant");
  const std::string &dir = run.dir;
  const fusekit::tools::Params &p = run.params;
  const int64_t rows = p.integer("rows"), cols = p.integer("cols"), n = rows * cols;
  const int64_t blocks = (n + 255) / 256;
  const std::string dtype = p.str("dtype");
  const aclDataType dt = fusekit::tools::acl_dtype_named(dtype);
  const double elem = dtype == "float32" ? 4.0 : 2.0;
  aclrtStream stream = run.stream;

  const std::string format = p.has("state_format") ? p.str("state_format") : "dynamic_map";
  const bool fp8 = format == "fp8" || format == "fp8_ue3m5";
  if (!fp8 && format != "dynamic_map") {
    fusekit::tools::die("state_format = " + format + ": expected dynamic_map, fp8 or fp8_ue3m5");
  }

  DeviceTensor var = run.input("var", {rows, cols}, dt);
  DeviceTensor grad = run.input("grad", {rows, cols}, dt);
  DeviceTensor m = run.input("m", {rows, cols}, ACL_UINT8);
  DeviceTensor v = run.input("v", {rows, cols}, ACL_UINT8);
  DeviceTensor qm, qv;  // no maps in the FP8 format
  if (!fp8) {
    qm = run.input("qmap_m", {256}, ACL_FLOAT);
    qv = run.input("qmap_v", {256}, ACL_FLOAT);
  }
  DeviceTensor am = run.input("absmax_m", {blocks}, ACL_FLOAT);
  DeviceTensor av = run.input("absmax_v", {blocks}, ACL_FLOAT);
  DeviceTensor step = run.input("step", {1}, ACL_INT64);

  char mode[] = "BLOCKWISE";
  // The FP8 format through the C++ API: the plan of these tensors (made on each call, as phase one
  // is), run with the step and lr; the skipped-block count as the aclnn face words it.
  fusekit::ApplyAdamWQuantOptions o;
  o.beta1 = p.num("beta1");
  o.beta2 = p.num("beta2");
  o.weight_decay = p.num("weight_decay");
  o.eps = p.num("eps");
  o.gnorm_scale = p.num("gnorm_scale");
  o.state_format = format == "fp8_ue3m5" ? fusekit::QuantStateFormat::kFp8Ue3m5
                                         : fusekit::QuantStateFormat::kFp8;
  const fusekit::DType ft = dtype_named(dtype);
  const float empty_map[1] = {0.0f};
  fusekit::ApplyAdamWQuant plan;
  fusekit::ApplyAdamWQuantStats fp8_stats;
  const int64_t step_value = p.integer("step");
  auto fp8_plan = [&](uint64_t *ws_size) {
    const fusekit::Status s = fusekit::ApplyAdamWQuant::plan(
        view(var, ft, n), view(grad, ft, n), view(m, fusekit::DType::kUInt8, n),
        view(v, fusekit::DType::kUInt8, n), fusekit::TensorView::of(empty_map, {0}),
        fusekit::TensorView::of(empty_map, {0}), view(am, fusekit::DType::kFloat32, blocks),
        view(av, fusekit::DType::kFloat32, blocks), o, &plan);
    *ws_size = plan.workspace_size();
    return s;
  };
  auto fp8_run = [&](void *ws, uint64_t ws_size) {
    return plan.run(step_value, static_cast<float>(p.num("lr")), ws, ws_size, &fp8_stats);
  };
  // One call (tools/bin_io.h): the first one's outputs are checked; the steady time comes from
  // repeated calls after they are written.
  fusekit::tools::OpCall call =
      fp8 ? fusekit::tools::OpCall(fp8_plan, fp8_run)
          : fusekit::tools::OpCall(
                stream,
                [&](uint64_t *ws_size, aclOpExecutor **executor) {
                  return aclnnApplyAdamWQuantGetWorkspaceSize(
                      var.tensor, grad.tensor, m.tensor, v.tensor, qm.tensor, qv.tensor, am.tensor,
                      av.tensor, step.tensor, p.num("lr"), p.num("beta1"), p.num("beta2"),
                      p.num("weight_decay"), p.num("eps"), p.num("gnorm_scale"), mode, 256, ws_size,
                      executor);
                },
                aclnnApplyAdamWQuant);
  const fusekit::tools::CallSeconds first = call();
  // the skipped-block count, if any
  const std::string warning =
      !fp8 ? std::string(aclGetRecentErrMsg())
      : fp8_stats.blocks_skipped_nonfinite > 0
          ? "ApplyAdamWQuant (fp8): " + std::to_string(fp8_stats.blocks_skipped_nonfinite) +
                " of " + std::to_string(blocks) +
                " blocks were left unchanged (a non-finite gradient, state or result)"
          : std::string();

  const double bytes = static_cast<double>(n) * (3.0 * elem + 4.0);  // var r+w, grad r, m and v r+w
  fusekit::tools::write_outputs(
      dir, {{&var, "var"}, {&m, "m"}, {&v, "v"}, {&am, "absmax_m"}, {&av, "absmax_v"}});
  const fusekit::tools::SteadySeconds steady = call.steady();
  char shape[128];
  std::snprintf(shape, sizeof shape, "[%lld, %lld] %s%s", static_cast<long long>(rows),
                static_cast<long long>(cols), dtype.c_str(), fp8 ? (" " + format).c_str() : "");
  fusekit::tools::write_run_stats(dir, call, first, steady, bytes, "GB/s", shape, warning);
  for (auto *t : {&var, &grad, &m, &v, &qm, &qv, &am, &av, &step}) {
    fusekit::tools::release(*t);
  }
  fusekit::tools::finish_acl(stream);
  return 0;
}
