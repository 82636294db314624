/* fusekit: aclnnAddLora, multi-adapter LoRA (CANN's signature). out = y, then for each row b whose
 * index a = indices[b] names an adapter (0 <= a < W): out[b, yOffset : yOffset + H2] =
 * y[b, yOffset : ...] + scale * (x[b] . weightA[a, layerIdx]^T) . weightB[a, layerIdx]^T.
 * out may be y (in place). Float32 accumulation, one rounding at the end. */
#ifndef FUSEKIT_ACLNNOP_ACLNN_ADD_LORA_H_
#define FUSEKIT_ACLNNOP_ACLNN_ADD_LORA_H_

#include "aclnn/acl_meta.h"

#ifdef __cplusplus
extern "C" {
#endif

ACL_FUNC_VISIBILITY aclnnStatus aclnnAddLoraGetWorkspaceSize(
    const aclTensor *y, const aclTensor *x, const aclTensor *weightB, const aclTensor *indices,
    const aclTensor *weightAOptional, int64_t layerIdx, double scale, int64_t yOffset,
    int64_t ySliceSize, const aclTensor *out, uint64_t *workspaceSize, aclOpExecutor **executor);

ACL_FUNC_VISIBILITY aclnnStatus aclnnAddLora(void *workspace, uint64_t workspaceSize,
                                             aclOpExecutor *executor, aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif /* FUSEKIT_ACLNNOP_ACLNN_ADD_LORA_H_ */
