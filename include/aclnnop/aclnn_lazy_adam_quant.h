/* fusekit: aclnnLazyAdamQuant, LazyAdam with 8-bit block-wise quantized m and v. This is
 * fusekit's own operator in the aclnn style, not one of CANN's or Rec SDK's (neither ships it):
 * aclnnLazyAdam's arguments (gradient, indices, inputM, inputV, inputVar, lr, beta1, beta2,
 * epsilon) with inputM and inputV as uint8 codes [R, D], the two float32 [256] maps qmapM and
 * qmapV, and the float32 scales absmaxM and absmaxV [R, ceil(D / 256)] (one per row and block of
 * 256 columns). inputM, inputV, inputVar, absmaxM and absmaxV are updated in place. inputVar is
 * float32, bfloat16 or float16; gradient is inputVar's dtype or float32. lr (one float32 element)
 * is read when phase two runs; lr is already bias-corrected. A row whose step would produce a
 * non-finite m, v or var (a NaN or Inf gradient, an overflow, non-finite state) is left
 * unchanged; their count is recorded as a warning readable with aclGetRecentErrMsg. See
 * docs/lazy_adam_quant.md. */
#ifndef FUSEKIT_ACLNNOP_ACLNN_LAZY_ADAM_QUANT_H_
#define FUSEKIT_ACLNNOP_ACLNN_LAZY_ADAM_QUANT_H_

#include "aclnn/acl_meta.h"

#ifdef __cplusplus
extern "C" {
#endif

ACL_FUNC_VISIBILITY aclnnStatus aclnnLazyAdamQuantGetWorkspaceSize(
    const aclTensor *gradient, const aclTensor *indices, aclTensor *inputM, aclTensor *inputV,
    aclTensor *inputVar, const aclTensor *qmapM, const aclTensor *qmapV, aclTensor *absmaxM,
    aclTensor *absmaxV, const aclTensor *lr, double beta1, double beta2, double epsilon,
    uint64_t *workspaceSize, aclOpExecutor **executor);

ACL_FUNC_VISIBILITY aclnnStatus aclnnLazyAdamQuant(void *workspace, uint64_t workspaceSize,
                                                   aclOpExecutor *executor, aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif /* FUSEKIT_ACLNNOP_ACLNN_LAZY_ADAM_QUANT_H_ */
