// fusekit: AddLora, multi-adapter LoRA for serving (Punica's BGMV/SGMV, vLLM's add_lora).
//
//   out = y
//   for each row b with a = indices[b], 0 <= a < W:
//     t = x[b] . weightA[a, layer]^T                      [R]   (t = x[b] when weightA is absent)
//     out[b, yOffset : yOffset + H2] = y[b, yOffset : ...] + scale * (t . weightB[a, layer]^T)
//
// Accumulated in float32 (t stays float32) and rounded once, to the output dtype, at the end.
// A negative index or an index equal to W means "no adapter": that row of out is the row of y.
// out may be y itself (in place); otherwise y is not modified. See docs/add_lora.md.
//
// Two phases: AddLora::plan() validates shapes, dtypes, layouts and attributes and sizes the
// workspace; run() checks the indices (an index > W fails, naming the row, before anything is
// written), groups the rows by adapter with a stable counting sort in the workspace and runs
// each group as a small GEMM (prefill: many rows per adapter) or matrix-vector products (decode).
#ifndef FUSEKIT_ADD_LORA_H_
#define FUSEKIT_ADD_LORA_H_

#include <cstddef>
#include <cstdint>

#include "fusekit/export.h"
#include "fusekit/kernel_choice.h"
#include "fusekit/status.h"
#include "fusekit/tensor.h"

namespace fusekit {

// Which optimized path serves an adapter's group of rows.
enum class AddLoraPath {
  kAuto,     // by group size: groups of at least AddLora::kPrefillMinRows rows run as GEMMs
  kPrefill,  // every group as a GEMM (weights packed once per group, tiles over rows and columns)
  kDecode,   // every group as matrix-vector products that stream the adapter's weights once
};

struct AddLoraOptions {
  int64_t layer_idx = 0;
  double scale = 1.0;  // converted to float32 when planned
  int64_t y_offset = 0;
  int64_t y_slice_size = -1;  // -1 or H2
  KernelChoice kernel = KernelChoice::kAuto;
  AddLoraPath path = AddLoraPath::kAuto;  // ignored by the reference kernel
  int num_threads = 0;                    // 0: fusekit::num_threads() when the plan is made
};

struct AddLoraStats {
  int64_t rows_with_adapter = 0;                  // rows that received an update
  int64_t rows_without_adapter = 0;               // index < 0 or == W
  int64_t prefill_groups = 0, decode_groups = 0;  // adapters served by each path (optimized kernel)
};

class AddLora {
 public:
  // Groups smaller than this run on the decode path under AddLoraPath::kAuto.
  static constexpr int64_t kPrefillMinRows = 8;

  // Phase one. y, out: [B, H3]; x: [B, H1]; weight_b: [W, L, H2, R]; indices: int32 [B];
  // weight_a: [W, L, R, H1], or an empty TensorView (then H1 must equal R). y, x, weights and out
  // share one dtype: float16, bfloat16 or float32. Every tensor needs a contiguous innermost
  // dimension; outer strides are free (out can be a slice of a wider buffer). out may be exactly
  // y; any other overlap of out with an input is refused.
  FUSEKIT_API static Status plan(const TensorView &y, const TensorView &x,
                                 const TensorView &weight_b, const TensorView &indices,
                                 const TensorView &weight_a, const TensorView &out,
                                 const AddLoraOptions &options, AddLora *plan);

  // Bytes of scratch memory run() needs (run() aligns the pointer itself).
  size_t workspace_size() const { return workspace_bytes_; }

  // Phase two. Reads the indices (an index > W fails with kShapeMismatch naming the row, and
  // nothing is written), then computes out.
  FUSEKIT_API Status run(void *workspace, size_t workspace_size,
                         AddLoraStats *stats = nullptr) const;

  int64_t batch() const { return b_; }
  int64_t rank() const { return r_; }
  int64_t adapters() const { return w_; }
  // The instruction set the optimized kernel runs on ("AVX3", "AVX2", ...).
  FUSEKIT_API static const char *optimized_target();

 private:
  TensorView y_, x_, wb_, idx_, wa_, out_;
  int64_t b_ = 0, h1_ = 0, h2_ = 0, h3_ = 0, r_ = 0, w_ = 0, layer_ = 0, y_offset_ = 0;
  bool has_a_ = false, in_place_ = false;
  float scale_ = 1.0f;
  KernelChoice kernel_ = KernelChoice::kAuto;
  AddLoraPath path_ = AddLoraPath::kAuto;
  int threads_ = 1;
  size_t workspace_bytes_ = 0;
};

// One call: plan, allocate the workspace, run.
FUSEKIT_API Status add_lora(const TensorView &y, const TensorView &x, const TensorView &weight_b,
                            const TensorView &indices, const TensorView &weight_a,
                            const TensorView &out, const AddLoraOptions &options = {},
                            AddLoraStats *stats = nullptr);

}  // namespace fusekit

#endif  // FUSEKIT_ADD_LORA_H_
