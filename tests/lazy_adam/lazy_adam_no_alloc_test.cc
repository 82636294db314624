// Phase two allocates nothing beyond the workspace phase one sized: this program replaces the
// global operator new (the library is a shared object, so its calls land here too) and counts
// allocations made while plan.run() and aclnnLazyAdam run.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>
#include <utility>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_lazy_adam.h"
#include "fusekit/lazy_adam.h"

// The replacement pair below is malloc/free on purpose; GCC cannot see that they match.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace {
std::atomic<long> g_allocations{0};
std::atomic<bool> g_counting{false};
std::atomic<bool> g_fail{false};  // every allocation throws std::bad_alloc
}  // namespace

void *operator new(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed))
    g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (g_fail.load(std::memory_order_relaxed)) throw std::bad_alloc();
  if (void *p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void *p) noexcept {
  std::free(p);
}
void operator delete(void *p, std::size_t) noexcept {
  std::free(p);
}

namespace {

using fusekit::TensorView;

struct Counting {
  Counting() { g_allocations = 0, g_counting = true; }
  ~Counting() { g_counting = false; }
  long count() const { return g_allocations.load(); }
};

TEST(LazyAdamNoAlloc, PhaseTwoAllocatesNothing) {
  const int64_t rows = 5000, n = 3000, dim = 16;
  std::vector<float> grad(n * dim, 0.5f), m(rows * dim, 0.1f), v(rows * dim, 0.2f),
      var(rows * dim, 1.0f);
  std::vector<int32_t> idx(n);
  for (int64_t i = 0; i < n; ++i) idx[i] = static_cast<int32_t>((i * 7) % rows);
  idx[10] = idx[20];  // a duplicate: the grouping path
  fusekit::LazyAdam plan;
  ASSERT_TRUE(fusekit::LazyAdam::plan(
                  TensorView::of(grad.data(), {n, dim}), TensorView::of(idx.data(), {n}),
                  TensorView::of(m.data(), {rows, dim}), TensorView::of(v.data(), {rows, dim}),
                  TensorView::of(var.data(), {rows, dim}), {}, &plan)
                  .ok());
  std::vector<char> ws(plan.workspace_size());
  ASSERT_TRUE(plan.run(0.01f, ws.data(), ws.size()).ok());  // warm up (thread pool start)
  Counting c;
  for (int rep = 0; rep < 3; ++rep) ASSERT_TRUE(plan.run(0.01f, ws.data(), ws.size()).ok());
  EXPECT_EQ(c.count(), 0);
}

// A LazyAdam problem as aclTensors over host tables: gradient 0.5, m 0.1, v 0.2, var 1, lr 0.01.
struct AclTables {
  AclTables(int64_t n_, int64_t rows_, int64_t dim_, std::vector<int32_t> idx_)
      : n(n_),
        rows(rows_),
        dim(dim_),
        grad(n * dim, 0.5f),
        m(rows * dim, 0.1f),
        v(rows * dim, 0.2f),
        var(rows * dim, 1.0f),
        idx(std::move(idx_)) {
    t[0] = aclCreateTensor(gd, 2, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, gd, 2, grad.data());
    t[1] = aclCreateTensor(id, 1, ACL_INT32, nullptr, 0, ACL_FORMAT_ND, id, 1, idx.data());
    t[2] = aclCreateTensor(td, 2, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, td, 2, m.data());
    t[3] = aclCreateTensor(td, 2, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, td, 2, v.data());
    t[4] = aclCreateTensor(td, 2, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, td, 2, var.data());
    t[5] = aclCreateTensor(ld, 1, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, ld, 1, &lr);
  }
  ~AclTables() {
    for (aclTensor *x : t) aclDestroyTensor(x);
  }
  aclnnStatus phase_one(uint64_t *ws, aclOpExecutor **ex) const {
    return aclnnLazyAdamGetWorkspaceSize(t[0], t[1], t[2], t[3], t[4], t[5], 0.9, 0.999, 1e-7, ws,
                                         ex);
  }
  int64_t n, rows, dim;
  std::vector<float> grad, m, v, var;
  std::vector<int32_t> idx;
  float lr = 0.01f;
  int64_t gd[2] = {n, dim}, id[1] = {n}, td[2] = {rows, dim}, ld[1] = {1};
  aclTensor *t[6];
};

TEST(LazyAdamNoAlloc, AclnnPhaseTwoAllocatesNothing) {
  std::vector<int32_t> idx(50);
  for (int32_t i = 0; i < 50; ++i) idx[i] = i * 2;
  const AclTables a(50, 100, 8, idx);
  for (int rep = 0; rep < 2; ++rep) {
    uint64_t ws = 0;
    aclOpExecutor *ex = nullptr;
    ASSERT_EQ(a.phase_one(&ws, &ex), 0);
    std::vector<char> buf(ws);
    long count = 0;
    {
      Counting c;
      ASSERT_EQ(aclnnLazyAdam(buf.data(), ws, ex, nullptr), 0);
      count = c.count();
    }
    if (rep == 1) {
      EXPECT_EQ(count, 0);  // rep 0 warms up the thread pool
    }
  }
}

// Nothing throws across the C boundary: with every allocation failing, phase one, tensor and
// stream creation return their error codes (and record a message when they can).
TEST(LazyAdamNoAlloc, AllocationFailureIsAStatusNotAnException) {
  const AclTables a(4, 10, 8, {1, 2, 3, 4});
  uint64_t ws = 0;
  aclOpExecutor *ex = nullptr;
  aclnnStatus phase_one = -1;
  aclTensor *made = reinterpret_cast<aclTensor *>(1);
  aclError stream_status = ACL_SUCCESS;
  aclrtStream stream = nullptr;
  g_fail = true;
  EXPECT_NO_THROW(phase_one = a.phase_one(&ws, &ex));
  EXPECT_NO_THROW(made = aclCreateTensor(a.gd, 2, ACL_FLOAT, nullptr, 0, ACL_FORMAT_ND, a.gd, 2,
                                         const_cast<float *>(a.grad.data())));
  EXPECT_NO_THROW(stream_status = aclrtCreateStream(&stream));
  g_fail = false;
  EXPECT_EQ(phase_one, ACLNN_ERR_INNER);
  EXPECT_EQ(ex, nullptr);
  EXPECT_EQ(made, nullptr);
  EXPECT_EQ(stream_status, ACL_ERROR_BAD_ALLOC);
  // Memory again: everything works, nothing was modified.
  ASSERT_EQ(a.phase_one(&ws, &ex), 0);
  EXPECT_EQ(aclDestroyAclOpExecutor(ex), 0);
  EXPECT_TRUE(std::all_of(a.m.begin(), a.m.end(), [](float x) { return x == 0.1f; }));
}

}  // namespace
