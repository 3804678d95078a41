#include "base/datatypes.h"

namespace mojoccl {

size_t datatypeSize(ncclDataType_t datatype) {
  switch (datatype) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

const char* datatypeName(ncclDataType_t datatype) {
  static const char* const names[] = {"int8",    "uint8",   "int32",   "uint32",  "int64",
                                      "uint64",  "float16", "float32", "float64", "bfloat16"};
  int index = static_cast<int>(datatype);
  return index >= 0 && index < ncclNumTypes ? names[index] : "unknown datatype";
}

const char* redOpName(ncclRedOp_t op) {
  static const char* const names[] = {"sum", "prod", "max", "min", "avg"};
  int index = static_cast<int>(op);
  return index >= 0 && index < ncclNumOps ? names[index] : "unknown op";
}

}  // namespace mojoccl
