// The large collectives on rails, where every node has the same number of
// ranks: local rank i of every node carries its share of the node's bytes
// between nodes, on its own endpoint (and NIC), where through the leaders
// the first rank of each node would carry them all.
#include <cstring>

#include "base/datatypes.h"
#include "base/reduce.h"
#include "hierarchy/hierarchy.h"

namespace mojoccl {

// Local rank i reduces slice i of its node's buffers (a reduce-scatter in
// shared memory), all-reduces it with local rank i of every other node,
// and the node's ranks gather the slices. Slices are equal; where the node's
// ranks do not divide the count, the call runs in a padded copy.
void Hierarchy::allReduceOnRails(const Call& call, void* result) {
  const size_t size = datatypeSize(call.datatype);
  const size_t perNode = topology_.localRanks();
  const size_t slice = (call.count + perNode - 1) / perNode;
  const bool even = slice * perNode == call.count;
  char* whole = static_cast<char*>(result);
  if (!even) {
    railBuffer_.resize(slice * perNode * size);
    whole = railBuffer_.data();
    std::memcpy(whole, call.send, call.count * size);
    std::memset(whole + call.count * size, 0, (slice * perNode - call.count) * size);
  }
  char* mine = whole + topology_.localIndex * slice * size;
  node_.reduceScatter({CallKind::ReduceScatter, even ? call.send : whole, mine, slice, call.datatype,
                       call.op == ncclAvg ? ncclSum : call.op, 0, call.sequence});
  allReduceBetweenNodes(ourRail(call), mine, slice, call);
  node_.allGather({CallKind::AllGather, mine, whole, slice, call.datatype, call.op, 0, call.sequence});
  if (!even) std::memcpy(result, whole, call.count * size);
}

// The root's node broadcasts within itself; local rank i of every node
// then carries slice i of the data down its rail (as the leaders' would,
// on its own endpoint), and each other node's ranks gather the slices
// their rails brought. Slices are equal bytes; where the node's ranks do
// not divide them, the call runs in a padded copy.
void Hierarchy::broadcastOnRails(const Call& call) {
  const size_t bytes = call.count * datatypeSize(call.datatype);
  const size_t perNode = topology_.localRanks();
  const size_t slice = (bytes + perNode - 1) / perNode;
  const bool even = slice * perNode == bytes;
  const int rootNode = topology_.nodeOfRank[call.root];
  const bool rootHere = topology_.node == rootNode;
  if (!even) railBuffer_.resize(slice * perNode);
  char* whole = even ? static_cast<char*>(call.recv) : railBuffer_.data();
  if (rootHere) {
    node_.broadcast(call);
    if (!even) std::memcpy(whole, call.recv, bytes);
  }
  char* mine = whole + topology_.localIndex * slice;
  broadcastBetweenNodes(ourRail(call), mine, slice, rootNode);
  if (rootHere) return;
  node_.allGather({CallKind::AllGather, mine, whole, slice, ncclInt8, call.op, call.root, call.sequence});
  if (!even) std::memcpy(call.recv, whole, bytes);
}

// Local rank i of every node swaps its block with the others of its rail,
// straight into the result; then each node's ranks gather, node by node,
// the blocks their rails brought.
void Hierarchy::allGatherOnRails(const Call& call) {
  const size_t block = call.count * datatypeSize(call.datatype);
  char* result = static_cast<char*>(call.recv);
  const int index = topology_.localIndex;
  if (call.send != result + topology_.rank * block) std::memcpy(result + topology_.rank * block, call.send, block);
  std::vector<Slice> railBlocks;  // in bytes of the result, in node order
  for (const auto& node : topology_.nodes) railBlocks.push_back({node[index] * block, (node[index] + 1) * block});
  const auto allGather = network_.direct(topology_) ? networkAllGather : networkAllGatherRing;
  allGather(ourRail(call), result, railBlocks);
  for (const auto& node : topology_.nodes) {
    Call inNode = call;
    inNode.send = result + node[index] * block;
    inNode.recv = result + node.front() * block;
    node_.allGather(inNode);
  }
}

// Each node's ranks reduce-scatter, node by node, so that local rank i
// holds its node's sum of block i of every node; local rank i of every
// node then reduce-scatters those sums on its rail (round the ring or by
// recursive halving, as the cost model says), each ending with its block.
void Hierarchy::reduceScatterOnRails(const Call& call) {
  const size_t size = datatypeSize(call.datatype);
  const size_t nodes = topology_.nodes.size();
  const ncclRedOp_t op = call.op == ncclAvg ? ncclSum : call.op;
  char* sums = scratch(call.count * nodes * size);  // our rail's blocks, one per node, in node order
  std::vector<Slice> byNode;
  for (size_t node = 0; node < nodes; ++node) {
    Call inNode = call;
    inNode.send = bytesAt(call.send, topology_.nodes[node].front() * call.count, size);
    inNode.recv = bytesAt(sums, node * call.count, size);
    inNode.op = op;
    node_.reduceScatter(inNode);
    byNode.push_back({node * call.count, (node + 1) * call.count});
  }
  const bool ring =
      network_.algorithms.reduceScatter(static_cast<int>(nodes), call.count * nodes * size) == NetworkAlgorithm::Ring;
  const NetworkGroup group = ourRail(call);
  if (ring)
    networkReduceScatter(group, {sums, sums, call.recv}, byNode, 0, call.datatype, op, nullptr);
  else
    networkReduceScatterHalving(group, sums, byNode, call.datatype, op);
  if (!ring) std::memcpy(call.recv, bytesAt(sums, topology_.node * call.count, size), call.count * size);
  if (call.op == ncclAvg) {
    const void* sum[1] = {call.recv};
    mojoccl::reduce(call.recv, sum, 1, call.count, call.datatype, ncclAvg, topology_.size);
  }
}

}  // namespace mojoccl
