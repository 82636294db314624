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
// An AddLoraProblem (shapes, dtypes, strides, devices, attributes; no data) is validated once;
// AddLora::plan() picks an implementation from AddLora::implementations() and sizes its
// workspace; run() binds the tensors of one call (checked against the problem), checks the
// indices (an index > W fails, naming the row, before anything is written), groups the rows by
// adapter and computes. A plan is reused for any number of runs, on other buffers each time.
//
// In place is a property of each binding, not of the problem: a run whose out is y itself (the
// same data pointer; the problem's out then has y's layout) updates y in place, and a run whose
// out is a separate buffer leaves y alone and copies the untouched part of y into out. One plan
// serves both. Any other overlap of out with y, or any overlap of out with x, the weights or the
// indices, is refused when the tensors are bound (AddLoraProblem::check).
#ifndef FUSEKIT_ADD_LORA_H_
#define FUSEKIT_ADD_LORA_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fusekit/device.h"
#include "fusekit/export.h"
#include "fusekit/kernel_choice.h"
#include "fusekit/plan_state.h"
#include "fusekit/status.h"
#include "fusekit/tensor.h"

namespace fusekit {

struct AddLoraOptions {
  int64_t layer_idx = 0;
  double scale = 1.0;  // converted to float32 when the problem is made
  int64_t y_offset = 0;
  int64_t y_slice_size = -1;  // -1 or H2
  KernelChoice kernel = KernelChoice::kAuto;
  // A name from AddLora::implementations(), or auto. cpu_hwy serves a group of at least
  // kPrefillMinRows rows as a GEMM (weights packed once per group, tiles over rows and columns),
  // a smaller one without packing (register tiles over rows and ranks; weightB transposed in
  // registers, a block of columns at a time);
  // cpu_hwy_prefill and cpu_hwy_decode (by name only) put every group on one path.
  const char *implementation = nullptr;
  int num_threads = 0;  // 0: fusekit::num_threads() when the plan is made
};

struct AddLoraStats {
  int64_t rows_with_adapter = 0;                  // rows that received an update
  int64_t rows_without_adapter = 0;               // index < 0 or == W
  int64_t prefill_groups = 0, decode_groups = 0;  // adapters served by each path (cpu_hwy)
};

// The tensors of one run. y, out: [B, H3]; x: [B, H1]; weight_b: [W, L, H2, R]; indices: int32
// (CANN's) or int64 (torch's and vLLM's, read as it is) [B], any stride; weight_a: [W, L, R, H1],
// or an empty TensorView (then H1 must equal R). y, x, the weights and out share one dtype:
// float16, bfloat16 or float32. Every other tensor needs a contiguous innermost dimension; outer
// strides are free (out can be a slice of a wider buffer).
struct AddLoraTensors {
  TensorView y, x, weight_b, indices, weight_a, out;
};

// What a plan is made for: shapes, dtypes, strides, devices and attributes. Data pointers are not
// looked at (the descriptions keep them null).
class AddLoraProblem {
 public:
  // Validates everything that shapes, dtypes, strides and attributes can tell (the codes and
  // messages of aclnnAddLora: dtypes 161002, ranks and shape relations 561002, ...).
  FUSEKIT_API static Status make(const AddLoraTensors &tensors, const AddLoraOptions &options,
                                 AddLoraProblem *out);
  // Checks the tensors bound to a run: the problem's layouts (kInvalidArgument naming the tensor),
  // data present (kNullPointer), and no forbidden overlap (kInvalidArgument): out may be exactly
  // y, and must not share memory with any input otherwise.
  FUSEKIT_API Status check(const AddLoraTensors &tensors) const;

  AddLoraTensors desc;  // the descriptions (data null); weight_a empty when absent
  int64_t b = 0, h1 = 0, h2 = 0, h3 = 0, r = 0, w = 0, l = 0, layer = 0, y_offset = 0;
  bool has_a = false;
  bool out_like_y = false;  // out has y's layout: a binding may pass y itself as out (in place)
  float scale = 1.0f;
};

struct AddLoraOp;  // the operator as the plan layer sees it (src/add_lora/add_lora_impl.h)

class AddLora {
 public:
  // Groups smaller than this run on cpu_hwy's decode path.
  static constexpr int64_t kPrefillMinRows = 48;

  // The implementations built into this library, in the order a plan tries them (the reference
  // implementation, "cpu_reference", last).
  FUSEKIT_API static std::vector<std::string> implementations();

  // Phase one: picks the implementation (the first that supports the problem on this machine, or
  // the one the options ask for: kNoImplementation when none can, kInvalidArgument for an
  // unknown name) and books its workspace. Writes nothing, reads no data.
  FUSEKIT_API static Status plan(const AddLoraProblem &problem, const AddLoraOptions &options,
                                 AddLora *plan);
  // Phase one and a binding in one call: the problem of these tensors (checked as a run would
  // check them), planned, with the tensors kept for run(workspace, ...) below.
  FUSEKIT_API static Status plan(const TensorView &y, const TensorView &x,
                                 const TensorView &weight_b, const TensorView &indices,
                                 const TensorView &weight_a, const TensorView &out,
                                 const AddLoraOptions &options, AddLora *plan);

  // Bytes of scratch memory a run needs (run() aligns the pointer itself).
  size_t workspace_size() const { return state_.workspace_bytes; }
  // The implementation the plan runs ("cpu_hwy", "cpu_reference", ...).
  const char *implementation() const { return state_.impl_name; }
  const AddLoraProblem &problem() const { return state_.problem; }

  // Phase two, any number of times: binds the tensors (checked against the problem; the pointers
  // and the indices may change from run to run), reads the indices (an index > W fails with
  // kShapeMismatch naming the row, and nothing is written), then computes out. CPU
  // implementations run synchronously and do not look at the stream.
  FUSEKIT_API Status run(const AddLoraTensors &tensors, void *workspace, size_t workspace_size,
                         AddLoraStats *stats = nullptr, StreamHandle stream = nullptr) const;
  // Phase two on the tensors given to plan(y, x, ...).
  FUSEKIT_API Status run(void *workspace, size_t workspace_size,
                         AddLoraStats *stats = nullptr) const;

  int64_t batch() const { return state_.problem.b; }
  int64_t rank() const { return state_.problem.r; }
  int64_t adapters() const { return state_.problem.w; }
  // The instruction set the Highway implementation runs on ("AVX3", "AVX2", ...).
  FUSEKIT_API static const char *optimized_target();

 private:
  PlanState<AddLoraOp, AddLoraProblem, AddLoraTensors> state_;
};

// One call: plan, allocate the workspace, run.
FUSEKIT_API Status add_lora(const TensorView &y, const TensorView &x, const TensorView &weight_b,
                            const TensorView &indices, const TensorView &weight_a,
                            const TensorView &out, const AddLoraOptions &options = {},
                            AddLoraStats *stats = nullptr);

}  // namespace fusekit

#endif  // FUSEKIT_ADD_LORA_H_
