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
using fusekit::tools::download;
using fusekit::tools::upload;

int main(int argc, char **argv) {
  if (argc != 2) die("usage: run_lazy_adam <dir>");
  const std::string dir = argv[1];
  fusekit::tools::Params p(dir + "/params.txt");
  const int64_t rows = p.integer("rows"), n = p.integer("n"), dim = p.integer("dim");
  if (aclInit(nullptr) != ACL_SUCCESS || aclrtSetDevice(0) != ACL_SUCCESS) die("acl init failed");
  aclrtStream stream = nullptr;
  if (aclrtCreateStream(&stream) != ACL_SUCCESS) die(aclGetRecentErrMsg());

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
  for (auto *t : {&m, &v, &var}) {
    std::vector<char> host(t->bytes);
    aclrtMemcpy(host.data(), host.size(), t->ptr, t->bytes, ACL_MEMCPY_DEVICE_TO_HOST);
    const char *name = t == &m ? "inputM" : t == &v ? "inputV" : "inputVar";
    fusekit::tools::write_bin(dir + "/output/" + name + ".bin", host.data(), host.size());
  }
  const fusekit::tools::SteadySeconds steady = call.steady();
  const double run_s = steady.median;
  char time_ms[32], rate[32], plan_ms[32];
  std::snprintf(time_ms, sizeof time_ms, "%.2f", run_s * 1e3);
  std::snprintf(plan_ms, sizeof plan_ms, "%.3f", first.phase_one * 1e3);
  std::snprintf(rate, sizeof rate, "%.2f GB/s", bytes / run_s * 1e-9);
  fusekit::tools::write_stats(dir, {{"time_ms", time_ms},
                                    {"first_call_ms", fusekit::tools::ms(first.run)},
                                    {"steady_runs", std::to_string(steady.runs)},
                                    {"phase_one_ms", plan_ms},
                                    {"rate", rate},
                                    {"shape", "R=" + std::to_string(rows) + " N=" +
                                                  std::to_string(n) + " D=" + std::to_string(dim)},
                                    {"workspace_bytes", std::to_string(call.workspace_size())}});
  for (auto *t : {&grad, &idx, &m, &v, &var, &lr}) {
    fusekit::tools::release(*t);
  }
  aclrtDestroyStream(stream);
  aclrtResetDevice(0);
  aclFinalize();
  return 0;
}
