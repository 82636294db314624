// The LazyAdam op runner of the golden flow: reads <dir>/input/*.bin and <dir>/params.txt, runs
// aclnnLazyAdam on "device" memory from aclrtMalloc(HUGE_FIRST), writes <dir>/output/*.bin.
#include <cstdio>
#include <string>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_lazy_adam.h"
#include "bin_io.h"

using fusekit::tools::die;

using fusekit::tools::DeviceTensor;
using fusekit::tools::upload;

int main(int argc, char **argv) {
  if (argc != 2) die("usage: run_lazy_adam <dir>");
  const std::string dir = argv[1];
  fusekit::tools::Params p(dir + "/params.txt");
  const int64_t rows = p.integer("rows"), n = p.integer("n"), dim = p.integer("dim");
  aclrtStream stream = fusekit::tools::start_acl();

  DeviceTensor grad =
      upload(fusekit::tools::read_bin(dir + "/input/gradient.bin"), {n, dim}, ACL_FLOAT);
  DeviceTensor idx = upload(fusekit::tools::read_bin(dir + "/input/indices.bin"), {n}, ACL_INT32);
  DeviceTensor m =
      upload(fusekit::tools::read_bin(dir + "/input/inputM.bin"), {rows, dim}, ACL_FLOAT);
  DeviceTensor v =
      upload(fusekit::tools::read_bin(dir + "/input/inputV.bin"), {rows, dim}, ACL_FLOAT);
  DeviceTensor var =
      upload(fusekit::tools::read_bin(dir + "/input/inputVar.bin"), {rows, dim}, ACL_FLOAT);
  DeviceTensor lr = upload(fusekit::tools::read_bin(dir + "/input/lr.bin"), {1}, ACL_FLOAT);

  // One call (tools/bin_io.h): the first one's outputs are checked; the steady time comes from
  // repeated calls after they are written.
  fusekit::tools::OpCall call(
      stream,
      [&](uint64_t *ws_size, aclOpExecutor **executor) {
        return aclnnLazyAdamGetWorkspaceSize(grad.tensor, idx.tensor, m.tensor, v.tensor,
                                             var.tensor, lr.tensor, p.num("beta1"), p.num("beta2"),
                                             p.num("epsilon"), ws_size, executor);
      },
      aclnnLazyAdam);
  const fusekit::tools::CallSeconds first = call();

  const double bytes = static_cast<double>(n) * (28.0 * static_cast<double>(dim) + 4.0);
  fusekit::tools::write_outputs(dir, {{&m, "inputM"}, {&v, "inputV"}, {&var, "inputVar"}});
  const fusekit::tools::SteadySeconds steady = call.steady();
  fusekit::tools::write_run_stats(
      dir, call, first, steady, bytes, "GB/s",
      "R=" + std::to_string(rows) + " N=" + std::to_string(n) + " D=" + std::to_string(dim));
  for (auto *t : {&grad, &idx, &m, &v, &var, &lr}) {
    fusekit::tools::release(*t);
  }
  fusekit::tools::finish_acl(stream);
  return 0;
}
