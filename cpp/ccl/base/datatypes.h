// Facts about NCCL's datatypes and reduction operations.
#pragma once

#include <cstddef>
#include <string>

#include "mojoccl/nccl.h"

namespace mojoccl {

size_t datatypeSize(ncclDataType_t datatype);  // 0 for an unknown datatype
const char* datatypeName(ncclDataType_t datatype);
const char* redOpName(ncclRedOp_t op);

}  // namespace mojoccl
