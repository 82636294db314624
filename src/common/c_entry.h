// fusekit internal: nothing throws across the C boundary. Every extern "C" entry point that can
// allocate runs its body through guard_c_entry(), which turns any exception (an allocation
// failure, above all) into the entry's error value and a message for aclGetRecentErrMsg().
#ifndef FUSEKIT_COMMON_C_ENTRY_H_
#define FUSEKIT_COMMON_C_ENTRY_H_

#include <new>
#include <string>

#include "common/last_message.h"

namespace fusekit {

// Records "fn: what" if that can be done (recording a message allocates too).
inline void record_exception(const char *fn, const char *what) noexcept {
  try {
    set_last_message(std::string(fn) + ": " + what);
  } catch (...) {  // no memory for the message either: the code alone tells
  }
}

template <typename R, typename Body>
R guard_c_entry(const char *fn, R on_exception, Body &&body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc &) {
    record_exception(fn, "out of memory");
  } catch (...) {
    record_exception(fn, "internal error (an exception inside the library)");
  }
  return on_exception;
}

}  // namespace fusekit

#endif  // FUSEKIT_COMMON_C_ENTRY_H_
