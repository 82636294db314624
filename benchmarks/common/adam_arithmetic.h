// fusekit benchmarks: the arithmetic floor of one Adam(W) step on this machine, with no memory
// traffic at all. The exact operations an element needs (the multiplies, adds, square root and
// divisions, in float32 and without FMA, as the kernels do them) run on values held in registers,
// with all worker threads, so that an operator's time can be compared with the least time its
// arithmetic alone takes here.
#ifndef FUSEKIT_BENCHMARKS_COMMON_ADAM_ARITHMETIC_H_
#define FUSEKIT_BENCHMARKS_COMMON_ADAM_ARITHMETIC_H_

namespace fusekit::bench {

enum class AdamArithmetic {
  kAdamW,            // 8 multiplies, 4 adds, 1 square root, 1 division per element
  kQuantDivide,      // ApplyAdamWQuant, exact: + 2 dequantizing multiplies, + the 2 normalizing
                     // divisions m / absmax (vdivps)
  kQuantDouble,      // exact too: the normalizing quotients as float(m * (1.0 / absmax)) in double,
                     // which equals the float32 division for every normal quotient
  kQuantReciprocal,  // not exact: m * (1 / absmax) in float32 (within the spec's code tolerance)
  kFp8,              // the FP8 state format (docs/fp8_state.md): AdamW's arithmetic on m and
                     // s = sqrt(v), + 3 dequantizing multiplies (m * scale, s * scale, s * s) and
                     // the 2 coding multiplies (m * inv, s * inv); the square root the update
                     // takes is the s stored, so one square root and one division remain
};

// Seconds per element with all worker threads (fusekit::num_threads(): wall time / elements),
// median of several runs; measured once per process, mix and thread count, then cached.
double adam_arithmetic_seconds_per_element(AdamArithmetic mix);

}  // namespace fusekit::bench

#endif  // FUSEKIT_BENCHMARKS_COMMON_ADAM_ARITHMETIC_H_
