// Same-process A/B timing of two builds of libfusekit for one ApplyAdamWQuant step.
//
//   build/benchmarks/ab_apply_adam_w_quant A.so B.so [elements=1048576] [steps=41] [linspace=0]
//
// On a shared 2-core VM two runs of one binary differ by up to 1.5x, so two library builds timed
// in separate processes cannot be told apart by a few percent. This program loads both builds
// (copies of libfusekit.so.0.1.0, by path) with dlopen(RTLD_DEEPBIND: each copy calls its own
// functions, not the first copy's), keeps a separate set of tensors for each, and alternates one
// single-thread step of A with one of B, so that both see the same machine state. It prints the
// minimum, first quartile and median ns per element of each (the first step is warm-up), their
// ratios, and whether both end with the same bits (var, codes and absmax after every step).
#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fusekit/apply_adam_w_quant.h"

namespace {

using fusekit::DType;
using fusekit::Status;
using fusekit::TensorView;

// fusekit::apply_adam_w_quant_step and fusekit::create_dynamic_map, by their mangled names.
using StepFn = Status (*)(const TensorView &, const TensorView &, const TensorView &,
                          const TensorView &, const TensorView &, const TensorView &,
                          const TensorView &, const TensorView &, int64_t,
                          const fusekit::ApplyAdamWQuantOptions &, fusekit::ApplyAdamWQuantStats *);
constexpr const char *kStepSymbol =
    "_ZN7fusekit23apply_adam_w_quant_stepERKNS_10TensorViewES2_S2_S2_S2_S2_S2_S2_lRKNS_"
    "22ApplyAdamWQuantOptionsEPNS_20ApplyAdamWQuantStatsE";

struct State {
  int64_t n, blocks;
  std::vector<float> var, grad, absmax_m, absmax_v;
  std::vector<uint8_t> m, v;
  std::array<float, 256> qm, qv;

  State(int64_t elements, bool linspace)
      : n(elements),
        blocks((elements + 255) / 256),
        var(n),
        grad(n),
        absmax_m(blocks, 0.01f),
        absmax_v(blocks, 1e-4f),
        m(n),
        v(n) {
    uint64_t x = 88172645463325252ull;
    const auto next = [&] {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      return x;
    };
    const auto uniform = [&] {
      return static_cast<float>(static_cast<double>(next() >> 40) / 8388608.0 - 1.0);
    };
    for (int64_t i = 0; i < n; ++i) {
      var[i] = uniform();
      grad[i] = 0.01f * uniform();
      m[i] = static_cast<uint8_t>(next() >> 56);
      v[i] = static_cast<uint8_t>(next() >> 56);
    }
    qm = fusekit::create_dynamic_map(true);
    qv = fusekit::create_dynamic_map(false);
    if (linspace) {
      for (int i = 0; i < 256; ++i) {
        qm[i] = -1.0f + 2.0f * static_cast<float>(i) / 255.0f;
        qv[i] = static_cast<float>(i) / 255.0f;
      }
    }
  }

  Status step(StepFn fn, int64_t t) {
    fusekit::ApplyAdamWQuantOptions o;
    o.weight_decay = 0.01;
    o.num_threads = 1;
    const auto flat = [](void *p, DType d, const int64_t *len) {
      return TensorView::contiguous(p, d, len, 1);
    };
    return fn(flat(var.data(), DType::kFloat32, &n), flat(grad.data(), DType::kFloat32, &n),
              flat(m.data(), DType::kUInt8, &n), flat(v.data(), DType::kUInt8, &n),
              TensorView::of(qm.data(), {256}), TensorView::of(qv.data(), {256}),
              flat(absmax_m.data(), DType::kFloat32, &blocks),
              flat(absmax_v.data(), DType::kFloat32, &blocks), t, o, nullptr);
  }

  bool same_bits(const State &o) const {
    return var == o.var && m == o.m && v == o.v && absmax_m == o.absmax_m && absmax_v == o.absmax_v;
  }
};

StepFn load(const char *path) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (h == nullptr) {
    std::fprintf(stderr, "dlopen(%s): %s\n", path, dlerror());
    std::exit(2);
  }
  auto *fn = reinterpret_cast<StepFn>(dlsym(h, kStepSymbol));
  if (fn == nullptr) {
    std::fprintf(stderr, "%s has no fusekit::apply_adam_w_quant_step\n", path);
    std::exit(2);
  }
  return fn;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s A.so B.so [elements] [steps] [linspace 0|1]\n", argv[0]);
    return 2;
  }
  const int64_t n = argc > 3 ? std::atoll(argv[3]) : int64_t{1} << 20;
  const int steps = argc > 4 ? std::atoi(argv[4]) : 41;
  const bool linspace = argc > 5 && std::atoi(argv[5]) == 1;
  const StepFn fn[2] = {load(argv[1]), load(argv[2])};
  State state[2] = {State(n, linspace), State(n, linspace)};
  std::vector<double> ns[2];
  for (int t = 0; t < steps; ++t) {
    for (int k = 0; k < 2; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      const Status st = state[k].step(fn[k], t);
      const std::chrono::duration<double, std::nano> dt = std::chrono::steady_clock::now() - t0;
      if (!st.ok()) {
        std::fprintf(stderr, "%s: %s\n", argv[1 + k], st.message().c_str());
        return 1;
      }
      if (t > 0) ns[k].push_back(dt.count() / static_cast<double>(n));
    }
  }
  double q[2][3];
  for (int k = 0; k < 2; ++k) {
    std::sort(ns[k].begin(), ns[k].end());
    q[k][0] = ns[k].front(), q[k][1] = ns[k][ns[k].size() / 4], q[k][2] = ns[k][ns[k].size() / 2];
    std::printf("%s: min %.3f  q25 %.3f  median %.3f ns/element\n", k == 0 ? "A" : "B", q[k][0],
                q[k][1], q[k][2]);
  }
  std::printf("B/A: min %.3f  q25 %.3f  median %.3f   %s\n", q[1][0] / q[0][0], q[1][1] / q[0][1],
              q[1][2] / q[0][2], state[0].same_bits(state[1]) ? "same bits" : "DIFFERENT BITS");
  return 0;
}
