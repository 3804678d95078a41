// Round the ring: the reduce-scatter (each member folding the slice from
// behind into its own and passing it on), the all-reduce built on it, and
// the all-gather.
#include "algorithms/network.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "algorithms/layout.h"
#include "algorithms/network_segments.h"
#include "base/datatypes.h"
#include "base/error.h"
#include "base/reduce.h"

namespace mojoccl {

void networkReduceScatter(const NetworkGroup& group, const RingBuffers& buffers, const std::vector<Slice>& slices,
                          int shift, ncclDataType_t datatype, ncclRedOp_t op, const std::function<void(Slice)>& whole) {
  const int n = group.size();
  if (n == 1) return;
  FabricTransport& fabric = group.fabric;
  const size_t size = datatypeSize(datatype);
  const int next = group.next(), previous = group.previous();
  // At step s we pass on slice (self + shift - 1 - s) and fold in the one
  // behind it, so that after n - 1 steps slice (self + shift) is whole.
  auto slice = [&](int step) { return slices[(((group.self + shift - 1 - step) % n) + n) % n]; };
  auto sendOn = [&](const void* from, Slice piece) {
    return fabric.postSend(next, bytesAt(from, piece.begin, size), bytesOf(piece, size));
  };
  // Two buffers for the slices arriving from behind: the next step's
  // receives are posted while this step's segments are folded in.
  auto receiveStep = [&](int step) {
    const Slice in = slice(step + 1);
    char* into = group.room.get(step % 2, bytesOf(in, size));
    std::vector<Segment> segments = segmentsOf(group, in, size);
    for (Segment& segment : segments)
      segment.arrival = fabric.postRecv(previous, into + (segment.slice.begin - in.begin) * size,
                                        bytesOf(segment.slice, size));
    return segments;
  };
  std::vector<FabricTransport::Ticket> sent;
  std::vector<Segment> arriving = receiveStep(0);
  const Slice mine = slices[(group.self + shift) % n];
  auto destination = [&](bool last, Slice piece) {
    return last ? bytesAt(buffers.result, piece.begin - mine.begin, size) : bytesAt(buffers.partial, piece.begin, size);
  };
  for (const Segment& segment : segmentsOf(group, slice(0), size))
    sent.push_back(sendOn(buffers.source, segment.slice));
  for (int step = 0; step < n - 1; ++step) {
    std::vector<Segment> following = step + 1 < n - 1 ? receiveStep(step + 1) : std::vector<Segment>{};
    const Slice in = slice(step + 1);
    const char* from = group.room.get(step % 2, 0);
    const bool last = step + 1 == n - 1;
    for (const Segment& segment : arriving) {
      fabric.waitFor(segment.arrival, group.what);
      // Each slice is folded here once, so our operand is always our own.
      reduceWhilePolling(group, destination(last, segment.slice), bytesAt(buffers.source, segment.slice.begin, size),
                         from + (segment.slice.begin - in.begin) * size, segment.slice, datatype, op);
      // A folded segment is what the next step sends on; after the last
      // step it is whole, and the caller's.
      if (!last)
        sent.push_back(sendOn(buffers.partial, segment.slice));
      else if (whole)
        whole(segment.slice);
    }
    arriving = std::move(following);
  }
  for (FabricTransport::Ticket ticket : sent) fabric.waitFor(ticket, group.what);
}

namespace {

// The all-gather half of a ring, in place: member m holds
// slices[(m + shift) % size] and has sent it on (or is sending it); it
// receives the others from behind, passing each segment on as it lands,
// all but the last one it receives.
void passRoundTheRing(const NetworkGroup& group, void* data, const std::vector<Slice>& slices, int shift,
                      size_t elementSize) {
  const int n = group.size();
  FabricTransport& fabric = group.fabric;
  auto slice = [&](int step) { return slices[(((group.self + shift - 1 - step) % n) + n) % n]; };
  std::vector<std::vector<Segment>> gathered;
  for (int step = 0; step < n - 1; ++step) {
    gathered.push_back(segmentsOf(group, slice(step), elementSize));
    for (Segment& segment : gathered.back())
      segment.arrival = fabric.postRecv(group.previous(), bytesAt(data, segment.slice.begin, elementSize),
                                        bytesOf(segment.slice, elementSize));
  }
  for (int step = 0; step + 1 < n - 1; ++step)
    for (const Segment& segment : gathered[step]) {
      fabric.waitFor(segment.arrival, group.what);
      fabric.postSend(group.next(), bytesAt(data, segment.slice.begin, elementSize), bytesOf(segment.slice, elementSize));
    }
  fabric.waitAll(group.what);
}

}  // namespace

void networkAllReduce(const NetworkGroup& group, void* data, size_t count, ncclDataType_t datatype,
                      ncclRedOp_t op) {
  const int n = group.size();
  if (n == 1) return;
  const size_t size = datatypeSize(datatype);
  std::vector<Slice> slices;
  for (int part = 0; part < n; ++part) slices.push_back(sliceOf(count, n, part, size));
  // Reduce-scatter, ending with slice self + 1 whole here; each of its
  // segments starts round the ring again as soon as it is. Then the whole
  // slices travel once round the ring (the reduce-scatter's sends from the
  // slices written there are complete).
  const RingBuffers inPlace{data, data, bytesAt(data, slices[(group.self + 1) % n].begin, size)};
  networkReduceScatter(group, inPlace, slices, 1, datatype, op, [&](Slice piece) {
    group.fabric.postSend(group.next(), bytesAt(data, piece.begin, size), bytesOf(piece, size));
  });
  passRoundTheRing(group, data, slices, 1, size);
}

void networkAllGatherRing(const NetworkGroup& group, char* data, const std::vector<Slice>& blocks) {
  if (group.size() == 1) return;
  postSegments(group, true, (group.self + 1) % group.size(), data, blocks[group.self], 1);
  passRoundTheRing(group, data, blocks, 0, 1);
}

}  // namespace mojoccl
