// fusekit tests: the aclnn face in a test. Tensors owned by the test (destroyed with it), both
// phases with a host workspace, and the check of a refusal (code, the operator's name first in
// the message, the fragments it must name).
#ifndef FUSEKIT_TESTS_COMMON_ACLNN_TEST_UTIL_H_
#define FUSEKIT_TESTS_COMMON_ACLNN_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "acl/acl.h"

namespace fusekit::testing {

// aclTensors over the test's host buffers, destroyed with it.
struct AclTensors {
  std::vector<aclTensor *> owned;
  AclTensors() = default;
  AclTensors(const AclTensors &) = delete;
  AclTensors &operator=(const AclTensors &) = delete;
  ~AclTensors() {
    for (aclTensor *t : owned) aclDestroyTensor(t);
  }
  aclTensor *make(std::vector<int64_t> dims, aclDataType dt, void *data,
                  const int64_t *strides = nullptr) {
    aclTensor *t =
        aclCreateTensor(dims.data(), dims.size(), dt, strides, 0, ACL_FORMAT_ND, nullptr, 0, data);
    owned.push_back(t);
    return t;
  }
};

// Phase one (`phase_one(&workspace_size, &executor)`), then phase two (`run`) with a host
// workspace of the size asked for; the first failure's status.
template <class PhaseOne>
aclnnStatus both_phases(PhaseOne phase_one,
                        aclnnStatus (*run)(void *, uint64_t, aclOpExecutor *, aclrtStream)) {
  uint64_t ws = 0;
  aclOpExecutor *ex = nullptr;
  const aclnnStatus s = phase_one(&ws, &ex);
  if (s != ACLNN_SUCCESS) return s;
  std::vector<char> buf(ws);
  return run(buf.data(), ws, ex, nullptr);
}

inline std::string last_message() {
  return aclGetRecentErrMsg();
}

// A refusal: `code`, a message starting with `prefix` (the aclnn name) and naming every needle.
inline void expect_aclnn_refused(aclnnStatus got, aclnnStatus code, const std::string &prefix,
                                 const std::vector<std::string> &needles) {
  EXPECT_EQ(got, code);
  const std::string msg = last_message();
  EXPECT_EQ(msg.rfind(prefix, 0), 0u) << msg;
  for (const auto &s : needles)
    EXPECT_NE(msg.find(s), std::string::npos) << "'" << s << "' not in: " << msg;
}

}  // namespace fusekit::testing

#endif  // FUSEKIT_TESTS_COMMON_ACLNN_TEST_UTIL_H_
