#include "algorithms/direct.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/layout.h"
#include "algorithms/step.h"
#include "base/datatypes.h"
#include "base/reduce.h"

namespace mojoccl {

void allReduceOneShot(ShmTransport& shm, uint32_t& rounds, const Call& call) {
  const size_t size = datatypeSize(call.datatype);
  const int nranks = shm.size();
  std::vector<const void*> sources(nranks);
  forEachChunk(call.count, shm.slotBytes() / size, [&](size_t offset, size_t count) {
    Step step(shm, rounds, call);
    step.shareCopyOf(bytesAt(call.send, offset, size), count * size);
    // Our own part from our input: it is in cache, our slot copy may not be.
    for (int peer = 0; peer < nranks; ++peer) sources[peer] = step.of(peer);
    sources[shm.self()] = bytesAt(call.send, offset, size);
    reduce(bytesAt(call.recv, offset, size), sources.data(), nranks, count, call.datatype, call.op,
           nranks);
  });
}

void allReduceTwoShot(ShmTransport& shm, uint32_t& rounds, const Call& call) {
  const size_t size = datatypeSize(call.datatype);
  const int nranks = shm.size();
  std::vector<const void*> sources(nranks);
  forEachChunk(call.count, shm.slotBytes() / size, [&](size_t offset, size_t count) {
    Step step(shm, rounds, call);
    step.shareCopyOf(bytesAt(call.send, offset, size), count * size);
    // Reduce my slice of every rank's chunk into my own slot: only I read
    // that slice of any slot until I publish Reduced.
    Slice mine = sliceOf(count, nranks, shm.self(), size);
    for (int peer = 0; peer < nranks; ++peer) sources[peer] = step.of(peer) + mine.begin * size;
    reduce(step.mine() + mine.begin * size, sources.data(), nranks, mine.end - mine.begin,
           call.datatype, call.op, nranks);
    step.publishReduced();
    step.awaitReduced();
    for (int peer = 0; peer < nranks; ++peer) {
      Slice theirs = sliceOf(count, nranks, peer, size);
      std::memcpy(bytesAt(call.recv, offset + theirs.begin, size), step.of(peer) + theirs.begin * size,
                  (theirs.end - theirs.begin) * size);
    }
  });
}

void reduceDirect(ShmTransport& shm, uint32_t& rounds, const Call& call) {
  const size_t size = datatypeSize(call.datatype);
  const int nranks = shm.size();
  const bool isRoot = shm.commRank(shm.self()) == call.root;
  std::vector<const void*> sources(nranks);
  forEachChunk(call.count, shm.slotBytes() / size, [&](size_t offset, size_t count) {
    Step step(shm, rounds, call);
    step.shareCopyOf(bytesAt(call.send, offset, size), count * size);
    if (!isRoot) return;
    for (int peer = 0; peer < nranks; ++peer) sources[peer] = step.of(peer);
    reduce(bytesAt(call.recv, offset, size), sources.data(), nranks, count, call.datatype, call.op,
           nranks);
  });
}

void broadcastDirect(ShmTransport& shm, uint32_t& rounds, const Call& call) {
  const size_t size = datatypeSize(call.datatype);
  const bool isRoot = shm.commRank(shm.self()) == call.root;
  forEachChunk(call.count, shm.slotBytes() / size, [&](size_t offset, size_t count) {
    Step step(shm, rounds, call);
    if (isRoot) {
      step.shareCopyOf(bytesAt(call.send, offset, size), count * size);
      if (call.recv != call.send)
        std::memcpy(bytesAt(call.recv, offset, size), bytesAt(call.send, offset, size), count * size);
      return;
    }
    step.share();
    std::memcpy(bytesAt(call.recv, offset, size), step.of(shm.indexOf(call.root)), count * size);
  });
}

void allGatherDirect(ShmTransport& shm, uint32_t& rounds, const Call& call) {
  const size_t size = datatypeSize(call.datatype);
  const int nranks = shm.size();
  forEachChunk(call.count, shm.slotBytes() / size, [&](size_t offset, size_t count) {
    Step step(shm, rounds, call);
    step.shareCopyOf(bytesAt(call.send, offset, size), count * size);
    for (int peer = 0; peer < nranks; ++peer) {
      char* destination = bytesAt(call.recv, peer * call.count + offset, size);
      if (destination != bytesAt(call.send, offset, size))  // in place: already there
        std::memcpy(destination, step.of(peer), count * size);
    }
  });
}

void reduceScatterDirect(ShmTransport& shm, uint32_t& rounds, const Call& call) {
  const size_t size = datatypeSize(call.datatype);
  const int nranks = shm.size();
  std::vector<const void*> sources(nranks);
  // A round carries the same chunk of every rank's block: nranks pieces.
  const size_t perRound = std::max<size_t>(1, shm.slotBytes() / size / nranks);
  forEachChunk(call.count, perRound, [&](size_t offset, size_t count) {
    Step step(shm, rounds, call);
    for (int block = 0; block < nranks; ++block)
      std::memcpy(step.mine() + block * count * size,
                  bytesAt(call.send, block * call.count + offset, size), count * size);
    step.share();
    for (int peer = 0; peer < nranks; ++peer) sources[peer] = step.of(peer) + shm.self() * count * size;
    reduce(bytesAt(call.recv, offset, size), sources.data(), nranks, count, call.datatype, call.op,
           nranks);
  });
}

}  // namespace mojoccl
