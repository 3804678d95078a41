// The communicator's collectives across nodes: each node's ranks meet in
// shared memory, the nodes' leaders (or, on rails, local rank i of every
// node) over libfabric (algorithms/network.h). comm.cc sets the
// communicator up and runs the collectives within one node.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "algorithms/network.h"
#include "algorithms/step.h"
#include "comm.h"
#include "datatypes.h"
#include "error.h"
#include "reduce.h"
#include "node_frames.h"

namespace mojoccl {
namespace {

// A rail's slice of an all-reduce (a rank's block of an all-gather or a
// reduce-scatter) at least this large: nodes of many ranks (a CPU rank per
// core) would otherwise cut a mid-size call into as many streams of small
// messages, each paying every step's latency.
constexpr size_t kMinRailSliceBytes = 64 << 10;

}  // namespace

char* Comm::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

NetworkGroup Comm::rail(const Call& call, int index) {
  std::vector<int> ranks;
  for (const auto& node : nodes_) ranks.push_back(node[index]);
  // The leaders' group (rail 0) exchanges its frames on their sockets, where they have them.
  return {*fabric_, receiveRoom_, ranks, node_, call.describe() + " across nodes",
          index == 0 ? leaderSockets_.get() : nullptr};
}

namespace {
// Half types cross nodes in float32 and are rounded once, at the end, as on
// one node: the result does not depend on how ranks are placed.
ncclDataType_t acrossNodesType(ncclDataType_t type) {
  return type == ncclFloat16 || type == ncclBfloat16 ? ncclFloat32 : type;
}
}  // namespace

std::string Comm::nodeDisagreement(const Call& call) {
  Step step(*shm_, rounds_, call);
  step.publishAndAwait();
  return step.disagreement();
}

// The first disagreement among the nodes' reports (`stride` bytes apart),
// or "": every leader finds the same.
std::string Comm::disagreementAcrossNodes(const char* reports, size_t stride) const {
  const auto* first = reinterpret_cast<const NodeReport*>(reports);
  for (size_t node = 0; node < nodes_.size(); ++node) {
    const auto* report = reinterpret_cast<const NodeReport*>(reports + node * stride);
    if (report->problemBytes > 0) return std::string(report->problem(), report->problemBytes);
    if (!report->signature.sameCollective(first->signature))
      return mismatchText(nodes_[node][0], report->signature, nodes_[0][0], first->signature);
  }
  return "";
}

// Before any data moves, every rank learns whether all ranks issued the same
// collective: each node compares its ranks' calls, the leaders compare the
// nodes', and each leader hands the verdict to its node. A mismatch then
// raises the same MismatchError on every rank, and the communicator stays
// usable, as within one node.
void Comm::agreeAcrossNodes(const Call& call) {
  reportInFrame(call);
  char verdict[kVerdictBytes] = {};
  if (isLeader()) copyText(verdict, exchangeNodeFrames(call, 0));
  localBroadcast({CallKind::Broadcast, verdict, verdict, kVerdictBytes, ncclInt8, ncclSum, leader(),
                  call.sequence});
  if (verdict[0] != '\0') throw MismatchError(verdict);
}

bool Comm::reportInFrame(const Call& call) { return reportInFrame(call, nodeDisagreement(call)); }

bool Comm::reportInFrame(const Call& call, const std::string& nodeProblem) {
  NodeReport& mine = *reinterpret_cast<NodeReport*>(frame(node_));
  mine.signature = CallSignature::of(call);
  const std::string problem = nodeProblem.substr(0, kVerdictBytes - 1);
  mine.problemBytes = problem.size();
  std::memcpy(payloadOf(frame(node_)), problem.data(), problem.size());
  return problem.empty();
}

char* Comm::frame(size_t node) {
  if (frames_.size() < nodes_.size() * kFrameRoom) frames_.resize(nodes_.size() * kFrameRoom);
  return frames_.data() + node * kFrameRoom;
}

// Each leader's frame (frame(node): its node's report, then its
// disagreement or `payloadBytes` of data) to every other leader, directly
// up to MOJOCCL_NET_DIRECT_NODES nodes and by Bruck's all-gather past
// them; returns the first disagreement among the reports, or "". A leader
// in a small all-reduce and one in any other call exchange frames alike,
// and so meet.
std::string Comm::exchangeNodeFrames(const Call& call, size_t payloadBytes) {
  std::vector<char*> frames;
  for (size_t node = 0; node < nodes_.size(); ++node) frames.push_back(frame(node));
  std::vector<size_t> received;
  const auto exchange = static_cast<int>(nodes_.size()) <= directNodes_ ? networkExchangeFrames
                                                                              : networkGatherFrames;
  const auto& mine = *reinterpret_cast<const NodeReport*>(frame(node_));
  exchange(leaders(call), frames, sizeof(NodeReport) + (mine.problemBytes > 0 ? mine.problemBytes : payloadBytes),
           kFrameRoom, received);
  return disagreementAcrossNodes(frames[0], kFrameRoom);
}

// To every other leader a frame of its own: our node's report, then, where
// the node found no disagreement, what `fill(node, payload)` writes for that
// leader's node (returning its length); frame(node) receives theirs.
// Returns the first disagreement among the nodes' reports, or "".
std::string Comm::sendOwnFrames(const Call& call, const std::function<size_t(size_t node, char* payload)>& fill) {
  const size_t nodes = nodes_.size();
  const auto& report = *reinterpret_cast<const NodeReport*>(frame(node_));
  const size_t reportBytes = sizeof(NodeReport) + report.problemBytes;
  if (outgoingFrames_.size() < nodes * kFrameRoom) outgoingFrames_.resize(nodes * kFrameRoom);
  std::vector<const char*> outgoing;
  std::vector<size_t> outgoingBytes;
  std::vector<char*> incoming;
  for (size_t node = 0; node < nodes; ++node) {
    char* out = outgoingFrames_.data() + node * kFrameRoom;
    std::memcpy(out, frame(node_), reportBytes);
    outgoing.push_back(out);
    outgoingBytes.push_back(reportBytes + (report.problemBytes == 0 ? fill(node, payloadOf(out)) : 0));
    incoming.push_back(frame(node));
  }
  std::vector<size_t> received;
  networkSendFrames(leaders(call), outgoing, outgoingBytes, incoming, kFrameRoom, received);
  return disagreementAcrossNodes(frame(0), kFrameRoom);
}

// A small all-gather (up to 64 KiB in all)
// takes one exchange between nodes: each leader sends its node's report
// with the node's blocks behind it, puts every node's blocks in rank order,
// and hands its node the verdict and the result in one broadcast.
void Comm::smallAllGatherAcrossNodes(const Call& call) {
  const size_t block = call.count * datatypeSize(call.datatype);
  auto blocks = [&](size_t node) { return payloadOf(frame(node)); };
  if (reportInFrame(call)) {
    Call inNode = call;
    inNode.recv = blocks(node_);
    localAllGather(inNode);
  }
  char* handBack = scratch(kVerdictBytes + block * size_);  // the verdict, then the result
  if (isLeader()) {
    copyText(handBack, exchangeNodeFrames(call, nodes_[node_].size() * block));
    if (handBack[0] == '\0')
      for (size_t node = 0; node < nodes_.size(); ++node)
        for (size_t i = 0; i < nodes_[node].size(); ++i)
          std::memcpy(handBack + kVerdictBytes + nodes_[node][i] * block, blocks(node) + i * block, block);
  }
  localBroadcast({CallKind::Broadcast, handBack, handBack, kVerdictBytes + block * size_, ncclInt8, ncclSum,
                  leader(), call.sequence});
  if (handBack[0] != '\0') throw MismatchError(handBack);
  std::memcpy(call.recv, handBack + kVerdictBytes, block * size_);
}

// A small broadcast (up to 64 KiB) takes one exchange between nodes: the
// root's node broadcasts within itself, then its leader's frame carries the
// data behind its report; every other leader hands its node the verdict and
// the data in one broadcast.
void Comm::smallBroadcastAcrossNodes(const Call& call) {
  const size_t bytes = call.count * datatypeSize(call.datatype);
  const int rootNode = nodeOfRank_[call.root];
  const bool rootHere = node_ == rootNode;
  const bool agreed = reportInFrame(call);
  if (agreed && rootHere) localBroadcast(call);
  const size_t handed = kVerdictBytes + (rootHere ? 0 : bytes);
  char* handBack = scratch(handed);  // the verdict, then the data
  if (isLeader()) {
    if (agreed && rootHere) std::memcpy(payloadOf(frame(node_)), call.recv, bytes);
    copyText(handBack, exchangeNodeFrames(call, rootHere ? bytes : 0));
    if (!rootHere && handBack[0] == '\0') std::memcpy(handBack + kVerdictBytes, payloadOf(frame(rootNode)), bytes);
  }
  localBroadcast({CallKind::Broadcast, handBack, handBack, handed, ncclInt8, ncclSum, leader(), call.sequence});
  if (handBack[0] != '\0') throw MismatchError(handBack);
  if (!rootHere) std::memcpy(call.recv, handBack + kVerdictBytes, bytes);
}

// A small all-reduce takes one exchange between nodes: each leader sends its
// node's report together with the node's partial result, and every leader
// combines all partials in node order (so all get the same bits). The
// leader hands its node the verdict and the result in one broadcast.
void Comm::smallAllReduceAcrossNodes(const Call& call) {
  keepResult(call.recv, smallAllReduceResult(call, call), call.count, call.datatype);
}

// A small reduce-scatter is the small all-reduce of the whole buffer, of
// which each rank keeps its block: one exchange between nodes, where the
// reduce-scatter ring takes an agreement and then its steps.
void Comm::smallReduceScatterAcrossNodes(const Call& call) {
  if (nodesAreRankRanges() && static_cast<int>(nodes_.size()) <= directNodes_) return smallReduceScatterByNodes(call);
  Call whole = call;
  whole.kind = CallKind::AllReduce;
  whole.count = call.count * size_;
  const char* result = smallAllReduceResult(call, whole);
  keepResult(call.recv, result + rank_ * call.count * datatypeSize(acrossNodesType(call.datatype)), call.count,
             call.datatype);
}

// Between nodes of consecutive ranks that exchange frames directly, each
// leader sends every other leader, behind its node's report, only that
// node's blocks of its own node's partial sums, and sums the partials of
// its node's blocks in node order (the small all-reduce's order: the same
// bits). A leader so receives its node's share of the buffer from each
// other leader, not the whole.
void Comm::smallReduceScatterByNodes(const Call& call) {
  const ncclDataType_t type = acrossNodesType(call.datatype);
  const size_t size = datatypeSize(type);
  const size_t nodes = nodes_.size(), count = call.count * size_;
  auto blocksOf = [&](size_t node) {  // in elements of the whole buffer
    return Slice{nodes_[node].front() * call.count, (nodes_[node].back() + 1) * call.count};
  };
  const Slice ours = blocksOf(node_);
  const char* partial = static_cast<const char*>(call.send);  // the node's sums of every block
  const bool agreed = reportInFrame(call);
  if (agreed && (nodes_[node_].size() > 1 || type != call.datatype)) {
    if (nodeSums_.size() < count * size) nodeSums_.resize(count * size);
    Call whole = call;
    whole.count = count;
    reduceToLeader(whole, nodeSums_.data());
    partial = nodeSums_.data();
  }
  const size_t ourBytes = (ours.end - ours.begin) * size;
  char* handBack = scratch(kVerdictBytes + ourBytes);  // the verdict, then the node's blocks
  if (isLeader()) {
    copyText(handBack, sendOwnFrames(call, [&](size_t node, char* payload) {
      const Slice theirs = blocksOf(node);
      std::memcpy(payload, partial + theirs.begin * size, (theirs.end - theirs.begin) * size);
      return (theirs.end - theirs.begin) * size;
    }));
    if (handBack[0] == '\0') {
      std::vector<const void*> sources;
      for (size_t node = 0; node < nodes; ++node)
        sources.push_back(static_cast<int>(node) == node_ ? partial + ours.begin * size : payloadOf(frame(node)));
      mojoccl::reduce(handBack + kVerdictBytes, sources.data(), static_cast<int>(nodes), ours.end - ours.begin, type,
                      call.op, size_);
    }
  }
  localBroadcast({CallKind::Broadcast, handBack, handBack, kVerdictBytes + ourBytes, ncclInt8, ncclSum, leader(),
                  call.sequence});
  if (handBack[0] != '\0') throw MismatchError(handBack);
  const size_t mine = (rank_ - nodes_[node_].front()) * call.count * size;
  keepResult(call.recv, handBack + kVerdictBytes + mine, call.count, call.datatype);
}

void Comm::reduceToLeader(const Call& call, char* sums) {
  const ncclDataType_t type = acrossNodesType(call.datatype);
  Call toLeader = call;
  toLeader.kind = CallKind::Reduce;
  toLeader.datatype = type;
  toLeader.op = call.op == ncclAvg ? ncclSum : call.op;
  toLeader.root = leader();
  if (type != call.datatype) {
    convert(sums, ncclFloat32, call.send, call.datatype, call.count);
    toLeader.send = sums;
  }
  toLeader.recv = sums;
  localReduce(toLeader);
}

const char* Comm::smallAllReduceResult(const Call& asked, const Call& call) {
  const ncclDataType_t type = acrossNodesType(call.datatype);
  const size_t bytes = call.count * datatypeSize(type);
  auto partial = [&](size_t node) { return payloadOf(frame(node)); };
  if (reportInFrame(asked)) reduceToLeader(call, partial(node_));
  char* handBack = scratch(kVerdictBytes + bytes);  // the verdict, then the result
  if (isLeader()) {
    copyText(handBack, exchangeNodeFrames(asked, bytes));
    // AVG: the partial sums, summed and divided once by the rank count.
    if (handBack[0] == '\0') {
      std::vector<const void*> sources;
      for (size_t node = 0; node < nodes_.size(); ++node) sources.push_back(partial(node));
      mojoccl::reduce(handBack + kVerdictBytes, sources.data(), static_cast<int>(sources.size()), call.count,
                      type, call.op, size_);
    }
  }
  localBroadcast({CallKind::Broadcast, handBack, handBack, kVerdictBytes + bytes, ncclInt8, ncclSum,
                  leader(), asked.sequence});
  if (handBack[0] != '\0') throw MismatchError(handBack);
  return handBack + kVerdictBytes;
}

void Comm::keepResult(void* to, const char* result, size_t count, ncclDataType_t type) {
  if (acrossNodesType(type) != type)
    convert(to, type, result, ncclFloat32, count);
  else
    std::memcpy(to, result, count * datatypeSize(type));
}

void Comm::allReduceAcrossNodes(const Call& call, void* result) {
  if (acrossNodesType(call.datatype) != call.datatype) {
    if (wide_.size() < call.count) wide_.resize(call.count);
    convert(wide_.data(), ncclFloat32, call.send, call.datatype, call.count);
    Call wide = call;
    wide.datatype = ncclFloat32;
    wide.send = wide.recv = wide_.data();
    allReduceAcrossNodes(wide, wide_.data());
    convert(result, call.datatype, wide_.data(), ncclFloat32, call.count);
    return;
  }
  if (onRails() && call.count * datatypeSize(call.datatype) / nodes_[node_].size() >= kMinRailSliceBytes)
    return allReduceOnRails(call, result);
  // AVG sums everywhere and divides once, by the whole rank count.
  Call toLeader = call;
  toLeader.kind = CallKind::Reduce;
  toLeader.recv = result;
  toLeader.op = call.op == ncclAvg ? ncclSum : call.op;
  toLeader.root = leader();
  localReduce(toLeader);
  if (isLeader()) allReduceBetweenNodes(leaders(call), result, call.count, call);
  Call fromLeader = call;
  fromLeader.kind = CallKind::Broadcast;
  fromLeader.send = fromLeader.recv = result;
  fromLeader.root = leader();
  localBroadcast(fromLeader);
}

void Comm::allReduceBetweenNodes(const NetworkGroup& group, void* data, size_t count, const Call& call) {
  const ncclRedOp_t op = call.op == ncclAvg ? ncclSum : call.op;
  switch (networkAlgorithms_.allReduce(group.size(), count * datatypeSize(call.datatype))) {
    case NetworkAlgorithm::Ring: networkAllReduce(group, data, count, call.datatype, op); break;
    case NetworkAlgorithm::RecursiveDoubling:
      networkAllReduceRecursiveDoubling(group, data, count, call.datatype, op);
      break;
    case NetworkAlgorithm::Rabenseifner: networkAllReduceRabenseifner(group, data, count, call.datatype, op); break;
    case NetworkAlgorithm::Tree: networkAllReduceTree(group, data, count, call.datatype, op); break;
  }
  if (call.op == ncclAvg) {
    const void* sum[1] = {data};
    mojoccl::reduce(data, sum, 1, count, call.datatype, ncclAvg, size_);
  }
}

// Local rank i reduces slice i of its node's buffers (a reduce-scatter in
// shared memory), all-reduces it with local rank i of every other node,
// and the node's ranks gather the slices. Slices are equal; where the node's
// ranks do not divide the count, the call runs in a padded copy.
void Comm::allReduceOnRails(const Call& call, void* result) {
  const size_t size = datatypeSize(call.datatype);
  const int perNode = static_cast<int>(nodes_[node_].size());
  const size_t slice = (call.count + perNode - 1) / perNode;
  const bool even = slice * perNode == call.count;
  char* whole = static_cast<char*>(result);
  if (!even) {
    railBuffer_.resize(slice * perNode * size);
    whole = railBuffer_.data();
    std::memcpy(whole, call.send, call.count * size);
    std::memset(whole + call.count * size, 0, (slice * perNode - call.count) * size);
  }
  char* mine = whole + localIndex_ * slice * size;
  Call scatter = call;
  scatter.kind = CallKind::ReduceScatter;
  scatter.send = even ? call.send : whole;
  scatter.recv = mine;
  scatter.count = slice;
  scatter.op = call.op == ncclAvg ? ncclSum : call.op;
  localReduceScatter(scatter);
  allReduceBetweenNodes(rail(call, localIndex_), mine, slice, call);
  Call gather = call;
  gather.kind = CallKind::AllGather;
  gather.send = mine;
  gather.recv = whole;
  gather.count = slice;
  localAllGather(gather);
  if (!even) std::memcpy(result, whole, call.count * size);
}

void Comm::broadcastAcrossNodes(const Call& call) {
  if (onRails() && call.count * datatypeSize(call.datatype) / nodes_[node_].size() >= kMinRailSliceBytes)
    return broadcastOnRails(call);
  const int rootNode = nodeOfRank_[call.root];
  if (node_ == rootNode) localBroadcast(call);
  if (isLeader())
    broadcastBetweenNodes(leaders(call), call.recv, call.count * datatypeSize(call.datatype), rootNode);
  if (node_ != rootNode) {
    Call fromLeader = call;
    fromLeader.send = call.recv;
    fromLeader.root = leader();
    localBroadcast(fromLeader);
  }
}

void Comm::broadcastBetweenNodes(const NetworkGroup& group, void* data, size_t bytes, int rootNode) {
  networkBroadcast(group, data, bytes, rootNode, networkAlgorithms_.broadcast(group.size(), bytes));
}

// The root's node broadcasts within itself; local rank i of every node
// then carries slice i of the data down its rail (as the leaders' would,
// on its own endpoint), and each other node's ranks gather the
// slices their rails brought. Slices are equal bytes; where the node's
// ranks do not divide them, the call runs in a padded copy.
void Comm::broadcastOnRails(const Call& call) {
  const size_t bytes = call.count * datatypeSize(call.datatype);
  const size_t perNode = nodes_[node_].size();
  const size_t slice = (bytes + perNode - 1) / perNode;
  const bool even = slice * perNode == bytes;
  const int rootNode = nodeOfRank_[call.root];
  if (!even) railBuffer_.resize(slice * perNode);
  char* whole = even ? static_cast<char*>(call.recv) : railBuffer_.data();
  if (node_ == rootNode) {
    localBroadcast(call);
    if (!even) std::memcpy(whole, call.recv, bytes);
  }
  char* mine = whole + localIndex_ * slice;
  broadcastBetweenNodes(rail(call, localIndex_), mine, slice, rootNode);
  if (node_ == rootNode) return;
  Call gather = call;
  gather.kind = CallKind::AllGather;
  gather.send = mine;
  gather.recv = whole;
  gather.count = slice;
  gather.datatype = ncclInt8;
  localAllGather(gather);
  if (!even) std::memcpy(call.recv, whole, bytes);
}

void Comm::allGatherAcrossNodes(const Call& call) {
  const size_t block = call.count * datatypeSize(call.datatype);
  if (onRails() && nodesAreRankRanges() && block >= kMinRailSliceBytes) return allGatherOnRails(call);
  // Each node's blocks gather at its leader, in node order; the leaders
  // swap them, put them in rank order, and broadcast. Where each node's
  // ranks are consecutive (as launchers place them), node order is rank
  // order: they gather in the result itself, with no copy to reorder them.
  const bool inPlace = nodesAreRankRanges();
  char* gathered = inPlace ? static_cast<char*>(call.recv) : scratch(block * size_);
  std::vector<Slice> nodeBlocks;  // in bytes of `gathered`, in node order
  for (const auto& node : nodes_) {
    const size_t begin = nodeBlocks.empty() ? 0 : nodeBlocks.back().end;
    nodeBlocks.push_back({begin, begin + node.size() * block});
  }
  Call inNode = call;
  inNode.recv = gathered + nodeBlocks[node_].begin;
  localAllGather(inNode);
  if (isLeader()) {
    const auto allGather = static_cast<int>(nodes_.size()) <= directNodes_ ? networkAllGather : networkAllGatherRing;
    allGather(leaders(call), gathered, nodeBlocks);
    for (size_t node = 0; node < nodes_.size() && !inPlace; ++node)
      for (size_t i = 0; i < nodes_[node].size(); ++i)
        std::memcpy(static_cast<char*>(call.recv) + nodes_[node][i] * block,
                    gathered + nodeBlocks[node].begin + i * block, block);
  }
  Call fromLeader = call;
  fromLeader.kind = CallKind::Broadcast;
  fromLeader.send = call.recv;
  fromLeader.count = call.count * size_;
  fromLeader.root = leader();
  localBroadcast(fromLeader);
}

// Local rank i of every node swaps its block with the others of its rail
// (its own endpoint and NIC, as the all-reduce on rails), straight into
// the result; then each node's ranks gather, node by node, the blocks their
// rails brought. Every rank carries its share of the node's bytes between
// nodes, where the leaders' all-gather puts them all on the first rank's.
void Comm::allGatherOnRails(const Call& call) {
  const size_t block = call.count * datatypeSize(call.datatype);
  char* result = static_cast<char*>(call.recv);
  if (call.send != result + rank_ * block) std::memcpy(result + rank_ * block, call.send, block);
  std::vector<Slice> railBlocks;  // in bytes of the result, in node order
  for (const auto& node : nodes_) railBlocks.push_back({node[localIndex_] * block, (node[localIndex_] + 1) * block});
  const auto allGather = static_cast<int>(nodes_.size()) <= directNodes_ ? networkAllGather : networkAllGatherRing;
  allGather(rail(call, localIndex_), result, railBlocks);
  for (const auto& node : nodes_) {
    Call inNode = call;
    inNode.send = result + node[localIndex_] * block;
    inNode.recv = result + node.front() * block;
    localAllGather(inNode);
  }
}

// Each node's ranks reduce-scatter, node by node, so that local rank i
// holds its node's sum of block i of every node; local rank i of every
// node then reduce-scatters those sums on its rail (round the ring or by
// recursive halving, as the cost model says), each ending with its block.
void Comm::reduceScatterOnRails(const Call& call) {
  const size_t size = datatypeSize(call.datatype);
  const size_t nodes = nodes_.size();
  const ncclRedOp_t op = call.op == ncclAvg ? ncclSum : call.op;
  char* sums = scratch(call.count * nodes * size);  // our rail's blocks, one per node, in node order
  std::vector<Slice> byNode;
  for (size_t node = 0; node < nodes; ++node) {
    Call inNode = call;
    inNode.send = bytesAt(call.send, nodes_[node].front() * call.count, size);
    inNode.recv = bytesAt(sums, node * call.count, size);
    inNode.op = op;
    localReduceScatter(inNode);
    byNode.push_back({node * call.count, (node + 1) * call.count});
  }
  const bool ring = networkAlgorithms_.reduceScatter(static_cast<int>(nodes), call.count * nodes * size) ==
                    NetworkAlgorithm::Ring;
  const NetworkGroup group = rail(call, localIndex_);
  if (ring)
    networkReduceScatter(group, {sums, sums, call.recv}, byNode, 0, call.datatype, op, nullptr);
  else
    networkReduceScatterHalving(group, sums, byNode, call.datatype, op);
  if (!ring) std::memcpy(call.recv, bytesAt(sums, node_ * call.count, size), call.count * size);
  if (call.op == ncclAvg) {
    const void* sum[1] = {call.recv};
    mojoccl::reduce(call.recv, sum, 1, call.count, call.datatype, ncclAvg, size_);
  }
}

void Comm::reduceScatterAcrossNodes(const Call& call) {
  if (acrossNodesType(call.datatype) == call.datatype && nodesAreRankRanges()) {
    if (onRails() && call.count * datatypeSize(call.datatype) >= kMinRailSliceBytes) return reduceScatterOnRails(call);
    return reduceScatterByNodes(call);
  }
  // The whole all-reduce, of which this rank keeps its block.
  const size_t block = call.count * datatypeSize(call.datatype);
  Call whole = call;
  whole.kind = CallKind::AllReduce;
  whole.count = call.count * size_;
  char* result = scratch(block * size_);
  allReduceAcrossNodes(whole, result);
  std::memcpy(call.recv, result + rank_ * block, block);
}

// Each node's ranks are consecutive, nodes in rank order (as launchers
// place ranks by default): a node's blocks of a reduce-scatter are one
// range of the buffer.
bool Comm::nodesAreRankRanges() const {
  int expected = 0;
  for (const auto& node : nodes_)
    for (int rank : node)
      if (rank != expected++) return false;
  return true;
}

// The leaders reduce-scatter the node sums (round the ring, or by recursive
// halving where the cost model says), each ending with its node's blocks:
// half the traffic of the whole all-reduce. Then each leader hands its
// node those blocks.
void Comm::reduceScatterByNodes(const Call& call) {
  const size_t size = datatypeSize(call.datatype);
  char* result = scratch(call.count * size_ * size);
  const ncclRedOp_t op = call.op == ncclAvg ? ncclSum : call.op;
  Call toLeader = call;
  toLeader.kind = CallKind::Reduce;
  toLeader.count = call.count * size_;
  toLeader.recv = result;
  toLeader.op = op;
  toLeader.root = leader();
  const bool ring = networkAlgorithms_.reduceScatter(static_cast<int>(nodes_.size()), call.count * size_ * size) ==
                    NetworkAlgorithm::Ring;
  // Round the ring, a node of one rank reads its operands from the caller's
  // buffer (its node sum would be a copy of it) and folds its block
  // straight into the caller's result.
  const bool fromCaller = ring && nodes_[node_].size() == 1;
  if (!fromCaller) localReduce(toLeader);
  std::vector<Slice> byNode;
  for (const auto& node : nodes_) byNode.push_back({node.front() * call.count, (node.back() + 1) * call.count});
  const Slice ours = byNode[node_];
  char* nodeBlocks = fromCaller ? static_cast<char*>(call.recv) : bytesAt(result, ours.begin, size);
  if (isLeader()) {
    const NetworkGroup group = leaders(call);
    if (ring)
      networkReduceScatter(group, {fromCaller ? call.send : result, result, nodeBlocks}, byNode, 0, call.datatype, op,
                           nullptr);
    else
      networkReduceScatterHalving(group, result, byNode, call.datatype, op);
    if (call.op == ncclAvg) {
      const void* sum[1] = {nodeBlocks};
      mojoccl::reduce(nodeBlocks, sum, 1, ours.end - ours.begin, call.datatype, ncclAvg, size_);
    }
  }
  Call fromLeader = call;
  fromLeader.kind = CallKind::Broadcast;
  fromLeader.send = fromLeader.recv = nodeBlocks;
  fromLeader.count = ours.end - ours.begin;
  fromLeader.root = leader();
  localBroadcast(fromLeader);
  if (!fromCaller) std::memcpy(call.recv, bytesAt(result, rank_ * call.count, size), call.count * size);
}

void Comm::reduceAcrossNodes(const Call& call) {
  Call whole = call;
  whole.kind = CallKind::AllReduce;
  allReduceAcrossNodes(whole, rank_ == call.root ? call.recv : scratch(call.count * datatypeSize(call.datatype)));
}

}  // namespace mojoccl
