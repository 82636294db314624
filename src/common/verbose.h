// fusekit internal: FUSEKIT_VERBOSE=1 prints one line per operator run to stderr: the operator,
// its shapes, the kernel and instruction set, threads, and the time of each stage (in the manner
// of ONEDNN_VERBOSE).
#ifndef FUSEKIT_COMMON_VERBOSE_H_
#define FUSEKIT_COMMON_VERBOSE_H_

#include <chrono>
#include <string>

namespace fusekit {

bool verbose_enabled();
void verbose_print(const std::string &line);

// Collects "stage=1.234ms" fields when verbose mode is on; costs a branch when it is off.
class StageTimer {
 public:
  StageTimer() : on_(verbose_enabled()) {
    if (on_) last_ = std::chrono::steady_clock::now();
  }
  bool on() const { return on_; }
  void stage(const char *name);
  const std::string &fields() const { return fields_; }

 private:
  bool on_;
  std::chrono::steady_clock::time_point last_;
  std::string fields_;
};

}  // namespace fusekit

#endif  // FUSEKIT_COMMON_VERBOSE_H_
