// fusekit internal: the Adam(W) update that AdamW and ApplyAdamWQuant share, written once: the
// per-step scalars (derived in float32 as CANN's kernel derives them, t = step + 1), the update of
// one element, the guard on what it produces, and the checks of the attributes and the step that
// both operators' plans make. The same operations on vectors are AdamVectors in
// common/hwy_dtype-inl.h.
#ifndef FUSEKIT_COMMON_ADAM_UPDATE_H_
#define FUSEKIT_COMMON_ADAM_UPDATE_H_

#include <math.h>

#include <bit>
#include <cmath>
#include <cstdint>

#include "common/implementation.h"
#include "common/str_cat.h"
#include "fusekit/float16.h"
#include "fusekit/status.h"
#include "fusekit/tensor.h"

namespace fusekit {

// The per-step scalars of the update (derive_adam_scalars below).
struct AdamScalars {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, gnorm_scale, step_size, eps_c2s, decay;
  // var *= decay before the Adam update (torch.optim.AdamW's order) or after it (CANN's); both
  // false when weight decay <= 0, at most one true.
  bool decay_before, decay_after;
};

// The attributes as float32 (the doubles of the options converted once, when planned).
struct AdamAttributes {
  float lr = 0, beta1 = 0, beta2 = 0, weight_decay = 0, eps = 0, gnorm_scale = 0;
  bool decay_before = false;  // AdamW's WeightDecayOrder::kBeforeUpdate; ApplyAdamWQuant: false
};

// Steps run from 0 to 2^62 - 1 (t = step + 1 in float32).
inline constexpr int64_t kAdamMaxStep = int64_t{1} << 62;

// The float32 scalars of step `step`, computed as CANN's kernel computes them:
//   t = step + 1;  c1 = 1 - beta1^t;  c2s = sqrt(1 - beta2^t);  step_size = (-lr * c2s) / c1
inline AdamScalars derive_adam_scalars(int64_t step, const AdamAttributes &a) {
  const float t = static_cast<float>(step + 1);
  const float c1 = 1.0f - ::powf(a.beta1, t);
  const float c2s = ::sqrtf(1.0f - ::powf(a.beta2, t));
  AdamScalars s;
  s.beta1 = a.beta1;
  s.beta2 = a.beta2;
  s.one_minus_beta1 = 1.0f - a.beta1;
  s.one_minus_beta2 = 1.0f - a.beta2;
  s.gnorm_scale = a.gnorm_scale;
  s.step_size = (-a.lr * c2s) / c1;
  s.eps_c2s = a.eps * c2s;
  s.decay = 1.0f - a.lr * a.weight_decay;
  s.decay_before = a.weight_decay > 0.0f && a.decay_before;
  s.decay_after = a.weight_decay > 0.0f && !a.decay_before;
  return s;
}

// One element: m and v (dequantized, or the float32 moments) updated in place; returns the new
// var. The float32 operations in the order of every kernel and of the NumPy golden; the project
// builds with -ffp-contract=off, so none is fused. With the decay before the update, w * decay is
// rounded to float32 first and the update is added to it (torch.optim.AdamW: p.mul_(1 - lr * wd),
// then p.addcdiv_); the caller stores nothing of an element it refuses, decay included.
inline float adam_update(const AdamScalars &s, float grad, float *m, float *v, float w) {
  if (s.decay_before) w = w * s.decay;
  const float g = grad * s.gnorm_scale;
  *m = *m * s.beta1 + g * s.one_minus_beta1;
  *v = *v * s.beta2 + (g * g) * s.one_minus_beta2;
  w = w + (*m * s.step_size) / (std::sqrt(*v) + s.eps_c2s);
  return s.decay_after ? w * s.decay : w;
}

// ---- the guard on what a step produces ---------------------------------------------------------
// An element (AdamW) or a block (ApplyAdamWQuant) whose new m, v or var would be NaN or Inf is left
// unchanged and counted; a NaN or Inf gradient is one case of it (it makes m non-finite: g * (1 -
// beta1) with 1 - beta1 > 0). "var" is the value as stored: a float32 w is stored as a finite value
// of var's dtype iff the magnitude bits of w (bits & 0x7fffffff) are below the limit of that dtype:
//   float32   0x7f800000  (Inf)
//   bfloat16  0x7f7f8000  (3.3961776e38, the midpoint above the largest bfloat16, 0x7f7f: rounding
//                          to nearest-even takes it and everything above to Inf)
//   float16   0x477ff000  (65520.0f, the midpoint above the largest float16, 65504)
// NaN bits are above every limit. The same limit as a float: |w| < limit (false for NaN).
template <typename T>
constexpr uint32_t adam_stored_finite_limit();
template <>
constexpr uint32_t adam_stored_finite_limit<float>() {
  return 0x7f800000u;
}
template <>
constexpr uint32_t adam_stored_finite_limit<bfloat16_t>() {
  return 0x7f7f8000u;
}
template <>
constexpr uint32_t adam_stored_finite_limit<float16_t>() {
  return 0x477ff000u;
}

inline uint32_t adam_magnitude_bits(float x) {
  return std::bit_cast<uint32_t>(x) & 0x7fffffffu;
}

// Whether the new m, v and var (w, before it is stored as T) of one element are all finite.
template <typename T>
inline bool adam_produced_finite(float m, float v, float w) {
  return adam_magnitude_bits(m) < 0x7f800000u && adam_magnitude_bits(v) < 0x7f800000u &&
         adam_magnitude_bits(w) < adam_stored_finite_limit<T>();
}

// The smallest eps accepted (in float32): 2^-114 = 4.81482486e-35. Then eps * c2s >= 2^-126 =
// FLT_MIN, a normal float, for every step and every beta2: c2s = sqrt(1 - beta2^t) >=
// sqrt(1 - beta2) >= 2^-12 for t >= 1 and beta2 < 1 in float32 (1 - beta2 >= 2^-24, and
// powf(beta2, t) <= beta2). So eps * c2s is never 0, even where the FPU flushes subnormals to zero,
// and a zero gradient on zero state gives 0 / (0 + eps * c2s) = 0, never 0 / 0.
inline constexpr float kAdamMinEps = 0x1p-114f;

namespace adam_detail {
inline Status check_attr(const char *op, const char *name, double value, bool ok,
                         const char *rule) {
  if (!std::isfinite(value) || !std::isfinite(static_cast<float>(value)) || !ok) {
    return Status::Invalid(str_cat(op, ": ", name, " = ", value, " ", rule));
  }
  return Status::Ok();
}
}  // namespace adam_detail

// Validates the attributes (the aclnn names in the messages) and converts them to float32.
// (lr is a per-run scalar: host_adam_scalars below.)
inline Status check_adam_attributes(const char *op, double beta1, double beta2, double weight_decay,
                                    double eps, double gnorm_scale, AdamAttributes *out) {
  using adam_detail::check_attr;
  FUSEKIT_RETURN_IF_ERROR(check_attr(op, "beta1", beta1,
                                     beta1 >= 0.0 && static_cast<float>(beta1) < 1.0f,
                                     "must be in [0, 1) in float32"));
  FUSEKIT_RETURN_IF_ERROR(check_attr(op, "beta2", beta2,
                                     beta2 >= 0.0 && static_cast<float>(beta2) < 1.0f,
                                     "must be in [0, 1) in float32"));
  FUSEKIT_RETURN_IF_ERROR(
      check_attr(op, "weightDecay", weight_decay, true, "must be finite in float32"));
  static_assert(kAdamMinEps == 0x1p-114f);  // the message below spells it out
  FUSEKIT_RETURN_IF_ERROR(check_attr(op, "eps", eps, static_cast<float>(eps) >= kAdamMinEps,
                                     "must be finite and >= 4.81482486e-35 (2^-114) in float32, so "
                                     "that eps * sqrt(1 - beta2^t) >= 2^-126 is never 0"));
  FUSEKIT_RETURN_IF_ERROR(
      check_attr(op, "gnormScale", gnorm_scale, true, "must be finite in float32"));
  out->beta1 = static_cast<float>(beta1);
  out->beta2 = static_cast<float>(beta2);
  out->weight_decay = static_cast<float>(weight_decay);
  out->eps = static_cast<float>(eps);
  out->gnorm_scale = static_cast<float>(gnorm_scale);
  return Status::Ok();
}

// LazyAdam's and LazyAdamQuant's attributes, checked as the kernel uses them, in float32: a beta in
// [0, 1) (so that 1 - 1e-9, which rounds to 1.0f and would freeze m or v, is refused), epsilon
// finite and > 0. Converted to float32 into *beta1_f, *beta2_f, *epsilon_f.
inline Status check_lazy_adam_attributes(const char *op, double beta1, double beta2, double epsilon,
                                         float *beta1_f, float *beta2_f, float *epsilon_f) {
  for (const auto &[value, name] : {std::pair{beta1, "beta1"}, {beta2, "beta2"}}) {
    if (!(value >= 0.0 && static_cast<float>(value) < 1.0f)) {
      return Status::Invalid(
          str_cat(op, ": ", name, " = ", value, " must be in [0, 1) in float32"));
    }
  }
  if (!(std::isfinite(epsilon) && epsilon > 0.0 && static_cast<float>(epsilon) > 0.0f &&
        std::isfinite(static_cast<float>(epsilon)))) {
    return Status::Invalid(
        str_cat(op, ": epsilon = ", epsilon, " must be finite and > 0 in float32"));
  }
  *beta1_f = static_cast<float>(beta1);
  *beta2_f = static_cast<float>(beta2);
  *epsilon_f = static_cast<float>(epsilon);
  return Status::Ok();
}

// Copies the float32 attributes into a problem (AdamWProblem, ApplyAdamWQuantProblem).
template <class Problem>
void set_adam_attributes(const AdamAttributes &a, Problem *p) {
  p->beta1 = a.beta1;
  p->beta2 = a.beta2;
  p->weight_decay = a.weight_decay;
  p->eps = a.eps;
  p->gnorm_scale = a.gnorm_scale;
}

// The aclnn setup of LazyAdam and LazyAdamQuant (aclnn_phase_one's last argument): the attributes
// beta1, beta2, epsilon into the options (checked when planned), lr as a tensor read by the
// implementation when phase two runs.
template <class Op>
auto lazy_adam_aclnn_setup(double beta1, double beta2, double epsilon) {
  return [=](const TensorView &lr, typename Op::Options &options, typename Op::Scalars &scalars) {
    options = {.beta1 = beta1, .beta2 = beta2, .epsilon = epsilon};
    scalars.lr_tensor = lr;
    return Status::Ok();
  };
}

// The learning rate: finite and >= 0 as a double and in float32.
inline Status check_adam_lr(const char *op, double lr) {
  return adam_detail::check_attr(op, "lr", lr, lr >= 0.0,
                                 "must be finite and >= 0; nothing was modified");
}

// A CPU implementation's per-run scalars (AdamWScalars, ApplyAdamWQuantScalars): the values, or
// their tensors where set (read on the host, now), checked (0 <= step < 2^62, lr finite and >= 0),
// and the step's derived scalars with the problem's attributes.
template <class Scalars, class Problem>
Status host_adam_scalars(const char *op, const Scalars &s, const Problem &p, AdamScalars *out) {
  int64_t t = s.step;
  float l = s.lr;
  FUSEKIT_RETURN_IF_ERROR(read_scalar_tensor(op, "step", s.step_tensor, DType::kInt64, &t));
  FUSEKIT_RETURN_IF_ERROR(read_scalar_tensor(op, "lr", s.lr_tensor, DType::kFloat32, &l));
  if (t < 0 || t >= kAdamMaxStep) {
    return Status::Invalid(
        str_cat(op, ": step = ", t, " must be in [0, 2^62); nothing was modified"));
  }
  FUSEKIT_RETURN_IF_ERROR(check_adam_lr(op, l));
  AdamAttributes attr{l, p.beta1, p.beta2, p.weight_decay, p.eps, p.gnorm_scale};
  // AdamW's problem has a decay order; ApplyAdamWQuant's has none (CANN's order, after).
  if constexpr (requires { p.decay_order; })
    attr.decay_before = p.decay_order == decltype(p.decay_order)::kBeforeUpdate;
  *out = derive_adam_scalars(t, attr);
  return Status::Ok();
}

// The dtypes an optimizer's var may have.
inline bool is_float_type(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat16 || t == DType::kBFloat16;
}

// A problem's var and grad (named as its aclnn call names them): a float dtype, the same for both.
inline Status check_var_grad_dtypes(const char *op, const char *var_name, const TensorView &var,
                                    const char *grad_name, const TensorView &grad) {
  if (!is_float_type(var.dtype)) {
    return Status::Invalid(str_cat(op, ": ", var_name, " has dtype ", dtype_name(var.dtype),
                                   "; float32, float16 or bfloat16 is required"));
  }
  if (grad.dtype != var.dtype) {
    return Status::Invalid(str_cat(op, ": ", grad_name, " has dtype ", dtype_name(grad.dtype),
                                   " but ", var_name, " has ", dtype_name(var.dtype),
                                   "; they must match"));
  }
  return Status::Ok();
}

// n = the product of a shape, refusing negative sizes and 64-bit overflow; also checks that the
// byte offset of the farthest element fits in 64 bits.
inline Status adam_checked_numel(const char *op, const TensorView &t, const char *name,
                                 int64_t *n) {
  int64_t count = 1, reach = 0;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0)
      return Status::Invalid(
          str_cat(op, ": ", name, " has a negative size in shape ", t.shape_string()));
    int64_t span = 0;
    if (__builtin_mul_overflow(count, t.shape[i], &count) ||
        (t.shape[i] > 0 &&
         __builtin_mul_overflow(t.shape[i] - 1, t.strides[i] < 0 ? -t.strides[i] : t.strides[i],
                                &span)) ||
        __builtin_add_overflow(reach, span, &reach)) {
      return Status::Invalid(
          str_cat(op, ": ", name, " of shape ", t.shape_string(), " overflows 64-bit sizes"));
    }
  }
  const auto elem = static_cast<int64_t>(dtype_size(t.dtype) > 0 ? dtype_size(t.dtype) : 1);
  if (__builtin_mul_overflow(reach, elem, &reach)) {
    return Status::Invalid(
        str_cat(op, ": ", name, " of shape ", t.shape_string(), " overflows 64-bit sizes"));
  }
  *n = count;
  return Status::Ok();
}

}  // namespace fusekit

#endif  // FUSEKIT_COMMON_ADAM_UPDATE_H_
