// AddLora, the plain scalar kernel: row by row in the grouped order, each sum a single float32
// chain in index order, one rounding to the output type at the end.
#include <algorithm>

#include "add_lora/add_lora_kernels.h"
#include "common/float_types.h"
#include "fusekit/float16.h"

namespace fusekit {
namespace {

constexpr int64_t kPad = 16;
int64_t round_up(int64_t n, int64_t m) {
  return (n + m - 1) / m * m;
}

template <typename T>
void reference_typed(const AddLoraArgs &a, const AddLoraScratch &s) {
  const T *x = static_cast<const T *>(a.x);
  const T *y = static_cast<const T *>(a.y);
  T *out = static_cast<T *>(a.out);
  const T *wa = static_cast<const T *>(a.wa);
  const T *wb = static_cast<const T *>(a.wb);
  for (int64_t ad = 0; ad < a.adapters; ++ad) {
    const T *A = wa != nullptr ? wa + ad * a.wa_adapter_stride : nullptr;
    const T *B = wb + ad * a.wb_adapter_stride;
    for (int64_t k = a.group_start[ad]; k < a.group_start[ad + 1]; ++k) {
      const int64_t row = a.rows[k];
      const T *xr = x + row * a.x_stride;
      float *t = s.t + k * s.t_stride;
      for (int64_t r = 0; r < a.r; ++r) {
        if (A == nullptr) {
          t[r] = to_float(xr[r]);
          continue;
        }
        const T *ar = A + r * a.wa_row_stride;
        float acc = 0.0f;
        for (int64_t i = 0; i < a.h1; ++i) acc = acc + to_float(xr[i]) * to_float(ar[i]);
        t[r] = acc;
      }
      const T *yr = y + row * a.y_stride + a.y_offset;
      T *outr = out + row * a.out_stride + a.y_offset;
      for (int64_t j = 0; j < a.h2; ++j) {
        const T *bj = B + j * a.wb_row_stride;
        float z = 0.0f;
        for (int64_t r = 0; r < a.r; ++r) z = z + t[r] * to_float(bj[r]);
        outr[j] = from_float<T>(to_float(yr[j]) + a.scale * z);
      }
    }
  }
}

}  // namespace

AddLoraScratchSizes add_lora_scratch_sizes(int64_t h1, int64_t h2, int64_t r) {
  AddLoraScratchSizes s;
  s.t_stride = round_up(std::max<int64_t>(r, 1), kPad);
  s.a_panel_bytes = static_cast<size_t>(h1) * static_cast<size_t>(s.t_stride) * sizeof(float);
  s.b_panel_bytes = static_cast<size_t>(round_up(h2, 64)) * static_cast<size_t>(r) * sizeof(float);
  // The larger of: a block of up to 8 rows of x in float32 (in chunks of 256 columns, prefill
  // shrink), the transposition buffers of the packing (64 x R). Either holds what the decode
  // expand needs (2 x 16 floats, or 256 outputs where vectors are not transposed in registers).
  const int64_t floats = std::max(8 * (round_up(h1, 256) + kPad), 64 * s.t_stride);
  s.per_thread_bytes = static_cast<size_t>(floats) * sizeof(float) + 256;
  return s;
}

void add_lora_reference(const AddLoraArgs &args, const AddLoraScratch &scratch) {
  with_float_type(args.dtype, [&]<class T>() { return reference_typed<T>(args, scratch); });
}

}  // namespace fusekit
