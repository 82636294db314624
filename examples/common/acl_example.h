// What fusekit's aclnn example programs share, written the way CANN's aclnn examples write it
// (only acl* calls): the CHECK_RET / LOG_PRINT macros, owning pointers for streams, device memory
// and tensors, a tensor made from host data, the session (aclInit, device, stream) and the run of
// an operator's phase two with its workspace.
#ifndef FUSEKIT_EXAMPLES_COMMON_ACL_EXAMPLE_H_
#define FUSEKIT_EXAMPLES_COMMON_ACL_EXAMPLE_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <type_traits>
#include <vector>

#include "acl/acl.h"

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

// A row-major tensor of `shape` on device memory holding a copy of `bytes` of host data.
inline int CreateAclTensor(const void *hostData, size_t bytes, const std::vector<int64_t> &shape,
                           aclDataType dataType, DeviceMemPtr &deviceAddr, TensorPtr &tensor) {
  void *raw = nullptr;
  auto ret = aclrtMalloc(&raw, bytes, ACL_MEM_MALLOC_HUGE_FIRST);
  CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclrtMalloc failed. ERROR: %d\n", ret); return ret);
  deviceAddr.reset(raw);
  ret = aclrtMemcpy(deviceAddr.get(), bytes, hostData, bytes, ACL_MEMCPY_HOST_TO_DEVICE);
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
template <typename T>
int CreateAclTensor(const std::vector<T> &hostData, const std::vector<int64_t> &shape,
                    aclDataType dataType, DeviceMemPtr &deviceAddr, TensorPtr &tensor) {
  return CreateAclTensor(hostData.data(), hostData.size() * sizeof(T), shape, dataType, deviceAddr,
                         tensor);
}

// aclInit, device 0 and a stream; reset and finalized when it goes.
struct AclSession {
  int32_t deviceId = 0;
  StreamPtr stream{nullptr, &aclrtDestroyStream};
  bool ok = false;
  AclSession() {
    auto ret = aclInit(nullptr);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclInit failed. ERROR: %d\n", ret); return );
    ret = aclrtSetDevice(deviceId);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclrtSetDevice failed. ERROR: %d\n", ret); return );
    aclrtStream rawStream = nullptr;
    ret = aclrtCreateStream(&rawStream);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclrtCreateStream failed. ERROR: %d\n", ret); return );
    stream.reset(rawStream);
    ok = true;
  }
  ~AclSession() {
    stream.reset();
    aclrtResetDevice(deviceId);
    aclFinalize();
  }
};

// Phase two of an operator (aclnnXxx) with a workspace of the size phase one asked for, then the
// stream synchronized.
using AclnnRun = aclnnStatus (*)(void *, uint64_t, aclOpExecutor *, aclrtStream);
inline int RunWithWorkspace(const char *name, AclnnRun run, uint64_t workspaceSize,
                            aclOpExecutor *executor, aclrtStream stream) {
  DeviceMemPtr workspace(nullptr, &aclrtFree);
  if (workspaceSize > 0) {
    void *raw = nullptr;
    auto ret = aclrtMalloc(&raw, workspaceSize, ACL_MEM_MALLOC_HUGE_FIRST);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("allocate workspace failed. ERROR: %d\n", ret);
              return ret);
    workspace.reset(raw);
  }
  auto ret = run(workspace.get(), workspaceSize, executor, stream);
  CHECK_RET(ret == ACL_SUCCESS,
            LOG_PRINT("%s failed. ERROR: %d (%s)\n", name, ret, aclGetRecentErrMsg());
            return ret);
  ret = aclrtSynchronizeStream(stream);
  CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclrtSynchronizeStream failed. ERROR: %d\n", ret);
            return ret);
  return ACL_SUCCESS;
}

// A device buffer copied back into `host` (its size).
template <typename T>
int CopyBack(std::vector<T> &host, const DeviceMemPtr &dev) {
  const size_t size = host.size() * sizeof(T);
  return aclrtMemcpy(host.data(), size, dev.get(), size, ACL_MEMCPY_DEVICE_TO_HOST);
}

#endif  // FUSEKIT_EXAMPLES_COMMON_ACL_EXAMPLE_H_
