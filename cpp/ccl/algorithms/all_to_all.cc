#include "algorithms/all_to_all.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "algorithms/step.h"
#include "algorithms/zero_copy.h"
#include "base/datatypes.h"
#include "base/error.h"

namespace mojoccl {
namespace {

// What every rank writes at the head of its slot in each step, then, by
// local rank, the count it sends that rank and where that part begins in its
// send buffer (bytes from the lowest part's start); then its staged pieces,
// a region of `stride` bytes per receiver.
struct PartsHeader {
  uint64_t sequence;  // its call's number, for a mismatch's message
  uint64_t inPlace;   // its parts are read from its own memory, not its slot
  // Its largest part rounded up, at most a slot's share (pieceBytes): small
  // parts lie together, in a few cache lines.
  uint64_t stride;
};

size_t roundUp(size_t value, size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

class NodeAllToAll {
 public:
  NodeAllToAll(ShmTransport& shm, const Call& call, const std::vector<Transfer>& transfers, bool zeroCopy)
      : shm_(shm), call_(call), element_(datatypeSize(call.datatype)), n_(shm.size()), me_(shm.self()),
        sendTo_(n_), receiveFrom_(n_), counts_(n_ * n_), offsets_(n_ * n_), inPlace_(n_), sequences_(n_), strides_(n_) {
    for (const Transfer& transfer : transfers) (transfer.isSend ? sendTo_ : receiveFrom_)[transfer.peer] = &transfer;
    dataAt_ = roundUp(sizeof(PartsHeader) + 2 * n_ * sizeof(uint64_t), 64);
    pieceBytes_ = (shm.slotBytes() - dataAt_) / n_ / 64 * 64;
    if (pieceBytes_ == 0)
      fail(ncclInternalError, "an all-to-all among " + std::to_string(n_) + " ranks of a node needs larger staging slots");
    locateSends();
    const size_t largest = largestSendToOthers();
    stride_ = std::min(pieceBytes_, std::max<size_t>(64, roundUp(largest, 64)));
    inPlaceMine_ = zeroCopy && largest >= kZeroCopyMinBytes && (buffers_.send.shared() || shm.canReadPeerMemory());
  }

  void run(uint32_t& rounds) {
    size_t steps = 1;
    for (size_t k = 0; k < steps; ++k) {
      Step step(shm_, rounds, call_);
      if (k == 0) writeTable(step.mine());
      if (!inPlaceMine_) writePieces(step.mine(), k);
      step.share(&buffers_);
      if (k == 0) {
        readTables(step);
        steps = stepsNeeded();
        takeOwnPart();
      }
      takePieces(step, k);
      if (k + 1 == steps && anyInPlace()) {
        takePartsInPlace(step);
        step.finishTogether();  // no rank's memory is left while a peer reads it
      }
    }
    if (!mismatch_.empty()) throw MismatchError(mismatch_);
  }

 private:
  // Where the parts lie, for the peers that read them in place. (An
  // all-to-all in place sends from a copy: ncclAllToAllv makes it.)
  void locateSends() {
    const char *sendHigh = nullptr, *recvLow = nullptr, *recvHigh = nullptr;
    auto widen = [](const char*& low, const char*& high, const Transfer* transfer, size_t bytes) {
      if (bytes == 0) return;
      const char* begin = static_cast<const char*>(transfer->buffer);
      if (low == nullptr || begin < low) low = begin;
      if (high == nullptr || begin + bytes > high) high = begin + bytes;
    };
    for (int peer = 0; peer < n_; ++peer) {
      widen(sendLow_, sendHigh, sendTo_[peer], sendTo_[peer]->count * element_);
      widen(recvLow, recvHigh, receiveFrom_[peer], receiveFrom_[peer]->count * element_);
    }
    Call located = call_;
    located.send = sendLow_;
    located.recv = const_cast<char*>(recvLow);
    buffers_ = CallBuffers::of(located, sendHigh - sendLow_, recvHigh - recvLow);
  }

  // Where the part for `peer` begins, in bytes from the lowest part's start.
  size_t offsetOf(int peer) const {
    return sendTo_[peer]->count == 0 ? 0 : static_cast<const char*>(sendTo_[peer]->buffer) - sendLow_;
  }
  const char* sendOf(int peer) const { return static_cast<const char*>(sendTo_[peer]->buffer); }

  size_t largestSendToOthers() const {
    size_t largest = 0;
    for (int peer = 0; peer < n_; ++peer)
      if (peer != me_) largest = std::max(largest, sendTo_[peer]->count * element_);
    return largest;
  }

  void writeTable(char* slot) const {
    *reinterpret_cast<PartsHeader*>(slot) = {call_.sequence, inPlaceMine_ ? 1u : 0u, stride_};
    auto* row = reinterpret_cast<uint64_t*>(slot + sizeof(PartsHeader));
    for (int peer = 0; peer < n_; ++peer) {
      row[peer] = sendTo_[peer]->count;
      row[n_ + peer] = offsetOf(peer);
    }
  }

  void readTables(const Step& step) {
    for (int sender = 0; sender < n_; ++sender) {
      const char* slot = step.of(sender);
      const auto& header = *reinterpret_cast<const PartsHeader*>(slot);
      sequences_[sender] = header.sequence;
      inPlace_[sender] = header.inPlace != 0;
      strides_[sender] = header.stride;
      const auto* row = reinterpret_cast<const uint64_t*>(slot + sizeof(PartsHeader));
      std::copy(row, row + n_, counts_.begin() + sender * n_);
      std::copy(row + n_, row + 2 * n_, offsets_.begin() + sender * n_);
    }
    for (int sender = 0; sender < n_; ++sender) {
      const Transfer& receive = *receiveFrom_[sender];
      if (sent(sender, me_) == receive.count || !mismatch_.empty()) continue;
      mismatch_ = transferMismatch(shm_.commRank(sender), sent(sender, me_), call_.datatype, sequences_[sender],
                                   shm_.commRank(me_), receive);
    }
  }

  uint64_t sent(int sender, int receiver) const { return counts_[sender * n_ + receiver]; }
  bool takes(int sender) const { return sent(sender, me_) == receiveFrom_[sender]->count; }
  bool anyInPlace() const { return std::find(inPlace_.begin(), inPlace_.end(), true) != inPlace_.end(); }

  // As many steps as the largest part staged takes, in pieces; at least one.
  size_t stepsNeeded() const {
    size_t steps = 1;
    for (int sender = 0; sender < n_; ++sender) {
      if (inPlace_[sender]) continue;
      for (int receiver = 0; receiver < n_; ++receiver)
        if (receiver != sender)
          steps = std::max(steps, (sent(sender, receiver) * element_ + pieceBytes_ - 1) / pieceBytes_);
    }
    return steps;
  }

  void takeOwnPart() {
    if (takes(me_)) std::memmove(receiveFrom_[me_]->buffer, sendOf(me_), sent(me_, me_) * element_);
  }

  // Step k carries bytes [k pieceBytes, (k + 1) pieceBytes) of each part.
  void writePieces(char* slot, size_t k) const {
    for (int peer = 0; peer < n_; ++peer) {
      const size_t bytes = sendTo_[peer]->count * element_, begin = k * pieceBytes_;
      if (peer == me_ || begin >= bytes) continue;
      std::memcpy(slot + dataAt_ + peer * stride_, sendOf(peer) + begin, std::min(pieceBytes_, bytes - begin));
    }
  }

  void takePieces(const Step& step, size_t k) const {
    for (int sender = 0; sender < n_; ++sender) {
      const size_t bytes = sent(sender, me_) * element_, begin = k * pieceBytes_;
      if (sender == me_ || inPlace_[sender] || !takes(sender) || begin >= bytes) continue;
      std::memcpy(static_cast<char*>(receiveFrom_[sender]->buffer) + begin,
                  step.of(sender) + dataAt_ + me_ * strides_[sender], std::min(pieceBytes_, bytes - begin));
    }
  }

  void takePartsInPlace(const Step& step) const {
    for (int sender = 0; sender < n_; ++sender) {
      const size_t bytes = sent(sender, me_) * element_;
      if (sender == me_ || !inPlace_[sender] || !takes(sender) || bytes == 0) continue;
      const CallBuffers theirs = step.buffersOf(sender);
      const uint64_t offset = offsets_[sender * n_ + me_];
      if (theirs.send.shared())
        std::memcpy(receiveFrom_[sender]->buffer, mapPeerBuffer(theirs.send) + offset, bytes);
      else
        shm_.readPeerMemory(sender, theirs.sendAddress + offset, receiveFrom_[sender]->buffer, bytes);
    }
  }

  ShmTransport& shm_;
  const Call& call_;
  const size_t element_;
  const int n_, me_;
  std::vector<const Transfer*> sendTo_, receiveFrom_;  // by local rank
  size_t dataAt_ = 0, pieceBytes_ = 0, stride_ = 0;
  const char* sendLow_ = nullptr;  // the lowest part's start
  CallBuffers buffers_{};
  bool inPlaceMine_ = false;
  // Every rank's, from the first step: counts by sender then receiver,
  // offsets likewise, whether it sends in place, its call's number.
  std::vector<uint64_t> counts_, offsets_;
  std::vector<bool> inPlace_;
  std::vector<uint64_t> sequences_, strides_;
  std::string mismatch_;
};

}  // namespace

void allToAllWithinNode(ShmTransport& shm, uint32_t& rounds, const Call& call, const std::vector<Transfer>& transfers,
                        bool zeroCopy) {
  NodeAllToAll(shm, call, transfers, zeroCopy).run(rounds);
}

}  // namespace mojoccl
