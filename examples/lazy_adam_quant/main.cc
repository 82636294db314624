// LazyAdamQuant through the aclnn API, written the way CANN's aclnn examples are: only acl* and
// aclnn* calls. aclnnLazyAdamQuant is fusekit's own operator (LazyAdam with 8-bit m and v), in
// the style of aclnnLazyAdam. One Adam step on 4 of the 10 rows of an embedding table whose
// optimizer state is 8-bit: m and v are uint8 codes into two 256-entry maps with one float32
// absmax per row (D = 8 < 256: one block per row). Row 3 is named twice (its gradients are summed
// and applied once) and index -1 is padding. The state starts at zero (absmax 0), so the step is
// the formula of LazyAdam's first step exactly: the program checks var bit for bit against it,
// absmax against max |m| and max v, the sign of every m code, and that untouched rows keep their
// bits; it exits non-zero on any difference.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_lazy_adam_quant.h"
#include "common/acl_example.h"

// A 256-entry ascending map: linspace(lo, hi) (CANN's tests of the 8-bit optimizer use these).
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

  const int64_t rows = 10, dim = 8, n = 5, blocks = (dim + 255) / 256;
  std::vector<float> var(rows * dim), grad(n * dim);
  for (int64_t i = 0; i < rows * dim; ++i) var[i] = 1.0f + 0.001f * static_cast<float>(i);
  for (int64_t i = 0; i < n * dim; ++i) grad[i] = 0.1f * static_cast<float>(i % 11) - 0.5f;
  const std::vector<int32_t> indices = {3, 7, -1, 3, 0};
  const std::vector<float> lr = {0.01f};
  const double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-7;
  const std::vector<float> qmapM = Linspace(-1.0f, 1.0f), qmapV = Linspace(0.0f, 1.0f);
  // Zero state: any codes, absmax 0 (every moment dequantizes to 0).
  std::vector<uint8_t> m(rows * dim, 127), v(rows * dim, 0);
  std::vector<float> absmaxM(rows * blocks, 0.0f), absmaxV(rows * blocks, 0.0f);

  DeviceMemPtr gradDev(nullptr, &aclrtFree), idxDev(nullptr, &aclrtFree), mDev(nullptr, &aclrtFree),
      vDev(nullptr, &aclrtFree), varDev(nullptr, &aclrtFree), qmDev(nullptr, &aclrtFree),
      qvDev(nullptr, &aclrtFree), amDev(nullptr, &aclrtFree), avDev(nullptr, &aclrtFree),
      lrDev(nullptr, &aclrtFree);
  TensorPtr gradT(nullptr, &aclDestroyTensor), idxT(nullptr, &aclDestroyTensor),
      mT(nullptr, &aclDestroyTensor), vT(nullptr, &aclDestroyTensor),
      varT(nullptr, &aclDestroyTensor), qmT(nullptr, &aclDestroyTensor),
      qvT(nullptr, &aclDestroyTensor), amT(nullptr, &aclDestroyTensor),
      avT(nullptr, &aclDestroyTensor), lrT(nullptr, &aclDestroyTensor);
  CHECK_RET(CreateAclTensor(grad, {n, dim}, ACL_FLOAT, gradDev, gradT) == ACL_SUCCESS, return 1);
  CHECK_RET(CreateAclTensor(indices, {n}, ACL_INT32, idxDev, idxT) == ACL_SUCCESS, return 1);
  CHECK_RET(CreateAclTensor(m, {rows, dim}, ACL_UINT8, mDev, mT) == ACL_SUCCESS, return 1);
  CHECK_RET(CreateAclTensor(v, {rows, dim}, ACL_UINT8, vDev, vT) == ACL_SUCCESS, return 1);
  CHECK_RET(CreateAclTensor(var, {rows, dim}, ACL_FLOAT, varDev, varT) == ACL_SUCCESS, return 1);
  CHECK_RET(CreateAclTensor(qmapM, {256}, ACL_FLOAT, qmDev, qmT) == ACL_SUCCESS, return 1);
  CHECK_RET(CreateAclTensor(qmapV, {256}, ACL_FLOAT, qvDev, qvT) == ACL_SUCCESS, return 1);
  CHECK_RET(CreateAclTensor(absmaxM, {rows, blocks}, ACL_FLOAT, amDev, amT) == ACL_SUCCESS,
            return 1);
  CHECK_RET(CreateAclTensor(absmaxV, {rows, blocks}, ACL_FLOAT, avDev, avT) == ACL_SUCCESS,
            return 1);
  CHECK_RET(CreateAclTensor(lr, {1}, ACL_FLOAT, lrDev, lrT) == ACL_SUCCESS, return 1);

  uint64_t workspaceSize = 0;
  aclOpExecutor *executor = nullptr;
  ret = aclnnLazyAdamQuantGetWorkspaceSize(gradT.get(), idxT.get(), mT.get(), vT.get(), varT.get(),
                                           qmT.get(), qvT.get(), amT.get(), avT.get(), lrT.get(),
                                           beta1, beta2, epsilon, &workspaceSize, &executor);
  CHECK_RET(ret == ACL_SUCCESS,
            LOG_PRINT("aclnnLazyAdamQuantGetWorkspaceSize failed. ERROR: %d (%s)\n", ret,
                      aclGetRecentErrMsg());
            return 1);
  ret = RunWithWorkspace("aclnnLazyAdamQuant", aclnnLazyAdamQuant, workspaceSize, executor, stream);
  CHECK_RET(ret == ACL_SUCCESS, return 1);

  std::vector<float> outVar(rows * dim), outAbsmaxM(rows * blocks), outAbsmaxV(rows * blocks);
  std::vector<uint8_t> outM(rows * dim), outV(rows * dim);
  CHECK_RET(CopyBack(outVar, varDev) == ACL_SUCCESS && CopyBack(outM, mDev) == ACL_SUCCESS &&
                CopyBack(outV, vDev) == ACL_SUCCESS && CopyBack(outAbsmaxM, amDev) == ACL_SUCCESS &&
                CopyBack(outAbsmaxV, avDev) == ACL_SUCCESS,
            LOG_PRINT("copy result from device to host failed\n");
            return 1);

  // The expected rows, from the formula: row 3 takes grad[0] + grad[3], row 7 grad[1], row 0
  // grad[4]. With zero state, m = g (1 - beta1) and v = |g g (1 - beta2)| exactly.
  const float b1 = static_cast<float>(beta1), b2 = static_cast<float>(beta2),
              eps = static_cast<float>(epsilon);
  std::vector<bool> touched(rows, false);
  const int64_t updates[3][3] = {
      {3, 0, 3}, {7, 1, -1}, {0, 4, -1}};  // row, first position, second position
  int bad = 0;
  for (const auto &u : updates) {
    touched[u[0]] = true;
    float max_m = 0.0f, max_v = 0.0f;
    for (int64_t j = 0; j < dim; ++j) {
      float g = grad[u[1] * dim + j];
      if (u[2] >= 0) g = g + grad[u[2] * dim + j];
      const int64_t k = u[0] * dim + j;
      const float mk = 0.0f * b1 + g * (1.0f - b1);
      const float vk = std::fabs(0.0f * b2 + (g * g) * (1.0f - b2));
      const float want = var[k] + (mk * -lr[0]) / (std::sqrt(vk) + eps);
      max_m = std::max(max_m, std::fabs(mk));
      max_v = std::max(max_v, vk);
      if (outVar[k] != want) {
        if (bad++ < 5)
          LOG_PRINT("var[%ld] = %.9g, expected %.9g\n", static_cast<long>(k), outVar[k], want);
      }
      // m's code carries g's sign (linspace(-1, 1): codes >= 128 are positive).
      if (g != 0.0f && (g > 0.0f) != (outM[k] >= 128)) {
        if (bad++ < 5)
          LOG_PRINT("m code[%ld] = %d does not carry the sign of g = %g\n", static_cast<long>(k),
                    outM[k], g);
      }
    }
    if (outAbsmaxM[u[0]] != max_m || outAbsmaxV[u[0]] != max_v) {
      if (bad++ < 10)
        LOG_PRINT("absmax of row %ld = %.9g, %.9g, expected %.9g, %.9g\n", static_cast<long>(u[0]),
                  outAbsmaxM[u[0]], outAbsmaxV[u[0]], max_m, max_v);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    if (touched[r]) continue;
    if (std::memcmp(&outVar[r * dim], &var[r * dim], dim * sizeof(float)) != 0 ||
        std::memcmp(&outM[r * dim], &m[r * dim], dim) != 0 ||
        std::memcmp(&outV[r * dim], &v[r * dim], dim) != 0 || outAbsmaxM[r] != 0.0f ||
        outAbsmaxV[r] != 0.0f) {
      if (bad++ < 10) LOG_PRINT("untouched row %ld changed\n", static_cast<long>(r));
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    LOG_PRINT("var[%ld][0..2] = %.7f %.7f %.7f  m codes %3d %3d %3d  absmaxM %.6f\n",
              static_cast<long>(r), outVar[r * dim], outVar[r * dim + 1], outVar[r * dim + 2],
              outM[r * dim], outM[r * dim + 1], outM[r * dim + 2], outAbsmaxM[r]);
  }
  LOG_PRINT(
      "state: %ld bytes per row (8-bit m and v, one absmax pair per block) instead of %ld "
      "(float32 m and v)\n",
      static_cast<long>(2 * dim + 8 * blocks), static_cast<long>(8 * dim));
  LOG_PRINT("%s: %d differences from the formula\n", bad == 0 ? "OK" : "FAILED", bad);
  return bad == 0 ? 0 : 1;
}
