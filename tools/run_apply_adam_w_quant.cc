// The ApplyAdamWQuant op runner of the golden flow: reads <dir>/input/*.bin and <dir>/params.txt,
// runs aclnnApplyAdamWQuant on "device" memory from aclrtMalloc(HUGE_FIRST), writes
// <dir>/output/*.bin (var, m, v, absmax_m, absmax_v) and its time.
#include <cstdio>
#include <string>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_apply_adam_w_quant.h"
#include "bin_io.h"

using fusekit::tools::DeviceTensor;

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

  DeviceTensor var = run.input("var", {rows, cols}, dt);
  DeviceTensor grad = run.input("grad", {rows, cols}, dt);
  DeviceTensor m = run.input("m", {rows, cols}, ACL_UINT8);
  DeviceTensor v = run.input("v", {rows, cols}, ACL_UINT8);
  DeviceTensor qm = run.input("qmap_m", {256}, ACL_FLOAT);
  DeviceTensor qv = run.input("qmap_v", {256}, ACL_FLOAT);
  DeviceTensor am = run.input("absmax_m", {blocks}, ACL_FLOAT);
  DeviceTensor av = run.input("absmax_v", {blocks}, ACL_FLOAT);
  DeviceTensor step = run.input("step", {1}, ACL_INT64);

  char mode[] = "BLOCKWISE";
  // One call (tools/bin_io.h): the first one's outputs are checked; the steady time comes from
  // repeated calls after they are written.
  fusekit::tools::OpCall call(
      stream,
      [&](uint64_t *ws_size, aclOpExecutor **executor) {
        return aclnnApplyAdamWQuantGetWorkspaceSize(
            var.tensor, grad.tensor, m.tensor, v.tensor, qm.tensor, qv.tensor, am.tensor, av.tensor,
            step.tensor, p.num("lr"), p.num("beta1"), p.num("beta2"), p.num("weight_decay"),
            p.num("eps"), p.num("gnorm_scale"), mode, 256, ws_size, executor);
      },
      aclnnApplyAdamWQuant);
  const fusekit::tools::CallSeconds first = call();
  const std::string warning = aclGetRecentErrMsg();  // the skipped-block count, if any

  const double bytes = static_cast<double>(n) * (3.0 * elem + 4.0);  // var r+w, grad r, m and v r+w
  fusekit::tools::write_outputs(
      dir, {{&var, "var"}, {&m, "m"}, {&v, "v"}, {&am, "absmax_m"}, {&av, "absmax_v"}});
  const fusekit::tools::SteadySeconds steady = call.steady();
  char shape[128];
  std::snprintf(shape, sizeof shape, "[%lld, %lld] %s", static_cast<long long>(rows),
                static_cast<long long>(cols), dtype.c_str());
  fusekit::tools::write_run_stats(dir, call, first, steady, bytes, "GB/s", shape, warning);
  for (auto *t : {&var, &grad, &m, &v, &qm, &qv, &am, &av, &step}) {
    fusekit::tools::release(*t);
  }
  fusekit::tools::finish_acl(stream);
  return 0;
}
