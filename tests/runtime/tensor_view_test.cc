#include <gtest/gtest.h>

#include <vector>

#include "fusekit/tensor.h"

namespace {
using fusekit::DType;
using fusekit::TensorView;

TEST(TensorView, ContiguityAndOverlap) {
  std::vector<float> buf(3 * 4 * 10);
  // Three interleaved [4, 10] tables in one buffer with row stride 30: distinct elements.
  auto a = TensorView::strided(buf.data(), DType::kFloat32, {4, 10}, {30, 1});
  auto b = TensorView::strided(buf.data() + 10, DType::kFloat32, {4, 10}, {30, 1});
  auto c = TensorView::strided(buf.data() + 5, DType::kFloat32, {4, 10}, {30, 1});
  EXPECT_FALSE(a.is_contiguous());
  EXPECT_TRUE(a.inner_contiguous());
  EXPECT_EQ(a.shape_string(), "[4, 10]");
  EXPECT_FALSE(a.overlaps(b));
  EXPECT_TRUE(a.overlaps(c));
  EXPECT_TRUE(a.overlaps(a));
  auto whole = TensorView::of(buf.data(), {120});
  EXPECT_TRUE(whole.is_contiguous());
  EXPECT_TRUE(whole.overlaps(b));
  auto other = TensorView::of(buf.data() + 120 - 1, {0});
  EXPECT_FALSE(whole.overlaps(other));  // empty views overlap nothing
}

// A single row with a row stride whose bytes overflow int64 (fuzz_create_tensor's finding of
// 2026-12-02: 2^61 float elements): no overflow, and the byte ranges decide.
TEST(TensorView, OverlapWithAHugeRowStride) {
  std::vector<float> buf(16);
  constexpr int64_t kHuge = int64_t{1} << 61;
  auto a = TensorView::strided(buf.data(), DType::kFloat32, {1, 8}, {kHuge, 1});
  auto b = TensorView::strided(buf.data() + 4, DType::kFloat32, {1, 8}, {kHuge, 1});
  auto c = TensorView::strided(buf.data() + 8, DType::kFloat32, {1, 8}, {kHuge, 1});
  EXPECT_TRUE(a.overlaps(b));
  EXPECT_TRUE(b.overlaps(a));
  EXPECT_FALSE(a.overlaps(c));
  EXPECT_FALSE(c.overlaps(a));
}

}  // namespace
