/* fusekit: aclnnApplyAdamWQuant, AdamW with 8-bit block-wise quantized moments (CANN's signature).
 * varRef, mRef, vRef, absmaxMRef and absmaxVRef are updated in place. blockSize must be 256;
 * quantModeOptional is null or "BLOCKWISE". The step tensor is read when phase two runs, and the
 * kernel uses t = step + 1 (as CANN's kernel does). A block whose step would produce a non-finite
 * m, v or var (a NaN or Inf gradient, an overflow, a non-finite state) is left unchanged; their
 * count is recorded as a warning readable with aclGetRecentErrMsg. */
#ifndef FUSEKIT_ACLNNOP_ACLNN_APPLY_ADAM_W_QUANT_H_
#define FUSEKIT_ACLNNOP_ACLNN_APPLY_ADAM_W_QUANT_H_

#include "aclnn/acl_meta.h"

#ifdef __cplusplus
extern "C" {
#endif

ACL_FUNC_VISIBILITY aclnnStatus aclnnApplyAdamWQuantGetWorkspaceSize(
    aclTensor *varRef, const aclTensor *grad, aclTensor *mRef, aclTensor *vRef,
    const aclTensor *qmapM, const aclTensor *qmapV, aclTensor *absmaxMRef, aclTensor *absmaxVRef,
    const aclTensor *step, double lr, double beta1, double beta2, double weightDecay, double eps,
    double gnormScale, char *quantModeOptional, int64_t blockSize, uint64_t *workspaceSize,
    aclOpExecutor **executor);

ACL_FUNC_VISIBILITY aclnnStatus aclnnApplyAdamWQuant(void *workspace, uint64_t workspaceSize,
                                                     aclOpExecutor *executor, aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif /* FUSEKIT_ACLNNOP_ACLNN_APPLY_ADAM_W_QUANT_H_ */
