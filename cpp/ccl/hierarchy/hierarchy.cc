#include "hierarchy/hierarchy.h"

#include "base/datatypes.h"
#include "base/reduce.h"

namespace mojoccl {
namespace {

// A rail's slice of an all-reduce (a rank's block of an all-gather or a
// reduce-scatter) at least this large: nodes of many ranks (a CPU rank per
// core) would otherwise cut a mid-size call into as many streams of small
// messages, each paying every step's latency.
constexpr size_t kMinRailSliceBytes = 64 << 10;

}  // namespace

Hierarchy::Hierarchy(const Topology& topology, NodeCollectives& node, BetweenNodes network)
    : topology_(topology),
      node_(node),
      network_(std::move(network)),
      frames_(topology_, node_, network_),
      allToAll_(topology_, node_, frames_, network_) {}

void Hierarchy::allReduce(const Call& call) {
  if (call.count * datatypeSize(call.datatype) <= kFramedMaxBytes) return allReduceInFrames(call);
  frames_.agree(call);
  allReduceInto(call, call.recv);
}

void Hierarchy::broadcast(const Call& call) {
  if (call.count * datatypeSize(call.datatype) <= kFramedMaxBytes) return broadcastInFrames(call);
  frames_.agree(call);
  const size_t bytes = call.count * datatypeSize(call.datatype);
  if (railsCarry(bytes / topology_.localRanks())) return broadcastOnRails(call);
  broadcastThroughLeaders(call);
}

void Hierarchy::allGather(const Call& call) {
  const size_t block = call.count * datatypeSize(call.datatype);
  if (block * topology_.size <= kFramedMaxBytes) return allGatherInFrames(call, call);
  frames_.agree(call);
  if (topology_.nodesAreRankRanges() && railsCarry(block)) return allGatherOnRails(call);
  allGatherThroughLeaders(call);
}

void Hierarchy::reduceScatter(const Call& call) {
  const size_t block = call.count * datatypeSize(call.datatype);
  if (block * topology_.size <= kFramedMaxBytes) return reduceScatterInFrames(call);
  frames_.agree(call);
  if (acrossNodesType(call.datatype) == call.datatype && topology_.nodesAreRankRanges() && railsCarry(block))
    return reduceScatterOnRails(call);
  reduceScatterThroughLeaders(call);
}

// The whole all-reduce, kept by the root.
void Hierarchy::reduce(const Call& call) {
  frames_.agree(call);
  Call whole = call;
  whole.kind = CallKind::AllReduce;
  const bool root = topology_.rank == call.root;
  allReduceInto(whole, root ? call.recv : scratch(call.count * datatypeSize(call.datatype)));
}

bool Hierarchy::allToAll(const std::vector<Transfer>& withinNode, const std::vector<Transfer>& remote,
                         const Call& call, const std::string& what) {
  if (allToAll_.takesFrames()) {
    allToAll_.run(withinNode, remote, call, what);
    return true;
  }
  frames_.agree(call);
  return false;
}

bool Hierarchy::railsCarry(size_t sliceBytes) const { return network_.rails && sliceBytes >= kMinRailSliceBytes; }

void Hierarchy::reduceToLeader(const Call& call, const void* send, void* sums, size_t count) {
  node_.reduce({CallKind::Reduce, send, sums, count, call.datatype, call.op == ncclAvg ? ncclSum : call.op,
                topology_.leader(), call.sequence});
}

void Hierarchy::broadcastFromLeader(const Call& call, void* data, size_t count) {
  node_.broadcast({CallKind::Broadcast, data, data, count, call.datatype, call.op, topology_.leader(), call.sequence});
}

void Hierarchy::allReduceBetweenNodes(const NetworkGroup& group, void* data, size_t count, const Call& call) {
  const ncclRedOp_t op = call.op == ncclAvg ? ncclSum : call.op;
  switch (network_.algorithms.allReduce(group.size(), count * datatypeSize(call.datatype))) {
    case NetworkAlgorithm::Ring: networkAllReduce(group, data, count, call.datatype, op); break;
    case NetworkAlgorithm::RecursiveDoubling:
      networkAllReduceRecursiveDoubling(group, data, count, call.datatype, op);
      break;
    case NetworkAlgorithm::Rabenseifner: networkAllReduceRabenseifner(group, data, count, call.datatype, op); break;
    case NetworkAlgorithm::Tree: networkAllReduceTree(group, data, count, call.datatype, op); break;
  }
  if (call.op == ncclAvg) {
    const void* sum[1] = {data};
    mojoccl::reduce(data, sum, 1, count, call.datatype, ncclAvg, topology_.size);
  }
}

void Hierarchy::broadcastBetweenNodes(const NetworkGroup& group, void* data, size_t bytes, int rootNode) {
  networkBroadcast(group, data, bytes, rootNode, network_.algorithms.broadcast(group.size(), bytes));
}

char* Hierarchy::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

}  // namespace mojoccl
