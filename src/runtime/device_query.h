// fusekit internal: which device a pointer handed to the aclnn face lives on. The CPU runtime
// (device_query_cpu.cc) answers "cpu" for every pointer; a CUDA build links device_query_cuda.cc
// instead (cudaPointerGetAttributes), and aclCreateTensor records the answer in the view, so that
// each operator's implementation list sees where the data is.
#ifndef FUSEKIT_RUNTIME_DEVICE_QUERY_H_
#define FUSEKIT_RUNTIME_DEVICE_QUERY_H_

#include "fusekit/device.h"

namespace fusekit {

Device device_of_pointer(const void *p);

}  // namespace fusekit

#endif  // FUSEKIT_RUNTIME_DEVICE_QUERY_H_
