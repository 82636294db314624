#include "bin_io.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>

namespace fusekit::tools {

void die(const std::string &message) {
  std::fprintf(stderr, "[ERROR] %s\n", message.c_str());
  std::exit(1);
}

std::vector<char> read_bin(const std::string &path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) die("cannot open " + path);
  const auto size = static_cast<size_t>(in.tellg());
  std::vector<char> data(size);
  in.seekg(0);
  if (size > 0 && !in.read(data.data(), static_cast<std::streamsize>(size)))
    die("cannot read " + path);
  return data;
}

void write_bin(const std::string &path, const void *data, size_t bytes) {
  std::ofstream out(path, std::ios::binary);
  if (!out || !out.write(static_cast<const char *>(data), static_cast<std::streamsize>(bytes))) {
    die("cannot write " + path);
  }
}

Params::Params(const std::string &path) : path_(path) {
  std::ifstream in(path);
  if (!in) die("cannot open " + path);
  std::string line;
  while (std::getline(in, line)) {
    const auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    const auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    auto trim = [](std::string s) {
      const auto b = s.find_first_not_of(" \t\r");
      const auto e = s.find_last_not_of(" \t\r");
      return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
    };
    values_[trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
  }
}

std::string Params::str(const std::string &key) const {
  const auto it = values_.find(key);
  if (it == values_.end()) die(path_ + ": missing key '" + key + "'");
  return it->second;
}
double Params::num(const std::string &key) const {
  return std::strtod(str(key).c_str(), nullptr);
}
long long Params::integer(const std::string &key) const {
  return std::strtoll(str(key).c_str(), nullptr, 10);
}

void write_stats(const std::string &dir, const std::map<std::string, std::string> &stats) {
  std::ofstream out(dir + "/run_stats.txt");
  for (const auto &[k, v] : stats) {
    out << k << " = " << v << "\n";
    std::printf("[INFO] %s = %s\n", k.c_str(), v.c_str());
  }
}

OpCall::OpCall(aclrtStream stream, PhaseOne phase_one, PhaseTwo phase_two)
    : stream_(stream), phase_one_(std::move(phase_one)), phase_two_(phase_two) {}

OpCall::OpCall(Plan plan, Run run) : plan_(std::move(plan)), run_(std::move(run)) {}

OpCall::~OpCall() {
  if (workspace_ != nullptr) aclrtFree(workspace_);
}

CallSeconds OpCall::operator()() {
  const auto t0 = std::chrono::steady_clock::now();
  aclOpExecutor *executor = nullptr;
  if (plan_) {
    const Status s = plan_(&workspace_size_);
    if (!s.ok()) die(s.message());
  } else if (phase_one_(&workspace_size_, &executor) != ACLNN_SUCCESS) {
    die(aclGetRecentErrMsg());
  }
  if (workspace_size_ > capacity_) {
    if (workspace_ != nullptr) aclrtFree(workspace_);
    workspace_ = nullptr;
    if (aclrtMalloc(&workspace_, workspace_size_, ACL_MEM_MALLOC_HUGE_FIRST) != ACL_SUCCESS)
      die(aclGetRecentErrMsg());
    capacity_ = workspace_size_;
  }
  const auto t1 = std::chrono::steady_clock::now();
  if (run_) {
    const Status s = run_(workspace_, workspace_size_);
    if (!s.ok()) die(s.message());
  } else {
    if (phase_two_(workspace_, workspace_size_, executor, stream_) != ACLNN_SUCCESS)
      die(aclGetRecentErrMsg());
    if (aclrtSynchronizeStream(stream_) != ACL_SUCCESS) die(aclGetRecentErrMsg());
  }
  const auto t2 = std::chrono::steady_clock::now();
  return {std::chrono::duration<double>(t1 - t0).count(),
          std::chrono::duration<double>(t2 - t1).count()};
}

SteadySeconds OpCall::steady() {
  (*this)();  // warm-up
  std::vector<double> runs;
  double total = 0;
  while (runs.size() < 25 && (runs.size() < 5 || total < 0.5)) {
    runs.push_back((*this)().run);
    total += runs.back();
  }
  std::sort(runs.begin(), runs.end());
  const size_t h = runs.size() / 2;
  const double median = runs.size() % 2 ? runs[h] : 0.5 * (runs[h - 1] + runs[h]);
  return {median, static_cast<int>(runs.size())};
}

std::string ms(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", seconds * 1e3);
  return buf;
}

DeviceTensor upload(const std::vector<char> &host, const std::vector<int64_t> &shape,
                    aclDataType dt) {
  size_t n = 1;
  for (int64_t s : shape) n *= static_cast<size_t>(s);
  if (host.size() != n * std::max<size_t>(1, aclDataTypeSize(dt))) {
    die("input of " + std::to_string(host.size()) + " bytes does not match its shape of " +
        std::to_string(n) + " elements");
  }
  DeviceTensor t;
  t.bytes = host.size();
  if (aclrtMalloc(&t.ptr, t.bytes > 0 ? t.bytes : 1, ACL_MEM_MALLOC_HUGE_FIRST) != ACL_SUCCESS) {
    die(aclGetRecentErrMsg());
  }
  if (t.bytes > 0 &&
      aclrtMemcpy(t.ptr, t.bytes, host.data(), t.bytes, ACL_MEMCPY_HOST_TO_DEVICE) != ACL_SUCCESS) {
    die(aclGetRecentErrMsg());
  }
  t.tensor = aclCreateTensor(shape.data(), shape.size(), dt, nullptr, 0, ACL_FORMAT_ND,
                             shape.data(), shape.size(), t.ptr);
  if (t.tensor == nullptr) die(aclGetRecentErrMsg());
  return t;
}

std::vector<char> download(const DeviceTensor &t) {
  std::vector<char> host(t.bytes);
  if (t.bytes > 0 && aclrtMemcpy(host.data(), host.size(), t.ptr, t.bytes,
                                 ACL_MEMCPY_DEVICE_TO_HOST) != ACL_SUCCESS) {
    die(aclGetRecentErrMsg());
  }
  return host;
}

void release(DeviceTensor &t) {
  if (t.tensor != nullptr) aclDestroyTensor(t.tensor);
  if (t.ptr != nullptr) aclrtFree(t.ptr);
  t = DeviceTensor();
}

aclrtStream start_acl() {
  if (aclInit(nullptr) != ACL_SUCCESS || aclrtSetDevice(0) != ACL_SUCCESS) die("acl init failed");
  aclrtStream stream = nullptr;
  if (aclrtCreateStream(&stream) != ACL_SUCCESS) die(aclGetRecentErrMsg());
  return stream;
}

void finish_acl(aclrtStream stream) {
  aclrtDestroyStream(stream);
  aclrtResetDevice(0);
  aclFinalize();
}

void write_outputs(const std::string &dir,
                   std::initializer_list<std::pair<const DeviceTensor *, const char *>> outputs) {
  for (const auto &[t, name] : outputs) {
    const std::vector<char> host = download(*t);
    write_bin(dir + "/output/" + name + ".bin", host.data(), host.size());
  }
}

void write_run_stats(const std::string &dir, const OpCall &call, const CallSeconds &first,
                     const SteadySeconds &steady, double amount, const char *unit,
                     const std::string &shape, const std::string &message) {
  char time_ms[32], rate[48], plan_ms[32];
  std::snprintf(time_ms, sizeof time_ms, "%.2f", steady.median * 1e3);
  std::snprintf(plan_ms, sizeof plan_ms, "%.3f", first.phase_one * 1e3);
  std::snprintf(rate, sizeof rate, "%.2f %s", amount / steady.median * 1e-9, unit);
  std::map<std::string, std::string> stats = {
      {"time_ms", time_ms},
      {"first_call_ms", ms(first.run)},
      {"steady_runs", std::to_string(steady.runs)},
      {"phase_one_ms", plan_ms},
      {"rate", rate},
      {"shape", shape},
      {"workspace_bytes", std::to_string(call.workspace_size())}};
  if (!message.empty()) stats["message"] = message;
  write_stats(dir, stats);
}

namespace {
std::string runner_dir(int argc, char **argv, const char *name) {
  if (argc != 2) die(std::string("usage: ") + name + " <dir>");
  return argv[1];
}
}  // namespace

Runner::Runner(int argc, char **argv, const char *name)
    : dir(runner_dir(argc, argv, name)), params(dir + "/params.txt"), stream(start_acl()) {}

DeviceTensor Runner::input(const char *file, const std::vector<int64_t> &shape,
                           aclDataType dtype) const {
  return upload(read_bin(dir + "/input/" + file + ".bin"), shape, dtype);
}

aclDataType acl_dtype_named(const std::string &name) {
  return name == "float16" ? ACL_FLOAT16 : name == "bfloat16" ? ACL_BF16 : ACL_FLOAT;
}

}  // namespace fusekit::tools
