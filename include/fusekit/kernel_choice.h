// fusekit: which implementation an operator runs.
#ifndef FUSEKIT_KERNEL_CHOICE_H_
#define FUSEKIT_KERNEL_CHOICE_H_

namespace fusekit {

enum class KernelChoice {
  kAuto,       // the optimized kernel (SIMD for the best instruction set this CPU has, threads)
  kReference,  // the plain scalar kernel: the fallback and the test oracle's twin
  kOptimized,  // the optimized kernel, explicitly
};

}  // namespace fusekit

#endif  // FUSEKIT_KERNEL_CHOICE_H_
