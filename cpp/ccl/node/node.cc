#include "node/node.h"

#include <cstring>

#include "algorithms/all_to_all.h"
#include "algorithms/direct.h"
#include "algorithms/step.h"
#include "algorithms/zero_copy.h"
#include "base/datatypes.h"

namespace mojoccl {
void NodeCollectives::run(const Call& call, size_t bytes, ZeroCopy zeroCopy, Staged staged) {
  // A node of one rank holds its result already (its `bytes` are the whole
  // of it): the steps would only copy the buffer into shared memory and
  // back, between single-rank nodes two copies of an all-reduce per call.
  if (shm_.size() == 1) {
    if (call.recv != call.send) std::memmove(call.recv, call.send, bytes);
    return;
  }
  // Every rank takes the same branch: `bytes` is checked to agree in the
  // first step of either.
  if (zeroCopy_ && bytes >= kZeroCopyMinBytes && zeroCopy(shm_, rounds_, call)) return;
  staged(shm_, rounds_, call);
}

void NodeCollectives::allReduce(const Call& call) {
  const size_t bytes = call.count * datatypeSize(call.datatype);
  bool oneShot = allReduceAlgorithm_ == AllReduceAlgorithm::OneShot ||
                 (allReduceAlgorithm_ == AllReduceAlgorithm::Auto && (shm_.size() <= 2 || bytes <= kOneShotMaxBytes));
  run(call, bytes, allReduceZeroCopy, oneShot ? allReduceOneShot : allReduceTwoShot);
}

void NodeCollectives::reduce(const Call& call) {
  run(call, call.count * datatypeSize(call.datatype), reduceZeroCopy, reduceDirect);
}

void NodeCollectives::broadcast(const Call& call) {
  run(call, call.count * datatypeSize(call.datatype), broadcastZeroCopy, broadcastDirect);
}

void NodeCollectives::allGather(const Call& call) {
  run(call, call.count * datatypeSize(call.datatype) * shm_.size(), allGatherZeroCopy, allGatherDirect);
}

void NodeCollectives::reduceScatter(const Call& call) {
  run(call, call.count * datatypeSize(call.datatype) * shm_.size(), reduceScatterZeroCopy, reduceScatterDirect);
}

void NodeCollectives::allToAll(const Call& call, const std::vector<Transfer>& transfers) {
  // A node of one rank only copies its own part.
  if (shm_.size() == 1) return runTransfers(shm_, transfers);
  allToAllWithinNode(shm_, rounds_, call, transfers, zeroCopy_);
}

void NodeCollectives::broadcastBytes(const Call& call, void* data, size_t bytes, int from) {
  broadcast({CallKind::Broadcast, data, data, bytes, ncclInt8, ncclSum, from, call.sequence});
}

std::string NodeCollectives::disagreement(const Call& call) {
  Step step(shm_, rounds_, call);
  step.publishAndAwait();
  return step.disagreement();
}

}  // namespace mojoccl
