// The all-to-all between nodes, in one exchange between the nodes' leaders
// where it is small. The node's ranks first compare their calls in one step
// in shared memory, each with its counts and, where they fit its slot, its
// sends in that step's slot. The leaders then exchange frames, as for every
// collective between nodes: every rank learns whether all ranks issued the
// call, and a node whose ranks send little to other nodes
// (kOneShotMaxBytes in all) sends it inside its frames. A node that sends
// more sends rank to rank on the fabric after them. Each node chooses for
// itself and its frames say which, so no rank needs another node's counts
// in advance. Each leader hands its node the verdict and what came in
// frames in one broadcast.
#include <algorithm>
#include <cstring>
#include <memory>

#include "algorithms/step.h"
#include "comm.h"
#include "datatypes.h"
#include "error.h"
#include "node_frames.h"

namespace mojoccl {

// Each local rank's counts in elements, read from its slot: its sends to
// every rank, then its receives from every rank.
struct Comm::AllToAllCounts {
  std::vector<uint64_t> rows;
  size_t size;
  uint64_t send(size_t local, int to) const { return rows[local * 2 * size + to]; }
  uint64_t receive(size_t local, int from) const { return rows[local * 2 * size + size + from]; }
};

namespace {

// A rank's slot in the node's step: whether its sends follow, its counts
// (a row of AllToAllCounts), then its sends to every other rank, by rank.
struct SlotHeader {
  uint64_t sendsFollow;
};

size_t slotBytesFor(size_t ranks, size_t sendBytes) {
  return sizeof(SlotHeader) + 2 * ranks * sizeof(uint64_t) + sendBytes;
}

}  // namespace

// What a leader hands its node once the frames are in: the first
// disagreement among the nodes' calls (which ends the call on every rank
// before any data moves); a byte per node, whether its sends came in its
// frames; for each other node in node order, the counts its frame says its
// ranks send to ours (by its rank, then ours); then, where it is small
// enough to ride along, what came in frames, laid out by the counts our
// ranks expect (by sending node, its rank, our rank).
struct Comm::AllToAllHandout {
  std::vector<char> bytes;
  std::vector<size_t> tableAt;  // by node
  size_t dataAt;

  AllToAllHandout(const std::vector<std::vector<int>>& nodes, int ours, size_t dataBytes) {
    size_t at = kVerdictBytes + nodes.size();
    for (size_t node = 0; node < nodes.size(); ++node) {
      tableAt.push_back(at);
      if (static_cast<int>(node) != ours) at += nodes[node].size() * nodes[ours].size() * sizeof(uint64_t);
    }
    dataAt = at;
    bytes.resize(at + dataBytes);
  }
  char* disagreement() { return bytes.data(); }
  char& sentInFrames(size_t node) { return bytes[kVerdictBytes + node]; }
  uint64_t* table(size_t node) { return reinterpret_cast<uint64_t*>(bytes.data() + tableAt[node]); }
};

// Our node's sends travel in its leader's frames when they are few and each
// frame, with its flag and table of counts, fits the room a leader has for one.
bool Comm::sendsFitInFrames(const AllToAllCounts& counts, size_t element) const {
  size_t total = 0;
  for (size_t node = 0; node < nodes_.size(); ++node) {
    if (static_cast<int>(node) == node_) continue;
    size_t bytes = 0;
    for (size_t s = 0; s < nodes_[node_].size(); ++s)
      for (int d : nodes_[node]) bytes += counts.send(s, d) * element;
    const size_t table = nodes_[node_].size() * nodes_[node].size() * sizeof(uint64_t);
    if (sizeof(uint64_t) + table + bytes > kFrameRoom - sizeof(NodeReport)) return false;
    total += bytes;
  }
  return total <= kOneShotMaxBytes;
}

// Where local rank s's send to rank d begins among the sends in its slot.
size_t Comm::slotOffsetOf(const AllToAllCounts& counts, size_t s, int d, size_t element) const {
  const int sender = nodes_[node_][s];
  size_t offset = slotBytesFor(size_, 0);
  for (int to = 0; to < d; ++to)
    if (to != sender) offset += counts.send(s, to) * element;
  return offset;
}

void Comm::allToAllAcrossNodes(const std::vector<Transfer>& withinNode, const std::vector<Transfer>& remote,
                               const Call& call, const std::string& what) {
  const size_t element = datatypeSize(call.datatype);
  const size_t localRanks = nodes_[node_].size();
  std::vector<const Transfer*> sendTo(size_), receiveFrom(size_);
  for (const Transfer& transfer : remote) (transfer.isSend ? sendTo : receiveFrom)[transfer.peer] = &transfer;
  for (const Transfer& transfer : withinNode)
    (transfer.isSend ? sendTo : receiveFrom)[nodes_[node_][transfer.peer]] = &transfer;

  AllToAllCounts counts{std::vector<uint64_t>(localRanks * 2 * size_), static_cast<size_t>(size_)};
  std::string mismatch;
  bool agreed = false, inSlots = false, inFrames = false;
  size_t expected = 0;  // the bytes our node's ranks expect from other nodes
  std::unique_ptr<AllToAllHandout> handout;
  {
    Step step(*shm_, rounds_, call);
    writeAllToAllSlot(step.mine(), sendTo, receiveFrom, element);
    step.publishAndAwait();
    agreed = reportInFrame(call, step.disagreement());
    if (agreed) {
      inSlots = true;
      for (size_t s = 0; s < localRanks; ++s) {
        const char* slot = step.of(static_cast<int>(s));
        inSlots &= reinterpret_cast<const SlotHeader*>(slot)->sendsFollow != 0;
        std::memcpy(&counts.rows[s * 2 * size_], slot + sizeof(SlotHeader), 2 * size_ * sizeof(uint64_t));
      }
      inFrames = inSlots && sendsFitInFrames(counts, element);
      for (size_t node = 0; node < nodes_.size(); ++node)
        if (static_cast<int>(node) != node_)
          for (size_t d = 0; d < localRanks; ++d)
            for (int s : nodes_[node]) expected += counts.receive(d, s) * element;
      if (inSlots) mismatch = takeLocalPartsFromSlots(step, counts, sendTo, receiveFrom, call);
    }
    handout = std::make_unique<AllToAllHandout>(nodes_, node_, agreed && expected <= kOneShotMaxBytes ? expected : 0);
    if (isLeader()) exchangeAllToAllFrames(call, step, counts, inFrames, *handout);
  }  // the node's slots are free again
  if (isLeader() && handout->bytes.size() > handout->dataAt)
    packFromFrames(call, counts, *handout, handout->bytes.data() + handout->dataAt);
  localBroadcast({CallKind::Broadcast, handout->bytes.data(), handout->bytes.data(), handout->bytes.size(), ncclInt8,
                  ncclSum, leader(), call.sequence});
  if (handout->disagreement()[0] != '\0') throw MismatchError(handout->disagreement());

  if (!inSlots) {
    try {
      runTransfers(*shm_, withinNode);
    } catch (const MismatchError& error) {
      mismatch = error.what();
    }
  }
  // What came in frames: in the handout, or (too large to ride along) in a broadcast of its own.
  bool anyInFrames = false;
  for (size_t node = 0; node < nodes_.size(); ++node) anyInFrames |= handout->sentInFrames(node) != 0;
  if (anyInFrames) {
    const char* data = handout->bytes.data() + handout->dataAt;
    std::vector<char> separate;
    if (handout->bytes.size() == handout->dataAt && expected > 0) {
      separate.resize(expected);
      if (isLeader()) packFromFrames(call, counts, *handout, separate.data());
      localBroadcast({CallKind::Broadcast, separate.data(), separate.data(), expected, ncclInt8, ncclSum, leader(),
                      call.sequence});
      data = separate.data();
    }
    const std::string problem = takePartsFromFrames(call, counts, *handout, data, receiveFrom);
    if (mismatch.empty()) mismatch = problem;
  }
  // The rest, rank to rank on the fabric: our sends unless they went in
  // frames, and the receives from nodes whose sends did not.
  std::vector<Transfer> direct;
  for (const Transfer& transfer : remote)
    if (transfer.isSend ? !inFrames : !handout->sentInFrames(nodeOfRank_[transfer.peer])) direct.push_back(transfer);
  try {
    if (!direct.empty()) runRemoteTransfers(*fabric_, rank_, direct, what, /*collective=*/true);
  } catch (const MismatchError& error) {
    if (mismatch.empty()) mismatch = error.what();
  }
  if (!mismatch.empty()) throw MismatchError(mismatch);
}

// Our counts, and our sends where they may go in frames (those to other
// nodes are small) and all of them fit the slot: a large all-to-all would
// only pay one more copy of its data.
void Comm::writeAllToAllSlot(char* slot, const std::vector<const Transfer*>& sendTo,
                             const std::vector<const Transfer*>& receiveFrom, size_t element) const {
  size_t sendBytes = 0, toOtherNodes = 0;
  for (int d = 0; d < size_; ++d)
    if (d != rank_ && sendTo[d] != nullptr) {
      sendBytes += sendTo[d]->count * element;
      if (nodeOfRank_[d] != node_) toOtherNodes += sendTo[d]->count * element;
    }
  const bool follow = toOtherNodes <= kOneShotMaxBytes && slotBytesFor(size_, sendBytes) <= shm_->slotBytes();
  reinterpret_cast<SlotHeader*>(slot)->sendsFollow = follow;
  auto* row = reinterpret_cast<uint64_t*>(slot + sizeof(SlotHeader));
  for (int peer = 0; peer < size_; ++peer) {
    row[peer] = sendTo[peer] != nullptr ? sendTo[peer]->count : 0;
    row[size_ + peer] = receiveFrom[peer] != nullptr ? receiveFrom[peer]->count : 0;
  }
  char* at = slot + slotBytesFor(size_, 0);
  for (int d = 0; follow && d < size_; ++d)
    if (d != rank_ && sendTo[d] != nullptr) {
      std::memcpy(at, sendTo[d]->buffer, sendTo[d]->count * element);
      at += sendTo[d]->count * element;
    }
}

// Our parts from the node's ranks (ourselves included), straight from their
// slots; the first whose count is not the one we expect is named.
std::string Comm::takeLocalPartsFromSlots(const Step& step, const AllToAllCounts& counts,
                                          const std::vector<const Transfer*>& sendTo,
                                          const std::vector<const Transfer*>& receiveFrom, const Call& call) const {
  const size_t element = datatypeSize(call.datatype);
  std::string mismatch;
  for (size_t s = 0; s < nodes_[node_].size(); ++s) {
    const int sender = nodes_[node_][s];
    const Transfer& receive = *receiveFrom[sender];
    const uint64_t sent = counts.send(s, rank_);
    if (sent != receive.count) {
      if (mismatch.empty()) mismatch = transferMismatch(sender, sent, call.datatype, call.sequence, rank_, receive);
      continue;
    }
    const char* from = sender == rank_ ? static_cast<const char*>(sendTo[rank_]->buffer)
                                       : step.of(static_cast<int>(s)) + slotOffsetOf(counts, s, rank_, element);
    std::memmove(receive.buffer, from, sent * element);
  }
  return mismatch;
}

// The leader's part: to every other leader a frame of its own (our report,
// whether our sends come in it, and if so their counts and data, by our
// sending rank, then their receiving rank), then from the frames received
// the verdict, which nodes sent in frames, and their counts to our ranks.
void Comm::exchangeAllToAllFrames(const Call& call, const Step& step, const AllToAllCounts& counts, bool inFrames,
                                  AllToAllHandout& handout) {
  const size_t nodes = nodes_.size(), localRanks = nodes_[node_].size();
  const size_t element = datatypeSize(call.datatype);
  copyText(handout.disagreement(), sendOwnFrames(call, [&](size_t node, char* payload) {
    char* at = payload;
    const uint64_t flag = inFrames && static_cast<int>(node) != node_;
    std::memcpy(at, &flag, sizeof(flag));
    at += sizeof(flag);
    for (size_t s = 0; flag && s < localRanks; ++s)
      for (int d : nodes_[node]) {
        const uint64_t count = counts.send(s, d);
        std::memcpy(at, &count, sizeof(count));
        at += sizeof(count);
      }
    for (size_t s = 0; flag && s < localRanks; ++s)
      for (int d : nodes_[node]) {
        const size_t bytes = counts.send(s, d) * element;
        std::memcpy(at, step.of(static_cast<int>(s)) + slotOffsetOf(counts, s, d, element), bytes);
        at += bytes;
      }
    return static_cast<size_t>(at - payload);
  }));
  if (handout.disagreement()[0] != '\0') return;
  for (size_t node = 0; node < nodes; ++node) {
    if (static_cast<int>(node) == node_) continue;
    uint64_t flag = 0;
    std::memcpy(&flag, payloadOf(frame(node)), sizeof(flag));
    handout.sentInFrames(node) = flag != 0;
    if (flag)
      std::memcpy(handout.table(node), payloadOf(frame(node)) + sizeof(flag),
                  nodes_[node].size() * localRanks * sizeof(uint64_t));
  }
}

// Visits, for every other node, each of its ranks' parts for each of ours:
// visit(node, sending rank, our local rank, count it sent (0 where its
// node's sends were not in frames), where it lies in the node's frame
// data, where our ranks' expected counts place it).
template <typename Visit>
void Comm::forEachPartFromNodes(const AllToAllCounts& counts, AllToAllHandout& handout, size_t element,
                                Visit visit) const {
  const size_t localRanks = nodes_[node_].size();
  size_t placed = 0;
  for (size_t node = 0; node < nodes_.size(); ++node) {
    if (static_cast<int>(node) == node_) continue;
    size_t inFrame = 0;
    for (size_t s = 0; s < nodes_[node].size(); ++s)
      for (size_t d = 0; d < localRanks; ++d) {
        const int sender = nodes_[node][s];
        const uint64_t sent = handout.sentInFrames(node) ? handout.table(node)[s * localRanks + d] : 0;
        visit(node, sender, d, sent, inFrame, placed);
        inFrame += sent * element;
        placed += counts.receive(d, sender) * element;
      }
  }
}

// At the leader: the parts that came in frames, each where our ranks'
// counts place it (a part of another count is left out, and named by its
// receiver).
void Comm::packFromFrames(const Call& call, const AllToAllCounts& counts, AllToAllHandout& handout, char* into) {
  const size_t element = datatypeSize(call.datatype);
  const size_t localRanks = nodes_[node_].size();
  forEachPartFromNodes(counts, handout, element,
                       [&](size_t node, int sender, size_t d, uint64_t sent, size_t inFrame, size_t placed) {
                         if (sent == 0 || sent != counts.receive(d, sender)) return;
                         const size_t table = nodes_[node].size() * localRanks * sizeof(uint64_t);
                         std::memcpy(into + placed, payloadOf(frame(node)) + sizeof(uint64_t) + table + inFrame,
                                     sent * element);
                       });
}

// Our parts from the nodes that sent in frames, out of `data` (laid out by
// packFromFrames); the first whose count is not the one we expect is named.
std::string Comm::takePartsFromFrames(const Call& call, const AllToAllCounts& counts, AllToAllHandout& handout,
                                      const char* data, const std::vector<const Transfer*>& receiveFrom) const {
  const size_t element = datatypeSize(call.datatype);
  std::string mismatch;
  forEachPartFromNodes(counts, handout, element,
                       [&](size_t node, int sender, size_t d, uint64_t sent, size_t, size_t placed) {
                         if (static_cast<int>(d) != localIndex_ || !handout.sentInFrames(node)) return;
                         const Transfer& receive = *receiveFrom[sender];
                         if (sent == receive.count)
                           std::memcpy(receive.buffer, data + placed, sent * element);
                         else if (mismatch.empty())
                           mismatch = transferMismatch(sender, sent, call.datatype, call.sequence, rank_, receive);
                       });
  return mismatch;
}

}  // namespace mojoccl
