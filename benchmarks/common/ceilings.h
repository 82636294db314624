// fusekit benchmarks: this machine's ceilings, measured in the same run as the operator.
#ifndef FUSEKIT_BENCHMARKS_COMMON_CEILINGS_H_
#define FUSEKIT_BENCHMARKS_COMMON_CEILINGS_H_

#include <benchmark/benchmark.h>

#include <cstddef>
#include <functional>
#include <vector>

namespace fusekit::bench {

// Sequential copy bandwidth in bytes per second (bytes read + bytes written), with all worker
// threads, over buffers far larger than the last-level cache. Median of several copies; measured
// once per process and cached.
double copy_bandwidth();

// Runs `work` on every worker thread at once, `reps` times; each call returns the units of work
// it did (FLOPs, elements). Returns the median over the repetitions of (units done by all threads)
// per wall second.
double median_rate_all_threads(int reps, const std::function<double()> &work);

// Peak float32 FMA throughput in FLOP/s (2 per lane per FMA) for the best SIMD target, all worker
// threads. Measured once per process and cached.
double fma_peak_flops();

// Adds the copy-bandwidth ceiling and ratio counters to a benchmark that moved `bytes` per
// iteration: "GB/s", "copy_GB/s", "of_copy".
void report_bandwidth(benchmark::State &state, double bytes_per_iteration);

// The same from a time the benchmark measured itself (for instance the median of its own
// per-iteration timings): plain counters, no "/s" suffix.
void report_bandwidth_seconds(benchmark::State &state, double bytes, double seconds);
void report_flops_seconds(benchmark::State &state, double flops, double seconds);

// The median of a sample (by value).
double median_of(std::vector<double> v);

// Adds GFLOP/s and the ratio to the FMA peak: "GFLOP/s", "peak_GFLOP/s", "of_peak".
void report_flops(benchmark::State &state, double flops_per_iteration);

// A buffer from aclrtMalloc (HUGE_FIRST): what the seed programs hand the operators.
struct DeviceBuffer {
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer &) = delete;
  DeviceBuffer &operator=(const DeviceBuffer &) = delete;
  template <typename T>
  T *as() const {
    return static_cast<T *>(ptr);
  }
  void *ptr = nullptr;
  size_t size = 0;
};

}  // namespace fusekit::bench

#endif  // FUSEKIT_BENCHMARKS_COMMON_CEILINGS_H_
