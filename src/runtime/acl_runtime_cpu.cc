// The ACL runtime on a CPU: devices, streams and memory. Device memory is host memory; a stream
// runs each operator synchronously when it is enqueued, so synchronizing a stream has nothing to
// wait for.

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_set>

#include "acl/acl.h"
#include "common/c_entry.h"
#include "common/last_message.h"
#include "common/str_cat.h"
#include "fusekit/memory.h"
#include "runtime/acl_tensor.h"
#include "runtime/stream.h"

namespace fusekit {
namespace {

aclError fail(aclError code, std::string message) {
  set_last_message(std::move(message));
  return code;
}

std::mutex g_streams_mu;
std::unordered_set<const void *> &live_streams() {
  static auto *s = new std::unordered_set<const void *>();
  return *s;
}

aclError allocate(void **ptr, size_t size, bool want_huge, const char *fn) {
  if (ptr == nullptr) return fail(ACL_ERROR_INVALID_PARAM, str_cat(fn, ": devPtr is null"));
  *ptr = nullptr;
  if (size == 0) return fail(ACL_ERROR_INVALID_PARAM, str_cat(fn, ": size is 0"));
  // Large allocations on 2 MiB-aligned memory advised for transparent huge pages: random row
  // access over a large table otherwise misses the TLB on almost every row (fusekit/memory.h).
  void *p = allocate_host(size, want_huge);
  if (p == nullptr) {
    return fail(ACL_ERROR_BAD_ALLOC, str_cat(fn, ": could not allocate ", size, " bytes"));
  }
  *ptr = p;
  return ACL_SUCCESS;
}

}  // namespace

bool stream_is_valid(aclrtStream stream) {
  if (stream == nullptr) return true;  // the default stream
  std::lock_guard<std::mutex> lock(g_streams_mu);
  return live_streams().count(stream) != 0;
}

}  // namespace fusekit

using fusekit::fail;
using fusekit::str_cat;

extern "C" {

aclError aclInit(const char *) {
  return ACL_SUCCESS;
}
aclError aclFinalize(void) {
  return ACL_SUCCESS;
}

aclError aclrtSetDevice(int32_t deviceId) {
  if (deviceId != 0) {
    return fail(ACL_ERROR_INVALID_PARAM, str_cat("aclrtSetDevice: deviceId = ", deviceId,
                                                 " but this CPU runtime has one device, 0"));
  }
  return ACL_SUCCESS;
}
aclError aclrtResetDevice(int32_t deviceId) {
  return aclrtSetDevice(deviceId);
}
aclError aclrtGetDevice(int32_t *deviceId) {
  if (deviceId == nullptr) return fail(ACL_ERROR_INVALID_PARAM, "aclrtGetDevice: deviceId is null");
  *deviceId = 0;
  return ACL_SUCCESS;
}
aclError aclrtGetDeviceCount(uint32_t *count) {
  if (count == nullptr) return fail(ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceCount: count is null");
  *count = 1;
  return ACL_SUCCESS;
}

aclError aclrtCreateStream(aclrtStream *stream) {
  return fusekit::guard_c_entry("aclrtCreateStream", ACL_ERROR_BAD_ALLOC, [&]() -> aclError {
    if (stream == nullptr)
      return fail(ACL_ERROR_INVALID_PARAM, "aclrtCreateStream: stream is null");
    auto s = std::make_unique<fusekit::Stream>();
    {
      std::lock_guard<std::mutex> lock(fusekit::g_streams_mu);
      fusekit::live_streams().insert(s.get());
    }
    *stream = s.release();
    return ACL_SUCCESS;
  });
}

aclError aclrtDestroyStream(aclrtStream stream) {
  if (stream == nullptr) return fail(ACL_ERROR_INVALID_PARAM, "aclrtDestroyStream: stream is null");
  {
    std::lock_guard<std::mutex> lock(fusekit::g_streams_mu);
    if (fusekit::live_streams().erase(stream) == 0) {
      return fail(ACL_ERROR_RT_PARAM_INVALID, "aclrtDestroyStream: not a live stream");
    }
  }
  delete static_cast<fusekit::Stream *>(stream);
  return ACL_SUCCESS;
}

aclError aclrtSynchronizeStream(aclrtStream stream) {
  if (!fusekit::stream_is_valid(stream)) {
    return fail(ACL_ERROR_RT_PARAM_INVALID, "aclrtSynchronizeStream: not a live stream");
  }
  return ACL_SUCCESS;  // work ran when it was enqueued
}

aclError aclrtSynchronizeStreamWithTimeout(aclrtStream stream, int32_t timeout) {
  if (timeout < -1) {
    return fail(
        ACL_ERROR_INVALID_PARAM,
        str_cat("aclrtSynchronizeStreamWithTimeout: timeout = ", timeout, " (must be >= -1)"));
  }
  return aclrtSynchronizeStream(stream);
}

aclError aclrtSynchronizeDevice(void) {
  return ACL_SUCCESS;
}

aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy) {
  // A C caller may pass any integer: look at it as one (loading an enum outside its values is
  // undefined in C++).
  const int p = fusekit::enum_bits(policy);
  if (p != ACL_MEM_MALLOC_HUGE_FIRST && p != ACL_MEM_MALLOC_HUGE_ONLY &&
      p != ACL_MEM_MALLOC_NORMAL_ONLY) {
    return fail(ACL_ERROR_INVALID_PARAM,
                str_cat("aclrtMalloc: policy = ", p, " is not a memory policy"));
  }
  return fusekit::allocate(devPtr, size, p != ACL_MEM_MALLOC_NORMAL_ONLY, "aclrtMalloc");
}

aclError aclrtFree(void *devPtr) {
  if (devPtr == nullptr) return fail(ACL_ERROR_INVALID_PARAM, "aclrtFree: devPtr is null");
  fusekit::free_host(devPtr);
  return ACL_SUCCESS;
}

aclError aclrtMallocHost(void **hostPtr, size_t size) {
  return fusekit::allocate(hostPtr, size, false, "aclrtMallocHost");
}

aclError aclrtFreeHost(void *hostPtr) {
  if (hostPtr == nullptr) return fail(ACL_ERROR_INVALID_PARAM, "aclrtFreeHost: hostPtr is null");
  fusekit::free_host(hostPtr);
  return ACL_SUCCESS;
}

aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count,
                     aclrtMemcpyKind kind) {
  const int k = fusekit::enum_bits(kind);  // any integer from a C caller
  if (k < ACL_MEMCPY_HOST_TO_HOST || k > ACL_MEMCPY_DEVICE_TO_DEVICE) {
    return fail(ACL_ERROR_INVALID_PARAM, str_cat("aclrtMemcpy: kind = ", k, " is not a copy kind"));
  }
  if (count > destMax) {
    return fail(ACL_ERROR_INVALID_PARAM,
                str_cat("aclrtMemcpy: count = ", count, " exceeds destMax = ", destMax));
  }
  if (count == 0) return ACL_SUCCESS;
  if (dst == nullptr || src == nullptr) {
    return fail(ACL_ERROR_INVALID_PARAM,
                str_cat("aclrtMemcpy: ", dst == nullptr ? "dst" : "src", " is null"));
  }
  std::memmove(dst, src, count);
  return ACL_SUCCESS;
}

aclError aclrtMemset(void *devPtr, size_t maxCount, int32_t value, size_t count) {
  if (count > maxCount) {
    return fail(ACL_ERROR_INVALID_PARAM,
                str_cat("aclrtMemset: count = ", count, " exceeds maxCount = ", maxCount));
  }
  if (count == 0) return ACL_SUCCESS;
  if (devPtr == nullptr) return fail(ACL_ERROR_INVALID_PARAM, "aclrtMemset: devPtr is null");
  std::memset(devPtr, value, count);
  return ACL_SUCCESS;
}

}  // extern "C"
