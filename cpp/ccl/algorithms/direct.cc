#include "direct.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "../datatypes.h"
#include "../kernels.h"
#include "step.h"

namespace mojoccl {
namespace {

// Calls `body(offset, count)` for each chunk of at most `perRound` elements;
// once with count 0 for an empty message, so that ranks still meet and
// compare their calls.
template <typename Body>
void forEachChunk(size_t total, size_t perRound, Body body) {
  size_t offset = 0;
  do {
    size_t count = std::min(perRound, total - offset);
    body(offset, count);
    offset += count;
  } while (offset < total);
}

struct Slice {
  size_t begin;
  size_t end;
};

// Slice `part` of `count` elements cut into `parts`, starting on 64-byte
// boundaries so that each rank's kernel runs on whole vectors.
Slice sliceOf(size_t count, int parts, int part, size_t elementSize) {
  size_t unit = std::max<size_t>(1, 64 / elementSize);
  size_t units = (count + unit - 1) / unit;
  size_t perPart = (units + parts - 1) / parts * unit;
  size_t begin = std::min(count, perPart * part);
  return {begin, std::min(count, begin + perPart)};
}

const char* bytesAt(const void* base, size_t elements, size_t elementSize) {
  return static_cast<const char*>(base) + elements * elementSize;
}
char* bytesAt(void* base, size_t elements, size_t elementSize) {
  return static_cast<char*>(base) + elements * elementSize;
}

}  // namespace

void allReduceOneShot(ShmTransport& shm, uint32_t& rounds, const Call& call) {
  const size_t size = datatypeSize(call.datatype);
  const int nranks = shm.size();
  std::vector<const void*> sources(nranks);
  forEachChunk(call.count, shm.slotBytes() / size, [&](size_t offset, size_t count) {
    Step step(shm, rounds, call);
    step.shareCopyOf(bytesAt(call.send, offset, size), count * size);
    for (int peer = 0; peer < nranks; ++peer) sources[peer] = step.of(peer);
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
    std::memcpy(bytesAt(call.recv, offset, size), step.of(call.root), count * size);
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
