/* fusekit: aclnnLazyAdam, the Rec SDK fused LazyAdam operator (argument order of Rec SDK's own
 * single-operator test). inputM, inputV and inputVar are updated in place. */
#ifndef FUSEKIT_ACLNNOP_ACLNN_LAZY_ADAM_H_
#define FUSEKIT_ACLNNOP_ACLNN_LAZY_ADAM_H_

#include "aclnn/acl_meta.h"

#ifdef __cplusplus
extern "C" {
#endif

ACL_FUNC_VISIBILITY aclnnStatus aclnnLazyAdamGetWorkspaceSize(
    const aclTensor *gradient, const aclTensor *indices, const aclTensor *inputM,
    const aclTensor *inputV, const aclTensor *inputVar, const aclTensor *lr, double beta1,
    double beta2, double epsilon, uint64_t *workspaceSize, aclOpExecutor **executor);

ACL_FUNC_VISIBILITY aclnnStatus aclnnLazyAdam(void *workspace, uint64_t workspaceSize,
                                              aclOpExecutor *executor, aclrtStream stream);

#ifdef __cplusplus
}
#endif

#endif /* FUSEKIT_ACLNNOP_ACLNN_LAZY_ADAM_H_ */
