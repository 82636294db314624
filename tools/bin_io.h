// fusekit tools: the .bin files and params.txt of the single-operator golden flow.
#ifndef FUSEKIT_TOOLS_BIN_IO_H_
#define FUSEKIT_TOOLS_BIN_IO_H_

#include <cstddef>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "acl/acl.h"

namespace fusekit::tools {

// Reads a whole raw binary file; exits with a message when it cannot.
std::vector<char> read_bin(const std::string &path);
void write_bin(const std::string &path, const void *data, size_t bytes);

// params.txt: one "key = value" per line, '#' starts a comment.
class Params {
 public:
  explicit Params(const std::string &path);
  double num(const std::string &key) const;
  long long integer(const std::string &key) const;
  std::string str(const std::string &key) const;
  bool has(const std::string &key) const { return values_.count(key) != 0; }

 private:
  std::map<std::string, std::string> values_;
  std::string path_;
};

// Writes "key = value" lines to <dir>/run_stats.txt and echoes them to stdout.
void write_stats(const std::string &dir, const std::map<std::string, std::string> &stats);

[[noreturn]] void die(const std::string &message);

// The seconds of one operator call: phase one (GetWorkspaceSize) and phase two (the run, through
// aclrtSynchronizeStream).
struct CallSeconds {
  double phase_one = 0;
  double run = 0;
};

// The steady time of a call: `call` once more as a warm-up, then repeated (at least 5 times and
// 0.5 s, at most 25 times) and the median of the runs' phase two. The runner calls it after it has
// written the outputs of its first call (the one the golden data checks): the repeated calls step
// the same buffers further.
struct SteadySeconds {
  double median = 0;
  int runs = 0;
};
SteadySeconds steady_seconds(const std::function<CallSeconds()> &call);

// "%.2f" of milliseconds, for run_stats.txt.
std::string ms(double seconds);

// A tensor in "device" memory (aclrtMalloc, HUGE_FIRST) with its aclTensor: what the seed's
// single-operator programs hand the operators.
struct DeviceTensor {
  void *ptr = nullptr;
  size_t bytes = 0;
  aclTensor *tensor = nullptr;
};

// Copies a host buffer to device memory and describes it as a contiguous ND tensor of `shape`;
// exits with a message when the buffer's size does not match the shape and dtype.
DeviceTensor upload(const std::vector<char> &host, const std::vector<int64_t> &shape,
                    aclDataType dt);
std::vector<char> download(const DeviceTensor &t);
void release(DeviceTensor &t);

}  // namespace fusekit::tools

#endif  // FUSEKIT_TOOLS_BIN_IO_H_
