// The collectives up to kFramedMaxBytes between nodes, in the leaders'
// frames: one exchange between nodes carries the agreement and the data.
#include <cstring>

#include "base/datatypes.h"
#include "base/error.h"
#include "base/reduce.h"
#include "hierarchy/hierarchy.h"

namespace mojoccl {
namespace {

// `count` elements of a result in acrossNodesType into `to`, as `type`.
void keepResult(void* to, const char* result, size_t count, ncclDataType_t type) {
  if (acrossNodesType(type) != type)
    convert(to, type, result, ncclFloat32, count);
  else
    std::memcpy(to, result, count * datatypeSize(type));
}

}  // namespace

// Each leader sends its node's report with the node's blocks behind it,
// puts every node's blocks in rank order, and hands its node the verdict
// and the result in one broadcast. The ranks agree on `asked`: `call`
// itself, or the call an all-gather serves.
void Hierarchy::allGatherInFrames(const Call& asked, const Call& call) {
  const size_t block = call.count * datatypeSize(call.datatype);
  const auto& nodes = topology_.nodes;
  auto blocks = [&](size_t node) { return payloadOf(frames_.frame(node)); };
  if (frames_.report(asked)) {
    Call inNode = call;
    inNode.recv = blocks(topology_.node);
    node_.allGather(inNode);
  }
  const size_t handed = kVerdictBytes + (alone() ? 0 : block * topology_.size);
  char* handBack = scratch(handed);  // the verdict, then the result
  char* result = alone() ? static_cast<char*>(call.recv) : handBack + kVerdictBytes;
  if (topology_.isLeader()) {
    copyText(handBack, frames_.exchange(asked, topology_.localRanks() * block));
    if (handBack[0] == '\0')
      for (size_t node = 0; node < nodes.size(); ++node)
        for (size_t i = 0; i < nodes[node].size(); ++i)
          std::memcpy(result + nodes[node][i] * block, blocks(node) + i * block, block);
  }
  frames_.handOut(asked, handBack, handed);
  if (!alone()) std::memcpy(call.recv, result, block * topology_.size);
}

// The root's node broadcasts within itself, then its leader's frame
// carries the data behind its report; every other leader hands its node
// the verdict and the data in one broadcast.
void Hierarchy::broadcastInFrames(const Call& call) {
  const size_t bytes = call.count * datatypeSize(call.datatype);
  const int rootNode = topology_.nodeOfRank[call.root];
  const bool rootHere = topology_.node == rootNode;
  const bool agreed = frames_.report(call);
  if (agreed && rootHere) node_.broadcast(call);
  const bool handsData = !rootHere && !alone();
  const size_t handed = kVerdictBytes + (handsData ? bytes : 0);
  char* handBack = scratch(handed);  // the verdict, then the data
  void* data = handsData ? handBack + kVerdictBytes : call.recv;
  if (topology_.isLeader()) {
    if (agreed && rootHere) std::memcpy(payloadOf(frames_.frame(topology_.node)), call.recv, bytes);
    copyText(handBack, frames_.exchange(call, rootHere ? bytes : 0));
    if (!rootHere && handBack[0] == '\0') std::memcpy(data, payloadOf(frames_.frame(rootNode)), bytes);
  }
  frames_.handOut(call, handBack, handed);
  if (handsData) std::memcpy(call.recv, data, bytes);
}

// Each leader sends its node's report together with the node's partial
// result, and every leader combines all partials in node order (so all get
// the same bits). The leader hands its node the verdict and the result in
// one broadcast.
void Hierarchy::allReduceInFrames(const Call& call) {
  const bool sameType = acrossNodesType(call.datatype) == call.datatype;
  const char* result = allReduceInFramesResult(call, call, sameType ? call.recv : nullptr);
  if (result != call.recv) keepResult(call.recv, result, call.count, call.datatype);
}

// The small all-reduce of the whole buffer, of which each rank keeps its
// block: one exchange between nodes, where the reduce-scatter ring takes
// an agreement and then its steps.
void Hierarchy::reduceScatterInFrames(const Call& call) {
  if (topology_.nodesAreRankRanges() && network_.direct(topology_)) return reduceScatterInFramesByNodes(call);
  Call whole = call;
  whole.kind = CallKind::AllReduce;
  whole.count = call.count * topology_.size;
  const char* result = allReduceInFramesResult(call, whole);
  keepResult(call.recv, result + topology_.rank * call.count * datatypeSize(acrossNodesType(call.datatype)),
             call.count, call.datatype);
}

// Between nodes of consecutive ranks that exchange frames directly, each
// leader sends every other leader, behind its node's report, only that
// node's blocks of its own node's partial sums, and sums the partials of
// its node's blocks in node order (the small all-reduce's order: the same
// bits). A leader so receives its node's share of the buffer from each
// other leader, not the whole.
void Hierarchy::reduceScatterInFramesByNodes(const Call& call) {
  const ncclDataType_t type = acrossNodesType(call.datatype);
  const size_t size = datatypeSize(type);
  const auto& nodes = topology_.nodes;
  const size_t count = call.count * topology_.size;
  auto blocksOf = [&](size_t node) {  // in elements of the whole buffer
    return Slice{nodes[node].front() * call.count, (nodes[node].back() + 1) * call.count};
  };
  const Slice ours = blocksOf(topology_.node);
  const char* partial = static_cast<const char*>(call.send);  // the node's sums of every block
  const bool agreed = frames_.report(call);
  if (agreed && (topology_.localRanks() > 1 || type != call.datatype)) {
    if (nodeSums_.size() < count * size) nodeSums_.resize(count * size);
    Call whole = call;
    whole.count = count;
    nodeSumsAtLeader(whole, nodeSums_.data());
    partial = nodeSums_.data();
  }
  const size_t ourBytes = (ours.end - ours.begin) * size;
  char* handBack = scratch(kVerdictBytes + ourBytes);  // the verdict, then the node's blocks
  if (topology_.isLeader()) {
    copyText(handBack, frames_.sendOwn(call, [&](size_t node, char* payload) {
      const Slice theirs = blocksOf(node);
      std::memcpy(payload, partial + theirs.begin * size, (theirs.end - theirs.begin) * size);
      return (theirs.end - theirs.begin) * size;
    }));
    if (handBack[0] == '\0') {
      std::vector<const void*> sources;
      for (size_t node = 0; node < nodes.size(); ++node)
        sources.push_back(static_cast<int>(node) == topology_.node ? partial + ours.begin * size
                                                                   : payloadOf(frames_.frame(node)));
      mojoccl::reduce(handBack + kVerdictBytes, sources.data(), static_cast<int>(nodes.size()),
                      ours.end - ours.begin, type, call.op, topology_.size);
    }
  }
  frames_.handOut(call, handBack, kVerdictBytes + ourBytes);
  const size_t mine = (topology_.rank - topology_.ours().front()) * call.count * size;
  keepResult(call.recv, handBack + kVerdictBytes + mine, call.count, call.datatype);
}

void Hierarchy::nodeSumsAtLeader(const Call& call, char* sums) {
  Call wide = call;
  wide.datatype = acrossNodesType(call.datatype);
  const void* send = call.send;
  if (wide.datatype != call.datatype) {
    convert(sums, wide.datatype, call.send, call.datatype, call.count);
    send = sums;
  }
  reduceToLeader(wide, send, sums, call.count);
}

const char* Hierarchy::allReduceInFramesResult(const Call& asked, const Call& call, void* resultHere) {
  const ncclDataType_t type = acrossNodesType(call.datatype);
  const size_t bytes = call.count * datatypeSize(type);
  auto partial = [&](size_t node) { return payloadOf(frames_.frame(node)); };
  if (frames_.report(asked)) nodeSumsAtLeader(call, partial(topology_.node));
  const bool handsData = resultHere == nullptr || !alone();
  const size_t handed = kVerdictBytes + (handsData ? bytes : 0);
  char* handBack = scratch(handed);  // the verdict, then the result
  char* result = handsData ? handBack + kVerdictBytes : static_cast<char*>(resultHere);
  if (topology_.isLeader()) {
    copyText(handBack, frames_.exchange(asked, bytes));
    // AVG: the partial sums, summed and divided once by the rank count.
    if (handBack[0] == '\0') {
      std::vector<const void*> sources;
      for (size_t node = 0; node < topology_.nodes.size(); ++node) sources.push_back(partial(node));
      mojoccl::reduce(result, sources.data(), static_cast<int>(sources.size()), call.count, type, call.op,
                      topology_.size);
    }
  }
  frames_.handOut(asked, handBack, handed);
  return result;
}

}  // namespace mojoccl
