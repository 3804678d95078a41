#include "algorithms/network_choice.h"

#include <algorithm>

#include "algorithms/network.h"
#include "base/error.h"
#include "base/settings.h"

namespace mojoccl {

namespace {
const std::vector<NetworkAlgorithm> kAllAlgorithms = {NetworkAlgorithm::Ring, NetworkAlgorithm::RecursiveDoubling,
                                                     NetworkAlgorithm::Rabenseifner, NetworkAlgorithm::Tree};
}  // namespace

std::string nameOf(NetworkAlgorithm algorithm) {
  switch (algorithm) {
    case NetworkAlgorithm::Ring: return "ring";
    case NetworkAlgorithm::RecursiveDoubling: return "recursive_doubling";
    case NetworkAlgorithm::Rabenseifner: return "rabenseifner";
    case NetworkAlgorithm::Tree: return "tree";
  }
  return "";
}

namespace {

struct Costs {
  double steps, sent, reduced;  // sent and reduced: bytes, per leader
};

struct NodeCount {
  double n, p;  // nodes, and the largest power of two up to it
  int doublings;
  int extra;  // steps for folding the nodes past p in, and handing back
};

NodeCount nodeCount(int nodes) {
  NodeCount count{static_cast<double>(nodes), 1, 0, 0};
  while (count.p * 2 <= nodes) count.p *= 2, ++count.doublings;
  count.extra = count.p == nodes ? 0 : 2;
  return count;
}

double secondsOf(const NetworkCostModel& model, Costs costs) {
  return costs.steps * model.stepSeconds + costs.sent / model.wireBytesPerSecond +
         costs.reduced / model.reduceBytesPerSecond;
}

}  // namespace

double NetworkCostModel::seconds(NetworkAlgorithm algorithm, int nodes, size_t bytes) const {
  const auto [n, p, doublings, extra] = nodeCount(nodes);
  const double data = static_cast<double>(bytes);
  switch (algorithm) {
    case NetworkAlgorithm::Ring:
      return secondsOf(*this, {2 * (n - 1), 2 * (n - 1) / n * data, (n - 1) / n * data});
    case NetworkAlgorithm::RecursiveDoubling: {
      const double steps = doublings + extra;
      return secondsOf(*this, {steps, steps * data, (doublings + extra / 2) * data});
    }
    case NetworkAlgorithm::Rabenseifner:
      return secondsOf(*this, {2.0 * doublings + extra, 2 * (p - 1) / p * data + extra * data,
                               (p - 1) / p * data + extra / 2 * data});
    case NetworkAlgorithm::Tree: {
      // Up and down the deeper tree, two steps apart (a segment's result
      // goes down two steps after it went up).
      const TreeLoad load = treeLoad(nodes);
      return secondsOf(*this, {2.0 * load.levels + 4, load.halvesSent * data / 2, load.halvesReduced * data / 2});
    }
  }
  return 0;
}

double NetworkCostModel::reduceScatterSeconds(NetworkAlgorithm algorithm, int nodes, size_t bytes) const {
  const auto [n, p, doublings, extra] = nodeCount(nodes);
  const double data = static_cast<double>(bytes);
  if (algorithm == NetworkAlgorithm::Ring) return secondsOf(*this, {n - 1, (n - 1) / n * data, (n - 1) / n * data});
  // The halving; a node past p hands its whole buffer in and gets its part back.
  return secondsOf(*this, {static_cast<double>(doublings + extra), (p - 1) / p * data + (extra ? data + data / n : 0),
                           (p - 1) / p * data + (extra ? data : 0)});
}

double NetworkCostModel::broadcastSeconds(NetworkAlgorithm algorithm, int nodes, size_t bytes) const {
  const double data = static_cast<double>(bytes);
  if (algorithm == NetworkAlgorithm::Ring) return secondsOf(*this, {nodes - 1.0, data, 0});
  double levels = 0;
  while ((1 << static_cast<int>(levels)) < nodes) ++levels;
  return secondsOf(*this, {levels, levels * data, 0});
}

std::string NetworkAlgorithms::setting() {
  return settingText("MOJOCCL_NET_ALGO");
}

NetworkAlgorithms NetworkAlgorithms::fromEnv() {
  NetworkAlgorithms algorithms;
  const std::string text = setting();
  if (text == "auto") {
    algorithms.allowed_ = kAllAlgorithms;
    return algorithms;
  }
  for (const auto& name : commaSeparated(text)) algorithms.allowed_.push_back(networkAlgorithmNamed(name, text));
  return algorithms;
}

NetworkAlgorithm networkAlgorithmNamed(const std::string& name, const std::string& setting) {
  for (NetworkAlgorithm algorithm : kAllAlgorithms)
    if (nameOf(algorithm) == name) return algorithm;
  fail(ncclInvalidArgument, "MOJOCCL_NET_ALGO=" + setting + " is not valid: expected auto, or a comma-separated "
                            "list of ring, recursive_doubling, rabenseifner, tree");
}

namespace {

// The candidate `seconds` says finishes first; on a tie, the first listed.
template <typename Seconds>
NetworkAlgorithm fastest(const std::vector<NetworkAlgorithm>& candidates, Seconds seconds) {
  return *std::min_element(candidates.begin(), candidates.end(),
                           [&](NetworkAlgorithm a, NetworkAlgorithm b) { return seconds(a) < seconds(b); });
}

}  // namespace

NetworkAlgorithm NetworkAlgorithms::allReduce(int nodes, size_t bytes) const {
  // A tie (2 nodes: the ring's steps and bytes) goes to Rabenseifner's,
  // measured faster there: its all-gather posts its receives before the
  // peer sends, where the ring's reduced segments go on while the peer is
  // still reducing and arrive before their receives.
  std::vector<NetworkAlgorithm> candidates = allowed_;
  std::stable_partition(candidates.begin(), candidates.end(),
                        [](NetworkAlgorithm algorithm) { return algorithm == NetworkAlgorithm::Rabenseifner; });
  return fastest(candidates, [&](NetworkAlgorithm algorithm) { return model_.seconds(algorithm, nodes, bytes); });
}

NetworkAlgorithm NetworkAlgorithms::reduceScatter(int nodes, size_t bytes) const {
  std::vector<NetworkAlgorithm> candidates;
  for (NetworkAlgorithm algorithm : allowed_)
    if (algorithm == NetworkAlgorithm::Ring || algorithm == NetworkAlgorithm::Rabenseifner)
      candidates.push_back(algorithm);
  if (candidates.empty()) return NetworkAlgorithm::Ring;
  return fastest(candidates,
                 [&](NetworkAlgorithm algorithm) { return model_.reduceScatterSeconds(algorithm, nodes, bytes); });
}

NetworkAlgorithm NetworkAlgorithms::broadcast(int nodes, size_t bytes) const {
  const bool ringAllowed = std::find(allowed_.begin(), allowed_.end(), NetworkAlgorithm::Ring) != allowed_.end();
  const bool treeAllowed = !ringAllowed || allowed_.size() > 1;  // every other algorithm's broadcast is the tree
  std::vector<NetworkAlgorithm> candidates;
  if (treeAllowed) candidates.push_back(NetworkAlgorithm::Tree);
  if (ringAllowed) candidates.push_back(NetworkAlgorithm::Ring);
  return fastest(candidates,
                 [&](NetworkAlgorithm algorithm) { return model_.broadcastSeconds(algorithm, nodes, bytes); });
}

}  // namespace mojoccl
