// The collectives past kFramedMaxBytes between nodes, through the nodes'
// leaders: each node reduces or gathers to its leader in shared memory,
// the leaders run the collective among themselves, and each leader hands
// the result to its node.
#include <cstring>

#include "base/datatypes.h"
#include "base/reduce.h"
#include "hierarchy/hierarchy.h"

namespace mojoccl {

void Hierarchy::allReduceInto(const Call& call, void* result) {
  if (acrossNodesType(call.datatype) != call.datatype) {
    if (wide_.size() < call.count) wide_.resize(call.count);
    convert(wide_.data(), ncclFloat32, call.send, call.datatype, call.count);
    Call wide = call;
    wide.datatype = ncclFloat32;
    wide.send = wide.recv = wide_.data();
    allReduceInto(wide, wide_.data());
    convert(result, call.datatype, wide_.data(), ncclFloat32, call.count);
    return;
  }
  if (railsCarry(call.count * datatypeSize(call.datatype) / topology_.localRanks()))
    return allReduceOnRails(call, result);
  allReduceThroughLeaders(call, result);
}

// AVG sums everywhere and divides once, by the whole rank count.
void Hierarchy::allReduceThroughLeaders(const Call& call, void* result) {
  reduceToLeader(call, call.send, result, call.count);
  if (topology_.isLeader()) allReduceBetweenNodes(leaders(call), result, call.count, call);
  broadcastFromLeader(call, result, call.count);
}

void Hierarchy::broadcastThroughLeaders(const Call& call) {
  const int rootNode = topology_.nodeOfRank[call.root];
  if (topology_.node == rootNode) node_.broadcast(call);
  if (topology_.isLeader())
    broadcastBetweenNodes(leaders(call), call.recv, call.count * datatypeSize(call.datatype), rootNode);
  if (topology_.node != rootNode) broadcastFromLeader(call, call.recv, call.count);
}

// Each node's blocks gather at its leader, in node order; the leaders swap
// them, put them in rank order, and broadcast. Where each node's ranks are
// consecutive (as launchers place them), node order is rank order: they
// gather in the result itself, with no copy to reorder them.
void Hierarchy::allGatherThroughLeaders(const Call& call) {
  const size_t block = call.count * datatypeSize(call.datatype);
  const auto& nodes = topology_.nodes;
  const bool inPlace = topology_.nodesAreRankRanges();
  char* gathered = inPlace ? static_cast<char*>(call.recv) : scratch(block * topology_.size);
  std::vector<Slice> nodeBlocks;  // in bytes of `gathered`, in node order
  for (const auto& node : nodes) {
    const size_t begin = nodeBlocks.empty() ? 0 : nodeBlocks.back().end;
    nodeBlocks.push_back({begin, begin + node.size() * block});
  }
  Call inNode = call;
  inNode.recv = gathered + nodeBlocks[topology_.node].begin;
  node_.allGather(inNode);
  if (topology_.isLeader()) {
    const auto allGather = network_.direct(topology_) ? networkAllGather : networkAllGatherRing;
    allGather(leaders(call), gathered, nodeBlocks);
    for (size_t node = 0; node < nodes.size() && !inPlace; ++node)
      for (size_t i = 0; i < nodes[node].size(); ++i)
        std::memcpy(static_cast<char*>(call.recv) + nodes[node][i] * block,
                    gathered + nodeBlocks[node].begin + i * block, block);
  }
  broadcastFromLeader(call, call.recv, call.count * topology_.size);
}

// Where the nodes are ranges of ranks, the leaders reduce-scatter the node
// sums (round the ring, or by recursive halving where the cost model
// says), each ending with its node's blocks: half the traffic of the whole
// all-reduce. Then each leader hands its node those blocks. Elsewhere (and
// for half types), the whole all-reduce, of which this rank keeps its block.
void Hierarchy::reduceScatterThroughLeaders(const Call& call) {
  const size_t size = datatypeSize(call.datatype);
  const size_t whole = call.count * topology_.size;
  char* result = scratch(whole * size);
  if (acrossNodesType(call.datatype) != call.datatype || !topology_.nodesAreRankRanges()) {
    Call all = call;
    all.kind = CallKind::AllReduce;
    all.count = whole;
    allReduceInto(all, result);
    std::memcpy(call.recv, result + topology_.rank * call.count * size, call.count * size);
    return;
  }
  const ncclRedOp_t op = call.op == ncclAvg ? ncclSum : call.op;
  const bool ring =
      network_.algorithms.reduceScatter(static_cast<int>(topology_.nodes.size()), whole * size) == NetworkAlgorithm::Ring;
  // Round the ring, a node of one rank reads its operands from the caller's
  // buffer (its node sum would be a copy of it) and folds its block
  // straight into the caller's result.
  const bool fromCaller = ring && topology_.localRanks() == 1;
  if (!fromCaller) reduceToLeader(call, call.send, result, whole);
  std::vector<Slice> byNode;
  for (const auto& node : topology_.nodes) byNode.push_back({node.front() * call.count, (node.back() + 1) * call.count});
  const Slice ours = byNode[topology_.node];
  char* nodeBlocks = fromCaller ? static_cast<char*>(call.recv) : bytesAt(result, ours.begin, size);
  if (topology_.isLeader()) {
    const NetworkGroup group = leaders(call);
    if (ring)
      networkReduceScatter(group, {fromCaller ? call.send : result, result, nodeBlocks}, byNode, 0, call.datatype, op,
                           nullptr);
    else
      networkReduceScatterHalving(group, result, byNode, call.datatype, op);
    if (call.op == ncclAvg) {
      const void* sum[1] = {nodeBlocks};
      mojoccl::reduce(nodeBlocks, sum, 1, ours.end - ours.begin, call.datatype, ncclAvg, topology_.size);
    }
  }
  broadcastFromLeader(call, nodeBlocks, ours.end - ours.begin);
  if (!fromCaller) std::memcpy(call.recv, bytesAt(result, topology_.rank * call.count, size), call.count * size);
}

}  // namespace mojoccl
