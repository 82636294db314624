#include "common/verbose.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace fusekit {

bool verbose_enabled() {
  static const bool on = [] {
    const char *v = std::getenv("FUSEKIT_VERBOSE");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return on;
}

void verbose_print(const std::string &line) {
  std::fprintf(stderr, "fusekit_verbose,%s\n", line.c_str());
}

void StageTimer::stage(const char *name) {
  if (!on_) return;
  const auto now = std::chrono::steady_clock::now();
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s%s=%.3fms", fields_.empty() ? "" : ",", name,
                std::chrono::duration<double, std::milli>(now - last_).count());
  fields_ += buf;
  last_ = now;
}

}  // namespace fusekit
