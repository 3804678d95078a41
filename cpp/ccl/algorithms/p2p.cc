#include "p2p.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "../datatypes.h"
#include "../error.h"
#include "../transports/fabric.h"

namespace mojoccl {
namespace {

// What an entry's note says about its message.
struct MessageNote {
  uint64_t count;
  uint64_t bytes;
  uint64_t bufferSerial;  // 0: the data is inline in the entry
  uint64_t bufferCapacity;
  uint64_t sequence;
  uint32_t datatype;
};
static_assert(sizeof(MessageNote) <= kNoteBytes, "a message note must fit in a note");

size_t bytesOf(const Transfer& transfer) {
  return transfer.count * datatypeSize(transfer.datatype);
}

std::string describe(size_t count, uint32_t datatype) {
  return std::to_string(count) + " x " + datatypeName(static_cast<ncclDataType_t>(datatype));
}


class Progress {
 public:
  Progress(ShmTransport& shm, const std::vector<Transfer>& transfers)
      : shm_(shm), transfers_(transfers), done_(transfers.size(), false) {}

  void run() {
    matchSelfTransfers();
    std::vector<int> peers;
    for (const auto& transfer : transfers_) peers.push_back(transfer.peer);
    while (true) {
      uint32_t bell = shm_.doorbell();  // read before looking, so no ring is missed
      bool pending = false;
      bool moved = false;
      for (size_t i = 0; i < transfers_.size(); ++i) {
        if (done_[i]) continue;
        pending = true;
        if (!firstInLine(i)) continue;
        if (transfers_[i].isSend ? trySend(transfers_[i]) : tryReceive(transfers_[i])) {
          done_[i] = true;
          moved = true;
        }
      }
      if (!pending) break;
      if (!moved) shm_.awaitDoorbell(bell, peers);
    }
    if (!mismatch_.empty()) throw MismatchError(mismatch_);
  }

  // Transfers to or from the same peer in the same direction go in order.
  bool firstInLine(size_t index) const {
    for (size_t j = 0; j < index; ++j)
      if (!done_[j] && transfers_[j].peer == transfers_[index].peer &&
          transfers_[j].isSend == transfers_[index].isSend)
        return false;
    return true;
  }

  // A rank's sends to itself pair with its receives from itself, in order.
  void matchSelfTransfers() {
    std::vector<size_t> sends, receives;
    for (size_t i = 0; i < transfers_.size(); ++i)
      if (transfers_[i].peer == shm_.self()) (transfers_[i].isSend ? sends : receives).push_back(i);
    if (sends.size() != receives.size())
      throw MismatchError("a send to oneself needs a receive from oneself in the same group (" +
                                 std::to_string(sends.size()) + " sends, " +
                                 std::to_string(receives.size()) + " receives)");
    for (size_t k = 0; k < sends.size(); ++k) {
      const Transfer& send = transfers_[sends[k]];
      const Transfer& receive = transfers_[receives[k]];
      if (send.count != receive.count || send.datatype != receive.datatype)
        throw MismatchError("a send to oneself of " + describe(send.count, send.datatype) +
                                   " met a receive of " + describe(receive.count, receive.datatype));
      std::memmove(receive.buffer, send.buffer, bytesOf(send));
      done_[sends[k]] = done_[receives[k]] = true;
    }
  }

  int receiveFromAny(Transfer transfer) {
    std::vector<int> peers;
    for (int peer = 0; peer < shm_.size(); ++peer)
      if (peer != shm_.self()) peers.push_back(peer);
    if (peers.empty()) throw Error(ncclInvalidUsage, "a receive from any rank needs another rank");
    while (true) {
      uint32_t bell = shm_.doorbell();  // read before looking, so no ring is missed
      for (int peer : peers) {
        transfer.peer = peer;
        if (!tryReceive(transfer)) continue;
        if (!mismatch_.empty()) throw MismatchError(mismatch_);
        return peer;
      }
      shm_.awaitDoorbell(bell, peers);
    }
  }

 private:
  bool trySend(const Transfer& transfer) {
    ShmTransport::Entry entry{};
    if (!shm_.claimSend(transfer.peer, &entry)) return false;
    const size_t bytes = bytesOf(transfer);
    MessageNote note{transfer.count, bytes, 0, 0, transfer.sequence, transfer.datatype};
    if (bytes <= shm_.inlineBytes()) {
      std::memcpy(entry.data, transfer.buffer, bytes);
    } else {
      ShmTransport::Buffer buffer = shm_.claimOutgoingBuffer(transfer.peer, bytes);
      std::memcpy(buffer.data, transfer.buffer, bytes);
      note.bufferSerial = buffer.serial;
      note.bufferCapacity = buffer.capacity;
    }
    std::memcpy(entry.note, &note, sizeof(note));
    shm_.postSend(transfer.peer);
    return true;
  }

  bool tryReceive(const Transfer& transfer) {
    ShmTransport::Entry entry{};
    if (!shm_.peekReceive(transfer.peer, &entry)) return false;
    MessageNote note{};
    std::memcpy(&note, entry.note, sizeof(note));
    const bool matches = note.count == transfer.count && note.datatype == transfer.datatype;
    if (!matches && mismatch_.empty())
      mismatch_ = transferMismatch(shm_.commRank(transfer.peer), note.count, note.datatype, note.sequence,
                                   shm_.commRank(shm_.self()), transfer);
    if (note.bufferSerial == 0) {
      if (matches) std::memcpy(transfer.buffer, entry.data, note.bytes);
    } else {
      const char* data = shm_.incomingBuffer(transfer.peer, note.bufferSerial, note.bufferCapacity);
      if (matches) std::memcpy(transfer.buffer, data, note.bytes);
      shm_.releaseIncomingBuffer(transfer.peer, note.bufferSerial);
    }
    shm_.releaseReceive(transfer.peer);
    return true;
  }

  ShmTransport& shm_;
  const std::vector<Transfer>& transfers_;
  std::vector<bool> done_;
  std::string mismatch_;
};

}  // namespace

std::string transferMismatch(int sender, size_t sentCount, uint32_t sentType, uint64_t sentCall, int receiver,
                             const Transfer& expected) {
  return "point-to-point mismatch: rank " + std::to_string(sender) + " sent " +
         describe(sentCount, sentType) + " (its call #" + std::to_string(sentCall) + "), rank " +
         std::to_string(receiver) + " expected " + describe(expected.count, expected.datatype) +
         " (its call #" + std::to_string(expected.sequence) + ")";
}

void runTransfers(ShmTransport& shm, const std::vector<Transfer>& transfers) {
  Progress(shm, transfers).run();
}

int receiveFromAny(ShmTransport& shm, const Transfer& transfer) {
  return Progress(shm, {}).receiveFromAny(transfer);
}

// Across nodes every message is preceded by a small one that describes it
// (exchangeHeadered), so a receive of another size consumes the message and
// names both sides, as within a node, and the communicator stays usable.
void runRemoteTransfers(FabricTransport& fabric, int self, const std::vector<Transfer>& transfers,
                        const std::string& what, bool collective) {
  struct Header {
    uint64_t count;
    uint64_t sequence;
    uint32_t datatype;
    uint32_t reserved;
  };
  std::vector<Header> headers(transfers.size());
  std::vector<HeaderedMessage> messages;
  for (size_t i = 0; i < transfers.size(); ++i) {
    const Transfer& transfer = transfers[i];
    if (transfer.isSend)
      headers[i] = {transfer.count, transfer.sequence, static_cast<uint32_t>(transfer.datatype), 0};
    messages.push_back({transfer.isSend, transfer.peer, &headers[i], transfer.buffer, bytesOf(transfer)});
  }
  std::string mismatch;
  std::vector<std::vector<char>> discarded;
  exchangeHeadered(fabric, messages, sizeof(Header), collective, [&](size_t i) {
    const Transfer& transfer = transfers[i];
    const Header& sent = headers[i];
    if (sent.count == transfer.count && sent.datatype == static_cast<uint32_t>(transfer.datatype))
      return std::make_pair(transfer.buffer, bytesOf(transfer));
    if (mismatch.empty())
      mismatch = transferMismatch(transfer.peer, sent.count, sent.datatype, sent.sequence, self, transfer);
    size_t datatypeBytes = datatypeSize(static_cast<ncclDataType_t>(sent.datatype));
    discarded.emplace_back(sent.count * (datatypeBytes ? datatypeBytes : 1));
    return std::make_pair(static_cast<void*>(discarded.back().data()), discarded.back().size());
  }, what);
  if (!mismatch.empty()) throw MismatchError(mismatch);
}

}  // namespace mojoccl
