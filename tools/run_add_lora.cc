// The AddLora op runner of the golden flow: reads <dir>/input/*.bin and <dir>/params.txt, runs
// aclnnAddLora on "device" memory from aclrtMalloc(HUGE_FIRST) with out a separate tensor, writes
// <dir>/output/out.bin and <dir>/output/y.bin (which must come back unchanged).
#include <cstdio>
#include <string>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_add_lora.h"
#include "bin_io.h"

using fusekit::tools::DeviceTensor;
using fusekit::tools::upload;

int main(int argc, char **argv) {
  const fusekit::tools::Runner run(argc, argv, "run_add_lora");
  const std::string &dir = run.dir;
  const fusekit::tools::Params &p = run.params;
  const int64_t B = p.integer("B"), H1 = p.integer("H1"), H2 = p.integer("H2"),
                H3 = p.integer("H3");
  const int64_t R = p.integer("R"), W = p.integer("W"), L = p.integer("L");
  const std::string dtype = p.str("dtype");
  const aclDataType dt = fusekit::tools::acl_dtype_named(dtype);
  const size_t es = dt == ACL_FLOAT ? 4 : 2;
  aclrtStream stream = run.stream;

  DeviceTensor x = run.input("x", {B, H1}, dt);
  DeviceTensor y = run.input("y", {B, H3}, dt);
  DeviceTensor wa = run.input("weightA", {W, L, R, H1}, dt);
  DeviceTensor wb = run.input("weightB", {W, L, H2, R}, dt);
  DeviceTensor idx = run.input("indices", {B}, ACL_INT32);
  DeviceTensor out =
      upload(std::vector<char>(static_cast<size_t>(B * H3) * es, static_cast<char>(0xff)), {B, H3},
             dt);  // NaN everywhere: an unwritten element fails the check

  // One call (tools/bin_io.h): the first one's outputs are checked; the steady time comes from
  // repeated calls after they are written.
  fusekit::tools::OpCall call(
      stream,
      [&](uint64_t *ws_size, aclOpExecutor **executor) {
        return aclnnAddLoraGetWorkspaceSize(
            y.tensor, x.tensor, wb.tensor, idx.tensor, wa.tensor, p.integer("layer"),
            p.num("scale"), p.integer("y_offset"), -1, out.tensor, ws_size, executor);
      },
      aclnnAddLora);
  const fusekit::tools::CallSeconds first = call();

  fusekit::tools::write_outputs(dir, {{&out, "out"}, {&y, "y"}});
  const double flops =
      2.0 * static_cast<double>(B) * static_cast<double>(R) * static_cast<double>(H1 + H2);
  const fusekit::tools::SteadySeconds steady = call.steady();
  fusekit::tools::write_run_stats(dir, call, first, steady, flops, "GFLOP/s",
                                  "B=" + std::to_string(B) + " H1=" + std::to_string(H1) +
                                      " H2=" + std::to_string(H2) + " R=" + std::to_string(R) +
                                      " W=" + std::to_string(W) + " " + dtype);
  for (auto *t : {&x, &y, &wa, &wb, &idx, &out}) {
    fusekit::tools::release(*t);
  }
  fusekit::tools::finish_acl(stream);
  return 0;
}
