// fusekit: where a tensor lives and what orders the work on it. Every implementation of an
// operator says which devices it serves; today all of them are CPU implementations, and a tensor
// on any other device is answered with StatusCode::kNoImplementation (see docs/architecture.md,
// "Adding a backend").
#ifndef FUSEKIT_DEVICE_H_
#define FUSEKIT_DEVICE_H_

#include <cstdint>

namespace fusekit {

enum class Device : int32_t {
  kCpu = 0,
  kCuda = 1,  // reserved for the CUDA implementations (none is built yet)
};

constexpr const char *device_name(Device d) {
  switch (d) {
    case Device::kCpu:
      return "cpu";
    case Device::kCuda:
      return "cuda";
  }
  return "unknown";
}

// The stream a run is ordered on: an aclrtStream on the aclnn path, a cudaStream_t for a CUDA
// implementation. CPU implementations run synchronously on the calling thread (and the library's
// helper threads) and return when the work is done; they do not look at it.
using StreamHandle = void *;

}  // namespace fusekit

#endif  // FUSEKIT_DEVICE_H_
