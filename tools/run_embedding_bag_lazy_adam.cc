// The EmbeddingBagLazyAdam op runner of the golden flow: reads <dir>/input/*.bin and
// <dir>/params.txt, runs the operator through its C++ API (it has no aclnn face: CANN has no such
// operator) on "device" memory from aclrtMalloc(HUGE_FIRST), writes <dir>/output/*.bin.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "acl/acl.h"
#include "bin_io.h"
#include "fusekit/embedding_bag_lazy_adam.h"

using fusekit::tools::DeviceTensor;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char **argv) {
  const fusekit::tools::Runner run(argc, argv, "run_embedding_bag_lazy_adam");
  const std::string &dir = run.dir;
  const fusekit::tools::Params &p = run.params;
  const int64_t rows = p.integer("rows"), dim = p.integer("dim"), bags = p.integer("bags"),
                lookups = p.integer("lookups");
  const bool weighted = p.integer("weighted") != 0;

  DeviceTensor grad = run.input("grad_output", {bags, dim}, ACL_FLOAT);
  DeviceTensor idx = run.input("indices", {lookups}, ACL_INT64);
  DeviceTensor off = run.input("offsets", {bags + 1}, ACL_INT64);
  DeviceTensor m = run.input("m", {rows, dim}, ACL_FLOAT);
  DeviceTensor v = run.input("v", {rows, dim}, ACL_FLOAT);
  DeviceTensor var = run.input("var", {rows, dim}, ACL_FLOAT);
  DeviceTensor w;
  if (weighted) w = run.input("per_sample_weights", {lookups}, ACL_FLOAT);

  using fusekit::TensorView;
  fusekit::EmbeddingBagLazyAdamTensors t;
  t.grad_output = TensorView::of(static_cast<float *>(grad.ptr), {bags, dim});
  t.indices = TensorView::of(static_cast<int64_t *>(idx.ptr), {lookups});
  t.offsets = TensorView::of(static_cast<int64_t *>(off.ptr), {bags + 1});
  if (weighted) t.per_sample_weights = TensorView::of(static_cast<float *>(w.ptr), {lookups});
  t.m = TensorView::of(static_cast<float *>(m.ptr), {rows, dim});
  t.v = TensorView::of(static_cast<float *>(v.ptr), {rows, dim});
  t.var = TensorView::of(static_cast<float *>(var.ptr), {rows, dim});
  fusekit::EmbeddingBagLazyAdamOptions o;
  o.beta1 = p.num("beta1");
  o.beta2 = p.num("beta2");
  o.epsilon = p.num("epsilon");
  o.pooling = p.str("mode") == "mean" ? fusekit::PoolingMode::kMean : fusekit::PoolingMode::kSum;
  const auto lr = static_cast<float>(p.num("lr"));

  // Problem and plan (timed as phase one), then the checked first run.
  auto t0 = std::chrono::steady_clock::now();
  fusekit::EmbeddingBagLazyAdamProblem problem;
  fusekit::EmbeddingBagLazyAdam plan;
  fusekit::Status s = fusekit::EmbeddingBagLazyAdamProblem::make(t, o, &problem);
  if (s.ok()) s = fusekit::EmbeddingBagLazyAdam::plan(problem, o, &plan);
  if (!s.ok()) fusekit::tools::die(s.message());
  const double phase_one = seconds_since(t0);
  std::vector<char> ws(plan.workspace_size(t));
  fusekit::EmbeddingBagLazyAdamStats stats;
  t0 = std::chrono::steady_clock::now();
  s = plan.run(t, {.lr = lr, .lr_tensor = {}}, ws.data(), ws.size(), &stats);
  const double first = seconds_since(t0);
  if (!s.ok()) fusekit::tools::die(s.message());
  if (stats.rows_updated != p.integer("rows_updated") ||
      stats.rows_skipped_nonfinite != p.integer("rows_skipped")) {
    fusekit::tools::die("rows updated / skipped " + std::to_string(stats.rows_updated) + " / " +
                        std::to_string(stats.rows_skipped_nonfinite) + ", the golden's " +
                        p.str("rows_updated") + " / " + p.str("rows_skipped"));
  }
  fusekit::tools::write_outputs(dir, {{&m, "m"}, {&v, "v"}, {&var, "var"}});

  // The steady time: a warm-up, then at least 5 runs and 0.5 s (at most 25), on the same buffers.
  (void)plan.run(t, {.lr = lr, .lr_tensor = {}}, ws.data(), ws.size());
  std::vector<double> times;
  const auto start = std::chrono::steady_clock::now();
  while (times.size() < 25 && (times.size() < 5 || seconds_since(start) < 0.5)) {
    t0 = std::chrono::steady_clock::now();
    (void)plan.run(t, {.lr = lr, .lr_tensor = {}}, ws.data(), ws.size());
    times.push_back(seconds_since(t0));
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  // Bytes: m, v, var of each updated row read and written, grad_output, ids, offsets, weights.
  const double bytes = static_cast<double>(stats.rows_updated) * 24.0 * static_cast<double>(dim) +
                       static_cast<double>(bags) * 4.0 * static_cast<double>(dim) +
                       static_cast<double>(lookups) * (weighted ? 12.0 : 8.0) +
                       static_cast<double>(bags + 1) * 8.0;
  char time_ms[32], rate[48], plan_ms[32], first_ms[32];
  std::snprintf(time_ms, sizeof time_ms, "%.2f", median * 1e3);
  std::snprintf(first_ms, sizeof first_ms, "%.2f", first * 1e3);
  std::snprintf(plan_ms, sizeof plan_ms, "%.3f", phase_one * 1e3);
  std::snprintf(rate, sizeof rate, "%.2f GB/s", bytes / median * 1e-9);
  fusekit::tools::write_stats(
      dir, {{"time_ms", time_ms},
            {"first_call_ms", first_ms},
            {"steady_runs", std::to_string(times.size())},
            {"phase_one_ms", plan_ms},
            {"rate", rate},
            {"shape", "R=" + std::to_string(rows) + " D=" + std::to_string(dim) +
                          " B=" + std::to_string(bags) + " L=" + std::to_string(lookups) + " " +
                          p.str("mode") + (weighted ? " weighted" : "")},
            {"workspace_bytes", std::to_string(ws.size())}});
  for (auto *x : {&grad, &idx, &off, &m, &v, &var}) fusekit::tools::release(*x);
  if (weighted) fusekit::tools::release(w);
  fusekit::tools::finish_acl(run.stream);
  return 0;
}
