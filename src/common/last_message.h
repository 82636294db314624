// fusekit internal: the thread-local message behind aclGetRecentErrMsg.
#ifndef FUSEKIT_COMMON_LAST_MESSAGE_H_
#define FUSEKIT_COMMON_LAST_MESSAGE_H_

#include <string>

namespace fusekit {

void set_last_message(std::string message);
const char *last_message();

}  // namespace fusekit

#endif  // FUSEKIT_COMMON_LAST_MESSAGE_H_
