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

#define CHECK_RET(cond, return_expr) \
  do {                               \
    if (!(cond)) {                   \
      return_expr;                   \
    }                                \
  } while (0)

#define LOG_PRINT(message, ...)     \
  do {                              \
    printf(message, ##__VA_ARGS__); \
  } while (0)

using StreamPtr =
    std::unique_ptr<std::remove_pointer<aclrtStream>::type, decltype(&aclrtDestroyStream)>;
using DeviceMemPtr = std::unique_ptr<void, decltype(&aclrtFree)>;
using TensorPtr = std::unique_ptr<aclTensor, decltype(&aclDestroyTensor)>;

template <typename T>
int CreateAclTensor(const std::vector<T> &hostData, const std::vector<int64_t> &shape,
                    aclDataType dataType, DeviceMemPtr &deviceAddr, TensorPtr &tensor) {
  const size_t size = hostData.size() * sizeof(T);
  void *raw = nullptr;
  auto ret = aclrtMalloc(&raw, size, ACL_MEM_MALLOC_HUGE_FIRST);
  CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclrtMalloc failed. ERROR: %d\n", ret); return ret);
  deviceAddr.reset(raw);
  ret = aclrtMemcpy(deviceAddr.get(), size, hostData.data(), size, ACL_MEMCPY_HOST_TO_DEVICE);
  CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclrtMemcpy failed. ERROR: %d\n", ret); return ret);
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; i--)
    strides[i] = shape[i + 1] * strides[i + 1];
  aclTensor *t =
      aclCreateTensor(shape.data(), shape.size(), dataType, strides.data(), 0,
                      aclFormat::ACL_FORMAT_ND, shape.data(), shape.size(), deviceAddr.get());
  CHECK_RET(t != nullptr, LOG_PRINT("aclCreateTensor failed: %s\n", aclGetRecentErrMsg());
            return ACL_ERROR_FAILURE);
  tensor.reset(t);
  return ACL_SUCCESS;
}

int main() {
  int32_t deviceId = 0;
  auto ret = aclInit(nullptr);
  CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclInit failed. ERROR: %d\n", ret); return 1);
  ret = aclrtSetDevice(deviceId);
  CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclrtSetDevice failed. ERROR: %d\n", ret); return 1);
  aclrtStream rawStream = nullptr;
  ret = aclrtCreateStream(&rawStream);
  CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclrtCreateStream failed. ERROR: %d\n", ret); return 1);
  StreamPtr stream(rawStream, &aclrtDestroyStream);

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
  DeviceMemPtr workspace(nullptr, &aclrtFree);
  if (workspaceSize > 0) {
    void *raw = nullptr;
    ret = aclrtMalloc(&raw, workspaceSize, ACL_MEM_MALLOC_HUGE_FIRST);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("allocate workspace failed. ERROR: %d\n", ret);
              return 1);
    workspace.reset(raw);
  }
  ret = aclnnLazyAdam(workspace.get(), workspaceSize, executor, stream.get());
  CHECK_RET(ret == ACL_SUCCESS,
            LOG_PRINT("aclnnLazyAdam failed. ERROR: %d (%s)\n", ret, aclGetRecentErrMsg());
            return 1);
  ret = aclrtSynchronizeStream(stream.get());
  CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclrtSynchronizeStream failed. ERROR: %d\n", ret);
            return 1);

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
  stream.reset();
  aclrtResetDevice(deviceId);
  aclFinalize();
  return bad == 0 ? 0 : 1;
}
