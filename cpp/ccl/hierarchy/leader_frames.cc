#include "hierarchy/leader_frames.h"

#include <cstring>

#include "algorithms/step.h"
#include "base/error.h"

namespace mojoccl {

void LeaderFrames::agree(const Call& call) {
  report(call);
  char verdict[kVerdictBytes] = {};
  if (topology_.isLeader()) copyText(verdict, exchange(call, 0));
  handOut(call, verdict, kVerdictBytes);
}

char* LeaderFrames::frame(size_t node) {
  if (frames_.size() < topology_.nodes.size() * kFrameRoom) frames_.resize(topology_.nodes.size() * kFrameRoom);
  return frames_.data() + node * kFrameRoom;
}

bool LeaderFrames::report(const Call& call) { return report(call, node_.disagreement(call)); }

bool LeaderFrames::report(const Call& call, const std::string& nodeProblem) {
  NodeReport& mine = *reinterpret_cast<NodeReport*>(frame(topology_.node));
  mine.signature = CallSignature::of(call);
  const std::string problem = nodeProblem.substr(0, kVerdictBytes - 1);
  mine.problemBytes = problem.size();
  std::memcpy(payloadOf(frame(topology_.node)), problem.data(), problem.size());
  return problem.empty();
}

// Directly up to MOJOCCL_NET_DIRECT_NODES nodes and by Bruck's all-gather
// past them. A leader in a small all-reduce and one in any other call
// exchange frames alike, and so meet.
std::string LeaderFrames::exchange(const Call& call, size_t payloadBytes) {
  std::vector<char*> frames;
  for (size_t node = 0; node < topology_.nodes.size(); ++node) frames.push_back(frame(node));
  std::vector<size_t> received;
  const auto exchangeFrames = network_.direct(topology_) ? networkExchangeFrames : networkGatherFrames;
  const auto& mine = *reinterpret_cast<const NodeReport*>(frame(topology_.node));
  exchangeFrames(network_.rail(topology_, call, 0), frames,
                 sizeof(NodeReport) + (mine.problemBytes > 0 ? mine.problemBytes : payloadBytes), kFrameRoom,
                 received);
  return disagreement(frames[0], kFrameRoom);
}

std::string LeaderFrames::sendOwn(const Call& call, const std::function<size_t(size_t node, char* payload)>& fill) {
  const size_t nodes = topology_.nodes.size();
  const auto& report = *reinterpret_cast<const NodeReport*>(frame(topology_.node));
  const size_t reportBytes = sizeof(NodeReport) + report.problemBytes;
  if (outgoingFrames_.size() < nodes * kFrameRoom) outgoingFrames_.resize(nodes * kFrameRoom);
  std::vector<const char*> outgoing;
  std::vector<size_t> outgoingBytes;
  std::vector<char*> incoming;
  for (size_t node = 0; node < nodes; ++node) {
    char* out = outgoingFrames_.data() + node * kFrameRoom;
    std::memcpy(out, frame(topology_.node), reportBytes);
    outgoing.push_back(out);
    outgoingBytes.push_back(reportBytes + (report.problemBytes == 0 ? fill(node, payloadOf(out)) : 0));
    incoming.push_back(frame(node));
  }
  std::vector<size_t> received;
  networkSendFrames(network_.rail(topology_, call, 0), outgoing, outgoingBytes, incoming, kFrameRoom, received);
  return disagreement(frame(0), kFrameRoom);
}

void LeaderFrames::handOut(const Call& call, char* verdictThenData, size_t bytes) {
  node_.broadcastBytes(call, verdictThenData, bytes, topology_.leader());
  if (verdictThenData[0] != '\0') throw MismatchError(verdictThenData);
}

// The first disagreement among the nodes' reports (`stride` bytes apart),
// or "": every leader finds the same.
std::string LeaderFrames::disagreement(const char* reports, size_t stride) const {
  const auto* first = reinterpret_cast<const NodeReport*>(reports);
  for (size_t node = 0; node < topology_.nodes.size(); ++node) {
    const auto* report = reinterpret_cast<const NodeReport*>(reports + node * stride);
    if (report->problemBytes > 0) return std::string(report->problem(), report->problemBytes);
    if (!report->signature.sameCollective(first->signature))
      return mismatchText(topology_.nodes[node][0], report->signature, topology_.nodes[0][0], first->signature);
  }
  return "";
}

}  // namespace mojoccl
