// The embedding-bag optimizers' shared checks, front stages and scalar row gradient
// (common/embedding_bags.h).
#include "common/embedding_bags.h"

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <utility>

#include "common/implementation.h"
#include "common/parallel.h"
#include "common/str_cat.h"

namespace fusekit {
namespace {

// Lookups and bags are numbered in 32 bits (the entries pack row and lookup; the bag of a lookup is
// a uint32).
constexpr int64_t kMaxBatch = int64_t{std::numeric_limits<uint32_t>::max()};

// A 1-D batch tensor (indices, offsets, per_sample_weights) of one of the dtypes named.
Status check_vector(const char *op, const TensorView &t, const char *name,
                    std::initializer_list<DType> dtypes, const char *dtypes_text) {
  bool dtype_ok = false;
  for (DType d : dtypes) dtype_ok = dtype_ok || t.dtype == d;
  if (!dtype_ok) {
    return Status::Invalid(str_cat(op, ": ", name, " has dtype ", dtype_name(t.dtype), "; ",
                                   dtypes_text, " is required"));
  }
  if (t.ndim != 1) {
    return Status::Invalid(str_cat(op, ": ", name, " must be 1-D, got shape ", t.shape_string()));
  }
  return Status::Ok();
}

// Element i of an int32 or int64 vector with any stride.
struct IntReader {
  const void *data;
  int64_t stride;
  bool wide;
  int64_t operator()(int64_t i) const {
    return wide ? static_cast<const int64_t *>(data)[i * stride]
                : static_cast<const int32_t *>(data)[i * stride];
  }
};
IntReader reader_of(const TensorView &t) {
  return {t.data, t.strides[0], t.dtype == DType::kInt64};
}

// The offsets stage's check: offsets[0] = 0, non-decreasing, offsets[B] = L (read only).
Status check_offsets(const char *op, const IntReader &off, int64_t bags, int64_t lookups) {
  if (off(0) != 0) {
    return Status::Invalid(str_cat(op, ": offsets[0] = ", off(0),
                                   " but the first bag must start at 0; nothing was modified"));
  }
  for (int64_t b = 0; b < bags; ++b) {
    if (off(b + 1) < off(b)) {
      return Status::Invalid(str_cat(op, ": offsets[", b + 1, "] = ", off(b + 1), " < offsets[", b,
                                     "] = ", off(b),
                                     ": offsets must be non-decreasing; nothing was modified"));
    }
  }
  if (off(bags) != lookups) {
    return Status::Invalid(str_cat(op, ": offsets[", bags, "] = ", off(bags), " but indices has ",
                                   lookups,
                                   " entries: the last offset must be the number of lookups; "
                                   "nothing was modified"));
  }
  return Status::Ok();
}

// The first index out of [0, rows), as a refusal (the check stage found one).
Status refuse_first_bad_index(const char *op, const TensorView &indices, int64_t rows) {
  const IntReader idx = reader_of(indices);
  const int64_t n = indices.shape[0];
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = idx(i);
    if (r < 0) {
      return Status::Invalid(str_cat(op, ": indices[", i, "] = ", r,
                                     " is negative (ids are rows 0 .. R - 1; a lookup to skip is "
                                     "left out of its bag); nothing was modified"));
    }
    if (r >= rows) {
      return Status::Invalid(str_cat(op, ": indices[", i, "] = ", r, " but the table has ", rows,
                                     " rows; nothing was modified"));
    }
  }
  return Status::Invalid(str_cat(op, ": an index is out of range; nothing was modified"));
}

}  // namespace

Status check_bag_inputs(const char *op, const TensorView &grad_output, const TensorView &indices,
                        const TensorView &offsets, const TensorView &per_sample_weights,
                        PoolingMode pooling, int64_t rows, int64_t dim, bool *weighted) {
  FUSEKIT_RETURN_IF_ERROR(check_float_row_table(op, grad_output, "grad_output"));
  FUSEKIT_RETURN_IF_ERROR(
      check_vector(op, indices, "indices", {DType::kInt32, DType::kInt64}, "int32 or int64"));
  FUSEKIT_RETURN_IF_ERROR(
      check_vector(op, offsets, "offsets", {DType::kInt32, DType::kInt64}, "int32 or int64"));
  *weighted = !per_sample_weights.empty_view();
  if (*weighted) {
    FUSEKIT_RETURN_IF_ERROR(
        check_vector(op, per_sample_weights, "per_sample_weights", {DType::kFloat32}, "float32"));
  }
  if (grad_output.shape[1] != dim) {
    return Status::Invalid(str_cat(op, ": grad_output has ", grad_output.shape[1],
                                   " columns but the table has ", dim, " (grad_output ",
                                   grad_output.shape_string(), ", var [", rows, ", ", dim, "])"));
  }
  if (rows >= kMaxBatch) {
    return Status::Invalid(str_cat(op, ": a table of ", rows,
                                   " rows exceeds this implementation's limit of 2^32 - 2"));
  }
  if (pooling != PoolingMode::kSum && pooling != PoolingMode::kMean) {
    return Status::Invalid(str_cat(op, ": pooling = ", static_cast<int>(pooling),
                                   " is not a pooling mode (sum 0, mean 1)"));
  }
  return Status::Ok();
}

Status check_bag_batch(const char *op, const TensorView &grad_output, const TensorView &indices,
                       const TensorView &offsets, const TensorView &per_sample_weights,
                       bool weighted) {
  const int64_t b = grad_output.shape[0], l = indices.shape[0];
  FUSEKIT_RETURN_IF_ERROR(check_float_row_table(op, grad_output, "grad_output"));
  if (l < 0 || offsets.shape[0] < 0) {
    return Status::Invalid(str_cat(op, ": indices ", indices.shape_string(), " or offsets ",
                                   offsets.shape_string(), " has a negative size"));
  }
  if (offsets.shape[0] != b + 1) {
    return Status::Invalid(
        str_cat(op, ": offsets has ", offsets.shape[0], " entries but grad_output has ", b,
                " bags: offsets must have B + 1 = ", b + 1,
                " (TorchRec's form, the last one the number of lookups; nn.EmbeddingBag's offsets "
                "need L appended)"));
  }
  if (weighted && per_sample_weights.shape[0] != l) {
    return Status::Invalid(str_cat(op, ": per_sample_weights has ", per_sample_weights.shape[0],
                                   " entries but indices has ", l,
                                   "; one weight per lookup is required"));
  }
  if (l > kMaxBatch || b >= kMaxBatch) {
    return Status::Invalid(
        str_cat(op, ": ", l, " lookups in ", b,
                " bags exceeds this implementation's limit of 2^32 - 1 of each"));
  }
  for (const auto &[v, name] : {std::pair{&indices, "indices"},
                                {&offsets, "offsets"},
                                {&per_sample_weights, "per_sample_weights"}}) {
    if (v->ndim == 1 && v->shape[0] > 1 && v->strides[0] < 0) {
      return Status::Invalid(str_cat(op, ": ", name, " has a negative stride ", v->strides[0]));
    }
    int64_t span = 0;
    if (v->ndim == 1 && v->shape[0] > 0 &&
        __builtin_mul_overflow(v->shape[0], std::max<int64_t>(v->strides[0], 1), &span)) {
      return Status::Invalid(
          str_cat(op, ": ", name, " of shape ", v->shape_string(), " overflows 64-bit sizes"));
    }
  }
  return Status::Ok();
}

BagLayout bag_layout(int64_t bags, int64_t lookups, int64_t rows, bool mean, int threads) {
  BagLayout w;
  w.groups = row_groups_layout(lookups, rows, threads);
  size_t off = w.groups.total;
  w.bag_of = off;
  off += align_up(static_cast<size_t>(lookups) * sizeof(uint32_t));
  w.bag_scale = off;
  if (mean) off += align_up(static_cast<size_t>(bags) * sizeof(float));
  w.end = off;
  return w;
}

Status bag_front_stages(const char *op, const TensorView &grad_output, const TensorView &indices,
                        const TensorView &offsets, const TensorView &per_sample_weights,
                        bool weighted, bool mean, int64_t rows, char *workspace,
                        const BagLayout &layout, int threads, RowEntries *e,
                        BagGradientArgs *bags_out, StageTimer &timer) {
  const int64_t bags = grad_output.shape[0], lookups = indices.shape[0];
  // ---- offsets: checked, then the bag of every lookup and the bags' scales ----
  const IntReader off = reader_of(offsets);
  FUSEKIT_RETURN_IF_ERROR(check_offsets(op, off, bags, lookups));
  *e = RowEntries();
  if (lookups == 0) {  // empty bags only: nothing to update
    timer.stage("offsets");
    return Status::Ok();
  }
  auto *bag_of = reinterpret_cast<uint32_t *>(workspace + layout.bag_of);
  auto *bag_scale = reinterpret_cast<float *>(workspace + layout.bag_scale);
  for (int64_t b = 0; b < bags; ++b) {
    const int64_t lo = off(b), hi = off(b + 1);
    for (int64_t i = lo; i < hi; ++i) bag_of[i] = static_cast<uint32_t>(b);
    if (mean) bag_scale[b] = hi > lo ? 1.0f / static_cast<float>(hi - lo) : 0.0f;
  }
  timer.stage("offsets");

  // ---- check: every index in [0, R), and the entries (row << 32 | lookup) ----
  const Status checked =
      row_groups_check(op, indices, rows, workspace, layout.groups, threads, e, timer);
  // row_groups_check takes negative ids as padding; here they are refused, like ids >= R, naming
  // the first bad position of either kind.
  if (!checked.ok() || e->padding > 0) return refuse_first_bad_index(op, indices, rows);

  bags_out->grad_output = grad_output.as<const float>();
  bags_out->grad_stride = grad_output.strides[0];
  bags_out->bag_of = bag_of;
  bags_out->bag_scale = mean ? bag_scale : nullptr;
  bags_out->weights = weighted ? per_sample_weights.as<const float>() : nullptr;
  bags_out->weight_stride = weighted ? per_sample_weights.strides[0] : 0;
  return Status::Ok();
}

void bag_entries_hold_bags(const RowEntries &e, int64_t lookups, int threads,
                           BagGradientArgs *bags) {
  if (bags->weights != nullptr) return;
  auto *entries = const_cast<uint64_t *>(e.entries);  // the workspace's, written by check
  const uint32_t *bag_of = bags->bag_of;
  parallel_for(lookups, threads, int64_t{1} << 14, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i)
      entries[i] = (entries[i] & ~uint64_t{0xffffffffu}) | bag_of[i];
  });
  bags->bag_of = nullptr;
}

int64_t bag_row_gradient_reference(const BagGradientArgs &a, const uint64_t *entries, int64_t k,
                                   int64_t end, int64_t dim, float *g) {
  const uint64_t row = entries[k] >> 32;
  const bool scaled = a.scaled();
  bool first = true;
  for (; k < end && (entries[k] >> 32) == row; ++k) {
    const auto i = static_cast<int64_t>(entries[k] & 0xffffffffu);
    const uint32_t b = a.bag(entries[k]);
    const float *go = a.grad_output + static_cast<int64_t>(b) * a.grad_stride;
    const float s = a.bag_scale != nullptr ? a.bag_scale[b] : 1.0f;
    const float c = a.weights != nullptr ? s * a.weights[i * a.weight_stride] : s;
    for (int64_t j = 0; j < dim; ++j) {
      const float x = scaled ? go[j] * c : go[j];
      g[j] = first ? x : g[j] + x;
    }
    first = false;
  }
  return k;
}

}  // namespace fusekit
