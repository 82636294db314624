// The ACL runtime face: memory, copies, streams, tensors, messages.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_lazy_adam.h"

namespace {

// Sizes as CANN documents them (and as sizeof gives them for the C types).
TEST(Runtime, DataTypeSize) {
  EXPECT_EQ(aclDataTypeSize(ACL_FLOAT), sizeof(float));
  EXPECT_EQ(aclDataTypeSize(ACL_DOUBLE), sizeof(double));
  EXPECT_EQ(aclDataTypeSize(ACL_FLOAT16), 2u);
  EXPECT_EQ(aclDataTypeSize(ACL_BF16), 2u);
  EXPECT_EQ(aclDataTypeSize(ACL_INT8), sizeof(int8_t));
  EXPECT_EQ(aclDataTypeSize(ACL_UINT8), sizeof(uint8_t));
  EXPECT_EQ(aclDataTypeSize(ACL_INT16), sizeof(int16_t));
  EXPECT_EQ(aclDataTypeSize(ACL_UINT16), sizeof(uint16_t));
  EXPECT_EQ(aclDataTypeSize(ACL_INT32), sizeof(int32_t));
  EXPECT_EQ(aclDataTypeSize(ACL_UINT32), sizeof(uint32_t));
  EXPECT_EQ(aclDataTypeSize(ACL_INT64), sizeof(int64_t));
  EXPECT_EQ(aclDataTypeSize(ACL_UINT64), sizeof(uint64_t));
  EXPECT_EQ(aclDataTypeSize(ACL_BOOL), 1u);
  EXPECT_EQ(aclDataTypeSize(ACL_DT_UNDEFINED), 0u);
}

TEST(Runtime, InitDeviceAndFinalize) {
  EXPECT_EQ(aclInit(nullptr), ACL_SUCCESS);
  EXPECT_EQ(aclrtSetDevice(0), ACL_SUCCESS);
  EXPECT_NE(aclrtSetDevice(3), ACL_SUCCESS);
  EXPECT_NE(std::string(aclGetRecentErrMsg()).find("deviceId = 3"), std::string::npos);
  EXPECT_EQ(aclrtResetDevice(0), ACL_SUCCESS);
  EXPECT_EQ(aclFinalize(), ACL_SUCCESS);
}

TEST(Runtime, StreamsWorkAsUniquePtrs) {
  using StreamPtr =
      std::unique_ptr<std::remove_pointer<aclrtStream>::type, decltype(&aclrtDestroyStream)>;
  aclrtStream raw = nullptr;
  ASSERT_EQ(aclrtCreateStream(&raw), ACL_SUCCESS);
  ASSERT_NE(raw, nullptr);
  StreamPtr stream(raw, &aclrtDestroyStream);
  EXPECT_EQ(aclrtSynchronizeStream(stream.get()), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeStreamWithTimeout(stream.get(), 1000), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeStreamWithTimeout(stream.get(), -1), ACL_SUCCESS);
  EXPECT_NE(aclrtSynchronizeStreamWithTimeout(stream.get(), -7), ACL_SUCCESS);
  EXPECT_EQ(aclrtSynchronizeStream(nullptr), ACL_SUCCESS);  // the default stream
  EXPECT_NE(aclrtCreateStream(nullptr), ACL_SUCCESS);
}

TEST(Runtime, DestroyedStreamIsRefused) {
  aclrtStream s = nullptr;
  ASSERT_EQ(aclrtCreateStream(&s), ACL_SUCCESS);
  ASSERT_EQ(aclrtDestroyStream(s), ACL_SUCCESS);
  EXPECT_NE(aclrtSynchronizeStream(s), ACL_SUCCESS);
  EXPECT_NE(aclrtDestroyStream(s), ACL_SUCCESS);
}

// True when /proc/self/smaps marks the mapping holding p with the "hg" (MADV_HUGEPAGE) flag.
bool mapping_has_hugepage_advice(const void *p) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  const auto addr = reinterpret_cast<uintptr_t>(p);
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find('-')) {
      inside = addr >= lo && addr < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line.find(" hg") != std::string::npos;
    }
  }
  return false;
}

TEST(Runtime, HugeFirstAsksForTransparentHugePages) {
  void *big = nullptr;
  ASSERT_EQ(aclrtMalloc(&big, size_t{8} << 20, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big) % (size_t{2} << 20), 0u);
  EXPECT_TRUE(mapping_has_hugepage_advice(big));
  std::memset(big, 0x5a, size_t{8} << 20);  // the whole block is usable
  EXPECT_EQ(aclrtFree(big), ACL_SUCCESS);

  void *normal = nullptr;
  ASSERT_EQ(aclrtMalloc(&normal, 1000, ACL_MEM_MALLOC_NORMAL_ONLY), ACL_SUCCESS);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(normal) % 64, 0u);
  EXPECT_EQ(aclrtFree(normal), ACL_SUCCESS);
}

TEST(Runtime, MallocRefusals) {
  void *p = reinterpret_cast<void *>(0x1);
  EXPECT_NE(aclrtMalloc(&p, 0, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  EXPECT_EQ(p, nullptr);
  EXPECT_NE(aclrtMalloc(nullptr, 64, ACL_MEM_MALLOC_HUGE_FIRST), ACL_SUCCESS);
  EXPECT_NE(aclrtMalloc(&p, 64, static_cast<aclrtMemMallocPolicy>(9)), ACL_SUCCESS);
  EXPECT_NE(aclrtFree(nullptr), ACL_SUCCESS);
  void *h = nullptr;
  ASSERT_EQ(aclrtMallocHost(&h, 100), ACL_SUCCESS);
  EXPECT_EQ(aclrtFreeHost(h), ACL_SUCCESS);
}

TEST(Runtime, MemcpyAllFourKindsAndLimits) {
  std::vector<uint8_t> src(300), dst(300, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
  for (auto kind : {ACL_MEMCPY_HOST_TO_HOST, ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST,
                    ACL_MEMCPY_DEVICE_TO_DEVICE}) {
    std::fill(dst.begin(), dst.end(), 0);
    ASSERT_EQ(aclrtMemcpy(dst.data(), dst.size(), src.data(), src.size(), kind), ACL_SUCCESS);
    EXPECT_EQ(dst, src);
  }
  std::fill(dst.begin(), dst.end(), 0xee);
  EXPECT_NE(aclrtMemcpy(dst.data(), 10, src.data(), 11, ACL_MEMCPY_HOST_TO_DEVICE), ACL_SUCCESS);
  EXPECT_NE(std::string(aclGetRecentErrMsg()).find("destMax = 10"), std::string::npos);
  EXPECT_EQ(dst[0], 0xee);  // nothing copied on failure
  EXPECT_NE(aclrtMemcpy(dst.data(), 10, src.data(), 1, static_cast<aclrtMemcpyKind>(42)),
            ACL_SUCCESS);
}

TEST(Runtime, MessagesAreThreadLocal) {
  EXPECT_NE(aclrtSetDevice(5), ACL_SUCCESS);
  std::string other;
  std::thread t([&] {
    EXPECT_NE(aclrtSetDevice(6), ACL_SUCCESS);
    other = aclGetRecentErrMsg();
  });
  t.join();
  EXPECT_NE(std::string(aclGetRecentErrMsg()).find("deviceId = 5"), std::string::npos);
  EXPECT_NE(other.find("deviceId = 6"), std::string::npos);
}

TEST(Tensor, CreateContiguousAndStrided) {
  std::vector<float> storage(4 * 10, 0.f);
  const int64_t dims[2] = {4, 8}, strides[2] = {10, 1}, sdims[2] = {4, 10};
  aclTensor *t =
      aclCreateTensor(dims, 2, ACL_FLOAT, strides, 1, ACL_FORMAT_ND, sdims, 2, storage.data());
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(aclDestroyTensor(t), ACLNN_SUCCESS);
  aclTensor *c = aclCreateTensor(dims, 2, aclDataType::ACL_FLOAT, nullptr, 0,
                                 aclFormat::ACL_FORMAT_ND, dims, 2, storage.data());
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(aclDestroyTensor(c), ACLNN_SUCCESS);
  EXPECT_EQ(aclDestroyTensor(nullptr), ACLNN_SUCCESS);
}

TEST(Tensor, RefusesViewsOutsideTheirStorage) {
  std::vector<float> storage(40, 0.f);
  const int64_t dims[2] = {4, 8}, strides[2] = {10, 1}, sdims[2] = {4, 10};
  // Offset 3 puts the last element at 3 + 30 + 7 = 40: one past the storage.
  EXPECT_EQ(
      aclCreateTensor(dims, 2, ACL_FLOAT, strides, 3, ACL_FORMAT_ND, sdims, 2, storage.data()),
      nullptr);
  EXPECT_NE(std::string(aclGetRecentErrMsg()).find("past its storage"), std::string::npos);
  const int64_t neg[2] = {-1, 8};
  EXPECT_EQ(aclCreateTensor(neg, 2, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, sdims, 2, storage.data()),
            nullptr);
  const int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_EQ(aclCreateTensor(nine, 9, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, nine, 9, storage.data()),
            nullptr);
  EXPECT_EQ(
      aclCreateTensor(dims, 2, ACL_FLOAT, nullptr, -1, ACL_FORMAT_ND, sdims, 2, storage.data()),
      nullptr);
}

// The caller's side of passing an integer where an enum is declared, as a C caller does; the
// out-of-range load happens here, on purpose, so it is exempt from the sanitizer.
template <typename E>
__attribute__((no_sanitize("enum"))) E as_enum(int bits) {
  E e;
  std::memcpy(&e, &bits, sizeof e);
  return e;
}
__attribute__((no_sanitize("enum"))) aclTensor *create_raw(int dtype, int format, float *data) {
  const int64_t dims[1] = {8};
  return aclCreateTensor(dims, 1, as_enum<aclDataType>(dtype), nullptr, 0,
                         as_enum<aclFormat>(format), dims, 1, data);
}
__attribute__((no_sanitize("enum"))) aclError malloc_raw(void **p, int policy) {
  return aclrtMalloc(p, 64, as_enum<aclrtMemMallocPolicy>(policy));
}
__attribute__((no_sanitize("enum"))) aclError memcpy_raw(float *data, int kind) {
  return aclrtMemcpy(data, 32, data + 4, 16, as_enum<aclrtMemcpyKind>(kind));
}

TEST(Runtime, EnumArgumentsOutsideTheirValuesAreIntegersNotUndefinedBehaviour) {
  // A C caller may pass any integer where an enum is declared; the library reads it as an integer
  // (clang's UBSan, in scripts/test.sh --clang-sanitize, reports a load of an out-of-range enum).
  std::vector<float> storage(8);
  aclTensor *t = create_raw(12345, ACL_FORMAT_ND, storage.data());
  EXPECT_NE(t, nullptr);  // described; every operator refuses its dtype
  aclDestroyTensor(t);
  t = create_raw(ACL_FLOAT, 777, storage.data());
  EXPECT_NE(t, nullptr);  // described; every operator refuses its format
  aclDestroyTensor(t);
  void *p = nullptr;
  EXPECT_EQ(malloc_raw(&p, 9), ACL_ERROR_INVALID_PARAM);
  EXPECT_NE(std::string(aclGetRecentErrMsg()).find("policy = 9"), std::string::npos);
  EXPECT_EQ(memcpy_raw(storage.data(), 42), ACL_ERROR_INVALID_PARAM);
  EXPECT_NE(std::string(aclGetRecentErrMsg()).find("kind = 42"), std::string::npos);
}

TEST(Runtime, CreateTensorRefusesOffsetsThatOverflow) {
  // Offsets near INT64_MAX: offset + reach and offset * element size overflow; refused with a
  // message, before any arithmetic that would be undefined (the sanitizer build checks that).
  std::vector<float> storage(16);
  const int64_t dims[2] = {2, 8}, sdims[1] = {16}, none[1] = {0};
  const int64_t big = INT64_MAX - 3;
  EXPECT_EQ(
      aclCreateTensor(dims, 2, ACL_FLOAT, nullptr, big, ACL_FORMAT_ND, sdims, 1, storage.data()),
      nullptr);
  EXPECT_NE(std::string(aclGetRecentErrMsg()).find("storage"), std::string::npos);
  // An empty view and a view without storage dims skip the storage check: the byte offset is
  // still checked.
  EXPECT_EQ(
      aclCreateTensor(none, 1, ACL_FLOAT, nullptr, big, ACL_FORMAT_ND, none, 1, storage.data()),
      nullptr);
  EXPECT_NE(std::string(aclGetRecentErrMsg()).find("overflows"), std::string::npos)
      << aclGetRecentErrMsg();
  EXPECT_EQ(
      aclCreateTensor(dims, 2, ACL_FLOAT, nullptr, big, ACL_FORMAT_ND, nullptr, 0, storage.data()),
      nullptr);
  EXPECT_NE(std::string(aclGetRecentErrMsg()).find("overflows"), std::string::npos)
      << aclGetRecentErrMsg();
}

#if FUSEKIT_TEST_HAVE_LAZY_ADAM  // an operator's phase two, here LazyAdam's (when it is built)
TEST(Executor, AConsumedExecutorIsRefusedWithoutBeingRead) {
  // Phase two consumes the executor; running or destroying it again is refused by the live set,
  // not by reading freed memory (which the sanitizer build would report).
  std::vector<float> g(8, 0.5f), m(16, 0.1f), v(16, 0.2f), w(16, 1.0f);
  int32_t idx[1] = {1};
  float lr = 0.1f;
  const int64_t gd[2] = {1, 8}, id[1] = {1}, td[2] = {2, 8}, ld[1] = {1};
  aclTensor *t[6] = {aclCreateTensor(gd, 2, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, gd, 2, g.data()),
                     aclCreateTensor(id, 1, ACL_INT32, nullptr, 0, ACL_FORMAT_ND, id, 1, idx),
                     aclCreateTensor(td, 2, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, td, 2, m.data()),
                     aclCreateTensor(td, 2, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, td, 2, v.data()),
                     aclCreateTensor(td, 2, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, td, 2, w.data()),
                     aclCreateTensor(ld, 1, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, ld, 1, &lr)};
  uint64_t ws = 0;
  aclOpExecutor *ex = nullptr;
  ASSERT_EQ(
      aclnnLazyAdamGetWorkspaceSize(t[0], t[1], t[2], t[3], t[4], t[5], 0.9, 0.999, 1e-7, &ws, &ex),
      ACLNN_SUCCESS);
  std::vector<char> buf(ws);
  ASSERT_EQ(aclnnLazyAdam(buf.data(), ws, ex, nullptr), ACLNN_SUCCESS);
  const std::vector<float> after = w;
  EXPECT_EQ(aclnnLazyAdam(buf.data(), ws, ex, nullptr), ACLNN_ERR_PARAM_INVALID);
  EXPECT_NE(std::string(aclGetRecentErrMsg()).find("not a live executor"), std::string::npos);
  EXPECT_EQ(aclDestroyAclOpExecutor(ex), ACLNN_ERR_PARAM_INVALID);
  EXPECT_EQ(w, after);  // the second run did nothing
  // A destroyed one too.
  ASSERT_EQ(
      aclnnLazyAdamGetWorkspaceSize(t[0], t[1], t[2], t[3], t[4], t[5], 0.9, 0.999, 1e-7, &ws, &ex),
      ACLNN_SUCCESS);
  EXPECT_EQ(aclDestroyAclOpExecutor(ex), ACLNN_SUCCESS);
  EXPECT_EQ(aclnnLazyAdam(buf.data(), ws, ex, nullptr), ACLNN_ERR_PARAM_INVALID);
  for (aclTensor *x : t) aclDestroyTensor(x);
}

TEST(Executor, PhaseTwoRefusesNullExecutor) {
  EXPECT_EQ(aclnnLazyAdam(nullptr, 0, nullptr, nullptr), ACLNN_ERR_PARAM_NULLPTR);
  EXPECT_NE(std::string(aclGetRecentErrMsg()).find("executor is null"), std::string::npos);
  EXPECT_EQ(aclDestroyAclOpExecutor(nullptr), ACLNN_SUCCESS);
}
#endif

}  // namespace
