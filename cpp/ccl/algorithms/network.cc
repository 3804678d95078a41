#include "network.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../datatypes.h"
#include "../error.h"
#include "../kernels.h"
#include "layout.h"

namespace mojoccl {

namespace {

// A message (a ring step's slice, a block, a broadcast) travels in
// segments (FabricTransport::segmentFor): several in flight keep the wire
// busy, and the reduction of one overlaps the transfer of the next.
struct Segment {
  Slice slice;
  FabricTransport::Ticket arrival = 0;
};

std::vector<Segment> segmentsOf(const NetworkGroup& group, Slice slice, size_t elementSize) {
  std::vector<Segment> segments;
  for (Slice piece : segmentSlices(group, slice, elementSize)) segments.push_back({piece});
  return segments;
}

size_t bytesOf(Slice slice, size_t elementSize) { return (slice.end - slice.begin) * elementSize; }

// The reduction of a segment goes in blocks of about this much, the
// transport polled between them: messages in flight keep moving meanwhile.
constexpr size_t kReduceBlockBytes = size_t{128} << 10;

// dst = op(first, second) over `slice` (first, second and dst at its start),
// polling the group's transport between blocks.
void reduceWhilePolling(const NetworkGroup& group, void* dst, const void* first, const void* second, Slice slice,
                        ncclDataType_t datatype, ncclRedOp_t op) {
  const size_t size = datatypeSize(datatype);
  const size_t perBlock = std::max<size_t>(1, kReduceBlockBytes / size);
  forEachChunk(slice.end - slice.begin, perBlock, [&](size_t offset, size_t count) {
    if (offset > 0) group.fabric.poll(group.what);
    const void* sources[2] = {bytesAt(first, offset, size), bytesAt(second, offset, size)};
    reduce(bytesAt(dst, offset, size), sources, 2, count, datatype, op, 1);
  });
}

}  // namespace

std::vector<Slice> segmentSlices(const NetworkGroup& group, Slice slice, size_t elementSize) {
  const size_t bytes = (slice.end - slice.begin) * elementSize;
  const size_t perSegment = std::max<size_t>(1, group.fabric.segmentFor(bytes) / elementSize);
  std::vector<Slice> segments;
  forEachPiece(slice.end - slice.begin, perSegment, [&](size_t offset, size_t count) {
    segments.push_back({slice.begin + offset, slice.begin + offset + count});
  });
  return segments;
}

void networkReduceScatter(const NetworkGroup& group, const RingBuffers& buffers, const std::vector<Slice>& slices,
                          int shift, ncclDataType_t datatype, ncclRedOp_t op, const std::function<void(Slice)>& whole) {
  const int n = group.size();
  if (n == 1) return;
  FabricTransport& fabric = group.fabric;
  const size_t size = datatypeSize(datatype);
  const int next = group.next(), previous = group.previous();
  // At step s we pass on slice (self + shift - 1 - s) and fold in the one
  // behind it, so that after n - 1 steps slice (self + shift) is whole.
  auto slice = [&](int step) { return slices[(((group.self + shift - 1 - step) % n) + n) % n]; };
  auto sendOn = [&](const void* from, Slice piece) {
    return fabric.postSend(next, bytesAt(from, piece.begin, size), bytesOf(piece, size));
  };
  // Two buffers for the slices arriving from behind: the next step's
  // receives are posted while this step's segments are folded in.
  auto receiveStep = [&](int step) {
    const Slice in = slice(step + 1);
    char* into = group.room.get(step % 2, bytesOf(in, size));
    std::vector<Segment> segments = segmentsOf(group, in, size);
    for (Segment& segment : segments)
      segment.arrival = fabric.postRecv(previous, into + (segment.slice.begin - in.begin) * size,
                                        bytesOf(segment.slice, size));
    return segments;
  };
  std::vector<FabricTransport::Ticket> sent;
  std::vector<Segment> arriving = receiveStep(0);
  const Slice mine = slices[(group.self + shift) % n];
  auto destination = [&](bool last, Slice piece) {
    return last ? bytesAt(buffers.result, piece.begin - mine.begin, size) : bytesAt(buffers.partial, piece.begin, size);
  };
  for (const Segment& segment : segmentsOf(group, slice(0), size))
    sent.push_back(sendOn(buffers.source, segment.slice));
  for (int step = 0; step < n - 1; ++step) {
    std::vector<Segment> following = step + 1 < n - 1 ? receiveStep(step + 1) : std::vector<Segment>{};
    const Slice in = slice(step + 1);
    const char* from = group.room.get(step % 2, 0);
    const bool last = step + 1 == n - 1;
    for (const Segment& segment : arriving) {
      fabric.waitFor(segment.arrival, group.what);
      // Each slice is folded here once, so our operand is always our own.
      reduceWhilePolling(group, destination(last, segment.slice), bytesAt(buffers.source, segment.slice.begin, size),
                         from + (segment.slice.begin - in.begin) * size, segment.slice, datatype, op);
      // A folded segment is what the next step sends on; after the last
      // step it is whole, and the caller's.
      if (!last)
        sent.push_back(sendOn(buffers.partial, segment.slice));
      else if (whole)
        whole(segment.slice);
    }
    arriving = std::move(following);
  }
  for (FabricTransport::Ticket ticket : sent) fabric.waitFor(ticket, group.what);
}

namespace {

// The all-gather half of a ring, in place: member m holds
// slices[(m + shift) % size] and has sent it on (or is sending it); it
// receives the others from behind, passing each segment on as it lands,
// all but the last one it receives.
void passRoundTheRing(const NetworkGroup& group, void* data, const std::vector<Slice>& slices, int shift,
                      size_t elementSize) {
  const int n = group.size();
  FabricTransport& fabric = group.fabric;
  auto slice = [&](int step) { return slices[(((group.self + shift - 1 - step) % n) + n) % n]; };
  std::vector<std::vector<Segment>> gathered;
  for (int step = 0; step < n - 1; ++step) {
    gathered.push_back(segmentsOf(group, slice(step), elementSize));
    for (Segment& segment : gathered.back())
      segment.arrival = fabric.postRecv(group.previous(), bytesAt(data, segment.slice.begin, elementSize),
                                        bytesOf(segment.slice, elementSize));
  }
  for (int step = 0; step + 1 < n - 1; ++step)
    for (const Segment& segment : gathered[step]) {
      fabric.waitFor(segment.arrival, group.what);
      fabric.postSend(group.next(), bytesAt(data, segment.slice.begin, elementSize), bytesOf(segment.slice, elementSize));
    }
  fabric.waitAll(group.what);
}

}  // namespace

void networkAllReduce(const NetworkGroup& group, void* data, size_t count, ncclDataType_t datatype,
                      ncclRedOp_t op) {
  const int n = group.size();
  if (n == 1) return;
  const size_t size = datatypeSize(datatype);
  std::vector<Slice> slices;
  for (int part = 0; part < n; ++part) slices.push_back(sliceOf(count, n, part, size));
  // Reduce-scatter, ending with slice self + 1 whole here; each of its
  // segments starts round the ring again as soon as it is. Then the whole
  // slices travel once round the ring (the reduce-scatter's sends from the
  // slices written there are complete).
  const RingBuffers inPlace{data, data, bytesAt(data, slices[(group.self + 1) % n].begin, size)};
  networkReduceScatter(group, inPlace, slices, 1, datatype, op, [&](Slice piece) {
    group.fabric.postSend(group.next(), bytesAt(data, piece.begin, size), bytesOf(piece, size));
  });
  passRoundTheRing(group, data, slices, 1, size);
}

namespace {

// `slice` of `buffer` to or from group member `member`, in segments (the
// same on both sides, so each receive matches its send): their tickets.
std::vector<FabricTransport::Ticket> postSegments(const NetworkGroup& group, bool isSend, int member, void* buffer,
                                                  Slice slice, size_t elementSize) {
  std::vector<FabricTransport::Ticket> tickets;
  for (const Segment& segment : segmentsOf(group, slice, elementSize)) {
    char* at = bytesAt(buffer, segment.slice.begin, elementSize);
    const size_t bytes = bytesOf(segment.slice, elementSize);
    tickets.push_back(isSend ? group.fabric.postSend(group.ranks[member], at, bytes)
                             : group.fabric.postRecv(group.ranks[member], at, bytes));
  }
  return tickets;
}

// Folds member `partner`'s `slice` into ours (`incoming` the same shape as
// `data`), the lower member's operand first, segment by segment as each
// lands; where `sendOurs` is set, that slice of ours goes to the partner
// too (a swap), and a segment is overwritten only once it has left.
void combineSlice(const NetworkGroup& group, int partner, void* data, void* incoming, Slice slice,
                  bool sendOurs, ncclDataType_t datatype, ncclRedOp_t op) {
  const size_t size = datatypeSize(datatype);
  const auto arrivals = postSegments(group, false, partner, incoming, slice, size);
  const auto departures = sendOurs ? postSegments(group, true, partner, data, slice, size)
                                   : std::vector<FabricTransport::Ticket>{};
  const std::vector<Segment> segments = segmentsOf(group, slice, size);
  for (size_t i = 0; i < segments.size(); ++i) {
    const Slice piece = segments[i].slice;
    group.fabric.waitFor(arrivals[i], group.what);
    if (sendOurs) group.fabric.waitFor(departures[i], group.what);
    const void* ours = bytesAt(data, piece.begin, size);
    const void* theirs = bytesAt(incoming, piece.begin, size);
    const bool oursFirst = group.self < partner;
    reduceWhilePolling(group, bytesAt(data, piece.begin, size), oursFirst ? ours : theirs,
                       oursFirst ? theirs : ours, piece, datatype, op);
  }
}

int largestPowerOfTwoUpTo(int n) {
  int powerOfTwo = 1;
  while (powerOfTwo * 2 <= n) powerOfTwo *= 2;
  return powerOfTwo;
}

// Runs `core` (an all-reduce among the group's first p members, p the
// largest power of two up to its size) so that every member ends with the
// result: member p + i first folds its data into member i, and gets the
// result back from it at the end (two steps more where the size is not a
// power of two).
template <typename Core>
void withExtraMembersFolded(const NetworkGroup& group, void* data, size_t count, ncclDataType_t datatype,
                            ncclRedOp_t op, char* incoming, Core core) {
  const size_t size = datatypeSize(datatype);
  const int powerOfTwo = largestPowerOfTwoUpTo(group.size());
  const int self = group.self;
  const Slice whole{0, count};
  if (self >= powerOfTwo) {
    postSegments(group, true, self - powerOfTwo, data, whole, size);
    group.fabric.waitAll(group.what);
    postSegments(group, false, self - powerOfTwo, data, whole, size);
    group.fabric.waitAll(group.what);
    return;
  }
  const bool foldsIn = self + powerOfTwo < group.size();
  if (foldsIn) combineSlice(group, self + powerOfTwo, data, incoming, whole, false, datatype, op);
  core(powerOfTwo);
  if (foldsIn) {
    postSegments(group, true, self + powerOfTwo, data, whole, size);
    group.fabric.waitAll(group.what);
  }
}

}  // namespace

void networkAllReduceRecursiveDoubling(const NetworkGroup& group, void* data, size_t count,
                                       ncclDataType_t datatype, ncclRedOp_t op) {
  if (group.size() == 1) return;
  char* incoming = group.room.get(0, count * datatypeSize(datatype));
  withExtraMembersFolded(group, data, count, datatype, op, incoming, [&](int powerOfTwo) {
    for (int distance = 1; distance < powerOfTwo; distance *= 2)
      combineSlice(group, group.self ^ distance, data, incoming, {0, count}, true, datatype, op);
  });
}

void networkAllReduceRabenseifner(const NetworkGroup& group, void* data, size_t count, ncclDataType_t datatype,
                                  ncclRedOp_t op) {
  if (group.size() == 1) return;
  const size_t size = datatypeSize(datatype);
  char* incoming = group.room.get(0, count * size);
  withExtraMembersFolded(group, data, count, datatype, op, incoming, [&](int powerOfTwo) {
    const int self = group.self;
    // Member i ends the halving with part i whole; [first, last) are the
    // parts a member still holds a share of.
    auto parts = [&](int first, int last) {
      return Slice{sliceOf(count, powerOfTwo, first, size).begin, sliceOf(count, powerOfTwo, last - 1, size).end};
    };
    int first = 0, last = powerOfTwo;
    for (int distance = powerOfTwo / 2; distance >= 1; distance /= 2) {
      const int middle = (first + last) / 2;
      const bool upper = self & distance;
      const Slice kept = upper ? parts(middle, last) : parts(first, middle);
      const Slice given = upper ? parts(first, middle) : parts(middle, last);
      postSegments(group, true, self ^ distance, data, given, size);
      combineSlice(group, self ^ distance, data, incoming, kept, false, datatype, op);
      group.fabric.waitAll(group.what);  // the given half is written again in the gathering
      if (upper) first = middle; else last = middle;
    }
    // Recursive doubling of the whole parts: each swap doubles what a member holds.
    for (int distance = 1; distance < powerOfTwo; distance *= 2) {
      const int held = last - first;
      const bool upper = self & distance;
      const Slice theirs = upper ? parts(first - held, first) : parts(last, last + held);
      postSegments(group, false, self ^ distance, data, theirs, size);
      postSegments(group, true, self ^ distance, data, parts(first, last), size);
      group.fabric.waitAll(group.what);
      if (upper) first -= held; else last += held;
    }
  });
}

void networkReduceScatterHalving(const NetworkGroup& group, void* data, const std::vector<Slice>& slices,
                                 ncclDataType_t datatype, ncclRedOp_t op) {
  const int n = group.size();
  if (n == 1) return;
  const size_t size = datatypeSize(datatype);
  const int powerOfTwo = largestPowerOfTwoUpTo(n);
  // Members 2i and 2i + 1, for i < paired, act as one in the halving: the
  // first hands the second its data. Halving member v so stands for
  // members [firstOf(v), firstOf(v + 1)), whose slices are one range.
  const int paired = n - powerOfTwo;
  auto firstOf = [&](int v) { return v < paired ? 2 * v : v + paired; };
  auto parts = [&](int first, int last) {
    return Slice{slices[firstOf(first)].begin, slices[firstOf(last) - 1].end};
  };
  const int self = group.self;
  const Slice whole = parts(0, powerOfTwo);
  if (self < 2 * paired && self % 2 == 0) {
    postSegments(group, true, self + 1, data, whole, size);
    group.fabric.waitAll(group.what);
    postSegments(group, false, self + 1, data, slices[self], size);
    group.fabric.waitAll(group.what);
    return;
  }
  char* incoming = group.room.get(0, whole.end * size);
  const bool holdsTwo = self < 2 * paired;
  if (holdsTwo) combineSlice(group, self - 1, data, incoming, whole, false, datatype, op);
  const int halving = holdsTwo ? self / 2 : self - paired;
  int first = 0, last = powerOfTwo;
  for (int distance = powerOfTwo / 2; distance >= 1; distance /= 2) {
    const int middle = (first + last) / 2;
    const bool upper = halving & distance;
    const int partner = firstOf((halving ^ distance) + 1) - 1;
    const Slice kept = upper ? parts(middle, last) : parts(first, middle);
    const Slice given = upper ? parts(first, middle) : parts(middle, last);
    postSegments(group, true, partner, data, given, size);
    combineSlice(group, partner, data, incoming, kept, false, datatype, op);
    group.fabric.waitAll(group.what);
    if (upper) first = middle; else last = middle;
  }
  if (holdsTwo) {
    postSegments(group, true, self - 1, data, slices[self - 1], size);
    group.fabric.waitAll(group.what);
  }
}

namespace {

// Where a broadcast's member gets the data from and passes it on to, in
// members numbered from the root (relative 0).
struct BroadcastLinks {
  int parent = -1;            // relative; -1 at the root
  std::vector<int> children;  // relative, in the order they are sent to
};

BroadcastLinks broadcastLinks(int relative, int n, NetworkAlgorithm shape) {
  BroadcastLinks links;
  if (shape == NetworkAlgorithm::Ring) {
    if (relative > 0) links.parent = relative - 1;
    if (relative + 1 < n) links.children.push_back(relative + 1);
    return links;
  }
  // The binomial tree: member r gets the data from r less its highest bit
  // and passes it to r + 2^k for each 2^k below that bit, the largest
  // subtree first.
  int mask = 1;
  while (mask < n && !(relative & mask)) mask <<= 1;
  if (relative > 0) links.parent = relative - mask;
  for (int below = mask >> 1; below > 0; below >>= 1)
    if (relative + below < n) links.children.push_back(relative + below);
  return links;
}

}  // namespace

void networkBroadcast(const NetworkGroup& group, void* data, size_t bytes, int root, NetworkAlgorithm shape) {
  const int n = group.size();
  if (n == 1) return;
  FabricTransport& fabric = group.fabric;
  const int relative = (group.self - root + n) % n;
  auto member = [&](int r) { return group.ranks[(r + root) % n]; };
  const BroadcastLinks links = broadcastLinks(relative, n, shape);
  const bool isRoot = links.parent < 0;
  // Segment by segment, each passed on as it lands. One way, eager pieces
  // stay fastest to a larger size than in swaps: between 2 nodes over tcp
  // (and alike over net), 32 MiB 6.1 -> 4.5 ms, 64 MiB 13.7 -> 10.0 ms
  // against 1 MiB pieces; 128 MiB alike, 256 MiB 11-25% slower.
  constexpr size_t kBroadcastEagerPiecesUpTo = size_t{64} << 20;
  std::vector<std::pair<char*, size_t>> segments;
  forEachPiece(bytes, group.fabric.segmentFor(bytes, kBroadcastEagerPiecesUpTo), [&](size_t offset, size_t length) {
    segments.push_back({static_cast<char*>(data) + offset, length});
  });
  std::vector<FabricTransport::Ticket> arrivals;
  if (!isRoot)
    for (const auto& [at, length] : segments) arrivals.push_back(fabric.postRecv(member(links.parent), at, length));
  for (size_t i = 0; i < segments.size(); ++i) {
    if (!isRoot) fabric.waitFor(arrivals[i], group.what);
    for (int child : links.children) fabric.postSend(member(child), segments[i].first, segments[i].second);
  }
  fabric.waitAll(group.what);
}

void networkAllGather(const NetworkGroup& group, char* data, const std::vector<Slice>& blocks) {
  // In segments, as the ring's, several in flight (between 2 nodes, 1 MiB
  // segments took 16 MiB in all 11% faster than one message each way,
  // 64 MiB 28%).
  for (int member = 0; member < group.size(); ++member)
    if (member != group.self) postSegments(group, false, member, data, blocks[member], 1);
  for (int member = 0; member < group.size(); ++member)
    if (member != group.self) postSegments(group, true, member, data, blocks[group.self], 1);
  group.fabric.waitAll(group.what);
}

void networkAllGatherRing(const NetworkGroup& group, char* data, const std::vector<Slice>& blocks) {
  if (group.size() == 1) return;
  postSegments(group, true, (group.self + 1) % group.size(), data, blocks[group.self], 1);
  passRoundTheRing(group, data, blocks, 0, 1);
}

namespace {

// A message of any length up to its receive's room goes in pieces the
// provider sends at once (a larger message costs a rendezvous round
// trip): whole pieces, then one shorter (empty where the message is whole
// pieces), which tells the receiver that it is complete. Sender and
// receiver so count the same messages whatever the length; most frames
// are one short piece.
void sendInPieces(const NetworkGroup& group, int member, const char* data, size_t bytes, size_t piece) {
  for (size_t offset = 0;; offset += piece) {
    const size_t length = std::min(piece, bytes - offset);
    group.fabric.postSend(group.ranks[member], data + offset, length);
    if (length < piece) break;
  }
}

// One such message on its way in: its first piece's receive is posted at
// construction (before the peer sends, where the caller can), the rest as
// each piece lands. Not to be moved once posted: the provider writes
// `pieceBytes`.
struct PiecedReceive {
  PiecedReceive(const NetworkGroup& group, int member, char* into, size_t roomBytes, size_t piece)
      : group(group), member(member), into(into), roomBytes(roomBytes), piece(piece) {
    postNext();
  }
  PiecedReceive(const PiecedReceive&) = delete;

  // Waits for the last piece; the message's length.
  size_t complete() {
    for (;;) {
      group.fabric.waitFor(arrival, group.what);
      received += pieceBytes;
      if (pieceBytes < piece) return received;
      postNext();
    }
  }

 private:
  void postNext() {
    arrival = group.fabric.postRecvUpTo(group.ranks[member], into + received,
                                        std::min(piece, roomBytes - received), &pieceBytes);
  }

  const NetworkGroup& group;
  const int member;
  char* const into;
  const size_t roomBytes, piece;
  size_t received = 0, pieceBytes = 0;
  FabricTransport::Ticket arrival = 0;
};

size_t pieceFor(const NetworkGroup& group, size_t roomBytes) { return std::min(group.fabric.eagerMessage(), roomBytes); }

// `outgoing` to member `to` while a message of up to incoming.size() bytes
// comes from member `from` into `incoming`; its length. Returns once both
// have moved (`outgoing` may then be refilled).
size_t swap(const NetworkGroup& group, int to, const std::vector<char>& outgoing, int from,
            std::vector<char>& incoming) {
  size_t arrived = 0;
  if (group.sockets) {
    group.sockets->exchange({{group.ranks[to], outgoing.data(), outgoing.size()}},
                            {{group.ranks[from], incoming.data(), incoming.size(), &arrived}}, group.what);
    return arrived;
  }
  // Both sides cut the message by the room for the frames, which they
  // compute alike: the pieces match.
  const size_t piece = pieceFor(group, incoming.size());
  PiecedReceive arriving(group, from, incoming.data(), incoming.size(), piece);
  sendInPieces(group, to, outgoing.data(), outgoing.size(), piece);
  arrived = arriving.complete();
  group.fabric.waitAll(group.what);  // our sends
  return arrived;
}

}  // namespace

void networkExchangeFrames(const NetworkGroup& group, const std::vector<char*>& frames, size_t sendBytes,
                           size_t roomBytes, std::vector<size_t>& received) {
  const std::vector<const char*> outgoing(group.size(), frames[group.self]);
  const std::vector<size_t> outgoingBytes(group.size(), sendBytes);
  networkSendFrames(group, outgoing, outgoingBytes, frames, roomBytes, received);
  received[group.self] = sendBytes;
}

void networkSendFrames(const NetworkGroup& group, const std::vector<const char*>& outgoing,
                       const std::vector<size_t>& outgoingBytes, const std::vector<char*>& frames, size_t roomBytes,
                       std::vector<size_t>& received) {
  const int n = group.size(), self = group.self;
  received.assign(n, 0);
  if (group.sockets) {
    std::vector<LeaderSockets::Send> sends;
    std::vector<LeaderSockets::Receive> receives;
    for (int member = 0; member < n; ++member) {
      if (member == self) continue;
      sends.push_back({group.ranks[member], outgoing[member], outgoingBytes[member]});
      receives.push_back({group.ranks[member], frames[member], roomBytes, &received[member]});
    }
    return group.sockets->exchange(sends, receives, group.what);
  }
  const size_t piece = pieceFor(group, roomBytes);
  std::vector<std::unique_ptr<PiecedReceive>> arriving(n);
  for (int member = 0; member < n; ++member)
    if (member != self) arriving[member] = std::make_unique<PiecedReceive>(group, member, frames[member], roomBytes, piece);
  for (int member = 0; member < n; ++member)
    if (member != self) sendInPieces(group, member, outgoing[member], outgoingBytes[member], piece);
  for (int member = 0; member < n; ++member)
    if (member != self) received[member] = arriving[member]->complete();
  group.fabric.waitAll(group.what);  // our sends
}

void networkGatherFrames(const NetworkGroup& group, const std::vector<char*>& frames, size_t sendBytes,
                         size_t roomBytes, std::vector<size_t>& received) {
  const int n = group.size(), self = group.self;
  received.assign(n, 0);
  received[self] = sendBytes;
  // Each frame travels with its length in front.
  using Length = uint64_t;
  const size_t slot = sizeof(Length) + roomBytes;
  std::vector<char> outgoing, incoming;
  // Bruck's all-gather: holding the frames of members self, self + 1, ...,
  // self + held - 1, a member sends as many of them as are still missing
  // elsewhere to member self - held and gets the next ones from self + held.
  for (int held = 1; held < n;) {
    const int count = std::min(held, n - held);
    const int to = (self - held + n) % n, from = (self + held) % n;
    incoming.resize(count * slot);
    outgoing.clear();
    for (int k = 0; k < count; ++k) {
      const int member = (self + k) % n;
      const Length length = received[member];
      outgoing.insert(outgoing.end(), reinterpret_cast<const char*>(&length),
                      reinterpret_cast<const char*>(&length) + sizeof length);
      outgoing.insert(outgoing.end(), frames[member], frames[member] + length);
    }
    const size_t arrived = swap(group, to, outgoing, from, incoming);
    size_t offset = 0;
    for (int k = 0; k < count; ++k) {
      const int member = (self + held + k) % n;
      Length length = 0;
      if (offset + sizeof length <= arrived) std::memcpy(&length, incoming.data() + offset, sizeof length);
      offset += sizeof length;
      if (length > roomBytes || offset + length > arrived)
        fail(ncclInternalError, group.what + ": the frames gathered from rank " + std::to_string(group.ranks[from]) +
                                    " are cut short (" + std::to_string(arrived) + " bytes)");
      std::memcpy(frames[member], incoming.data() + offset, length);
      received[member] = length;
      offset += length;
    }
    held += count;
  }
}

}  // namespace mojoccl
