// AddLora through the aclnn API, written the way CANN's aclnn examples are: only acl* and aclnn*
// calls. A batch of 3 tokens whose fused QKV projection output y is [3, 48]; LoRA adds into the
// V part (yOffset = 32, H2 = 16) from 2 adapters of rank 4 at layer 1 of 2. Token 0 uses adapter
// 1, token 1 no adapter (-1), token 2 adapter 0. First out of place (y must stay as it was), then
// in place (out = y). The inputs are multiples of 1/8, so every float32 sum is exact and the
// expected float16 result is the exact value rounded once; the program checks every element and
// exits non-zero on any difference.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_add_lora.h"
#include "common/acl_example.h"

// float16 bits of a normal float, rounded to nearest even (the example's values are normal).
uint16_t ToHalf(double v) {
  if (v == 0.0) return 0;
  const uint16_t sign = v < 0 ? 0x8000 : 0;
  int e = 0;
  const double m = std::frexp(std::fabs(v), &e);           // |v| = m * 2^e, m in [0.5, 1)
  double mant = std::nearbyint((m * 2.0 - 1.0) * 1024.0);  // 10 fraction bits, ties to even
  if (mant == 1024.0) {
    mant = 0.0;
    ++e;
  }
  return static_cast<uint16_t>(sign | ((e - 1 + 15) << 10) | static_cast<int>(mant));
}
double FromHalf(uint16_t h) {
  const int e = (h >> 10) & 0x1f, mant = h & 0x3ff;
  const double v = e == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, e - 25);
  return (h & 0x8000) ? -v : v;
}

// Runs the two phases; returns 0 on success.
int RunAddLora(aclTensor *y, aclTensor *x, aclTensor *wb, aclTensor *idx, aclTensor *wa,
               aclTensor *out, aclrtStream stream) {
  uint64_t workspaceSize = 0;
  aclOpExecutor *executor = nullptr;
  auto ret =
      aclnnAddLoraGetWorkspaceSize(y, x, wb, idx, wa, /*layerIdx=*/1, /*scale=*/0.5, /*yOffset=*/32,
                                   /*ySliceSize=*/-1, out, &workspaceSize, &executor);
  CHECK_RET(ret == ACL_SUCCESS,
            LOG_PRINT("aclnnAddLoraGetWorkspaceSize failed: %s\n", aclGetRecentErrMsg());
            return 1);
  ret = RunWithWorkspace("aclnnAddLora", aclnnAddLora, workspaceSize, executor, stream);
  CHECK_RET(ret == ACL_SUCCESS, return 1);
  return 0;
}

int main() {
  AclSession session;
  CHECK_RET(session.ok, return 1);
  aclrtStream stream = session.stream.get();

  const int64_t B = 3, H1 = 8, H2 = 16, H3 = 48, R = 4, W = 2, L = 2, layer = 1, yOffset = 32;
  const double scale = 0.5;
  std::vector<double> x(B * H1), y(B * H3), wa(W * L * R * H1), wb(W * L * H2 * R);
  for (int64_t i = 0; i < B * H1; ++i) x[i] = static_cast<double>(i % 5 - 2) / 8.0;
  for (int64_t i = 0; i < B * H3; ++i) y[i] = static_cast<double>(i % 9) / 4.0 - 1.0;
  for (int64_t i = 0; i < W * L * R * H1; ++i) wa[i] = static_cast<double>(i % 7 - 3) / 8.0;
  for (int64_t i = 0; i < W * L * H2 * R; ++i) wb[i] = static_cast<double>(i % 3 - 1) / 2.0 + 0.125;
  const std::vector<int32_t> indices = {1, -1, 0};
  auto halves = [](const std::vector<double> &v) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = ToHalf(v[i]);
    return h;
  };
  const std::vector<uint16_t> xh = halves(x), yh = halves(y), wah = halves(wa), wbh = halves(wb);
  const std::vector<uint16_t> outh(B * H3, 0x7e00);  // NaN: anything not written shows

  // Expected: y, plus the update on the V slice of rows with an adapter, in float64, rounded once.
  std::vector<uint16_t> expected = yh;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t a = indices[b];
    if (a < 0 || a >= W) continue;
    double t[R];
    for (int64_t r = 0; r < R; ++r) {
      t[r] = 0;
      for (int64_t k = 0; k < H1; ++k)
        t[r] += FromHalf(xh[b * H1 + k]) * FromHalf(wah[((a * L + layer) * R + r) * H1 + k]);
    }
    for (int64_t o = 0; o < H2; ++o) {
      double z = 0;
      for (int64_t r = 0; r < R; ++r) z += t[r] * FromHalf(wbh[((a * L + layer) * H2 + o) * R + r]);
      expected[b * H3 + yOffset + o] = ToHalf(FromHalf(yh[b * H3 + yOffset + o]) + scale * z);
    }
  }

  DeviceMemPtr xDev(nullptr, &aclrtFree), yDev(nullptr, &aclrtFree), waDev(nullptr, &aclrtFree),
      wbDev(nullptr, &aclrtFree), idxDev(nullptr, &aclrtFree), outDev(nullptr, &aclrtFree);
  TensorPtr xT(nullptr, &aclDestroyTensor), yT(nullptr, &aclDestroyTensor),
      waT(nullptr, &aclDestroyTensor), wbT(nullptr, &aclDestroyTensor),
      idxT(nullptr, &aclDestroyTensor), outT(nullptr, &aclDestroyTensor);
  CHECK_RET(
      CreateAclTensor(xh.data(), xh.size() * 2, {B, H1}, ACL_FLOAT16, xDev, xT) == ACL_SUCCESS,
      return 1);
  CHECK_RET(
      CreateAclTensor(yh.data(), yh.size() * 2, {B, H3}, ACL_FLOAT16, yDev, yT) == ACL_SUCCESS,
      return 1);
  CHECK_RET(CreateAclTensor(wah.data(), wah.size() * 2, {W, L, R, H1}, ACL_FLOAT16, waDev, waT) ==
                ACL_SUCCESS,
            return 1);
  CHECK_RET(CreateAclTensor(wbh.data(), wbh.size() * 2, {W, L, H2, R}, ACL_FLOAT16, wbDev, wbT) ==
                ACL_SUCCESS,
            return 1);
  CHECK_RET(CreateAclTensor(indices.data(), indices.size() * 4, {B}, ACL_INT32, idxDev, idxT) ==
                ACL_SUCCESS,
            return 1);
  CHECK_RET(CreateAclTensor(outh.data(), outh.size() * 2, {B, H3}, ACL_FLOAT16, outDev, outT) ==
                ACL_SUCCESS,
            return 1);

  int failures = 0;
  auto compare = [&](const DeviceMemPtr &dev, const std::vector<uint16_t> &want, const char *what) {
    std::vector<uint16_t> got(want.size());
    auto r = aclrtMemcpy(got.data(), got.size() * 2, dev.get(), got.size() * 2,
                         ACL_MEMCPY_DEVICE_TO_HOST);
    if (r != ACL_SUCCESS) {
      LOG_PRINT("copy back failed. ERROR: %d\n", r);
      ++failures;
      return;
    }
    for (size_t i = 0; i < want.size(); ++i) {
      if (got[i] != want[i]) {
        LOG_PRINT("%s[%zu, %zu] = %g, expected %g\n", what, i / H3, i % H3, FromHalf(got[i]),
                  FromHalf(want[i]));
        ++failures;
      }
    }
  };

  // 1. Out of place: out gets the result, y is untouched.
  CHECK_RET(
      RunAddLora(yT.get(), xT.get(), wbT.get(), idxT.get(), waT.get(), outT.get(), stream) == 0,
      return 1);
  compare(outDev, expected, "out");
  compare(yDev, yh, "y (must be untouched)");
  // 2. In place: out is y.
  CHECK_RET(RunAddLora(yT.get(), xT.get(), wbT.get(), idxT.get(), waT.get(), yT.get(), stream) == 0,
            return 1);
  compare(yDev, expected, "y (in place)");

  for (int64_t b = 0; b < B; ++b) {
    LOG_PRINT("row %ld (adapter %d): V slice[0..3] = %g %g %g %g\n", static_cast<long>(b),
              indices[b], FromHalf(expected[b * H3 + yOffset]),
              FromHalf(expected[b * H3 + yOffset + 1]), FromHalf(expected[b * H3 + yOffset + 2]),
              FromHalf(expected[b * H3 + yOffset + 3]));
  }
  LOG_PRINT("%s\n", failures == 0 ? "AddLora example: all elements as expected"
                                  : "AddLora example: FAILED");
  return failures == 0 ? 0 : 1;
}
