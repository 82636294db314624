// The EmbeddingBagLazyAdamQuant op runner of the golden flow: reads <dir>/input/*.bin and
// <dir>/params.txt (state_format: dynamic_map or fp8; guard_lost_v), runs the operator through its
// C++ API (it has no aclnn face) on "device" memory from aclrtMalloc(HUGE_FIRST), checks the rows
// updated and skipped against the golden's, writes <dir>/output/*.bin and the steady time.
#include <cstdio>
#include <string>

#include "acl/acl.h"
#include "bin_io.h"
#include "fusekit/embedding_bag_lazy_adam_quant.h"

using fusekit::tools::DeviceTensor;

int main(int argc, char **argv) {
  const fusekit::tools::Runner run(argc, argv, "run_embedding_bag_lazy_adam_quant");
  const std::string &dir = run.dir;
  const fusekit::tools::Params &p = run.params;
  const int64_t rows = p.integer("rows"), dim = p.integer("dim"), bags = p.integer("bags"),
                lookups = p.integer("lookups"), blocks = (dim + 255) / 256;
  const bool weighted = p.integer("weighted") != 0;
  const bool fp8 = p.str("state_format") == "fp8";
  if (!fp8 && p.str("state_format") != "dynamic_map") {
    fusekit::tools::die("state_format = " + p.str("state_format") +
                        ": expected dynamic_map or fp8");
  }

  DeviceTensor grad = run.input("grad_output", {bags, dim}, ACL_FLOAT);
  DeviceTensor idx = run.input("indices", {lookups}, ACL_INT64);
  DeviceTensor off = run.input("offsets", {bags + 1}, ACL_INT64);
  DeviceTensor m = run.input("m", {rows, dim}, ACL_UINT8);
  DeviceTensor v = run.input("v", {rows, dim}, ACL_UINT8);
  DeviceTensor var = run.input("var", {rows, dim}, ACL_FLOAT);
  DeviceTensor am = run.input("absmax_m", {rows, blocks}, ACL_FLOAT);
  DeviceTensor av = run.input("absmax_v", {rows, blocks}, ACL_FLOAT);
  DeviceTensor w;
  if (weighted) w = run.input("per_sample_weights", {lookups}, ACL_FLOAT);

  using fusekit::DType;
  using fusekit::TensorView;
  // The golden's maps are bitsandbytes' dynamic maps, which fusekit makes the same way.
  const auto qmap_m = fusekit::create_dynamic_map(true),
             qmap_v = fusekit::create_dynamic_map(false);
  fusekit::EmbeddingBagLazyAdamQuantTensors t;
  t.grad_output = TensorView::contiguous(grad.ptr, DType::kFloat32, {bags, dim});
  t.indices = TensorView::contiguous(idx.ptr, DType::kInt64, {lookups});
  t.offsets = TensorView::contiguous(off.ptr, DType::kInt64, {bags + 1});
  if (weighted) t.per_sample_weights = TensorView::contiguous(w.ptr, DType::kFloat32, {lookups});
  t.m = TensorView::contiguous(m.ptr, DType::kUInt8, {rows, dim});
  t.v = TensorView::contiguous(v.ptr, DType::kUInt8, {rows, dim});
  t.var = TensorView::contiguous(var.ptr, DType::kFloat32, {rows, dim});
  t.qmap_m = TensorView::of(qmap_m.data(), {fp8 ? 0 : 256});
  t.qmap_v = TensorView::of(qmap_v.data(), {fp8 ? 0 : 256});
  t.absmax_m = TensorView::contiguous(am.ptr, DType::kFloat32, {rows, blocks});
  t.absmax_v = TensorView::contiguous(av.ptr, DType::kFloat32, {rows, blocks});
  fusekit::EmbeddingBagLazyAdamQuantOptions o;
  o.beta1 = p.num("beta1");
  o.beta2 = p.num("beta2");
  o.epsilon = p.num("epsilon");
  o.pooling = p.str("mode") == "mean" ? fusekit::PoolingMode::kMean : fusekit::PoolingMode::kSum;
  o.state_format = fp8 ? fusekit::QuantStateFormat::kFp8 : fusekit::QuantStateFormat::kDynamicMap;
  o.guard_lost_v = p.integer("guard_lost_v") != 0;
  const auto lr = static_cast<float>(p.num("lr"));

  // One call (tools/bin_io.h): the plan of these tensors as phase one, the run as phase two.
  fusekit::EmbeddingBagLazyAdamQuant plan;
  fusekit::EmbeddingBagLazyAdamQuantStats stats;
  fusekit::tools::OpCall call(
      [&](uint64_t *ws_size) {
        const fusekit::Status s = fusekit::EmbeddingBagLazyAdamQuant::plan(t, o, &plan);
        *ws_size = plan.workspace_size(t);
        return s;
      },
      [&](void *ws, uint64_t ws_size) {
        return plan.run(t, {.lr = lr, .lr_tensor = {}}, ws, ws_size, &stats);
      });
  const fusekit::tools::CallSeconds first = call();
  if (stats.rows_updated != p.integer("rows_updated") ||
      stats.rows_skipped_nonfinite != p.integer("rows_skipped")) {
    fusekit::tools::die("rows updated / skipped " + std::to_string(stats.rows_updated) + " / " +
                        std::to_string(stats.rows_skipped_nonfinite) + ", the golden's " +
                        p.str("rows_updated") + " / " + p.str("rows_skipped"));
  }
  fusekit::tools::write_outputs(
      dir, {{&m, "m"}, {&v, "v"}, {&var, "var"}, {&am, "absmax_m"}, {&av, "absmax_v"}});
  // Bytes: per updated row var read and written, both code rows and both scale rows read and
  // written; grad_output, ids, offsets, weights read.
  const double d = static_cast<double>(dim);
  const double bytes = static_cast<double>(stats.rows_updated) *
                           (8.0 * d + 4.0 * d + 16.0 * static_cast<double>(blocks)) +
                       static_cast<double>(bags) * 4.0 * d +
                       static_cast<double>(lookups) * (weighted ? 12.0 : 8.0) +
                       static_cast<double>(bags + 1) * 8.0;
  const fusekit::tools::SteadySeconds steady = call.steady();
  char shape[160];
  std::snprintf(shape, sizeof shape, "R=%lld D=%lld B=%lld L=%lld %s%s %s",
                static_cast<long long>(rows), static_cast<long long>(dim),
                static_cast<long long>(bags), static_cast<long long>(lookups),
                p.str("mode").c_str(), weighted ? " weighted" : "", fp8 ? "fp8" : "dynamic_map");
  fusekit::tools::write_run_stats(dir, call, first, steady, bytes, "GB/s", shape);
  for (auto *x : {&grad, &idx, &off, &m, &v, &var, &am, &av}) fusekit::tools::release(*x);
  if (weighted) fusekit::tools::release(w);
  fusekit::tools::finish_acl(run.stream);
  return 0;
}
