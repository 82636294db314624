// ApplyAdamWQuant's implementations, in the order a plan tries them: the 8-bit optimizers' CPU list
// (common/quant_implementations.h). A new backend adds its entries here (a CUDA implementation:
// entries under FUSEKIT_HAVE_CUDA, defined in their own file).
#include "apply_adam_w_quant/apply_adam_w_quant_impl.h"

namespace fusekit {

std::span<const ApplyAdamWQuantImpl *const> ApplyAdamWQuantOp::implementations() {
  return apply_adam_w_quant_cpu_implementations();
}

}  // namespace fusekit
