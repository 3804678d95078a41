#include "network.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../datatypes.h"
#include "../error.h"
#include "../kernels.h"
#include "layout.h"

namespace mojoccl {

namespace {

// A ring step's slice travels in segments of about this much: several in
// flight keep the wire busy, and the reduction of one overlaps the
// transfer of the next.
constexpr size_t kSegmentBytes = size_t{1} << 20;

struct Segment {
  Slice slice;
  FabricTransport::Ticket arrival = 0;
};

// `slice` cut into segments (one, if empty: an empty message still travels).
std::vector<Segment> segmentsOf(Slice slice, size_t elementSize) {
  const size_t perSegment = std::max<size_t>(1, kSegmentBytes / elementSize);
  std::vector<Segment> segments;
  forEachChunk(slice.end - slice.begin, perSegment, [&](size_t offset, size_t count) {
    segments.push_back({{slice.begin + offset, slice.begin + offset + count}});
  });
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

void networkReduceScatter(const NetworkGroup& group, void* data, const std::vector<Slice>& slices, int shift,
                          ncclDataType_t datatype, ncclRedOp_t op, const std::function<void(Slice)>& whole) {
  const int n = group.size();
  if (n == 1) return;
  FabricTransport& fabric = group.fabric;
  const size_t size = datatypeSize(datatype);
  const int next = group.next(), previous = group.previous();
  // At step s we pass on slice (self + shift - 1 - s) and fold in the one
  // behind it, so that after n - 1 steps slice (self + shift) is whole.
  auto slice = [&](int step) { return slices[(((group.self + shift - 1 - step) % n) + n) % n]; };
  auto sendOn = [&](Slice piece) { return fabric.postSend(next, bytesAt(data, piece.begin, size), bytesOf(piece, size)); };
  // Two buffers for the slices arriving from behind: the next step's
  // receives are posted while this step's segments are folded in.
  std::vector<char> incoming[2];
  auto receiveStep = [&](int step) {
    const Slice in = slice(step + 1);
    std::vector<char>& into = incoming[step % 2];
    into.resize(bytesOf(in, size));
    std::vector<Segment> segments = segmentsOf(in, size);
    for (Segment& segment : segments)
      segment.arrival = fabric.postRecv(previous, into.data() + (segment.slice.begin - in.begin) * size,
                                        bytesOf(segment.slice, size));
    return segments;
  };
  std::vector<FabricTransport::Ticket> sent;
  std::vector<Segment> arriving = receiveStep(0);
  for (const Segment& segment : segmentsOf(slice(0), size)) sent.push_back(sendOn(segment.slice));
  for (int step = 0; step < n - 1; ++step) {
    std::vector<Segment> following = step + 1 < n - 1 ? receiveStep(step + 1) : std::vector<Segment>{};
    const Slice in = slice(step + 1);
    const char* from = incoming[step % 2].data();
    for (const Segment& segment : arriving) {
      fabric.waitFor(segment.arrival, group.what);
      reduceWhilePolling(group, bytesAt(data, segment.slice.begin, size), bytesAt(data, segment.slice.begin, size),
                         from + (segment.slice.begin - in.begin) * size, segment.slice, datatype, op);
      // A folded segment is what the next step sends on; after the last
      // step it is whole, and the caller's.
      if (step + 1 < n - 1)
        sent.push_back(sendOn(segment.slice));
      else if (whole)
        whole(segment.slice);
    }
    arriving = std::move(following);
  }
  for (FabricTransport::Ticket ticket : sent) fabric.waitFor(ticket, group.what);
}

void networkAllReduce(const NetworkGroup& group, void* data, size_t count, ncclDataType_t datatype,
                      ncclRedOp_t op) {
  const int n = group.size();
  if (n == 1) return;
  FabricTransport& fabric = group.fabric;
  const size_t size = datatypeSize(datatype);
  const int next = group.next(), previous = group.previous();
  std::vector<Slice> slices;
  for (int part = 0; part < n; ++part) slices.push_back(sliceOf(count, n, part, size));
  auto slice = [&](int index) { return slices[((index % n) + n) % n]; };
  auto sendOn = [&](Slice piece) { return fabric.postSend(next, bytesAt(data, piece.begin, size), bytesOf(piece, size)); };

  // Reduce-scatter, ending with slice self + 1 whole here; each of its
  // segments starts round the ring again as soon as it is.
  networkReduceScatter(group, data, slices, 1, datatype, op, [&](Slice piece) { sendOn(piece); });
  // All-gather: the whole slices travel once round the ring, each segment
  // passed on as it lands (the reduce-scatter's sends from the slices
  // written here are complete).
  std::vector<std::vector<Segment>> gathered;
  for (int step = 0; step < n - 1; ++step) {
    gathered.push_back(segmentsOf(slice(group.self - step), size));
    for (Segment& segment : gathered.back())
      segment.arrival = fabric.postRecv(previous, bytesAt(data, segment.slice.begin, size), bytesOf(segment.slice, size));
  }
  for (int step = 0; step + 1 < n - 1; ++step)
    for (const Segment& segment : gathered[step]) {
      fabric.waitFor(segment.arrival, group.what);
      sendOn(segment.slice);
    }
  fabric.waitAll(group.what);
}

void networkAllReduceRecursiveDoubling(const NetworkGroup& group, void* data, size_t count,
                                       ncclDataType_t datatype, ncclRedOp_t op) {
  const int n = group.size();
  if (n == 1) return;
  FabricTransport& fabric = group.fabric;
  const size_t size = datatypeSize(datatype);
  // Every message travels in the same segments, each receive matching its send.
  const std::vector<Segment> segments = segmentsOf({0, count}, size);
  auto post = [&](bool isSend, int member, void* buffer) {
    std::vector<FabricTransport::Ticket> tickets;
    for (const Segment& segment : segments) {
      char* at = bytesAt(buffer, segment.slice.begin, size);
      const size_t bytes = bytesOf(segment.slice, size);
      tickets.push_back(isSend ? fabric.postSend(group.ranks[member], at, bytes)
                               : fabric.postRecv(group.ranks[member], at, bytes));
    }
    return tickets;
  };
  int powerOfTwo = 1;
  while (powerOfTwo * 2 <= n) powerOfTwo *= 2;
  const int self = group.self;
  if (self >= powerOfTwo) {  // folded into member self - powerOfTwo, which hands back the result
    post(true, self - powerOfTwo, data);
    fabric.waitAll(group.what);
    post(false, self - powerOfTwo, data);
    fabric.waitAll(group.what);
    return;
  }
  std::vector<char> incoming(count * size);
  // Combines member `partner`'s data into ours, the lower member's operand
  // first, segment by segment as each lands (and, where ours goes to it
  // too, once that segment of ours has left).
  auto combineWith = [&](int partner, bool exchange) {
    const auto arrivals = post(false, partner, incoming.data());
    const auto departures = exchange ? post(true, partner, data) : std::vector<FabricTransport::Ticket>{};
    for (size_t i = 0; i < segments.size(); ++i) {
      const Slice slice = segments[i].slice;
      fabric.waitFor(arrivals[i], group.what);
      if (exchange) fabric.waitFor(departures[i], group.what);
      const void* ours = bytesAt(data, slice.begin, size);
      const void* theirs = bytesAt(incoming.data(), slice.begin, size);
      reduceWhilePolling(group, bytesAt(data, slice.begin, size), self < partner ? ours : theirs,
                         self < partner ? theirs : ours, slice, datatype, op);
    }
  };
  const bool foldsIn = self + powerOfTwo < n;
  if (foldsIn) combineWith(self + powerOfTwo, false);
  for (int distance = 1; distance < powerOfTwo; distance *= 2) combineWith(self ^ distance, true);
  if (foldsIn) {
    post(true, self + powerOfTwo, data);
    fabric.waitAll(group.what);
  }
}

void networkBroadcast(const NetworkGroup& group, void* data, size_t bytes, int root) {
  const int n = group.size();
  if (n == 1) return;
  FabricTransport& fabric = group.fabric;
  // In members numbered from the root, member r gets the data from r less
  // its highest bit and passes it to r + 2^k for each 2^k below that bit,
  // the largest subtree first: log2(n) rounds, the root sending log2(n)
  // copies rather than n - 1.
  const int relative = (group.self - root + n) % n;
  auto member = [&](int r) { return group.ranks[(r + root) % n]; };
  int mask = 1;
  while (mask < n && !(relative & mask)) mask <<= 1;
  const bool isRoot = relative == 0;
  std::vector<int> children;
  for (int below = mask >> 1; below > 0; below >>= 1)
    if (relative + below < n) children.push_back(member(relative + below));
  // Segment by segment, each passed on as it lands.
  std::vector<std::pair<char*, size_t>> segments;
  forEachChunk(bytes, kSegmentBytes, [&](size_t offset, size_t length) {
    segments.push_back({static_cast<char*>(data) + offset, length});
  });
  std::vector<FabricTransport::Ticket> arrivals;
  if (!isRoot)
    for (const auto& [at, length] : segments) arrivals.push_back(fabric.postRecv(member(relative - mask), at, length));
  for (size_t i = 0; i < segments.size(); ++i) {
    if (!isRoot) fabric.waitFor(arrivals[i], group.what);
    for (int child : children) fabric.postSend(child, segments[i].first, segments[i].second);
  }
  fabric.waitAll(group.what);
}

void networkAllGather(const NetworkGroup& group, const std::vector<char*>& blocks,
                      const std::vector<size_t>& blockBytes) {
  for (int member = 0; member < group.size(); ++member)
    if (member != group.self) group.fabric.postRecv(group.ranks[member], blocks[member], blockBytes[member]);
  for (int member = 0; member < group.size(); ++member)
    if (member != group.self) group.fabric.postSend(group.ranks[member], blocks[group.self], blockBytes[group.self]);
  group.fabric.waitAll(group.what);
}

void networkExchangeFrames(const NetworkGroup& group, const std::vector<char*>& frames, size_t sendBytes,
                           size_t roomBytes, std::vector<size_t>& received) {
  FabricTransport& fabric = group.fabric;
  // A frame goes in pieces the provider sends at once (a larger message
  // costs a rendezvous round trip): whole pieces, then one shorter (empty
  // where the frame is whole pieces), which tells the receiver that the
  // frame is complete. Sender and receiver so count the same messages
  // whatever the frame; most frames are one short piece.
  const size_t piece = std::min(fabric.eagerMessage(), roomBytes);
  auto room = [&](size_t offset) { return std::min(piece, roomBytes - offset); };
  std::vector<FabricTransport::Ticket> arrival(group.size());
  received.assign(group.size(), 0);
  std::vector<size_t> pieceBytes(group.size());
  for (int member = 0; member < group.size(); ++member)
    if (member != group.self)
      arrival[member] = fabric.postRecvUpTo(group.ranks[member], frames[member], room(0), &pieceBytes[member]);
  for (int member = 0; member < group.size(); ++member) {
    if (member == group.self) continue;
    for (size_t offset = 0;; offset += piece) {
      const size_t bytes = std::min(piece, sendBytes - offset);
      fabric.postSend(group.ranks[member], frames[group.self] + offset, bytes);
      if (bytes < piece) break;
    }
  }
  received[group.self] = sendBytes;
  for (int member = 0; member < group.size(); ++member) {
    if (member == group.self) continue;
    // The pieces after the first are on their way already: each receive
    // is posted as the last one completes, into the frame's next piece.
    for (;;) {
      fabric.waitFor(arrival[member], group.what);
      received[member] += pieceBytes[member];
      if (pieceBytes[member] < piece) break;
      arrival[member] = fabric.postRecvUpTo(group.ranks[member], frames[member] + received[member],
                                            room(received[member]), &pieceBytes[member]);
    }
  }
  fabric.waitAll(group.what);  // our sends
}

}  // namespace mojoccl
