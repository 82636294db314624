// LazyAdam through the aclnn API, written the way CANN's aclnn examples are: only acl* and aclnn*
// calls. One Adam step on 4 of the 10 rows of an embedding table; row 3 is named twice (its
// gradients are summed and applied once) and index -1 is padding. The program checks the table
// against the formula of spec/lazy_adam.md and exits non-zero on any difference.
#include <cmath>
#include <cstdio>
#include <memory>
#include <type_traits>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_lazy_adam.h"
#include "common/acl_example.h"

int main() {
  AclSession session;
  CHECK_RET(session.ok, return 1);
  aclrtStream stream = session.stream.get();
  int ret = ACL_SUCCESS;

  const int64_t rows = 10, dim = 8, n = 5;
  std::vector<float> m(rows * dim), v(rows * dim), var(rows * dim), grad(n * dim);
  for (int64_t i = 0; i < rows * dim; ++i) {
    m[i] = 0.01f * static_cast<float>(i % 7);
    v[i] = 0.02f * static_cast<float>(i % 5);
    var[i] = 1.0f + 0.001f * static_cast<float>(i);
  }
  for (int64_t i = 0; i < n * dim; ++i) grad[i] = 0.1f * static_cast<float>(i % 11) - 0.5f;
  const std::vector<int32_t> indices = {3, 7, -1, 3, 0};
  const std::vector<float> lr = {0.01f};
  const double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-7;

  DeviceMemPtr gradDev(nullptr, &aclrtFree), idxDev(nullptr, &aclrtFree), mDev(nullptr, &aclrtFree),
      vDev(nullptr, &aclrtFree), varDev(nullptr, &aclrtFree), lrDev(nullptr, &aclrtFree);
  TensorPtr gradT(nullptr, &aclDestroyTensor), idxT(nullptr, &aclDestroyTensor),
      mT(nullptr, &aclDestroyTensor), vT(nullptr, &aclDestroyTensor),
      varT(nullptr, &aclDestroyTensor), lrT(nullptr, &aclDestroyTensor);
  CHECK_RET(CreateAclTensor(grad, {n, dim}, ACL_FLOAT, gradDev, gradT) == ACL_SUCCESS, return 1);
  CHECK_RET(CreateAclTensor(indices, {n}, ACL_INT32, idxDev, idxT) == ACL_SUCCESS, return 1);
  CHECK_RET(CreateAclTensor(m, {rows, dim}, ACL_FLOAT, mDev, mT) == ACL_SUCCESS, return 1);
  CHECK_RET(CreateAclTensor(v, {rows, dim}, ACL_FLOAT, vDev, vT) == ACL_SUCCESS, return 1);
  CHECK_RET(CreateAclTensor(var, {rows, dim}, ACL_FLOAT, varDev, varT) == ACL_SUCCESS, return 1);
  CHECK_RET(CreateAclTensor(lr, {1}, ACL_FLOAT, lrDev, lrT) == ACL_SUCCESS, return 1);

  uint64_t workspaceSize = 0;
  aclOpExecutor *executor = nullptr;
  ret = aclnnLazyAdamGetWorkspaceSize(gradT.get(), idxT.get(), mT.get(), vT.get(), varT.get(),
                                      lrT.get(), beta1, beta2, epsilon, &workspaceSize, &executor);
  CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclnnLazyAdamGetWorkspaceSize failed. ERROR: %d (%s)\n",
                                          ret, aclGetRecentErrMsg());
            return 1);
  ret = RunWithWorkspace("aclnnLazyAdam", aclnnLazyAdam, workspaceSize, executor, stream);
  CHECK_RET(ret == ACL_SUCCESS, return 1);

  std::vector<float> outVar(rows * dim);
  ret = aclrtMemcpy(outVar.data(), outVar.size() * sizeof(float), varDev.get(),
                    outVar.size() * sizeof(float), ACL_MEMCPY_DEVICE_TO_HOST);
  CHECK_RET(ret == ACL_SUCCESS,
            LOG_PRINT("copy result from device to host failed. ERROR: %d\n", ret);
            return 1);

  // The expected table, from the formula: row 3 takes grad[0] + grad[3], row 7 grad[1], row 0
  // grad[4].
  const float b1 = static_cast<float>(beta1), b2 = static_cast<float>(beta2),
              eps = static_cast<float>(epsilon);
  std::vector<float> want = var;
  const int64_t updates[3][3] = {
      {3, 0, 3}, {7, 1, -1}, {0, 4, -1}};  // row, first position, second position
  for (const auto &u : updates) {
    for (int64_t j = 0; j < dim; ++j) {
      float g = grad[u[1] * dim + j];
      if (u[2] >= 0) g = g + grad[u[2] * dim + j];
      const int64_t k = u[0] * dim + j;
      const float mk = m[k] * b1 + g * (1.0f - b1);
      const float vk = std::fabs(v[k] * b2 + (g * g) * (1.0f - b2));
      want[k] = var[k] + (mk * -lr[0]) / (std::sqrt(vk) + eps);
    }
  }
  int bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    LOG_PRINT("var[%ld][0..2] = %.7f %.7f %.7f\n", static_cast<long>(r), outVar[r * dim],
              outVar[r * dim + 1], outVar[r * dim + 2]);
    for (int64_t j = 0; j < dim; ++j) bad += outVar[r * dim + j] != want[r * dim + j] ? 1 : 0;
  }
  LOG_PRINT("%s: %d of %ld elements differ from the formula\n", bad == 0 ? "OK" : "FAILED", bad,
            static_cast<long>(rows * dim));
  return bad == 0 ? 0 : 1;
}
