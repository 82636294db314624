// fusekit: the 256-entry quantization maps of the 8-bit optimizers (ApplyAdamWQuant,
// LazyAdamQuant): bitsandbytes' dynamic map, and how the generic SIMD implementations find the
// nearest code. Included by fusekit/apply_adam_w_quant.h and fusekit/lazy_adam_quant.h.
#ifndef FUSEKIT_QUANT_MAP_H_
#define FUSEKIT_QUANT_MAP_H_

#include <array>

#include "fusekit/export.h"

namespace fusekit {

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

}  // namespace fusekit

#endif  // FUSEKIT_QUANT_MAP_H_
