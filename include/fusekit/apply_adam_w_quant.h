// fusekit: ApplyAdamWQuant, one AdamW step whose moments m and v are kept as 8-bit codes into two
// 256-entry maps with one float32 scale (absmax) per block of 256 elements (the block-wise 8-bit
// optimizer of Dettmers et al., bitsandbytes' AdamW8bit), and AdamW, the same step on float32
// moments.
//
//   t   = step + 1                 c1 = 1 - beta1^t          c2s = sqrt(1 - beta2^t)
//   step_size = -lr * c2s / c1     (all derived scalars in float32, as CANN's kernel computes them)
//   per element of block b:
//     g   = grad * gnorm_scale
//     m   = qmap_m[m_code] * absmax_m[b];   v = qmap_v[v_code] * absmax_v[b]      (8-bit only)
//     m   = m * beta1 + g * (1 - beta1)
//     v   = v * beta2 + (g * g) * (1 - beta2)
//     var = var + (m * step_size) / (sqrt(v) + eps * c2s)
//     if weight_decay > 0: var = var * (1 - lr * weight_decay)       (after the Adam step)
//   per block (8-bit only): absmax_m = max |m|, absmax_v = max v; codes = the nearest map entry to
//   m / absmax_m (resp. v / absmax_v; an absmax of 0 divides by 1), ties to the lower index, and
//   for m the sign fix (see docs/apply_adam_w_quant.md).
//
// This is CANN's kernel (t = step + 1, decay after the step), not the seed document's formula.
// A block (8-bit) or element (AdamW) whose gradient holds NaN or Inf is left bit-for-bit unchanged
// and counted. See docs/apply_adam_w_quant.md.
#ifndef FUSEKIT_APPLY_ADAM_W_QUANT_H_
#define FUSEKIT_APPLY_ADAM_W_QUANT_H_

#include <array>
#include <cstddef>
#include <cstdint>

#include "fusekit/export.h"
#include "fusekit/kernel_choice.h"
#include "fusekit/status.h"
#include "fusekit/tensor.h"

namespace fusekit {

// Elements per absmax block (the only block size CANN's kernel and this one accept).
inline constexpr int64_t kAdamWQuantBlockSize = 256;
// Entries in a quantization map.
inline constexpr int kQuantMapSize = 256;

// The dynamic quantization map of bitsandbytes' create_dynamic_map: for each of
// `max_exponent_bits` decades 10^(i - max_exponent_bits + 1), the midpoints of an even split of
// [0.1, 1] (2^i of them per sign when signed, 2^(i+1) when unsigned), then 0 and 1.0, padded with
// zeros to 256 entries and sorted ascending. Signed (for m): 127 negative values, 0, 127 positive
// values and 1.0. Unsigned (for v): 0, 254 positive values and 1.0. Computed in double, rounded
// once to float32. max_exponent_bits outside [1, 7] is clamped.
FUSEKIT_API std::array<float, kQuantMapSize> create_dynamic_map(bool is_signed,
                                                                int max_exponent_bits = 7);

// How the optimized kernel finds the nearest code (the reference kernel always uses the same
// exact threshold search, by binary search).
enum class QuantSearch {
  kAuto,          // kTable for tensors of 65,536 elements or more, else kBinarySearch
  kTable,         // a 65,536-entry table over the normalized value's float bits, then a comparison
  kBinarySearch,  // 8 branch-free steps over the 255 decision thresholds
};

struct ApplyAdamWQuantOptions {
  // The attributes as the aclnn call takes them (doubles, converted to float32 when planned).
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double weight_decay = 0.0;
  double eps = 1e-8;
  double gnorm_scale = 1.0;
  int64_t block_size = kAdamWQuantBlockSize;  // must be 256
  KernelChoice kernel = KernelChoice::kAuto;
  QuantSearch search = QuantSearch::kAuto;
  int num_threads = 0;  // 0: fusekit::num_threads() when the plan is made
};

struct ApplyAdamWQuantStats {
  int64_t blocks_updated = 0;
  int64_t blocks_skipped_nonfinite = 0;  // left bit-for-bit unchanged: NaN or Inf in the gradient
};

class ApplyAdamWQuant {
 public:
  // Phase one. var, grad: float32, float16 or bfloat16 (the same), 1 to 8 dimensions, n elements;
  // m, v: uint8 codes of var's shape; qmap_m, qmap_v: float32 [256]; absmax_m, absmax_v: float32
  // [ceil(n / 256)]. var, m, v, absmax_m and absmax_v are updated in place and must not share
  // memory with each other or with any input. var, grad, m and v may have any strides (a view that
  // is not contiguous runs on a gathering path); the 1-D tensors may have any stride.
  FUSEKIT_API static Status plan(const TensorView &var, const TensorView &grad, const TensorView &m,
                                 const TensorView &v, const TensorView &qmap_m,
                                 const TensorView &qmap_v, const TensorView &absmax_m,
                                 const TensorView &absmax_v, const ApplyAdamWQuantOptions &options,
                                 ApplyAdamWQuant *out);

  // Bytes of scratch memory run() needs (the search tables of both maps, built by run()).
  size_t workspace_size() const { return workspace_bytes_; }

  // Phase two. Checks step (0 <= step < 2^62) and both maps (256 finite floats in ascending order,
  // ties allowed) before writing anything, builds the search tables in the workspace, then runs.
  FUSEKIT_API Status run(int64_t step, void *workspace, size_t workspace_size,
                         ApplyAdamWQuantStats *stats = nullptr) const;

  int64_t numel() const { return n_; }
  int64_t num_blocks() const { return blocks_; }
  // True when run() will use the 65,536-entry table (kTable, or kAuto on a large tensor).
  bool uses_table() const { return use_table_; }

 private:
  TensorView var_, grad_, m_, v_, qmap_m_, qmap_v_, absmax_m_, absmax_v_;
  int64_t n_ = 0, blocks_ = 0;
  bool contiguous_ = true;
  float lr_ = 0, beta1_ = 0, beta2_ = 0, weight_decay_ = 0, eps_ = 0, gnorm_scale_ = 0;
  KernelChoice kernel_ = KernelChoice::kAuto;
  bool use_table_ = false;
  int threads_ = 1;
  size_t workspace_bytes_ = 0;
};

// One call: plan, allocate the workspace, run.
FUSEKIT_API Status apply_adam_w_quant_step(const TensorView &var, const TensorView &grad,
                                           const TensorView &m, const TensorView &v,
                                           const TensorView &qmap_m, const TensorView &qmap_v,
                                           const TensorView &absmax_m, const TensorView &absmax_v,
                                           int64_t step, const ApplyAdamWQuantOptions &options = {},
                                           ApplyAdamWQuantStats *stats = nullptr);

// ---------------------------------------------------------------------------------------------
// AdamW on float32 moments: the same step without quantization. For the tensors an 8-bit
// optimizer keeps in 32-bit (small ones), and the yardstick of the 8-bit operator's benchmark.
// ---------------------------------------------------------------------------------------------
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double weight_decay = 0.0;
  double eps = 1e-8;
  double gnorm_scale = 1.0;
  KernelChoice kernel = KernelChoice::kAuto;
  int num_threads = 0;
};

struct AdamWStats {
  int64_t elements_skipped_nonfinite = 0;  // left unchanged: NaN or Inf gradient
};

class AdamW {
 public:
  // var, grad: float32, float16 or bfloat16 (the same), contiguous, n elements; m, v: float32,
  // contiguous, n elements. var, m and v are updated in place and must not overlap each other or
  // grad. No workspace.
  FUSEKIT_API static Status plan(const TensorView &var, const TensorView &grad, const TensorView &m,
                                 const TensorView &v, const AdamWOptions &options, AdamW *out);
  // Phase two: 0 <= step < 2^62 (t = step + 1, as for ApplyAdamWQuant).
  FUSEKIT_API Status run(int64_t step, AdamWStats *stats = nullptr) const;

  int64_t numel() const { return n_; }

 private:
  TensorView var_, grad_, m_, v_;
  int64_t n_ = 0;
  float lr_ = 0, beta1_ = 0, beta2_ = 0, weight_decay_ = 0, eps_ = 0, gnorm_scale_ = 0;
  KernelChoice kernel_ = KernelChoice::kAuto;
  int threads_ = 1;
};

FUSEKIT_API Status adam_w_step(const TensorView &var, const TensorView &grad, const TensorView &m,
                               const TensorView &v, int64_t step, const AdamWOptions &options = {},
                               AdamWStats *stats = nullptr);

}  // namespace fusekit

#endif  // FUSEKIT_APPLY_ADAM_W_QUANT_H_
