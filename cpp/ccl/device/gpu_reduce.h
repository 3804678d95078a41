// The Mojo GPU reduction kernel (kernels/gpu_reduce.mojo), compiled ahead of
// time into gpu_kernels/reduce.<target>.{ptx,hsaco} next to libmojoccl and
// loaded here with the process's own runtime (runtime.h): the image
// the current GPU accepts is found by trying each one built for its vendor.
#pragma once

#include <cstddef>
#include <string>

#include "mojoccl/nccl.h"

namespace mojoccl {

// MAX_SOURCES in kernels/gpu_reduce.mojo.
constexpr int kMaxDeviceSources = 16;

// Empty when the kernel loads on the current device, else why it does not.
std::string deviceKernelUnavailable();

// dst[i] = sources[0][i] op sources[1][i] op ... (in that order), enqueued
// on `stream`; AVG divides the sum by `divisor` once. `dst` may alias a
// source. All buffers are device memory the current device can read.
void reduceOnDevice(void* dst, const void* const* sources, int nsources, size_t count,
                    ncclDataType_t datatype, ncclRedOp_t op, int divisor, ncclStream_t stream);

}  // namespace mojoccl
