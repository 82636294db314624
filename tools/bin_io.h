// fusekit tools: the .bin files and params.txt of the single-operator golden flow.
#ifndef FUSEKIT_TOOLS_BIN_IO_H_
#define FUSEKIT_TOOLS_BIN_IO_H_

#include <cstddef>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "acl/acl.h"
#include "aclnn/acl_meta.h"
#include "fusekit/status.h"

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

// The steady time of a call: the median of phase two over repeated calls.
struct SteadySeconds {
  double median = 0;
  int runs = 0;
};

// One operator's two-phase call, made as often as asked: `phase_one` (the operator's
// GetWorkspaceSize with its arguments bound) gives the workspace size and the executor, the
// workspace is allocated once (grown if a later call asks for more), `phase_two` runs on `stream`,
// which is synchronized. Any failure exits with the library's message.
//
// The second constructor makes the same call through the operator's C++ API, for what the aclnn
// face does not take (the FP8 state format of the 8-bit optimizers, docs/fp8_state.md): `plan`
// (phase one) makes the plan with the arguments bound and gives its workspace size, `run`
// (phase two) runs it on the workspace. Any failure exits with the status's message.
class OpCall {
 public:
  using PhaseOne = std::function<aclnnStatus(uint64_t *workspace_size, aclOpExecutor **executor)>;
  using PhaseTwo = aclnnStatus (*)(void *workspace, uint64_t workspace_size,
                                   aclOpExecutor *executor, aclrtStream stream);
  using Plan = std::function<Status(uint64_t *workspace_size)>;
  using Run = std::function<Status(void *workspace, uint64_t workspace_size)>;
  OpCall(aclrtStream stream, PhaseOne phase_one, PhaseTwo phase_two);
  OpCall(Plan plan, Run run);
  ~OpCall();
  OpCall(const OpCall &) = delete;
  OpCall &operator=(const OpCall &) = delete;

  CallSeconds operator()();
  // The runner calls it after it has written the outputs of its first call (the one the golden
  // data checks): one more call as a warm-up, then at least 5 and 0.5 s of calls (at most 25),
  // which step the same buffers further.
  SteadySeconds steady();
  uint64_t workspace_size() const { return workspace_size_; }

 private:
  aclrtStream stream_ = nullptr;
  PhaseOne phase_one_;
  PhaseTwo phase_two_ = nullptr;
  Plan plan_;  // the C++ API's call, when phase_one_ is not set
  Run run_;
  void *workspace_ = nullptr;
  uint64_t workspace_size_ = 0, capacity_ = 0;
};

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

// A runner's start: its command line (`name` <dir>; else the usage, and exit), <dir>/params.txt,
// and the acl session (start_acl; the runner ends it with finish_acl(stream)).
struct Runner {
  Runner(int argc, char **argv, const char *name);
  // <dir>/input/<file>.bin on the device as a tensor of `shape` and `dtype`.
  DeviceTensor input(const char *file, const std::vector<int64_t> &shape, aclDataType dtype) const;
  std::string dir;
  Params params;
  aclrtStream stream = nullptr;
};

// The dtype params.txt names: "float16", "bfloat16", else float32.
aclDataType acl_dtype_named(const std::string &name);

// aclInit, device 0 and a stream (exits on failure); finish_acl undoes them.
aclrtStream start_acl();
void finish_acl(aclrtStream stream);

// Each tensor copied back and written to <dir>/output/<name>.bin.
void write_outputs(const std::string &dir,
                   std::initializer_list<std::pair<const DeviceTensor *, const char *>> outputs);

// run_stats.txt of a runner: the steady time (median), the first call, the steady runs, phase one,
// the rate (`amount` per second, in `unit`: "GB/s" of bytes, "GFLOP/s" of operations), the shape,
// the workspace and, when not empty, the library's message (a skipped-row count).
void write_run_stats(const std::string &dir, const OpCall &call, const CallSeconds &first,
                     const SteadySeconds &steady, double amount, const char *unit,
                     const std::string &shape, const std::string &message = "");

}  // namespace fusekit::tools

#endif  // FUSEKIT_TOOLS_BIN_IO_H_
