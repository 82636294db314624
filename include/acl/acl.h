/* fusekit: the ACL header programs written for CANN include. */
#ifndef FUSEKIT_ACL_ACL_H_
#define FUSEKIT_ACL_ACL_H_

#include "acl/acl_base.h"
#include "acl/acl_rt.h"
#include "aclnn/acl_meta.h"

#endif /* FUSEKIT_ACL_ACL_H_ */
