#include "fusekit/threading.h"

#include <sched.h>

#include <atomic>
#include <cstdlib>
#include <thread>

namespace fusekit {
namespace {

std::atomic<int> g_threads{0};  // 0: the default

// OMP_NUM_THREADS (its first number, as OpenMP reads a list), else the CPUs this process may run
// on, else the hardware's count.
int default_threads() {
  static const int n = [] {
    if (const char *e = std::getenv("OMP_NUM_THREADS"); e != nullptr && *e != '\0') {
      const long v = std::strtol(e, nullptr, 10);
      if (v > 0) return static_cast<int>(std::min(v, 1024L));
    }
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    const unsigned h = std::thread::hardware_concurrency();
    return h > 0 ? static_cast<int>(h) : 1;
  }();
  return n;
}

}  // namespace

void set_num_threads(int n) {
  g_threads.store(n > 0 ? n : 0, std::memory_order_relaxed);
}

int num_threads() {
  const int n = g_threads.load(std::memory_order_relaxed);
  return n > 0 ? n : default_threads();
}

}  // namespace fusekit
