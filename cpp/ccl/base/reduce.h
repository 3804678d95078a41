// The Mojo reduction kernels (kernels/reduce.mojo, libtorch_mojo_kernels.so).
// Every reduction in libmojoccl goes through reduce(); there is no C++
// reduction code path to drift from it.
#pragma once

#include <cstddef>

#include "mojoccl/nccl.h"

namespace mojoccl {

// dst[i] = sources[0][i] op sources[1][i] op ... (in that order); AVG divides
// the sum by `divisor` once. `dst` may alias a source.
void reduce(void* dst, const void* const* sources, int nsources, size_t count,
            ncclDataType_t datatype, ncclRedOp_t op, int divisor);

// Between a half type (ncclFloat16, ncclBfloat16) and ncclFloat32, rounding
// to nearest even as reduce() does.
void convert(void* dst, ncclDataType_t dstType, const void* src, ncclDataType_t srcType,
             size_t count);

}  // namespace mojoccl
