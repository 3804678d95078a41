// The agreement on every collective between nodes, and the frames it
// travels in: each node's ranks compare their calls in shared memory, each
// leader sends the others a frame (its node's report on the call, then the
// node's disagreement or a small call's data), and each leader hands its
// node the verdict, with the result where the call travelled in the frames.
// A mismatch so raises the same MismatchError on every rank, before any
// data moves, and the communicator stays usable.
#pragma once

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "algorithms/call.h"
#include "hierarchy/between_nodes.h"
#include "node/node.h"
#include "node/topology.h"

namespace mojoccl {

// A disagreement's text, as a leader hands it to its node.
constexpr size_t kVerdictBytes = 512;

// What a node's leader tells the other leaders about a call, at the front
// of its frame: its ranks' call, and the node's own disagreement, if any,
// as `problemBytes` of text right behind the report. Where there is none,
// the data of a small collective follows the report instead (an 8-byte
// all-reduce's frame is 48 bytes: small enough to go inject).
struct NodeReport {
  CallSignature signature;
  uint64_t problemBytes;
  const char* problem() const { return reinterpret_cast<const char*>(this + 1); }
};

// A frame's data, where its node found no disagreement.
inline char* payloadOf(char* frame) { return frame + sizeof(NodeReport); }

inline void copyText(char* to, const std::string& text) { std::snprintf(to, kVerdictBytes, "%s", text.c_str()); }

// Room for any leader's frame: its node's report, then its disagreement or
// the data of a small all-reduce (halves cross in float32, at twice their
// bytes).
constexpr size_t kFrameRoom = sizeof(NodeReport) + std::max(kVerdictBytes, 2 * kFramedMaxBytes);

class LeaderFrames {
 public:
  LeaderFrames(const Topology& topology, NodeCollectives& node, BetweenNodes& network)
      : topology_(topology), node_(node), network_(network) {}

  // Agreement and nothing else, for a call whose data moves afterwards.
  void agree(const Call& call);

  // Each node's frame: its report, then its disagreement or data. Ours is
  // written before an exchange, the others' arrive in it.
  char* frame(size_t node);
  // Writes our node's report on `call` into our frame; true when the
  // node's ranks agree. The node's ranks compare their calls here, or
  // have already (`nodeProblem`).
  bool report(const Call& call);
  bool report(const Call& call, const std::string& nodeProblem);

  // At a leader: our frame (the report, then `payloadBytes` of data where
  // the node agreed) to every other leader, theirs into frame(node);
  // returns the first disagreement among the nodes' reports, or "".
  std::string exchange(const Call& call, size_t payloadBytes);
  // The same with a frame of its own to each other leader: our report,
  // then what `fill(node, payload)` writes for that leader's node
  // (returning its length).
  std::string sendOwn(const Call& call, const std::function<size_t(size_t node, char* payload)>& fill);

  // The leader's verdict (kVerdictBytes of text, "" where all agree) and
  // whatever follows it, to the node's other ranks; a disagreement raises
  // MismatchError on every rank.
  void handOut(const Call& call, char* verdictThenData, size_t bytes);

 private:
  std::string disagreement(const char* reports, size_t stride) const;

  const Topology& topology_;
  NodeCollectives& node_;
  BetweenNodes& network_;
  std::vector<char> frames_;          // each node's, kFrameRoom apart
  std::vector<char> outgoingFrames_;  // a frame for each leader, where they differ
};

}  // namespace mojoccl
