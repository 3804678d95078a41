// A collective call as the caller described it. Every rank of a collective
// shares its call with the others at each step, and a step only proceeds
// when all of them describe the same call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "mojoccl/nccl.h"
#include "transports/shared_regions.h"

namespace mojoccl {

// AllToAll: each rank's counts are its own (count 0); only an all-to-all
// between nodes is a Call, to agree on it.
enum class CallKind : uint32_t { AllReduce = 1, Broadcast, AllGather, ReduceScatter, Reduce, AllToAll };

struct Call {
  CallKind kind;
  const void* send;
  void* recv;
  size_t count;  // AllGather: elements each rank sends; ReduceScatter: each rank receives
  ncclDataType_t datatype;
  ncclRedOp_t op;  // reductions only
  int root;        // Broadcast and Reduce
  uint64_t sequence;

  // "ncclAllReduce(count=4, float32, sum)"
  std::string describe() const;
};

// What ranks compare: the call without its buffers.
struct CallSignature {
  uint32_t kind;
  uint32_t datatype;
  uint32_t op;
  int32_t root;
  uint64_t count;
  uint64_t sequence;

  static CallSignature of(const Call& call);
  bool sameCollective(const CallSignature& other) const;
  std::string describe() const;
};

// Where a rank's buffers are, for algorithms that read peers' buffers in place.
struct CallBuffers {
  RegionDescriptor send;
  RegionDescriptor recv;
  uint64_t sendAddress;  // in the owner's address space, for process_vm_readv
  uint32_t inPlace;      // the send and receive ranges overlap

  static CallBuffers of(const Call& call, size_t sendBytes, size_t recvBytes);
};

}  // namespace mojoccl
