/* fusekit: aclnn's tensor, executor and status types. */
#ifndef FUSEKIT_ACLNN_ACL_META_H_
#define FUSEKIT_ACLNN_ACL_META_H_

#include "acl/acl_base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef int32_t aclnnStatus;

#define ACLNN_SUCCESS 0
#define ACLNN_ERR_PARAM_NULLPTR 161001
#define ACLNN_ERR_PARAM_INVALID 161002
#define ACLNN_ERR_RUNTIME_ERROR 361001
#define ACLNN_ERR_INNER 561000
#define ACLNN_ERR_INNER_TILING_ERROR 561002
#define ACLNN_ERR_INNER_FIND_KERNEL_ERROR 561003

/* A view of device (here: host) memory: viewDims/stride describe the view in elements, offset is
 * in elements from tensorData, storageDims describe the allocation the view lies in. */
typedef struct aclTensor aclTensor;
/* The plan that phase one returns and phase two consumes. */
typedef struct aclOpExecutor aclOpExecutor;

/* Returns null (and records a message) when the description is inconsistent: negative sizes,
 * more than 8 dimensions, or a view that reaches outside its storage. A null stride means
 * contiguous (row-major). */
ACL_FUNC_VISIBILITY aclTensor *aclCreateTensor(const int64_t *viewDims, uint64_t viewDimsNum,
                                               aclDataType dataType, const int64_t *stride,
                                               int64_t offset, aclFormat format,
                                               const int64_t *storageDims, uint64_t storageDimsNum,
                                               void *tensorData);
ACL_FUNC_VISIBILITY aclnnStatus aclDestroyTensor(const aclTensor *tensor);

/* Frees an executor that phase one returned and that will never be executed. Phase two frees its
 * executor itself, on success and on failure; do not call this after phase two. */
ACL_FUNC_VISIBILITY aclnnStatus aclDestroyAclOpExecutor(aclOpExecutor *executor);

#ifdef __cplusplus
}
#endif

#endif /* FUSEKIT_ACLNN_ACL_META_H_ */
