#include "rank_order.h"

#include <algorithm>
#include <cstring>

#include "algorithms/p2p.h"
#include "base/datatypes.h"
#include "base/error.h"
#include "base/reduce.h"

namespace mojoccl {
namespace {

bool isHalf(ncclDataType_t type) { return type == ncclFloat16 || type == ncclBfloat16; }

}  // namespace

bool RankOrderReductions::takes(const Call& call) const {
  const bool reduces =
      call.kind == CallKind::AllReduce || call.kind == CallKind::Reduce || call.kind == CallKind::ReduceScatter;
  const bool floating = isHalf(call.datatype) || call.datatype == ncclFloat32 || call.datatype == ncclFloat64;
  const bool orderMatters = call.op == ncclSum || call.op == ncclAvg || call.op == ncclProd;
  if (!reduces || !floating || !orderMatters || topology_.size == 1) return false;
  return hierarchy_ != nullptr || isHalf(call.datatype);
}

void RankOrderReductions::run(const Call& call) {
  if (fitsFrames(call)) return gatherAndCombine(call);
  agree(call);
  if (call.kind == CallKind::ReduceScatter) return reduceScatter(call);
  Call whole = call;  // a reduce: the whole all-reduce, kept by the root
  whole.kind = CallKind::AllReduce;
  allReduceInto(whole, resultOf(call));
}

void* RankOrderReductions::resultOf(const Call& call) {
  if (call.kind == CallKind::AllReduce || topology_.rank == call.root) return call.recv;
  unkept_.resize(std::max(unkept_.size(), call.count * datatypeSize(call.datatype)));
  return unkept_.data();
}

bool RankOrderReductions::fitsFrames(const Call& call) const {
  const size_t perRank = call.count * (call.kind == CallKind::ReduceScatter ? topology_.size : 1);
  return hierarchy_ != nullptr && perRank * datatypeSize(call.datatype) * topology_.size <= kFramedMaxBytes;
}

void RankOrderReductions::gatherAndCombine(const Call& call) {
  const size_t element = datatypeSize(call.datatype);
  const bool scatter = call.kind == CallKind::ReduceScatter;
  const size_t perRank = call.count * (scatter ? topology_.size : 1);
  if (gathered_.size() < perRank * topology_.size * element) gathered_.resize(perRank * topology_.size * element);
  hierarchy_->allGatherAgreeingOn(
      call, {CallKind::AllGather, call.send, gathered_.data(), perRank, call.datatype, ncclSum, 0, call.sequence});
  if (call.kind == CallKind::Reduce && topology_.rank != call.root) return;
  const size_t ours = scatter ? topology_.rank * call.count : 0;  // where our result lies in each rank's buffer
  std::vector<const void*> parts;
  for (int rank = 0; rank < topology_.size; ++rank) parts.push_back(gathered_.data() + (rank * perRank + ours) * element);
  combineParts(call, parts, scatter ? call.recv : resultOf(call), call.count);
}

// Before any part moves, as every collective does: a rank in another call
// fails every rank with MismatchError, and the parts exchanged after it
// cannot be mistaken for another call's.
void RankOrderReductions::agree(const Call& call) {
  if (hierarchy_) return hierarchy_->agree(call);
  const std::string disagreement = node_.disagreement(call);
  if (!disagreement.empty()) throw MismatchError(disagreement);
}

// The node's ranks all-gather their send buffers in shared memory, in the
// node's own steps: the point-to-point mailboxes may hold a send the user
// has not received yet, which a part must never be taken for. Other nodes'
// parts come rank to rank on the fabric's collective lane, which no
// point-to-point call uses.
std::vector<const void*> RankOrderReductions::exchangeParts(const Call& call, const std::vector<Slice>& slices) {
  const size_t element = datatypeSize(call.datatype);
  const int me = topology_.rank;
  const size_t sendCount = slices.back().end;
  const size_t ours = slices[me].end - slices[me].begin;
  const size_t partBytes = std::max<size_t>(ours * element, 1);
  if (parts_.size() < partBytes * topology_.size) parts_.resize(partBytes * topology_.size);
  std::vector<const void*> parts(topology_.size);
  std::vector<Transfer> remote;
  char* send = const_cast<char*>(static_cast<const char*>(call.send));
  const bool alone = topology_.localRanks() == 1;
  if (alone) {
    // Our own part only, copied: the result may overwrite the send buffer
    // before every part is combined.
    std::memcpy(parts_.data() + me * partBytes, send + slices[me].begin * element, ours * element);
  } else {
    if (nodeBuffers_.size() < sendCount * topology_.localRanks() * element)
      nodeBuffers_.resize(sendCount * topology_.localRanks() * element);
    node_.allGather({CallKind::AllGather, call.send, nodeBuffers_.data(), sendCount, call.datatype, ncclSum, 0,
                     call.sequence});
  }
  for (int peer = 0; peer < topology_.size; ++peer) {
    if (alone && peer == me) {
      parts[peer] = parts_.data() + me * partBytes;
      continue;
    }
    if (topology_.onOurNode(peer)) {
      const size_t local = node_.shm().indexOf(peer);
      parts[peer] = nodeBuffers_.data() + (local * sendCount + slices[me].begin) * element;
      continue;
    }
    char* part = parts_.data() + peer * partBytes;
    parts[peer] = part;
    const Slice theirs = slices[peer];
    remote.push_back({true, peer, send + theirs.begin * element, theirs.end - theirs.begin, call.datatype,
                      call.sequence});
    remote.push_back({false, peer, part, ours, call.datatype, call.sequence});
  }
  if (!remote.empty()) runRemoteTransfers(*fabric_, me, remote, call.describe(), /*collective=*/true);
  return parts;
}

// In the call's type: float32 and float64 in one pass over every part (the
// kernel adds its sources in order, in their own type); a half type one
// addition at a time, each rounded, as torch adds two half tensors.
void RankOrderReductions::combineParts(const Call& call, const std::vector<const void*>& parts, void* into,
                                       size_t count) {
  const int ranks = topology_.size;
  if (!isHalf(call.datatype)) return reduce(into, parts.data(), ranks, count, call.datatype, call.op, ranks);
  const ncclRedOp_t step = call.op == ncclAvg ? ncclSum : call.op;
  const void* firstTwo[2] = {parts[0], parts[1]};
  reduce(into, firstTwo, 2, count, call.datatype, step, 1);
  for (int rank = 2; rank < ranks; ++rank) {
    const void* next[2] = {into, parts[rank]};
    reduce(into, next, 2, count, call.datatype, step, 1);
  }
  if (call.op == ncclAvg) {
    const void* sum[1] = {into};
    reduce(into, sum, 1, count, call.datatype, ncclAvg, ranks);
  }
}

// Rank r owns elements [r * slice, (r + 1) * slice) of the count (the last
// ranks' slices short or empty where the ranks do not divide it); the
// slices go round as an all-gather of `slice` elements a rank.
void RankOrderReductions::allReduceInto(const Call& call, void* result) {
  const size_t element = datatypeSize(call.datatype);
  const size_t ranks = topology_.size;
  const size_t slice = (call.count + ranks - 1) / ranks;
  std::vector<Slice> slices;
  for (size_t rank = 0; rank < ranks; ++rank)
    slices.push_back({std::min(rank * slice, call.count), std::min((rank + 1) * slice, call.count)});
  const std::vector<const void*> parts = exchangeParts(call, slices);
  if (owned_.size() < std::max<size_t>(slice * element, 1)) owned_.resize(std::max<size_t>(slice * element, 1));
  const Slice ours = slices[topology_.rank];
  combineParts(call, parts, owned_.data(), ours.end - ours.begin);
  const bool even = slice * ranks == call.count;
  if (!even && gathered_.size() < slice * ranks * element) gathered_.resize(slice * ranks * element);
  void* gathered = even ? result : gathered_.data();
  const Call gather{CallKind::AllGather, owned_.data(), gathered, slice, call.datatype, ncclSum, 0, call.sequence};
  if (hierarchy_)
    hierarchy_->allGather(gather);
  else
    node_.allGather(gather);
  if (!even) std::memcpy(result, gathered, call.count * element);
}

// Rank r owns its block: every rank's block r comes to it, rank to rank.
void RankOrderReductions::reduceScatter(const Call& call) {
  std::vector<Slice> slices;
  for (size_t rank = 0; rank < static_cast<size_t>(topology_.size); ++rank)
    slices.push_back({rank * call.count, (rank + 1) * call.count});
  combineParts(call, exchangeParts(call, slices), call.recv, call.count);
}

}  // namespace mojoccl
