// Which algorithm moves an all-reduce, a reduce-scatter or a broadcast
// between nodes once it is past the size that travels in the leaders'
// one-message frames: the one a cost model expects to finish first, among
// those MOJOCCL_NET_ALGO allows.
//
// The model counts, for `nodes` leaders and `bytes` of data, the steps
// each takes (a message's latency apiece), the bytes each leader sends one
// way, and the bytes it reduces:
//   ring                 2(n-1) steps, 2(n-1)/n x bytes sent, (n-1)/n x bytes reduced
//   recursive doubling   log2(p) steps (+2 where n is not a power of two p),
//                        as many times the whole buffer sent and reduced
//   rabenseifner         2 log2(p) steps (+2), 2(p-1)/p x bytes sent and
//                        (p-1)/p x reduced (+ the whole buffer twice sent,
//                        once reduced, where n is not a power of two)
//   tree                 2 x levels + 4 steps (up the deeper of two binary
//                        trees, about log2(n) levels, and down, pipelined
//                        two segments apart); what the busiest member sends
//                        and reduces (treeLoad: up to 2 x and 1 x bytes)
// A reduce-scatter is the first half of the ring or of Rabenseifner's
// algorithm (recursive halving): half the steps, the same bytes less the
// all-gather's; recursive doubling and the tree have no such half, so
// where only they are allowed a reduce-scatter takes the ring.
// A broadcast goes along the ring (a chain, pipelined in segments: n-1
// steps, the bytes sent once by each member) or down a binomial tree
// (log2(n) steps, the root sending the bytes log2(n) times): recursive
// doubling's and Rabenseifner's broadcast is that tree.
// Its constants were measured on the tcp provider (benchmarks/investigations.md,
// "Choosing the algorithm between nodes").
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace mojoccl {

enum class NetworkAlgorithm { Ring, RecursiveDoubling, Rabenseifner, Tree };

struct NetworkCostModel {
  double stepSeconds = 50e-6;           // one exchange between leaders, software included
  double wireBytesPerSecond = 2e9;      // one direction of a leader's link, both busy
  // The reduction's cost beyond what overlaps the wire (segments are
  // reduced while the next ones travel).
  double reduceBytesPerSecond = 6e9;

  // Predicted seconds for `nodes` leaders and `bytes` of data (the whole
  // buffer, of which a reduce-scatter leaves each leader its part).
  double seconds(NetworkAlgorithm algorithm, int nodes, size_t bytes) const;
  double reduceScatterSeconds(NetworkAlgorithm algorithm, int nodes, size_t bytes) const;
  // Ring (the chain) or Tree (the binomial tree).
  double broadcastSeconds(NetworkAlgorithm algorithm, int nodes, size_t bytes) const;
};

// "ring" / "recursive_doubling" / "rabenseifner" / "tree", as MOJOCCL_NET_ALGO spells them.
std::string nameOf(NetworkAlgorithm algorithm);
// The algorithm of that name; an unknown name fails, naming the known ones
// (`setting`: the text it came from, for the message).
NetworkAlgorithm networkAlgorithmNamed(const std::string& name, const std::string& setting);

class NetworkAlgorithms {
 public:
  // MOJOCCL_NET_ALGO: `auto` (every algorithm) or a comma-separated list of
  // the ones allowed; anything else fails, naming the allowed values.
  static NetworkAlgorithms fromEnv();
  // MOJOCCL_NET_ALGO as set, "auto" where unset or empty: what every rank must share.
  static std::string setting();
  // Among the allowed ones, the fastest by the model (on a tie, the first
  // of rabenseifner, ring, recursive doubling, tree).
  NetworkAlgorithm allReduce(int nodes, size_t bytes) const;
  // The same for a reduce-scatter: the ring or rabenseifner (its halving;
  // on a tie the ring, which on single-rank nodes reads and writes the
  // caller's buffers).
  NetworkAlgorithm reduceScatter(int nodes, size_t bytes) const;
  // The same for a broadcast: Ring (the chain) where `ring` is allowed and
  // the model expects it first, else Tree (the binomial tree; on a tie too).
  NetworkAlgorithm broadcast(int nodes, size_t bytes) const;
  const NetworkCostModel& model() const { return model_; }

 private:
  std::vector<NetworkAlgorithm> allowed_;
  NetworkCostModel model_;
};

}  // namespace mojoccl
