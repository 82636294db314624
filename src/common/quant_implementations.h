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
// An operator whose batch is bound per run (EmbeddingBagLazyAdamQuant) gives instead of the two in
// the middle
//   size_t run_workspace_bytes(const Problem &, const Tensors &, int threads, QuantSearch);
// (the search of a cpu_hwy entry, kBinarySearch for the others: whether this batch builds the
// tables is the run's to say), and its plans book the workspace of the problem's own tensors.
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
  using Tensors = typename Op::Tensors;
  static constexpr bool kBatchBound = requires { &Cpu::run_workspace_bytes; };
  template <QK K, QS S>
  static size_t run_workspace(const Problem &p, const Tensors &t, int threads) {
    return Cpu::run_workspace_bytes(p, t, threads, K == QK::kHwy ? S : QS::kBinarySearch);
  }
  template <QK K, QS S>
  static size_t workspace(const Problem &p, int threads) {
    if constexpr (kBatchBound) {
      return run_workspace<K, S>(p, p.desc, threads);
    } else {
      return Cpu::workspace_bytes(p, threads, K == QK::kHwy && Cpu::wants_table(S, p));
    }
  }
  using RunWorkspaceFn = size_t (*)(const Problem &, const Tensors &, int);
  template <QK K, QS S>
  static constexpr RunWorkspaceFn run_workspace_of() {
    if constexpr (kBatchBound) {
      return &run_workspace<K, S>;
    } else {
      return nullptr;
    }
  }
  template <QK K, QS S>
  static Status run(const Problem &p, const typename Op::Tensors &t, const typename Op::Scalars &s,
                    const RunContext &ctx, typename Op::Stats *st) {
    return Cpu::run(K, S, p, t, s, ctx, st);
  }

  // One entry: kernel K with search S.
  template <QK K, QS S>
  static constexpr Implementation<Op> entry(const char *name,
                                            const char *(*why_not)(const Problem &),
                                            const char *(*target)(), bool by_name_only) {
    return {
        name, why_not, target, workspace<K, S>, run<K, S>, by_name_only, run_workspace_of<K, S>()};
  }
  static constexpr Implementation<Op> kVbmi =
      entry<QK::kAvx512Vbmi, QS::kBinarySearch>("cpu_avx512vbmi", vbmi_why_not, vbmi_target, false);
  static constexpr Implementation<Op> kHwy =
      entry<QK::kHwy, QS::kAuto>("cpu_hwy", cpu_only<Op>, hwy_dispatched_target, false);
  static constexpr Implementation<Op> kHwyTable = entry<QK::kHwy, QS::kTable>(
      "cpu_hwy_table", cpu_only<Op>, hwy_dispatched_target, /*by_name_only=*/true);
  static constexpr Implementation<Op> kHwyBinarySearch = entry<QK::kHwy, QS::kBinarySearch>(
      "cpu_hwy_binary_search", cpu_only<Op>, hwy_dispatched_target, /*by_name_only=*/true);
  static constexpr Implementation<Op> kReference =
      entry<QK::kReference, QS::kBinarySearch>(kReferenceName, cpu_only<Op>, scalar_target, false);
  static constexpr const Implementation<Op> *kList[] = {&kVbmi, &kHwy, &kHwyTable,
                                                        &kHwyBinarySearch, &kReference};

 public:
  // The list, for Op::implementations(). A new backend (CUDA) would put its entries before these.
  static std::span<const Implementation<Op> *const> list() { return kList; }
};

}  // namespace fusekit

#endif  // FUSEKIT_COMMON_QUANT_IMPLEMENTATIONS_H_
