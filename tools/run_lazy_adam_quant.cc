// The LazyAdamQuant op runner of the golden flow: reads <dir>/input/*.bin and <dir>/params.txt,
// runs aclnnLazyAdamQuant on "device" memory from aclrtMalloc(HUGE_FIRST), writes
// <dir>/output/*.bin (inputM, inputV, inputVar, absmaxM, absmaxV) and its time.
#include <cstdio>
#include <string>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_lazy_adam_quant.h"
#include "bin_io.h"

using fusekit::tools::DeviceTensor;

namespace {}  // namespace

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
  DeviceTensor qm = run.input("qmapM", {256}, ACL_FLOAT);
  DeviceTensor qv = run.input("qmapV", {256}, ACL_FLOAT);
  DeviceTensor am = run.input("absmaxM", {rows, blocks}, ACL_FLOAT);
  DeviceTensor av = run.input("absmaxV", {rows, blocks}, ACL_FLOAT);
  DeviceTensor lr = run.input("lr", {1}, ACL_FLOAT);

  // One call (tools/bin_io.h): the first one's outputs are checked; the steady time comes from
  // repeated calls after they are written.
  fusekit::tools::OpCall call(
      stream,
      [&](uint64_t *ws_size, aclOpExecutor **executor) {
        return aclnnLazyAdamQuantGetWorkspaceSize(
            grad.tensor, idx.tensor, m.tensor, v.tensor, var.tensor, qm.tensor, qv.tensor,
            am.tensor, av.tensor, lr.tensor, p.num("beta1"), p.num("beta2"), p.num("epsilon"),
            ws_size, executor);
      },
      aclnnLazyAdamQuant);
  const fusekit::tools::CallSeconds first = call();
  const std::string warning = aclGetRecentErrMsg();  // the skipped-row count, if any

  // Per index: the index, the gradient row read; var, both code rows and both absmax rows read and
  // written.
  const double d = static_cast<double>(dim), b = static_cast<double>(blocks);
  const double bytes = static_cast<double>(n) * (4.0 + d * gs + 2.0 * d * es + 4.0 * d + 16.0 * b);
  fusekit::tools::write_outputs(
      dir,
      {{&m, "inputM"}, {&v, "inputV"}, {&var, "inputVar"}, {&am, "absmaxM"}, {&av, "absmaxV"}});
  const fusekit::tools::SteadySeconds steady = call.steady();
  char shape[128];
  std::snprintf(shape, sizeof shape, "R=%lld N=%lld D=%lld %s", static_cast<long long>(rows),
                static_cast<long long>(n), static_cast<long long>(dim), dtype.c_str());
  fusekit::tools::write_run_stats(dir, call, first, steady, bytes, "GB/s", shape, warning);
  for (auto *t : {&grad, &idx, &m, &v, &var, &qm, &qv, &am, &av, &lr}) {
    fusekit::tools::release(*t);
  }
  fusekit::tools::finish_acl(stream);
  return 0;
}
