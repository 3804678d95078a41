#include <algorithm>
#include <cstring>
#include <memory>

#include "hierarchy/all_to_all.h"

#include "base/datatypes.h"
#include "base/error.h"

namespace mojoccl {

namespace {

// A rank's slot in the node's step: whether its sends follow, its call's
// number (for a mismatch's message), its counts (a row of Counts),
// then its sends to every other rank, by rank.
struct SlotHeader {
  uint64_t sendsFollow;
  uint64_t sequence;
};

size_t slotBytesFor(size_t ranks, size_t sendBytes) {
  return sizeof(SlotHeader) + 2 * ranks * sizeof(uint64_t) + sendBytes;
}

// Past this many bytes of counts for a node's ranks to receive from the
// other nodes' (the tables a leader hands its node), an all-to-all leaves
// the frames to its agreement: 2 nodes of 64 ranks hand out 32 KiB.
constexpr size_t kHandedTablesMax = 16 << 10;

size_t roundUp(size_t value, size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

}  // namespace

// Each local rank's counts in elements, read from its slot: its sends to
// every rank, then its receives from every rank; where each send begins in
// its slot; its call's number.
struct AllToAllAcrossNodes::Counts {
  std::vector<uint64_t> rows;
  std::vector<size_t> sendsAt;
  std::vector<uint64_t> sequences;
  size_t size;

  Counts(size_t localRanks, size_t ranks)
      : rows(localRanks * 2 * ranks), sendsAt(localRanks * ranks), sequences(localRanks), size(ranks) {}
  uint64_t send(size_t local, int to) const { return rows[local * 2 * size + to]; }
  uint64_t receive(size_t local, int from) const { return rows[local * 2 * size + size + from]; }
  size_t sendAt(size_t local, int to) const { return sendsAt[local * size + to]; }

  // Local rank `local` (rank `sender`) from its slot.
  void read(size_t local, int sender, const char* slot, size_t element) {
    sequences[local] = reinterpret_cast<const SlotHeader*>(slot)->sequence;
    std::memcpy(&rows[local * 2 * size], slot + sizeof(SlotHeader), 2 * size * sizeof(uint64_t));
    size_t offset = slotBytesFor(size, 0);
    for (size_t to = 0; to < size; ++to) {
      sendsAt[local * size + to] = offset;
      if (static_cast<int>(to) != sender) offset += send(local, static_cast<int>(to)) * element;
    }
  }
};

bool AllToAllAcrossNodes::takesFrames() const {
  if (!network_.direct(topology_) || slotBytesFor(topology_.size, 0) > node_.shm().slotBytes()) return false;
  for (const auto& node : topology_.nodes)
    if ((topology_.size - node.size()) * node.size() * sizeof(uint64_t) > kHandedTablesMax) return false;
  return true;
}

// What a leader hands its node once the frames are in: the first
// disagreement among the nodes' calls (which ends the call on every rank
// before any data moves between nodes; parts within the node may be in
// place already); a byte per node, whether its sends came in its frames;
// for each other node in node order, the counts its frame says its ranks
// send to ours (by its rank, then ours); then, where our ranks expect
// kFramedMaxBytes or less from other nodes, what came in frames, laid out
// by those expected counts (by sending node, its rank, our rank).
// Its bytes live in the communicator's `storage`, kept from call to call.
struct AllToAllAcrossNodes::Handout {
  char* bytes;
  size_t size;
  std::vector<size_t> tableAt;  // by node
  size_t dataAt;

  Handout(std::vector<char>& storage, const std::vector<std::vector<int>>& nodes, int ours, size_t dataBytes) {
    size_t at = roundUp(kVerdictBytes + nodes.size(), sizeof(uint64_t));
    for (size_t node = 0; node < nodes.size(); ++node) {
      tableAt.push_back(at);
      if (static_cast<int>(node) != ours) at += nodes[node].size() * nodes[ours].size() * sizeof(uint64_t);
    }
    dataAt = at;
    size = at + dataBytes;
    if (storage.size() < size) storage.resize(size);
    bytes = storage.data();
    std::memset(bytes, 0, kVerdictBytes + nodes.size());  // no disagreement, nothing in frames yet
  }
  char* disagreement() { return bytes; }
  char& sentInFrames(size_t node) { return bytes[kVerdictBytes + node]; }
  uint64_t* table(size_t node) { return reinterpret_cast<uint64_t*>(bytes + tableAt[node]); }
};

// Our node's sends travel in its leader's frames when they are few and each
// frame, with its flag and table of counts, fits the room a leader has for one.
bool AllToAllAcrossNodes::sendsFitInFrames(const Counts& counts, size_t element) const {
  size_t total = 0;
  for (size_t node = 0; node < topology_.nodes.size(); ++node) {
    if (static_cast<int>(node) == topology_.node) continue;
    size_t bytes = 0;
    for (size_t s = 0; s < topology_.nodes[topology_.node].size(); ++s)
      for (int d : topology_.nodes[node]) bytes += counts.send(s, d) * element;
    const size_t table = topology_.nodes[topology_.node].size() * topology_.nodes[node].size() * sizeof(uint64_t);
    if (sizeof(uint64_t) + table + bytes > kFrameRoom - sizeof(NodeReport)) return false;
    total += bytes;
  }
  return total <= kFramedMaxBytes;
}

void AllToAllAcrossNodes::run(const std::vector<Transfer>& withinNode, const std::vector<Transfer>& remote,
                               const Call& call, const std::string& what) {
  const size_t element = datatypeSize(call.datatype);
  const size_t localRanks = topology_.nodes[topology_.node].size();
  // ncclAllToAllv gives every peer a send and a receive (of any count, 0 included).
  std::vector<const Transfer*> sendTo(topology_.size), receiveFrom(topology_.size);
  for (const Transfer& transfer : remote) (transfer.isSend ? sendTo : receiveFrom)[transfer.peer] = &transfer;
  for (const Transfer& transfer : withinNode)
    (transfer.isSend ? sendTo : receiveFrom)[topology_.nodes[topology_.node][transfer.peer]] = &transfer;

  // A rank alone on its node sends from its own buffers and receives
  // straight from the frames: no copies through the slot or a hand-out.
  const bool alone = localRanks == 1;
  Counts counts(localRanks, topology_.size);
  std::string mismatch;
  bool agreed = false, inSlots = false, inFrames = false;
  size_t expected = 0;  // the bytes our node's ranks expect from other nodes
  std::unique_ptr<Handout> handout;
  {
    Step step(node_.shm(), node_.rounds(), call);
    writeSlot(step.mine(), sendTo, receiveFrom, call, /*sendsInSlot=*/!alone);
    step.publishAndAwait();
    agreed = frames_.report(call, step.disagreement());
    if (agreed) {
      inSlots = true;
      for (size_t s = 0; s < localRanks; ++s) {
        const char* slot = step.of(static_cast<int>(s));
        inSlots &= reinterpret_cast<const SlotHeader*>(slot)->sendsFollow != 0;
        counts.read(s, topology_.nodes[topology_.node][s], slot, element);
      }
      inFrames = inSlots && sendsFitInFrames(counts, element);
      for (size_t node = 0; node < topology_.nodes.size(); ++node)
        if (static_cast<int>(node) != topology_.node)
          for (size_t d = 0; d < localRanks; ++d)
            for (int s : topology_.nodes[node]) expected += counts.receive(d, s) * element;
      if (inSlots) mismatch = takeLocalPartsFromSlots(step, counts, sendTo, receiveFrom, call);
    }
    const bool handsData = agreed && !alone && expected <= kFramedMaxBytes;
    handout = std::make_unique<Handout>(handoutStorage_, topology_.nodes, topology_.node, handsData ? expected : 0);
    if (topology_.isLeader()) {
      auto sendOf = [&](size_t s, int d) {
        return alone ? static_cast<const char*>(sendTo[d]->buffer) : step.of(static_cast<int>(s)) + counts.sendAt(s, d);
      };
      exchangeFrames(call, counts, inFrames, sendOf, *handout);
    }
  }  // the node's slots are free again
  if (topology_.isLeader() && handout->size > handout->dataAt)
    packFromFrames(call, counts, *handout, handout->bytes + handout->dataAt, /*compact=*/false);
  frames_.handOut(call, handout->bytes, handout->size);

  if (!inSlots) {
    try {
      node_.allToAll(call, withinNode);
    } catch (const MismatchError& error) {
      mismatch = error.what();
    }
  }
  // What came in frames: in the handout, or, where our ranks expect more
  // from other nodes than rides along, in a broadcast of its own of just the
  // parts that came in frames at the counts expected.
  bool anyInFrames = false;
  for (size_t node = 0; node < topology_.nodes.size(); ++node) anyInFrames |= handout->sentInFrames(node) != 0;
  if (anyInFrames && alone) {
    const std::string problem = takePartsFromFrames(call, counts, *handout, nullptr, /*compact=*/false, receiveFrom);
    if (mismatch.empty()) mismatch = problem;
  } else if (anyInFrames) {
    const bool compact = handout->size == handout->dataAt;
    const char* data = handout->bytes + handout->dataAt;
    std::vector<char> separate;
    if (compact) {
      separate.resize(forEachPartFromNodes(counts, *handout, element, true, [](auto...) {}));
      if (topology_.isLeader()) packFromFrames(call, counts, *handout, separate.data(), compact);
      node_.broadcastBytes(call, separate.data(), separate.size(), topology_.leader());
      data = separate.data();
    }
    const std::string problem = takePartsFromFrames(call, counts, *handout, data, compact, receiveFrom);
    if (mismatch.empty()) mismatch = problem;
  }
  // The rest, rank to rank on the fabric: our sends unless they went in
  // frames, and the receives from nodes whose sends did not.
  std::vector<Transfer> direct;
  for (const Transfer& transfer : remote)
    if (transfer.isSend ? !inFrames : !handout->sentInFrames(topology_.nodeOfRank[transfer.peer])) direct.push_back(transfer);
  try {
    if (!direct.empty()) runRemoteTransfers(network_.fabric, topology_.rank, direct, what, /*collective=*/true);
  } catch (const MismatchError& error) {
    if (mismatch.empty()) mismatch = error.what();
  }
  if (!mismatch.empty()) throw MismatchError(mismatch);
}

// Our counts, and our sends where they may go in frames (those to other
// nodes are small) and all of them fit the slot: a large all-to-all would
// only pay one more copy of its data.
void AllToAllAcrossNodes::writeSlot(char* slot, const std::vector<const Transfer*>& sendTo,
                             const std::vector<const Transfer*>& receiveFrom, const Call& call,
                             bool sendsInSlot) const {
  const size_t element = datatypeSize(call.datatype);
  size_t sendBytes = 0, toOtherNodes = 0;
  for (int d = 0; d < topology_.size; ++d)
    if (d != topology_.rank && sendTo[d] != nullptr) {
      sendBytes += sendTo[d]->count * element;
      if (topology_.nodeOfRank[d] != topology_.node) toOtherNodes += sendTo[d]->count * element;
    }
  const bool follow = toOtherNodes <= kFramedMaxBytes &&
                      (!sendsInSlot || slotBytesFor(topology_.size, sendBytes) <= node_.shm().slotBytes());
  *reinterpret_cast<SlotHeader*>(slot) = {follow, call.sequence};
  auto* row = reinterpret_cast<uint64_t*>(slot + sizeof(SlotHeader));
  for (int peer = 0; peer < topology_.size; ++peer) {
    row[peer] = sendTo[peer] != nullptr ? sendTo[peer]->count : 0;
    row[topology_.size + peer] = receiveFrom[peer] != nullptr ? receiveFrom[peer]->count : 0;
  }
  char* at = slot + slotBytesFor(topology_.size, 0);
  for (int d = 0; follow && sendsInSlot && d < topology_.size; ++d)
    if (d != topology_.rank && sendTo[d] != nullptr) {
      std::memcpy(at, sendTo[d]->buffer, sendTo[d]->count * element);
      at += sendTo[d]->count * element;
    }
}

// Our parts from the node's ranks (ourselves included), straight from their
// slots; the first whose count is not the one we expect is named.
std::string AllToAllAcrossNodes::takeLocalPartsFromSlots(const Step& step, const Counts& counts,
                                          const std::vector<const Transfer*>& sendTo,
                                          const std::vector<const Transfer*>& receiveFrom, const Call& call) const {
  const size_t element = datatypeSize(call.datatype);
  std::string mismatch;
  for (size_t s = 0; s < topology_.nodes[topology_.node].size(); ++s) {
    const int sender = topology_.nodes[topology_.node][s];
    const Transfer& receive = *receiveFrom[sender];
    const uint64_t sent = counts.send(s, topology_.rank);
    if (sent != receive.count) {
      if (mismatch.empty())
        mismatch = transferMismatch(sender, sent, call.datatype, counts.sequences[s], topology_.rank, receive);
      continue;
    }
    const char* from = sender == topology_.rank ? static_cast<const char*>(sendTo[topology_.rank]->buffer)
                                       : step.of(static_cast<int>(s)) + counts.sendAt(s, topology_.rank);
    std::memmove(receive.buffer, from, sent * element);
  }
  return mismatch;
}

// The leader's part: to every other leader a frame of its own (our report,
// whether our sends come in it, and if so their counts and data, by our
// sending rank, then their receiving rank), then from the frames received
// the verdict, which nodes sent in frames, and their counts to our ranks.
void AllToAllAcrossNodes::exchangeFrames(const Call& call, const Counts& counts, bool inFrames,
                                         const std::function<const char*(size_t, int)>& sendOf, Handout& handout) {
  const size_t nodes = topology_.nodes.size(), localRanks = topology_.nodes[topology_.node].size();
  const size_t element = datatypeSize(call.datatype);
  copyText(handout.disagreement(), frames_.sendOwn(call, [&](size_t node, char* payload) {
    char* at = payload;
    const uint64_t flag = inFrames && static_cast<int>(node) != topology_.node;
    std::memcpy(at, &flag, sizeof(flag));
    at += sizeof(flag);
    for (size_t s = 0; flag && s < localRanks; ++s)
      for (int d : topology_.nodes[node]) {
        const uint64_t count = counts.send(s, d);
        std::memcpy(at, &count, sizeof(count));
        at += sizeof(count);
      }
    for (size_t s = 0; flag && s < localRanks; ++s)
      for (int d : topology_.nodes[node]) {
        const size_t bytes = counts.send(s, d) * element;
        std::memcpy(at, sendOf(s, d), bytes);
        at += bytes;
      }
    return static_cast<size_t>(at - payload);
  }));
  if (handout.disagreement()[0] != '\0') return;
  for (size_t node = 0; node < nodes; ++node) {
    if (static_cast<int>(node) == topology_.node) continue;
    uint64_t flag = 0;
    std::memcpy(&flag, payloadOf(frames_.frame(node)), sizeof(flag));
    handout.sentInFrames(node) = flag != 0;
    if (flag)
      std::memcpy(handout.table(node), payloadOf(frames_.frame(node)) + sizeof(flag),
                  topology_.nodes[node].size() * localRanks * sizeof(uint64_t));
  }
}

// Visits, for every other node, each of its ranks' parts for each of ours:
// visit(node, sending rank, our local rank, count it sent (0 where its
// node's sends were not in frames), where it lies in the node's frame
// data, where it lies in what the leader hands its node); returns the
// bytes handed. Laid out by the counts our ranks expect, every part of
// every other node (in the handout), or `compact`: only the parts that came
// in frames at the count expected (in a broadcast of their own).
template <typename Visit>
size_t AllToAllAcrossNodes::forEachPartFromNodes(const Counts& counts, Handout& handout, size_t element,
                                  bool compact, Visit visit) const {
  const size_t localRanks = topology_.nodes[topology_.node].size();
  size_t placed = 0;
  for (size_t node = 0; node < topology_.nodes.size(); ++node) {
    if (static_cast<int>(node) == topology_.node) continue;
    size_t inFrame = 0;
    for (size_t s = 0; s < topology_.nodes[node].size(); ++s)
      for (size_t d = 0; d < localRanks; ++d) {
        const int sender = topology_.nodes[node][s];
        const uint64_t sent = handout.sentInFrames(node) ? handout.table(node)[s * localRanks + d] : 0;
        const uint64_t expected = counts.receive(d, sender);
        visit(node, sender, d, sent, inFrame, placed);
        inFrame += sent * element;
        if (!compact || (handout.sentInFrames(node) && sent == expected)) placed += expected * element;
      }
  }
  return placed;
}

// At the leader: the parts that came in frames at the counts our ranks
// expect (one of another count is left out, and named by its receiver).
void AllToAllAcrossNodes::packFromFrames(const Call& call, const Counts& counts, Handout& handout, char* into,
                          bool compact) {
  const size_t element = datatypeSize(call.datatype);
  forEachPartFromNodes(counts, handout, element, compact,
                       [&](size_t node, int sender, size_t d, uint64_t sent, size_t inFrame, size_t placed) {
                         if (sent == 0 || sent != counts.receive(d, sender)) return;
                         std::memcpy(into + placed, sendsInFrame(node) + inFrame, sent * element);
                       });
}

// The sends in node `node`'s frame, behind its flag and its table of counts.
const char* AllToAllAcrossNodes::sendsInFrame(size_t node) {
  const size_t table = topology_.nodes[node].size() * topology_.nodes[topology_.node].size() * sizeof(uint64_t);
  return payloadOf(frames_.frame(node)) + sizeof(uint64_t) + table;
}

// Our parts from the nodes that sent in frames, out of `data` (laid out by
// packFromFrames), or, where `data` is null, out of the frames themselves;
// the first whose count is not the one we expect is named.
std::string AllToAllAcrossNodes::takePartsFromFrames(const Call& call, const Counts& counts, Handout& handout,
                                      const char* data, bool compact,
                                      const std::vector<const Transfer*>& receiveFrom) {
  const size_t element = datatypeSize(call.datatype);
  std::string mismatch;
  forEachPartFromNodes(counts, handout, element, compact,
                       [&](size_t node, int sender, size_t d, uint64_t sent, size_t inFrame, size_t placed) {
                         if (static_cast<int>(d) != topology_.localIndex || !handout.sentInFrames(node)) return;
                         const Transfer& receive = *receiveFrom[sender];
                         const char* part = data != nullptr ? data + placed : sendsInFrame(node) + inFrame;
                         if (sent == receive.count)
                           std::memcpy(receive.buffer, part, sent * element);
                         else if (mismatch.empty())  // the sender's call number is not in its frame
                           mismatch = transferMismatch(sender, sent, call.datatype, 0, topology_.rank, receive);
                       });
  return mismatch;
}

}  // namespace mojoccl
