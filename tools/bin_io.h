// fusekit tools: the .bin files and params.txt of the single-operator golden flow.
#ifndef FUSEKIT_TOOLS_BIN_IO_H_
#define FUSEKIT_TOOLS_BIN_IO_H_

#include <cstddef>
#include <map>
#include <string>
#include <vector>

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

}  // namespace fusekit::tools

#endif  // FUSEKIT_TOOLS_BIN_IO_H_
