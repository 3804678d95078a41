// Reductions whose result is the same bits at any layout of the ranks on
// nodes (MOJOCCL_DETERMINISTIC=1): the rank-order sum
// ((x0 + x1) + x2) + ... + x(n-1), element by element in the call's own
// type, a half type rounded after every addition as torch's own add of two
// such tensors rounds; an average is that sum divided once by the rank
// count; a product likewise in rank order.
//
// Each rank owns a slice of the buffer: it receives every other node's
// ranks' parts of that slice (the volume of a reduce-scatter, rank to rank)
// and its own node's send buffers (an all-gather in shared memory),
// combines the parts in rank order, and an all-reduce then all-gathers the
// slices.
// Between nodes a call whose every rank's buffer fits the leaders' frames
// (kFramedMaxBytes in all) is instead one all-gather of those buffers, in
// the step that agrees on the call, and each rank combines them all. The
// hierarchy's own sums instead add each node's ranks first and the nodes'
// partial sums after, in an order that follows the layout.
#pragma once

#include <vector>

#include "algorithms/call.h"
#include "algorithms/layout.h"
#include "hierarchy/hierarchy.h"
#include "node/node.h"
#include "node/topology.h"
#include "transports/fabric.h"

namespace mojoccl {

class RankOrderReductions {
 public:
  // `hierarchy` and `fabric`: null on a communicator within one node.
  RankOrderReductions(const Topology& topology, NodeCollectives& node, Hierarchy* hierarchy, FabricTransport* fabric)
      : topology_(topology), node_(node), hierarchy_(hierarchy), fabric_(fabric) {}

  // Whether `call` needs this path: a floating-point sum, average or
  // product (minimum, maximum and integer arithmetic come out the same in
  // any order), except where the node's own path already combines every
  // rank in rank order in the call's type (one node, float32 and float64).
  bool takes(const Call& call) const;
  void run(const Call& call);

 private:
  void agree(const Call& call);
  // Between nodes, every rank's whole send buffer fits the leaders' frames.
  bool fitsFrames(const Call& call) const;
  // Every rank's send buffer to every rank, in the step that agrees on the
  // call; each combines its part of the result.
  void gatherAndCombine(const Call& call);
  // The all-reduce of `call` into `result`, `result` may be the call's send buffer.
  void allReduceInto(const Call& call, void* result);
  void reduceScatter(const Call& call);
  // Every rank's part of our slice, in rank order: `slices` (in elements
  // of the send buffer, one per rank) says which part goes where.
  std::vector<const void*> exchangeParts(const Call& call, const std::vector<Slice>& slices);
  // `parts`, `count` elements each, combined in rank order into `into`.
  void combineParts(const Call& call, const std::vector<const void*>& parts, void* into, size_t count);
  // The result of an all-reduce or a reduce on this rank.
  void* resultOf(const Call& call);

  const Topology& topology_;
  NodeCollectives& node_;
  Hierarchy* hierarchy_;
  FabricTransport* fabric_;
  std::vector<char> parts_;        // one part of our slice per rank of another node
  std::vector<char> nodeBuffers_;  // the send buffers of our node's ranks
  std::vector<char> owned_;  // our slice of an all-reduce's result
  std::vector<char> gathered_;  // an all-reduce's slices, where the ranks do not divide its count
  std::vector<char> unkept_;    // a reduce's result, on ranks other than its root
};

}  // namespace mojoccl
