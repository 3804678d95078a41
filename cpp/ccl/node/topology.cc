#include "node/topology.h"

namespace mojoccl {

Topology Topology::of(const std::vector<RankInfo>& ranks, int rank) {
  Topology topology;
  topology.rank = rank;
  topology.size = static_cast<int>(ranks.size());
  topology.nodeOfRank.resize(ranks.size());
  for (const auto& info : ranks) {
    size_t node = 0;
    while (node < topology.nodes.size() && ranks[topology.nodes[node][0]].hostHash != info.hostHash) ++node;
    if (node == topology.nodes.size()) topology.nodes.emplace_back();
    topology.nodes[node].push_back(info.rank);
    topology.nodeOfRank[info.rank] = static_cast<int>(node);
  }
  topology.node = topology.nodeOfRank[rank];
  for (int peer : topology.ours())
    if (peer < rank) ++topology.localIndex;
  return topology;
}

bool Topology::nodesAreRankRanges() const {
  int expected = 0;
  for (const auto& members : nodes)
    for (int member : members)
      if (member != expected++) return false;
  return true;
}

}  // namespace mojoccl
