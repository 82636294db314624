// The ApplyAdamWQuant op runner of the golden flow: reads <dir>/input/*.bin and <dir>/params.txt,
// runs aclnnApplyAdamWQuant on "device" memory from aclrtMalloc(HUGE_FIRST), writes
// <dir>/output/*.bin (var, m, v, absmax_m, absmax_v) and its time.
#include <cstdio>
#include <string>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_apply_adam_w_quant.h"
#include "bin_io.h"

using fusekit::tools::die;

using fusekit::tools::DeviceTensor;
using fusekit::tools::upload;

int main(int argc, char **argv) {
  if (argc != 2) die("usage: run_apply_adam_w_quant <dir>");
  const std::string dir = argv[1];
  fusekit::tools::Params p(dir + "/params.txt");
  const int64_t rows = p.integer("rows"), cols = p.integer("cols"), n = rows * cols;
  const int64_t blocks = (n + 255) / 256;
  const std::string dtype = p.str("dtype");
  const aclDataType dt = dtype == "float16"    ? ACL_FLOAT16
                         : dtype == "bfloat16" ? ACL_BF16
                                               : ACL_FLOAT;
  const double elem = dtype == "float32" ? 4.0 : 2.0;
  aclrtStream stream = fusekit::tools::start_acl();

  auto in = [&](const char *name) {
    return fusekit::tools::read_bin(dir + "/input/" + name + ".bin");
  };
  DeviceTensor var = upload(in("var"), {rows, cols}, dt);
  DeviceTensor grad = upload(in("grad"), {rows, cols}, dt);
  DeviceTensor m = upload(in("m"), {rows, cols}, ACL_UINT8);
  DeviceTensor v = upload(in("v"), {rows, cols}, ACL_UINT8);
  DeviceTensor qm = upload(in("qmap_m"), {256}, ACL_FLOAT);
  DeviceTensor qv = upload(in("qmap_v"), {256}, ACL_FLOAT);
  DeviceTensor am = upload(in("absmax_m"), {blocks}, ACL_FLOAT);
  DeviceTensor av = upload(in("absmax_v"), {blocks}, ACL_FLOAT);
  DeviceTensor step = upload(in("step"), {1}, ACL_INT64);

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
