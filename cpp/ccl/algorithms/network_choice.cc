#include "network_choice.h"

#include <algorithm>

#include "../env.h"
#include "../error.h"

namespace mojoccl {

namespace {
const std::vector<NetworkAllReduce> kAllAlgorithms = {NetworkAllReduce::Ring, NetworkAllReduce::RecursiveDoubling,
                                                     NetworkAllReduce::Rabenseifner};
}  // namespace

std::string nameOf(NetworkAllReduce algorithm) {
  switch (algorithm) {
    case NetworkAllReduce::Ring: return "ring";
    case NetworkAllReduce::RecursiveDoubling: return "recursive_doubling";
    case NetworkAllReduce::Rabenseifner: return "rabenseifner";
  }
  return "";
}

double NetworkCostModel::seconds(NetworkAllReduce algorithm, int nodes, size_t bytes) const {
  const double n = nodes, data = static_cast<double>(bytes);
  double steps, sent, reduced;
  int powerOfTwo = 1, doublings = 0;
  while (powerOfTwo * 2 <= nodes) powerOfTwo *= 2, ++doublings;
  const int extra = powerOfTwo == nodes ? 0 : 2;  // folding in, and handing back
  const double p = powerOfTwo;
  if (algorithm == NetworkAllReduce::Ring) {
    steps = 2 * (n - 1);
    sent = 2 * (n - 1) / n * data;
    reduced = (n - 1) / n * data;
  } else if (algorithm == NetworkAllReduce::RecursiveDoubling) {
    steps = doublings + extra;
    sent = (doublings + extra) * data;
    reduced = (doublings + extra / 2) * data;
  } else {
    steps = 2 * doublings + extra;
    sent = 2 * (p - 1) / p * data + extra * data;
    reduced = (p - 1) / p * data + extra / 2 * data;
  }
  return steps * stepSeconds + sent / wireBytesPerSecond + reduced / reduceBytesPerSecond;
}

std::string NetworkAlgorithms::setting() {
  const std::string text = envString("MOJOCCL_NET_ALGO");
  return text.empty() ? "auto" : text;
}

NetworkAlgorithms NetworkAlgorithms::fromEnv() {
  NetworkAlgorithms algorithms;
  const std::string text = setting();
  if (text == "auto") {
    algorithms.allowed_ = kAllAlgorithms;
    return algorithms;
  }
  for (const auto& name : commaSeparated(text)) algorithms.allowed_.push_back(networkAllReduceNamed(name, text));
  return algorithms;
}

NetworkAllReduce networkAllReduceNamed(const std::string& name, const std::string& setting) {
  for (NetworkAllReduce algorithm : kAllAlgorithms)
    if (nameOf(algorithm) == name) return algorithm;
  fail(ncclInvalidArgument, "MOJOCCL_NET_ALGO=" + setting + " is not valid: expected auto, or a comma-separated "
                            "list of ring, recursive_doubling, rabenseifner");
}

NetworkAllReduce NetworkAlgorithms::allReduce(int nodes, size_t bytes) const {
  return *std::min_element(allowed_.begin(), allowed_.end(), [&](NetworkAllReduce a, NetworkAllReduce b) {
    return model_.seconds(a, nodes, bytes) < model_.seconds(b, nodes, bytes);
  });
}

}  // namespace mojoccl
