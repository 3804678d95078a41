// Where a communicator's ranks are: which node each one is on (ranks with
// equal host hashes share a node), and this rank's place in its node.
#pragma once

#include <vector>

#include "base/bootstrap.h"

namespace mojoccl {

struct Topology {
  int rank = 0;
  int size = 1;
  std::vector<std::vector<int>> nodes;  // each node's ranks; nodes ordered by their lowest rank
  std::vector<int> nodeOfRank;
  int node = 0;        // ours
  int localIndex = 0;  // our place among our node's ranks

  static Topology of(const std::vector<RankInfo>& ranks, int rank);

  const std::vector<int>& ours() const { return nodes[node]; }
  int localRanks() const { return static_cast<int>(nodes[node].size()); }
  int leader() const { return nodes[node][0]; }  // our node's lowest rank
  bool isLeader() const { return leader() == rank; }
  bool onOurNode(int peer) const { return nodeOfRank[peer] == node; }
  // Each node's ranks are consecutive, nodes in rank order (as launchers
  // place ranks by default): a node's blocks of a reduce-scatter or an
  // all-gather are one range of the buffer.
  bool nodesAreRankRanges() const;
};

}  // namespace mojoccl
