// An outside program: built against an installed fusekit with find_package(fusekit). It makes one
// LazyAdam step through the aclnn API and one through the C++ API and checks a value of each.
#include <cmath>
#include <cstdio>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_lazy_adam.h"
#include "fusekit/lazy_adam.h"

int main() {
  if (aclInit(nullptr) != ACL_SUCCESS || aclrtSetDevice(0) != ACL_SUCCESS) return 1;
  std::vector<float> grad = {1.0f, 2.0f}, m = {0, 0, 0, 0}, v = {0, 0, 0, 0}, var = {1, 1, 1, 1};
  std::vector<int32_t> idx = {1};
  float lr = 0.5f;
  const int64_t gdims[2] = {1, 2}, idims[1] = {1}, tdims[2] = {2, 2}, ldims[1] = {1};
  aclTensor *g =
      aclCreateTensor(gdims, 2, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, gdims, 2, grad.data());
  aclTensor *i =
      aclCreateTensor(idims, 1, ACL_INT32, nullptr, 0, ACL_FORMAT_ND, idims, 1, idx.data());
  aclTensor *tm =
      aclCreateTensor(tdims, 2, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, tdims, 2, m.data());
  aclTensor *tv =
      aclCreateTensor(tdims, 2, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, tdims, 2, v.data());
  aclTensor *tw =
      aclCreateTensor(tdims, 2, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, tdims, 2, var.data());
  aclTensor *tl = aclCreateTensor(ldims, 1, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, ldims, 1, &lr);
  uint64_t ws = 0;
  aclOpExecutor *ex = nullptr;
  if (aclnnLazyAdamGetWorkspaceSize(g, i, tm, tv, tw, tl, 0.9, 0.999, 1e-7, &ws, &ex) !=
      ACLNN_SUCCESS) {
    std::printf("phase one failed: %s\n", aclGetRecentErrMsg());
    return 1;
  }
  std::vector<char> workspace(ws);
  if (aclnnLazyAdam(workspace.data(), ws, ex, nullptr) != ACLNN_SUCCESS) return 1;
  // m = 0.1 * g = 0.1 (float32 arithmetic), v = 0.001 * g^2, var = 1 - 0.5 * m / (sqrt(v) + eps).
  const float m_want = 1.0f * (1.0f - 0.9f);
  if (m[2] != m_want || var[0] != 1.0f || !(var[2] < 1.0f)) {
    std::printf("unexpected result: m[2] = %g, var[2] = %g\n", m[2], var[2]);
    return 1;
  }
  for (aclTensor *t : {g, i, tm, tv, tw, tl}) aclDestroyTensor(t);

  using fusekit::TensorView;
  fusekit::LazyAdamStats stats;
  fusekit::Status st =
      fusekit::lazy_adam_step(TensorView::of(grad.data(), {1, 2}), TensorView::of(idx.data(), {1}),
                              TensorView::of(m.data(), {2, 2}), TensorView::of(v.data(), {2, 2}),
                              TensorView::of(var.data(), {2, 2}), 0.5f, {}, &stats);
  if (!st.ok() || stats.rows_updated != 1) {
    std::printf("C++ API failed: %s\n", st.message().c_str());
    return 1;
  }
  std::printf("consumer OK: var[2] = %.9g\n", var[2]);
  aclFinalize();
  return 0;
}
