// fusekit: which implementation an operator runs.
#ifndef FUSEKIT_KERNEL_CHOICE_H_
#define FUSEKIT_KERNEL_CHOICE_H_

namespace fusekit {

// Each operator has an ordered list of implementations (Xxx::implementations(), the reference
// implementation "cpu_reference" last). A plan takes the first one that supports the problem on
// this machine, unless the options name one (Options::implementation, e.g. "cpu_hwy") or say:
enum class KernelChoice {
  kAuto,       // the first implementation in the list that supports the problem
  kReference,  // "cpu_reference": the plain scalar kernel, the fallback and the test oracle's twin
  kOptimized,  // the first supported implementation other than the reference
};

}  // namespace fusekit

#endif  // FUSEKIT_KERNEL_CHOICE_H_
