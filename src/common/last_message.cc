#include "common/last_message.h"

#include "acl/acl_base.h"

namespace fusekit {
namespace {
thread_local std::string g_last_message;
}  // namespace

void set_last_message(std::string message) {
  g_last_message = std::move(message);
}
const char *last_message() {
  return g_last_message.c_str();
}

}  // namespace fusekit

extern "C" const char *aclGetRecentErrMsg(void) {
  return fusekit::last_message();
}
