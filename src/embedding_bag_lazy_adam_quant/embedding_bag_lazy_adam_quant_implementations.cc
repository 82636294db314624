// EmbeddingBagLazyAdamQuant's implementations, in the order a plan tries them: the 8-bit
// optimizers' CPU list (common/quant_implementations.h), over LazyAdamQuant's row kernels.
#include "embedding_bag_lazy_adam_quant/embedding_bag_lazy_adam_quant_impl.h"

namespace fusekit {

std::span<const EmbeddingBagLazyAdamQuantImpl *const>
EmbeddingBagLazyAdamQuantOp::implementations() {
  return embedding_bag_lazy_adam_quant_cpu_implementations();
}

}  // namespace fusekit
