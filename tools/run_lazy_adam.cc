// The LazyAdam op runner of the golden flow: reads <dir>/input/*.bin and <dir>/params.txt, runs
// aclnnLazyAdam on "device" memory from aclrtMalloc(HUGE_FIRST), writes <dir>/output/*.bin.
#include <cstdio>
#include <string>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_lazy_adam.h"
#include "bin_io.h"

using fusekit::tools::DeviceTensor;

int main(int argc, char **argv) {
  const fusekit::tools::Runner run(argc, argv, "run_lazy_adam");
  const std::string &dir = run.dir;
  const fusekit::tools::Params &p = run.params;
  const int64_t rows = p.integer("rows"), n = p.integer("n"), dim = p.integer("dim");
  aclrtStream stream = run.stream;

  DeviceTensor grad = run.input("gradient", {n, dim}, ACL_FLOAT);
  DeviceTensor idx = run.input("indices", {n}, ACL_INT32);
  DeviceTensor m = run.input("inputM", {rows, dim}, ACL_FLOAT);
  DeviceTensor v = run.input("inputV", {rows, dim}, ACL_FLOAT);
  DeviceTensor var = run.input("inputVar", {rows, dim}, ACL_FLOAT);
  DeviceTensor lr = run.input("lr", {1}, ACL_FLOAT);

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
