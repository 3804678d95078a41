// What the algorithms between nodes share (network*.cc): how a message is
// cut into segments, folded while the transport moves, posted segment by
// segment. Not for use outside algorithms/.
#pragma once

#include <cstddef>
#include <vector>

#include "algorithms/network.h"

namespace mojoccl {

// A message (a ring step's slice, a block, a broadcast) travels in
// segments (FabricTransport::segmentFor): several in flight keep the wire
// busy, and the reduction of one overlaps the transfer of the next.
struct Segment {
  Slice slice;
  FabricTransport::Ticket arrival = 0;
};

std::vector<Segment> segmentsOf(const NetworkGroup& group, Slice slice, size_t elementSize);

inline size_t bytesOf(Slice slice, size_t elementSize) { return (slice.end - slice.begin) * elementSize; }

// dst = op(first, second) over `slice` (first, second and dst at its start),
// polling the group's transport between blocks.
void reduceWhilePolling(const NetworkGroup& group, void* dst, const void* first, const void* second, Slice slice,
                        ncclDataType_t datatype, ncclRedOp_t op);

// `slice` of `buffer` to or from group member `member`, in segments (the
// same on both sides, so each receive matches its send): their tickets.
std::vector<FabricTransport::Ticket> postSegments(const NetworkGroup& group, bool isSend, int member, void* buffer,
                                                  Slice slice, size_t elementSize);

}  // namespace mojoccl
