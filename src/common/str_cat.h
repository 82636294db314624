// fusekit internal: building the one-sentence messages that name arguments and values.
#ifndef FUSEKIT_COMMON_STR_CAT_H_
#define FUSEKIT_COMMON_STR_CAT_H_

#include <sstream>
#include <string>

namespace fusekit {

template <typename... Args>
std::string str_cat(const Args &...args) {
  std::ostringstream os;
  os.precision(9);
  (os << ... << args);
  return os.str();
}

}  // namespace fusekit

#endif  // FUSEKIT_COMMON_STR_CAT_H_
