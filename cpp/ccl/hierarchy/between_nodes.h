// The network between nodes as the hierarchy uses it: the fabric, a
// leader's own sockets, and the settings every rank agreed on at set-up.
#pragma once

#include <string>
#include <vector>

#include "algorithms/call.h"
#include "algorithms/network.h"
#include "algorithms/network_choice.h"
#include "node/topology.h"
#include "transports/fabric.h"
#include "transports/leader_sockets.h"

namespace mojoccl {

// Calls up to this size between nodes travel in the leaders' frames, with
// the agreement on the call (leader_frames.h).
constexpr size_t kFramedMaxBytes = 64 << 10;

struct BetweenNodes {
  FabricTransport& fabric;
  LeaderSockets* leaderSockets;  // a leader's, where frames go on its sockets (MOJOCCL_NET_FRAMES)
  NetworkAlgorithms algorithms;  // MOJOCCL_NET_ALGO
  // Up to this many nodes (MOJOCCL_NET_DIRECT_NODES) the leaders exchange
  // directly, every leader with every other in one step: the frames and a
  // larger all-gather's blocks. Past it the frames go by Bruck's
  // all-gather, in ceil(log2 n) steps of one message, and the blocks round
  // the ring, each leader with two peers (benchmarks/investigations.md, "The
  // leaders' frames at many nodes").
  int directNodes;
  // Every node has the same number of ranks, more than one, and
  // MOJOCCL_NET_RAILS does not turn rails off.
  bool rails;
  ReceiveRoom room;  // what the algorithms between nodes receive into

  bool direct(const Topology& topology) const { return static_cast<int>(topology.nodes.size()) <= directNodes; }
  // Local rank `index` of every node, in node order; rail 0 is the leaders,
  // who exchange their frames on their sockets where they have them.
  NetworkGroup rail(const Topology& topology, const Call& call, int index) {
    std::vector<int> ranks;
    for (const auto& node : topology.nodes) ranks.push_back(node[index]);
    return {fabric, room, ranks, topology.node, call.describe() + " across nodes",
            index == 0 ? leaderSockets : nullptr};
  }
};

}  // namespace mojoccl
