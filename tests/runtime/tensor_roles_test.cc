// check_bound_tensors (src/common/implementation.h): the one check of the tensors bound to a run,
// from an operator's roles. Expected outcomes are written out by hand from the rule: layouts as
// planned, data present where needed, no memory shared between a written tensor and any other.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/implementation.h"

namespace {
using fusekit::DType;
using fusekit::Status;
using fusekit::StatusCode;
using fusekit::TensorRole;
using fusekit::TensorView;

// in: an input; out1, out2: written; map: an input read even when the run updates nothing.
constexpr TensorRole kRoles[4] = {{"in"}, {"out1", true}, {"out2", true}, {"map", false, true}};

struct Bound {  // four tensors apart in one buffer (not copyable: the views point into it)
  Bound() = default;
  Bound(const Bound &) = delete;
  std::vector<float> buf = std::vector<float>(64, 1.0f);
  TensorView t[4] = {TensorView::of(buf.data(), {8}), TensorView::of(buf.data() + 8, {8}),
                     TensorView::of(buf.data() + 16, {8}), TensorView::of(buf.data() + 24, {8})};
  Status check(const TensorView (&planned)[4]) const {
    const TensorView *p[4] = {&planned[0], &planned[1], &planned[2], &planned[3]};
    const TensorView *b[4] = {&t[0], &t[1], &t[2], &t[3]};
    return fusekit::check_bound_tensors("Op", kRoles, p, b);
  }
};

TensorView planned_of(const TensorView &t) {
  TensorView d = t;
  d.data = nullptr;
  return d;
}

void expect_refused(const Status &s, StatusCode code, const std::string &message) {
  EXPECT_EQ(s.code(), code) << s.message();
  EXPECT_EQ(s.message(), message);
}

TEST(TensorRoles, CheckBoundTensors) {
  Bound b;
  const TensorView planned[4] = {planned_of(b.t[0]), planned_of(b.t[1]), planned_of(b.t[2]),
                                 planned_of(b.t[3])};
  EXPECT_TRUE(b.check(planned).ok());

  // A written tensor against a later written one, then against an input; the written one first.
  {
    Bound o;
    o.t[2] = TensorView::of(o.buf.data() + 12, {8});  // out2 starts inside out1
    expect_refused(o.check(planned), StatusCode::kInvalidArgument,
                   "Op: out1 and out2 overlap in memory");
  }
  {
    Bound o;
    o.t[0] = TensorView::of(o.buf.data() + 20, {8});  // in starts inside out2
    expect_refused(o.check(planned), StatusCode::kInvalidArgument,
                   "Op: out2 and in overlap in memory");
  }
  {
    Bound o;                                     // two inputs may share memory
    o.t[3] = TensorView::of(o.buf.data(), {8});  // map on top of in
    EXPECT_TRUE(o.check(planned).ok());
  }

  // Data: needed where a tensor has elements, and for `map` even when it has none.
  {
    Bound o;
    o.t[1].data = nullptr;
    expect_refused(o.check(planned), StatusCode::kNullPointer, "Op: out1 has no data");
  }
  const TensorView empty_planned[4] = {
      planned_of(TensorView::of(static_cast<float *>(nullptr), {0})),
      planned_of(TensorView::of(static_cast<float *>(nullptr), {0})),
      planned_of(TensorView::of(static_cast<float *>(nullptr), {0})),
      planned_of(TensorView::of(static_cast<float *>(nullptr), {0}))};
  Bound e;
  for (auto &t : e.t) t = TensorView::of(static_cast<float *>(nullptr), {0});
  expect_refused(e.check(empty_planned), StatusCode::kNullPointer, "Op: map has no data");
  e.t[3] = TensorView::of(e.buf.data(), {0});
  EXPECT_TRUE(e.check(empty_planned).ok());

  // A layout other than the planned one names the tensor.
  Bound o;
  o.t[2] = TensorView::of(o.buf.data() + 16, {4});
  const Status s = o.check(planned);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("Op: out2 is float32 [4]", 0), 0u) << s.message();
}

}  // namespace
