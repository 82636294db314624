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

// How an 8-bit optimizer (ApplyAdamWQuant, LazyAdamQuant) keeps m and v (docs/fp8_state.md):
//   kDynamicMap  codes into the 256-entry maps qmap_m / qmap_v, one absmax per block of 256
//                (bitsandbytes' format; the nearest code is found by a search). The default.
//   kFp8         m as E4M3 (float8_e4m3fn) and sqrt(v) as UE4M4 (unsigned, 4 exponent and 4
//                mantissa bits), coded by bit arithmetic, one float32 scale per block (the block's
//                max / 448, resp. max sqrt(v) / 496) in the absmax tensors; no maps (the map
//                tensors must be empty). The lost-v guard is always on.
//   kFp8Ue3m5    ApplyAdamWQuant only: as kFp8, but sqrt(v) as UE3M5 (unsigned, 3 exponent and 5
//                mantissa bits; scale = max sqrt(v) / 31.5): half UE4M4's rounding error, a range
//                of 2^12 instead of 2^19 (the lost-v guard takes a v below it). For dense layers,
//                whose moments span few decades; embedding rows keep kFp8 (docs/fp8_state.md).
enum class QuantStateFormat : int { kDynamicMap = 0, kFp8 = 1, kFp8Ue3m5 = 2 };

// Whether the format is one of the FP8 ones (kFp8, kFp8Ue3m5): no maps, the lost-v guard on.
constexpr bool is_fp8_state(QuantStateFormat f) {
  return f == QuantStateFormat::kFp8 || f == QuantStateFormat::kFp8Ue3m5;
}

// The format's name as the docs, the messages and the Python faces spell it ("dynamic_map", "fp8",
// "fp8_ue3m5").
FUSEKIT_API const char *quant_state_format_name(QuantStateFormat f);

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
