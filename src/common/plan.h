// fusekit internal: the plan of every operator, written once.
//
// An operator is described to this layer by one struct (for LazyAdam, LazyAdamOp in
// src/lazy_adam/lazy_adam_impl.h):
//
//   struct XxxOp : OpTypes<XxxProblem, XxxTensors, XxxScalars, XxxOptions, XxxStats> {
//     // Its tensors by role, in the order of Tensors (name, written, read when empty, optional),
//     // and the same tensors as pointers into a Tensors (or const Tensors).
//     static constexpr TensorRole kRoles[] = {{"var", true}, {"grad"}, ...};
//     static auto views(auto &t) { return std::array{&t.var, &t.grad, ...}; }
//     static constexpr const char *kName = "Xxx";           // the name messages start with
//     static std::span<const Implementation<XxxOp> *const> implementations();  // reference last
//     // The FUSEKIT_VERBOSE line's fields: of the problem (and run), then of the result.
//     static std::string problem_fields(const Problem &, const Tensors &);
//     static std::string result_fields(const Stats &);
//   };
//
// where OpTypes names its types: Problem (validated once: make(tensors, options, &p),
// p.check(tensors)), Tensors (those of one run), Scalars (the per-run scalars, lr and step, handed
// to the implementation untouched: it reads them where they live), Options (attributes, kernel,
// implementation, num_threads) and Stats. From the struct come the public plan class's bodies
// (plan from a problem, plan from tensors, run, run on the bound tensors, the one-call form): see
// make_plan() ... run_once() below; the aclnn face (runtime/executor.h); the seam tests.
// and from it come the public plan class's bodies (plan from a problem, plan from tensors, run,
// run on the bound tensors, the one-call form): see make_plan() ... run_once() below. The
// operator's own code is its Problem (shape rules), its implementations and their kernels.
#ifndef FUSEKIT_COMMON_PLAN_H_
#define FUSEKIT_COMMON_PLAN_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "common/implementation.h"
#include "common/str_cat.h"
#include "common/verbose.h"
#include "fusekit/plan_state.h"
#include "fusekit/threading.h"

namespace fusekit {

// One implementation: plain function pointers over the operator's Problem (shapes, dtypes,
// strides, attributes; no pointers). A list of them, in order of preference, is the operator's
// src/<op>/<op>_implementations.cc.
template <class Op>
struct Implementation {
  using Problem = typename Op::Problem;
  const char *name;                         // "cpu_hwy", "cpu_reference", ...
  const char *(*why_not)(const Problem &);  // null: supported on this machine
  const char *(*target)();                  // the instruction set, for FUSEKIT_VERBOSE
  // Bytes of workspace a run needs with `threads` threads (SIZE_MAX: more than 64-bit sizes can
  // hold); null: none.
  size_t (*workspace_bytes)(const Problem &, int threads);
  // One run, on tensors already checked against the problem. Does the per-step data work (index
  // and scalar checks, grouping) as named stages on ctx.timer and writes nothing before its
  // checks pass. The scalars are as the caller gave them: a CPU implementation reads a scalar
  // tensor on the host, a device one would read it on its device.
  Status (*run)(const Problem &, const typename Op::Tensors &, const typename Op::Scalars &,
                const RunContext &, typename Op::Stats *);
  // Planned only when asked for by name: a variant kept for tests and tuning runs (auto never
  // picks it).
  bool by_name_only = false;
  // For an operator whose batch-sized dimensions are bound per run (EmbeddingBagLazyAdam: the
  // bags and lookups of each batch; XNNPACK's reshape): the bytes of workspace a run on these
  // tensors (already checked against the problem) needs with `threads` threads, SIZE_MAX when that
  // overflows. Null: workspace_bytes(problem, threads), fixed when planned.
  size_t (*run_workspace_bytes)(const Problem &, const typename Op::Tensors &,
                                int threads) = nullptr;
};

// The Scalars of an operator without per-run scalars (AddLora).
struct NoScalars {};

// The types of an operator's description (see the top of this file).
template <class P, class T, class Sc, class O, class St>
struct OpTypes {
  using Problem = P;
  using Tensors = T;
  using Scalars = Sc;
  using Options = O;
  using Stats = St;
};

// The `target` of a plain scalar implementation.
inline const char *scalar_target() {
  return "scalar";
}
// The `target` of a Highway implementation: the target its dispatch tables use now ("AVX3",
// "AVX2", ...; one for every operator, common/hwy_target.cc).
const char *hwy_dispatched_target();

// The descriptions of a problem: the tensors without their data pointers.
template <class Op>
typename Op::Tensors without_data(typename Op::Tensors t) {
  for (TensorView *v : Op::views(t)) v->data = nullptr;
  return t;
}

// Problem::check's generic part: the tensors bound to a run against the planned descriptions, role
// by role (check_bound_tensors).
template <class Op>
Status check_bound(const typename Op::Tensors &planned, const typename Op::Tensors &bound) {
  return check_bound_tensors(Op::kName, Op::kRoles, Op::views(planned), Op::views(bound));
}

// For why_not(): null when every tensor of the problem is on the CPU.
template <class Op>
const char *cpu_only(const typename Op::Problem &p) {
  for (const TensorView *t : Op::views(p.desc)) {
    if (t->device != Device::kCpu) return "a tensor is not on the cpu";
  }
  return nullptr;
}

template <class Op>
using PlanStateOf = PlanState<Op, typename Op::Problem, typename Op::Tensors>;

// The first implementation of `list` that supports the problem (why_not() == null) and matches
// the request: a name (when non-empty), else the kernel choice.
template <class Op>
Status choose_implementation(std::span<const Implementation<Op> *const> list,
                             const typename Op::Problem &p, KernelChoice choice, const char *name,
                             const Implementation<Op> **out) {
  const bool by_name = name != nullptr && *name != '\0';
  std::string compiled, reasons;
  for (const Implementation<Op> *impl : list) {
    compiled += (compiled.empty() ? "" : ", ") + std::string(impl->name);
    const bool is_ref = std::strcmp(impl->name, kReferenceName) == 0;
    if (by_name ? std::strcmp(impl->name, name) != 0
                : impl->by_name_only || (choice == KernelChoice::kReference && !is_ref) ||
                      (choice == KernelChoice::kOptimized && is_ref)) {
      continue;
    }
    if (const char *why = impl->why_not(p); why != nullptr) {
      reasons += str_cat(reasons.empty() ? "" : "; ", impl->name, ": ", why);
      continue;
    }
    *out = impl;
    return Status::Ok();
  }
  if (by_name && reasons.empty()) {
    return Status::Invalid(
        str_cat(Op::kName, ": no implementation is named \"", name, "\" (built: ", compiled, ")"));
  }
  return Status::NoImplementation(str_cat(
      Op::kName,
      ": no implementation built into this library supports this problem on this machine (",
      reasons.empty() ? std::string("none requested") : reasons, "; built: ", compiled, ")"));
}

template <class Op>
std::vector<std::string> implementation_names() {
  std::vector<std::string> names;
  for (const Implementation<Op> *impl : Op::implementations()) names.emplace_back(impl->name);
  return names;
}

// Phase one: picks the implementation and books its workspace. *out is written only on success
// (null: kNullPointer, "Xxx: out is null").
template <class Op>
Status make_plan(const typename Op::Problem &problem, const typename Op::Options &options,
                 PlanStateOf<Op> *out) {
  if (out == nullptr) return Status::NullPointer(str_cat(Op::kName, ": out is null"));
  PlanStateOf<Op> s;
  FUSEKIT_RETURN_IF_ERROR(choose_implementation<Op>(Op::implementations(), problem, options.kernel,
                                                    options.implementation, &s.impl));
  s.impl_name = s.impl->name;
  s.problem = problem;
  s.threads = std::max(1, options.num_threads > 0 ? options.num_threads : num_threads());
  s.workspace_bytes =
      s.impl->workspace_bytes != nullptr ? s.impl->workspace_bytes(problem, s.threads) : 0;
  if (s.workspace_bytes == std::numeric_limits<size_t>::max()) {
    return Status::Invalid(str_cat(Op::kName, ": the workspace of this problem (",
                                   Op::problem_fields(problem, problem.desc),
                                   ") overflows 64-bit sizes"));
  }
  *out = s;
  return Status::Ok();
}

// Phase one from tensors: their problem (checked as a run would check them), planned, with the
// tensors kept for run_bound().
template <class Op>
Status make_bound_plan(const typename Op::Tensors &tensors, const typename Op::Options &options,
                       PlanStateOf<Op> *out) {
  if (out == nullptr) return Status::NullPointer(str_cat(Op::kName, ": out is null"));
  typename Op::Problem problem;
  FUSEKIT_RETURN_IF_ERROR(Op::Problem::make(tensors, options, &problem));
  FUSEKIT_RETURN_IF_ERROR(problem.check(tensors));
  PlanStateOf<Op> s;
  FUSEKIT_RETURN_IF_ERROR(make_plan<Op>(problem, options, &s));
  s.bound = tensors;
  s.has_bound = true;
  *out = s;
  return Status::Ok();
}

// The bytes of workspace a run of plan `s` on `tensors` needs: the plan's, or (for an operator
// whose batch is bound per run) the implementation's for these tensors.
template <class Op>
size_t run_workspace_bytes(const PlanStateOf<Op> &s, const typename Op::Tensors &tensors) {
  if (s.impl == nullptr) return 0;
  return s.impl->run_workspace_bytes != nullptr
             ? s.impl->run_workspace_bytes(s.problem, tensors, s.threads)
             : s.workspace_bytes;
}

// Phase two: binds the tensors (checked against the problem), then runs the implementation;
// prints the FUSEKIT_VERBOSE line.
template <class Op>
Status run_plan(const PlanStateOf<Op> &s, const typename Op::Tensors &tensors,
                const typename Op::Scalars &scalars, void *workspace, size_t workspace_size,
                typename Op::Stats *stats, StreamHandle stream) {
  typename Op::Stats local;
  typename Op::Stats &st = stats != nullptr ? *stats : local;
  st = typename Op::Stats();
  if (s.impl == nullptr) {
    return Status::Invalid(str_cat(Op::kName, ": run on a plan that was not made"));
  }
  FUSEKIT_RETURN_IF_ERROR(s.problem.check(tensors));
  const size_t needed = run_workspace_bytes<Op>(s, tensors);
  if (needed == std::numeric_limits<size_t>::max()) {
    return Status::Invalid(str_cat(Op::kName, ": the workspace of this run (",
                                   Op::problem_fields(s.problem, tensors),
                                   ") overflows 64-bit sizes"));
  }
  StageTimer timer;
  RunContext ctx;
  FUSEKIT_RETURN_IF_ERROR(make_run_context(Op::kName, workspace, workspace_size, needed, s.threads,
                                           stream, &timer, &ctx));
  FUSEKIT_RETURN_IF_ERROR(s.impl->run(s.problem, tensors, scalars, ctx, &st));
  if (timer.on()) {
    verbose_print(str_cat(Op::kName, ",", Op::problem_fields(s.problem, tensors),
                          ",impl=", s.impl->name, ",isa=", s.impl->target(), ",threads=", s.threads,
                          ",", Op::result_fields(st), ",", timer.fields()));
  }
  return Status::Ok();
}

// Phase two on the tensors given to make_bound_plan(); `form` names the call in the message when
// there are none ("run(lr, ...)").
template <class Op>
Status run_bound(const PlanStateOf<Op> &s, const typename Op::Scalars &scalars, void *workspace,
                 size_t workspace_size, typename Op::Stats *stats, const char *form) {
  if (!s.has_bound) {
    if (stats != nullptr) *stats = typename Op::Stats();
    return Status::Invalid(str_cat(Op::kName, ": ", form,
                                   " needs a plan made from tensors; pass the tensors to run()"));
  }
  return run_plan<Op>(s, s.bound, scalars, workspace, workspace_size, stats, nullptr);
}

// The one-call form: plan, allocate the workspace, run once.
template <class Op>
Status run_once(const typename Op::Tensors &tensors, const typename Op::Options &options,
                const typename Op::Scalars &scalars, typename Op::Stats *stats) {
  PlanStateOf<Op> s;
  FUSEKIT_RETURN_IF_ERROR(make_bound_plan<Op>(tensors, options, &s));
  const size_t bytes = run_workspace_bytes<Op>(s, tensors);
  if (bytes == std::numeric_limits<size_t>::max()) {  // (run_plan refuses it by name)
    return run_plan<Op>(s, tensors, scalars, nullptr, 0, stats, nullptr);
  }
  return with_own_workspace(Op::kName, bytes, [&](void *workspace) {
    return run_plan<Op>(s, tensors, scalars, workspace, bytes, stats, nullptr);
  });
}

}  // namespace fusekit

#endif  // FUSEKIT_COMMON_PLAN_H_
