// fusekit internal: streams. A stream is a token; work on it runs synchronously when enqueued.
#ifndef FUSEKIT_RUNTIME_STREAM_H_
#define FUSEKIT_RUNTIME_STREAM_H_

#include "acl/acl_base.h"

namespace fusekit {

struct Stream {
  int reserved = 0;
};

// True for null (the default stream) and for streams created and not yet destroyed.
bool stream_is_valid(aclrtStream stream);

}  // namespace fusekit

#endif  // FUSEKIT_RUNTIME_STREAM_H_
