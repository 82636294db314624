// The CPU runtime: "device" memory is host memory, so every pointer is on the CPU.
#include "runtime/device_query.h"

namespace fusekit {

Device device_of_pointer(const void * /*p*/) {
  return Device::kCpu;
}

}  // namespace fusekit
