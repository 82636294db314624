// fusekit internal: the implementation list of an 8-bit optimizer (ApplyAdamWQuant,
// LazyAdamQuant), written once. In the order a plan tries them:
//   cpu_avx512vbmi          maps and searches in registers, no gathers (AVX-512 VBMI CPUs only)
//   cpu_hwy                 the Highway kernel, dispatched to the best target of this CPU; the
//                           lookup tables on a large step (QuantSearch::kAuto)
//   cpu_hwy_table           cpu_hwy always with the tables      } planned by name only, for
//   cpu_hwy_binary_search   cpu_hwy never with the tables       } tests and tuning runs
//   cpu_reference           the plain scalar kernel, the fallback and the test oracle's twin
// The operator's CPU run (its <op>_cpu.cc) provides `Cpu`, a struct of static functions:
//   const char *avx512vbmi_why_not(const Problem &);   // null: this CPU runs that kernel
//   bool wants_table(QuantSearch, const Problem &);     // whether a run builds the tables
//   size_t workspace_bytes(const Problem &, int threads, bool with_table);
//   Status run(QuantKernelKind, QuantSearch, const Problem &, const Tensors &, const Scalars &,
//              const RunContext &, Stats *);
#ifndef FUSEKIT_COMMON_QUANT_IMPLEMENTATIONS_H_
#define FUSEKIT_COMMON_QUANT_IMPLEMENTATIONS_H_

#include <span>

#include "common/plan.h"
#include "common/quant_search.h"

namespace fusekit {

// Why cpu_avx512vbmi does not run the FP8 state format (its kernels keep the maps in registers).
inline constexpr const char *kFp8NoMapKernel =
    "the fp8 state format has no map to keep in registers; cpu_hwy runs it";

// The kernel a CPU implementation of an 8-bit optimizer runs.
enum class QuantKernelKind { kAvx512Vbmi, kHwy, kReference };

template <class Op, class Cpu>
class QuantImplementations {
  using Problem = typename Op::Problem;
  using QK = QuantKernelKind;
  using QS = QuantSearch;

  static const char *vbmi_why_not(const Problem &p) {
    if (const char *why = cpu_only<Op>(p); why != nullptr) return why;
    return Cpu::avx512vbmi_why_not(p);
  }
  static const char *vbmi_target() { return "AVX512VBMI"; }
  template <QK K, QS S>
  static size_t workspace(const Problem &p, int threads) {
    return Cpu::workspace_bytes(p, threads, K == QK::kHwy && Cpu::wants_table(S, p));
  }
  template <QK K, QS S>
  static Status run(const Problem &p, const typename Op::Tensors &t, const typename Op::Scalars &s,
                    const RunContext &ctx, typename Op::Stats *st) {
    return Cpu::run(K, S, p, t, s, ctx, st);
  }

  static constexpr Implementation<Op> kVbmi{"cpu_avx512vbmi", vbmi_why_not, vbmi_target,
                                            workspace<QK::kAvx512Vbmi, QS::kBinarySearch>,
                                            run<QK::kAvx512Vbmi, QS::kBinarySearch>};
  static constexpr Implementation<Op> kHwy{"cpu_hwy", cpu_only<Op>, hwy_dispatched_target,
                                           workspace<QK::kHwy, QS::kAuto>,
                                           run<QK::kHwy, QS::kAuto>};
  static constexpr Implementation<Op> kHwyTable{
      "cpu_hwy_table",           cpu_only<Op>,
      hwy_dispatched_target,     workspace<QK::kHwy, QS::kTable>,
      run<QK::kHwy, QS::kTable>, /*by_name_only=*/true};
  static constexpr Implementation<Op> kHwyBinarySearch{"cpu_hwy_binary_search",
                                                       cpu_only<Op>,
                                                       hwy_dispatched_target,
                                                       workspace<QK::kHwy, QS::kBinarySearch>,
                                                       run<QK::kHwy, QS::kBinarySearch>,
                                                       /*by_name_only=*/true};
  static constexpr Implementation<Op> kReference{kReferenceName, cpu_only<Op>, scalar_target,
                                                 workspace<QK::kReference, QS::kBinarySearch>,
                                                 run<QK::kReference, QS::kBinarySearch>};
  static constexpr const Implementation<Op> *kList[] = {&kVbmi, &kHwy, &kHwyTable,
                                                        &kHwyBinarySearch, &kReference};

 public:
  // The list, for Op::implementations(). A new backend (CUDA) would put its entries before these.
  static std::span<const Implementation<Op> *const> list() { return kList; }
};

}  // namespace fusekit

#endif  // FUSEKIT_COMMON_QUANT_IMPLEMENTATIONS_H_
