// ApplyAdamWQuant through the aclnn API, written the way CANN's aclnn examples are: only acl* and
// aclnn* calls. A [4, 250] float32 weight (1000 elements: three full blocks of 256 and a partial
// one) with 8-bit moments starting at zero takes its first AdamW step (step input 0, so t = 1).
// With m = v = 0 before the step, the first step is lr * sign(g) to within eps (the bias
// corrections cancel), then the decay: the program checks var against that, checks that the new
// absmax of m is (1 - beta1) * max|g| per block, and exits non-zero on any difference.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <type_traits>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_apply_adam_w_quant.h"
#include "common/acl_example.h"

// A 256-entry ascending map: linspace(lo, hi) (CANN's tests use these).
std::vector<float> Linspace(float lo, float hi) {
  std::vector<float> q(256);
  for (int i = 0; i < 256; ++i)
    q[i] = static_cast<float>(double{lo} + (double{hi} - double{lo}) * i / 255.0);
  return q;
}

int main() {
  AclSession session;
  CHECK_RET(session.ok, return 1);
  aclrtStream stream = session.stream.get();
  int ret = ACL_SUCCESS;

  const std::vector<int64_t> shape = {4, 250};
  const int64_t n = 1000, blocks = (n + 255) / 256;
  std::vector<float> var(n), grad(n);
  for (int64_t i = 0; i < n; ++i) {
    var[i] = 0.5f * std::sin(0.37f * static_cast<float>(i));
    grad[i] = 0.01f * std::cos(1.3f * static_cast<float>(i)) * static_cast<float>(1 + i % 7);
  }
  const std::vector<float> qmapM = Linspace(-1.0f, 1.0f), qmapV = Linspace(0.0f, 1.0f);
  // m = v = 0: codes of the entries nearest 0 (linspace(-1, 1) has no 0; either neighbour, scaled
  // by an absmax of 0, is 0), absmax 0.
  std::vector<uint8_t> m(n, 127), v(n, 0);
  std::vector<float> absmaxM(blocks, 0.0f), absmaxV(blocks, 0.0f);
  std::vector<int64_t> step = {0};
  const double lr = 1e-2, beta1 = 0.9, beta2 = 0.999, weightDecay = 0.01, eps = 1e-8,
               gnormScale = 1.0;
  char quantMode[] = "BLOCKWISE";

  DeviceMemPtr varAddr(nullptr, &aclrtFree), gradAddr(nullptr, &aclrtFree),
      mAddr(nullptr, &aclrtFree), vAddr(nullptr, &aclrtFree), qmAddr(nullptr, &aclrtFree),
      qvAddr(nullptr, &aclrtFree), amAddr(nullptr, &aclrtFree), avAddr(nullptr, &aclrtFree),
      stepAddr(nullptr, &aclrtFree);
  TensorPtr varT(nullptr, &aclDestroyTensor), gradT(nullptr, &aclDestroyTensor),
      mT(nullptr, &aclDestroyTensor), vT(nullptr, &aclDestroyTensor),
      qmT(nullptr, &aclDestroyTensor), qvT(nullptr, &aclDestroyTensor),
      amT(nullptr, &aclDestroyTensor), avT(nullptr, &aclDestroyTensor),
      stepT(nullptr, &aclDestroyTensor);
  ret = CreateAclTensor(var, shape, ACL_FLOAT, varAddr, varT);
  CHECK_RET(ret == ACL_SUCCESS, return 1);
  ret = CreateAclTensor(grad, shape, ACL_FLOAT, gradAddr, gradT);
  CHECK_RET(ret == ACL_SUCCESS, return 1);
  ret = CreateAclTensor(m, shape, ACL_UINT8, mAddr, mT);
  CHECK_RET(ret == ACL_SUCCESS, return 1);
  ret = CreateAclTensor(v, shape, ACL_UINT8, vAddr, vT);
  CHECK_RET(ret == ACL_SUCCESS, return 1);
  ret = CreateAclTensor(qmapM, {256}, ACL_FLOAT, qmAddr, qmT);
  CHECK_RET(ret == ACL_SUCCESS, return 1);
  ret = CreateAclTensor(qmapV, {256}, ACL_FLOAT, qvAddr, qvT);
  CHECK_RET(ret == ACL_SUCCESS, return 1);
  ret = CreateAclTensor(absmaxM, {blocks}, ACL_FLOAT, amAddr, amT);
  CHECK_RET(ret == ACL_SUCCESS, return 1);
  ret = CreateAclTensor(absmaxV, {blocks}, ACL_FLOAT, avAddr, avT);
  CHECK_RET(ret == ACL_SUCCESS, return 1);
  ret = CreateAclTensor(step, {1}, ACL_INT64, stepAddr, stepT);
  CHECK_RET(ret == ACL_SUCCESS, return 1);

  uint64_t workspaceSize = 0;
  aclOpExecutor *executor = nullptr;
  ret = aclnnApplyAdamWQuantGetWorkspaceSize(varT.get(), gradT.get(), mT.get(), vT.get(), qmT.get(),
                                             qvT.get(), amT.get(), avT.get(), stepT.get(), lr,
                                             beta1, beta2, weightDecay, eps, gnormScale, quantMode,
                                             256, &workspaceSize, &executor);
  CHECK_RET(ret == ACL_SUCCESS,
            LOG_PRINT("aclnnApplyAdamWQuantGetWorkspaceSize failed. ERROR: %d (%s)\n", ret,
                      aclGetRecentErrMsg());
            return 1);
  ret = RunWithWorkspace("aclnnApplyAdamWQuant", aclnnApplyAdamWQuant, workspaceSize, executor,
                         stream);
  CHECK_RET(ret == ACL_SUCCESS, return 1);

  std::vector<float> outVar(n), outAbsmaxM(blocks);
  std::vector<uint8_t> outM(n);
  ret = aclrtMemcpy(outVar.data(), n * sizeof(float), varAddr.get(), n * sizeof(float),
                    ACL_MEMCPY_DEVICE_TO_HOST);
  CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("copy var back failed. ERROR: %d\n", ret); return 1);
  ret = aclrtMemcpy(outAbsmaxM.data(), blocks * sizeof(float), amAddr.get(), blocks * sizeof(float),
                    ACL_MEMCPY_DEVICE_TO_HOST);
  CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("copy absmaxM back failed. ERROR: %d\n", ret); return 1);
  ret = aclrtMemcpy(outM.data(), n, mAddr.get(), n, ACL_MEMCPY_DEVICE_TO_HOST);
  CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("copy m back failed. ERROR: %d\n", ret); return 1);

  // The first step: m = (1 - beta1) g, v = (1 - beta2) g^2, and with the bias corrections
  // var - lr g / (|g| + eps), then times (1 - lr * weightDecay).
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double g = grad[i];
    const double want = (var[i] - lr * g / (std::fabs(g) + eps)) * (1.0 - lr * weightDecay);
    if (std::fabs(outVar[i] - want) > 1e-5 * std::max(1.0, std::fabs(want))) {
      if (bad++ < 5)
        LOG_PRINT("var[%ld] is %.7f, expected %.7f\n", static_cast<long>(i), outVar[i], want);
    }
    // m's code must carry g's sign (linspace(-1, 1): codes >= 128 are positive).
    if ((g > 0) != (outM[i] >= 128)) {
      if (bad++ < 5)
        LOG_PRINT("m code[%ld] = %d does not carry the sign of g = %g\n", static_cast<long>(i),
                  outM[i], g);
    }
  }
  for (int64_t b = 0; b < blocks; ++b) {
    double maxg = 0;
    for (int64_t i = b * 256; i < std::min(n, (b + 1) * 256); ++i)
      maxg = std::max(maxg, std::fabs(double{grad[i]}));
    const double want = (1.0 - beta1) * maxg;
    if (std::fabs(outAbsmaxM[b] - want) > 1e-6 * want) {
      if (bad++ < 10)
        LOG_PRINT("absmaxM[%ld] is %.9f, expected %.9f\n", static_cast<long>(b), outAbsmaxM[b],
                  want);
    }
  }
  for (int64_t i = 0; i < 4; ++i)
    LOG_PRINT("result[%ld] is: %f\n", static_cast<long>(i), outVar[i]);
  LOG_PRINT("%s: %d mismatches in %ld elements and %ld blocks\n", bad == 0 ? "PASS" : "FAIL", bad,
            static_cast<long>(n), static_cast<long>(blocks));
  return bad == 0 ? 0 : 1;
}
