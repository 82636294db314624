// fusekit internal: AddLora's kernels. A kernel is a pure function: it neither allocates nor
// reports errors; the problem, the binding and the CPU implementation's check stage have checked
// everything (shapes, layouts, every index) before it runs.
#ifndef FUSEKIT_ADD_LORA_ADD_LORA_KERNELS_H_
#define FUSEKIT_ADD_LORA_ADD_LORA_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "fusekit/dtype.h"

namespace fusekit {

struct AddLoraArgs {
  DType dtype;  // of x, y, out and the weights
  const void *x;
  int64_t x_stride;  // elements between rows
  const void *y;
  int64_t y_stride;
  void *out;  // may equal y (in place)
  int64_t out_stride;
  // weight_a[a] = the [R, H1] matrix of adapter a at the planned layer: wa + a * wa_adapter_stride,
  // rows wa_row_stride apart. Null when weightA is absent (then t = x[b], H1 == R).
  const void *wa;
  int64_t wa_adapter_stride, wa_row_stride;
  // weight_b[a] = the [H2, R] matrix of adapter a at the planned layer.
  const void *wb;
  int64_t wb_adapter_stride, wb_row_stride;
  int64_t h1, h2, r, y_offset;  // out columns [y_offset, y_offset + h2) are updated
  float scale;
  // The grouping (a stable counting sort of the rows by adapter): rows of adapter a are
  // rows[group_start[a] .. group_start[a + 1]), in ascending order. group_start has adapters + 1
  // entries; rows with no adapter are not listed.
  const uint32_t *rows;
  const int64_t *group_start;
  int64_t adapters;
};

// Scratch for the kernels, carved from the caller's workspace by the CPU implementation
// (add_lora_cpu.cc; 64-byte aligned).
struct AddLoraScratch {
  float *t;          // [valid rows, t_stride]: the shrunk rows, in sorted order
  int64_t t_stride;  // >= R, a multiple of 16
  float *a_panel;    // the packed weightA of the group being served (prefill)
  float *b_panel;    // the packed weightB of the group being served (prefill)
  char *per_thread;  // per_thread_bytes for each thread (indexed by parallel_chunks' worker)
  size_t per_thread_bytes;
  int64_t *group_list;  // adapters + 1 entries the optimized kernel may use (its list of groups)
};

// The sizes of the scratch areas for a problem (the CPU implementation's workspace layout uses
// these).
struct AddLoraScratchSizes {
  int64_t t_stride;
  size_t a_panel_bytes, b_panel_bytes, per_thread_bytes;
};
AddLoraScratchSizes add_lora_scratch_sizes(int64_t h1, int64_t h2, int64_t r);

// The plain scalar kernel, one thread: the fallback and the test oracle's twin.
void add_lora_reference(const AddLoraArgs &args, const AddLoraScratch &scratch);

// The Highway kernel for the best instruction set of this CPU. Groups of at least
// prefill_min_rows rows take the prefill (GEMM) path, smaller ones the decode path.
// The cpu_hwy kernel as work items (add_lora_hwy.cc): each item is a pure function of its index
// and the worker's scratch buffer (no threads, no dispatch inside; the driver in add_lora_cpu.cc
// runs them on the thread layer). The stages, per prefill group (the n rows from g0 in the
// sorted order, adapter `adapter`): pack (weightA^T and weightB^T panels), shrink, expand; the
// decode groups (listed in scratch.group_list): a whole group each (shrink, then expand), or their
// shrink items (group, rank chunk), then their expand items (group, column block).
enum class AddLoraStage { kPack, kShrink, kExpand, kDecodeGroup, kDecodeShrink, kDecodeExpand };
struct AddLoraWork {
  AddLoraStage stage;
  int64_t adapter = 0, g0 = 0, n = 0;  // the prefill group (prefill stages only)
};
// How many items each stage has: of a prefill group of n rows, and per decode group.
struct AddLoraItemCounts {
  int64_t pack, shrink, expand;        // of the prefill group
  int64_t rank_chunks, column_blocks;  // per decode group
};
struct AddLoraHwyKernel {
  AddLoraItemCounts (*counts)(const AddLoraArgs &args, const AddLoraScratch &scratch, int64_t n);
  // Items [begin, end) of `work`; buf: the worker's scratch (scratch.per_thread_bytes).
  void (*items)(const AddLoraArgs &args, const AddLoraScratch &scratch, const AddLoraWork &work,
                int64_t begin, int64_t end, float *buf);
};
// Looked up on each call (one table read) so that tests can switch targets.
AddLoraHwyKernel add_lora_hwy();

}  // namespace fusekit

#endif  // FUSEKIT_ADD_LORA_ADD_LORA_KERNELS_H_
