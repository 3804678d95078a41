// The collectives among this node's ranks, in shared memory: the whole of a
// collective on one node, and the within-the-node parts of one across
// nodes (hierarchy/hierarchy.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <vector>

#include "algorithms/call.h"
#include "algorithms/p2p.h"
#include "transports/shm.h"

namespace mojoccl {

enum class AllReduceAlgorithm { Auto, OneShot, TwoShot };

// Up to this size one-shot all-reduce wins whatever the rank count; above it
// two-shot does once more than two ranks share the work.
constexpr size_t kOneShotMaxBytes = 64 << 10;

class NodeCollectives {
 public:
  // `allReduceAlgorithm`: MOJOCCL_ALGO; `zeroCopy`: MOJOCCL_ZERO_COPY.
  NodeCollectives(ShmTransport& shm, AllReduceAlgorithm allReduceAlgorithm, bool zeroCopy)
      : shm_(shm), allReduceAlgorithm_(allReduceAlgorithm), zeroCopy_(zeroCopy) {}

  // Each as the node's part of `call`: a rank is a communicator rank (the
  // root), counts as in the call.
  void allReduce(const Call& call);
  void reduce(const Call& call);
  void broadcast(const Call& call);
  void allGather(const Call& call);
  void reduceScatter(const Call& call);
  // `transfers`: this rank's send to and receive from every rank of the
  // node (peer: the local index), as ncclAllToAllv makes them.
  void allToAll(const Call& call, const std::vector<Transfer>& transfers);

  // `bytes` at `data` from the rank `from` to the node's other ranks, as
  // part of `call` (whose sequence the ranks compare).
  void broadcastBytes(const Call& call, void* data, size_t bytes, int from);
  // One step in which the ranks compare their calls: the first
  // disagreement among them, or "".
  std::string disagreement(const Call& call);

  ShmTransport& shm() { return shm_; }
  // The steps taken so far: every algorithm on shared memory counts them.
  uint32_t& rounds() { return rounds_; }

 private:
  using Staged = void (*)(ShmTransport&, uint32_t&, const Call&);
  using ZeroCopy = bool (*)(ShmTransport&, uint32_t&, const Call&);
  // Large messages try `zeroCopy` first, which declines when some buffer it
  // must read is private; `staged` always works.
  void run(const Call& call, size_t bytes, ZeroCopy zeroCopy, Staged staged);

  ShmTransport& shm_;
  uint32_t rounds_ = 0;
  AllReduceAlgorithm allReduceAlgorithm_;
  bool zeroCopy_;  // MOJOCCL_ZERO_COPY: read peers' buffers in place when possible
};

}  // namespace mojoccl
