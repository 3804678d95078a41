#include "algorithms/zero_copy.h"

#include <cstring>
#include <vector>

#include "algorithms/layout.h"
#include "algorithms/step.h"
#include "base/datatypes.h"
#include "base/reduce.h"

namespace mojoccl {
namespace {

// Every rank's buffers, as this rank sees them after the shared step.
class Peers {
 public:
  Peers(ShmTransport& shm, Step& step, const Call& call, size_t sendBytes, size_t recvBytes)
      : shm_(shm), call_(call), buffers_(shm.size()) {
    CallBuffers mine = CallBuffers::of(call, sendBytes, recvBytes);
    step.share(&mine);
    for (int peer = 0; peer < shm.size(); ++peer) buffers_[peer] = step.buffersOf(peer);
  }

  bool allSendShared() const { return all([](const CallBuffers& b) { return b.send.shared(); }); }
  bool allRecvShared() const { return all([](const CallBuffers& b) { return b.recv.shared(); }); }
  bool anyInPlace() const { return !all([](const CallBuffers& b) { return !b.inPlace; }); }
  bool sendShared(int peer) const { return buffers_[peer].send.shared(); }

  // Copies `bytes` of `peer`'s send buffer from `offset` into `destination`:
  // from its mapping when shared, else straight out of its private memory.
  void copySend(int peer, size_t offset, void* destination, size_t bytes) const {
    if (peer == shm_.self() || buffers_[peer].send.shared()) {
      const char* source = send(peer) + offset;
      if (source != destination) std::memcpy(destination, source, bytes);
    } else {
      shm_.readPeerMemory(peer, buffers_[peer].sendAddress + offset, destination, bytes);
    }
  }

  const char* send(int peer) const {
    return peer == shm_.self() ? static_cast<const char*>(call_.send) : mapPeerBuffer(buffers_[peer].send);
  }
  char* recv(int peer) const {
    return peer == shm_.self() ? static_cast<char*>(call_.recv) : mapPeerBuffer(buffers_[peer].recv);
  }

 private:
  template <typename Test>
  bool all(Test test) const {
    for (const auto& buffers : buffers_)
      if (!test(buffers)) return false;
    return true;
  }

  ShmTransport& shm_;
  const Call& call_;
  std::vector<CallBuffers> buffers_;
};

}  // namespace

bool allReduceZeroCopy(ShmTransport& shm, uint32_t& rounds, const Call& call) {
  const size_t size = datatypeSize(call.datatype);
  const size_t bytes = call.count * size;
  const int nranks = shm.size();
  Step step(shm, rounds, call);
  Peers peers(shm, step, call, bytes, bytes);
  if (!peers.allSendShared()) return false;
  std::vector<const void*> sources(nranks);
  if (!peers.allRecvShared()) {
    // One-shot: every rank reads every input. Only safe when no rank writes
    // an output that is also an input.
    if (peers.anyInPlace()) return false;
    for (int peer = 0; peer < nranks; ++peer) sources[peer] = peers.send(peer);
    reduce(call.recv, sources.data(), nranks, call.count, call.datatype, call.op, nranks);
    step.finishTogether();
    return true;
  }
  // Two-shot: each rank reduces its slice of every input into its own
  // output, then copies the other slices from their owners' outputs.
  Slice mine = sliceOf(call.count, nranks, shm.self(), size);
  for (int peer = 0; peer < nranks; ++peer) sources[peer] = peers.send(peer) + mine.begin * size;
  reduce(bytesAt(call.recv, mine.begin, size), sources.data(), nranks, mine.end - mine.begin,
         call.datatype, call.op, nranks);
  step.publishReduced();
  step.awaitReduced();
  for (int peer = 0; peer < nranks; ++peer) {
    if (peer == shm.self()) continue;
    Slice theirs = sliceOf(call.count, nranks, peer, size);
    std::memcpy(bytesAt(call.recv, theirs.begin, size), peers.recv(peer) + theirs.begin * size,
                (theirs.end - theirs.begin) * size);
  }
  step.finishTogether();
  return true;
}

bool reduceZeroCopy(ShmTransport& shm, uint32_t& rounds, const Call& call) {
  const size_t bytes = call.count * datatypeSize(call.datatype);
  const int nranks = shm.size();
  Step step(shm, rounds, call);
  Peers peers(shm, step, call, bytes, bytes);
  if (!peers.allSendShared()) return false;
  if (shm.commRank(shm.self()) == call.root) {
    std::vector<const void*> sources(nranks);
    for (int peer = 0; peer < nranks; ++peer) sources[peer] = peers.send(peer);
    reduce(call.recv, sources.data(), nranks, call.count, call.datatype, call.op, nranks);
  }
  step.finishTogether();
  return true;
}

bool broadcastZeroCopy(ShmTransport& shm, uint32_t& rounds, const Call& call) {
  const size_t bytes = call.count * datatypeSize(call.datatype);
  Step step(shm, rounds, call);
  Peers peers(shm, step, call, bytes, bytes);
  const int root = shm.indexOf(call.root);
  if (!peers.sendShared(root) && !shm.canReadPeerMemory()) return false;
  peers.copySend(root, 0, call.recv, bytes);
  step.finishTogether();
  return true;
}

bool allGatherZeroCopy(ShmTransport& shm, uint32_t& rounds, const Call& call) {
  const size_t bytes = call.count * datatypeSize(call.datatype);
  const int nranks = shm.size();
  Step step(shm, rounds, call);
  Peers peers(shm, step, call, bytes, bytes * nranks);
  if (!peers.allSendShared() && !shm.canReadPeerMemory()) return false;
  for (int peer = 0; peer < nranks; ++peer)
    peers.copySend(peer, 0, static_cast<char*>(call.recv) + peer * bytes, bytes);
  step.finishTogether();
  return true;
}

bool reduceScatterZeroCopy(ShmTransport& shm, uint32_t& rounds, const Call& call) {
  const size_t bytes = call.count * datatypeSize(call.datatype);
  const int nranks = shm.size();
  Step step(shm, rounds, call);
  Peers peers(shm, step, call, bytes * nranks, bytes);
  if (!peers.allSendShared()) return false;
  std::vector<const void*> sources(nranks);
  for (int peer = 0; peer < nranks; ++peer) sources[peer] = peers.send(peer) + shm.self() * bytes;
  reduce(call.recv, sources.data(), nranks, call.count, call.datatype, call.op, nranks);
  step.finishTogether();
  return true;
}

}  // namespace mojoccl
