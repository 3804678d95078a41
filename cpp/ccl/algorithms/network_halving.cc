// Recursive doubling and halving: the all-reduce by recursive doubling,
// Rabenseifner's (a reduce-scatter by recursive halving, then an all-gather
// by recursive doubling), and the reduce-scatter by recursive halving; a
// member past the largest power of two folded in first.
#include "algorithms/network.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "algorithms/layout.h"
#include "algorithms/network_segments.h"
#include "base/datatypes.h"
#include "base/error.h"
#include "base/reduce.h"

namespace mojoccl {

namespace {

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

}  // namespace mojoccl
