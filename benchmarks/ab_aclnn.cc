// Same-process A/B timing of two builds of libfusekit through the aclnn face, with the library's
// default threads: AddLora decode and prefill, LazyAdam at the seed shape, ApplyAdamWQuant on 16M
// float32 elements.
//
//   build/benchmarks/ab_aclnn A.so B.so [steps=31]
//
// The aclnn C API is the same in every build, so A may be any older build of the library (a copy
// of its libfusekit.so.0.1.0). Both are loaded with dlopen(RTLD_DEEPBIND: each copy calls its own
// functions), each has its own aclTensor handles over one set of buffers, and the program
// alternates one call of A with one of B (phase one and phase two, as a user makes them), so that
// both see the same machine state. Prints the median and first quartile of each and B / A.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_add_lora.h"
#include "aclnnop/aclnn_apply_adam_w_quant.h"
#include "aclnnop/aclnn_lazy_adam.h"

namespace {

struct Lib {
  decltype(&aclCreateTensor) create;
  decltype(&aclDestroyTensor) destroy;
  decltype(&aclnnLazyAdamGetWorkspaceSize) lazy_adam_ws;
  decltype(&aclnnLazyAdam) lazy_adam;
  decltype(&aclnnAddLoraGetWorkspaceSize) add_lora_ws;
  decltype(&aclnnAddLora) add_lora;
  decltype(&aclnnApplyAdamWQuantGetWorkspaceSize) awq_ws;
  decltype(&aclnnApplyAdamWQuant) awq;

  explicit Lib(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (h == nullptr) {
      std::fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
      std::exit(2);
    }
    auto sym = [&](const char *name) {
      void *p = dlsym(h, name);
      if (p == nullptr) {
        std::fprintf(stderr, "%s: no %s\n", path, name);
        std::exit(2);
      }
      return p;
    };
    create = reinterpret_cast<decltype(create)>(sym("aclCreateTensor"));
    destroy = reinterpret_cast<decltype(destroy)>(sym("aclDestroyTensor"));
    lazy_adam_ws = reinterpret_cast<decltype(lazy_adam_ws)>(sym("aclnnLazyAdamGetWorkspaceSize"));
    lazy_adam = reinterpret_cast<decltype(lazy_adam)>(sym("aclnnLazyAdam"));
    add_lora_ws = reinterpret_cast<decltype(add_lora_ws)>(sym("aclnnAddLoraGetWorkspaceSize"));
    add_lora = reinterpret_cast<decltype(add_lora)>(sym("aclnnAddLora"));
    awq_ws = reinterpret_cast<decltype(awq_ws)>(sym("aclnnApplyAdamWQuantGetWorkspaceSize"));
    awq = reinterpret_cast<decltype(awq)>(sym("aclnnApplyAdamWQuant"));
  }
  aclTensor *tensor(std::vector<int64_t> dims, aclDataType t, void *data) const {
    return create(dims.data(), dims.size(), t, nullptr, 0, ACL_FORMAT_ND, dims.data(), dims.size(),
                  data);
  }
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

void report(const char *name, const std::vector<double> &a, const std::vector<double> &b) {
  const double ma = quantile(a, 0.5), mb = quantile(b, 0.5);
  const double qa = quantile(a, 0.25), qb = quantile(b, 0.25);
  std::printf(
      "%-34s A median %9.3f ms q1 %9.3f | B median %9.3f ms q1 %9.3f | B/A %.3f (q1 %.3f)\n", name,
      ma * 1e3, qa * 1e3, mb * 1e3, qb * 1e3, mb / ma, qb / qa);
}

// Alternates step(lib A), step(lib B) `steps` times (the first pair is warm-up).
void ab(const char *name, const Lib &a, const Lib &b, int steps,
        const std::function<void(const Lib &)> &step) {
  std::vector<double> ta, tb;
  for (int s = 0; s < steps; ++s) {
    const bool a_first = s % 2 == 0;
    for (int k = 0; k < 2; ++k) {
      const bool is_a = (k == 0) == a_first;
      const double t0 = now_s();
      step(is_a ? a : b);
      const double t = now_s() - t0;
      if (s > 0) (is_a ? ta : tb).push_back(t);
    }
  }
  report(name, ta, tb);
}

void check(aclnnStatus s, const char *what) {
  if (s != 0) {
    std::fprintf(stderr, "%s failed: %d\n", what, s);
    std::exit(1);
  }
}

void lazy_adam_case(const Lib &a, const Lib &b, int steps) {
  const int64_t rows = 2'000'000, n = 564'096, d = 32;
  std::vector<float> m(rows * d, 0.1f), v(rows * d, 0.2f), var(rows * d, 1.0f), g(n * d, 0.01f);
  std::vector<int32_t> perm(rows);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(5));
  perm.resize(n);
  float lr = 1e-4f;
  std::vector<char> ws;
  ab("LazyAdam seed shape (unique)", a, b, steps, [&](const Lib &l) {
    aclTensor *t[6] = {
        l.tensor({n, d}, ACL_FLOAT, g.data()),      l.tensor({n}, ACL_INT32, perm.data()),
        l.tensor({rows, d}, ACL_FLOAT, m.data()),   l.tensor({rows, d}, ACL_FLOAT, v.data()),
        l.tensor({rows, d}, ACL_FLOAT, var.data()), l.tensor({1}, ACL_FLOAT, &lr)};
    uint64_t size = 0;
    aclOpExecutor *ex = nullptr;
    check(l.lazy_adam_ws(t[0], t[1], t[2], t[3], t[4], t[5], 0.9, 0.999, 1e-7, &size, &ex),
          "aclnnLazyAdamGetWorkspaceSize");
    if (ws.size() < size) ws.resize(size);
    check(l.lazy_adam(ws.data(), size, ex, nullptr), "aclnnLazyAdam");
    for (aclTensor *x : t) l.destroy(x);
  });
}

void add_lora_case(const Lib &a, const Lib &b, int steps, const char *name, int64_t batch,
                   int64_t adapters) {
  const int64_t h = 4096, r = 16;
  auto half = [](size_t n) { return std::vector<uint16_t>(n, 0x2e66); };  // 0.1 in float16
  std::vector<uint16_t> y = half(batch * h), x = half(batch * h), out = half(batch * h),
                        wa = half(adapters * r * h), wb = half(adapters * h * r);
  std::vector<int32_t> idx(batch);
  for (int64_t i = 0; i < batch; ++i) idx[i] = static_cast<int32_t>(i % adapters);
  std::vector<char> ws;
  ab(name, a, b, steps, [&](const Lib &l) {
    aclTensor *t[6] = {l.tensor({batch, h}, ACL_FLOAT16, y.data()),
                       l.tensor({batch, h}, ACL_FLOAT16, x.data()),
                       l.tensor({adapters, 1, h, r}, ACL_FLOAT16, wb.data()),
                       l.tensor({batch}, ACL_INT32, idx.data()),
                       l.tensor({adapters, 1, r, h}, ACL_FLOAT16, wa.data()),
                       l.tensor({batch, h}, ACL_FLOAT16, out.data())};
    uint64_t size = 0;
    aclOpExecutor *ex = nullptr;
    check(l.add_lora_ws(t[0], t[1], t[2], t[3], t[4], 0, 1.0, 0, h, t[5], &size, &ex),
          "aclnnAddLoraGetWorkspaceSize");
    if (ws.size() < size) ws.resize(size);
    check(l.add_lora(ws.data(), size, ex, nullptr), "aclnnAddLora");
    for (aclTensor *z : t) l.destroy(z);
  });
}

void apply_adam_w_quant_case(const Lib &a, const Lib &b, int steps) {
  const int64_t n = int64_t{16} << 20, blocks = n / 256;
  std::vector<float> var(n, 1.0f), grad(n), absmax_m(blocks, 0.01f), absmax_v(blocks, 1e-4f);
  std::vector<uint8_t> m(n, 140), v(n, 100);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> u(-0.01f, 0.01f);
  for (float &g : grad) g = u(rng);
  // Linear maps (ascending): a valid map for timing; the dynamic maps are tested elsewhere.
  std::vector<float> qm(256), qv(256);
  for (int i = 0; i < 256; ++i) {
    qm[i] = -1.0f + 2.0f * static_cast<float>(i) / 255.0f;
    qv[i] = static_cast<float>(i) / 255.0f;
  }
  int64_t step = 10;
  char mode[] = "BLOCKWISE";
  std::vector<char> ws;
  ab("ApplyAdamWQuant 16M float32", a, b, steps, [&](const Lib &l) {
    aclTensor *t[9] = {l.tensor({n}, ACL_FLOAT, var.data()),
                       l.tensor({n}, ACL_FLOAT, grad.data()),
                       l.tensor({n}, ACL_UINT8, m.data()),
                       l.tensor({n}, ACL_UINT8, v.data()),
                       l.tensor({256}, ACL_FLOAT, qm.data()),
                       l.tensor({256}, ACL_FLOAT, qv.data()),
                       l.tensor({blocks}, ACL_FLOAT, absmax_m.data()),
                       l.tensor({blocks}, ACL_FLOAT, absmax_v.data()),
                       l.tensor({1}, ACL_INT64, &step)};
    uint64_t size = 0;
    aclOpExecutor *ex = nullptr;
    check(l.awq_ws(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], 1e-4, 0.9, 0.999, 0.01,
                   1e-8, 1.0, mode, 256, &size, &ex),
          "aclnnApplyAdamWQuantGetWorkspaceSize");
    if (ws.size() < size) ws.resize(size);
    check(l.awq(ws.data(), size, ex, nullptr), "aclnnApplyAdamWQuant");
    for (aclTensor *z : t) l.destroy(z);
  });
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s A.so B.so [steps=31]\n", argv[0]);
    return 2;
  }
  const Lib a(argv[1]), b(argv[2]);
  const int steps = argc > 3 ? std::atoi(argv[3]) : 31;
  add_lora_case(a, b, steps * 4, "AddLora decode B=32 W=32 fp16", 32, 32);
  add_lora_case(a, b, steps, "AddLora prefill B=4096 W=4 fp16", 4096, 4);
  lazy_adam_case(a, b, steps);
  apply_adam_w_quant_case(a, b, steps);
  return 0;
}
