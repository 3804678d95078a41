#include "base/reduce.h"

#include <cstdint>
#include <string>

#include "base/datatypes.h"
#include "base/error.h"

extern "C" int32_t tm_reduce(void* dst, const void* const* srcs, int64_t nsrcs, int64_t count,
                             int32_t dtype, int32_t op, int64_t divisor);
extern "C" int32_t tm_convert(void* dst, int32_t dstType, const void* src, int32_t srcType,
                              int64_t count);

namespace mojoccl {

void reduce(void* dst, const void* const* sources, int nsources, size_t count,
            ncclDataType_t datatype, ncclRedOp_t op, int divisor) {
  int32_t rc = tm_reduce(dst, sources, nsources, static_cast<int64_t>(count), datatype, op, divisor);
  if (rc != 0)
    fail(ncclInvalidArgument, std::string("the reduction kernel rejected ") + redOpName(op) +
                                  " on " + datatypeName(datatype) + " (code " +
                                  std::to_string(rc) + ")");
}

void convert(void* dst, ncclDataType_t dstType, const void* src, ncclDataType_t srcType,
             size_t count) {
  int32_t rc = tm_convert(dst, dstType, src, srcType, static_cast<int64_t>(count));
  if (rc != 0)
    fail(ncclInvalidArgument, std::string("the conversion kernel rejected ") + datatypeName(srcType) +
                                  " to " + datatypeName(dstType) + " (code " + std::to_string(rc) + ")");
}

}  // namespace mojoccl
