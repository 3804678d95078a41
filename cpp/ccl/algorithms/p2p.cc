#include "algorithms/p2p.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/datatypes.h"
#include "base/error.h"
#include "transports/fabric.h"

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
  return "point-to-point mismatch: rank " + std::to_string(sender) + " sent " + describe(sentCount, sentType) +
         (sentCall > 0 ? " (its call #" + std::to_string(sentCall) + ")" : "") + ", rank " +
         std::to_string(receiver) + " expected " + describe(expected.count, expected.datatype) +
         " (its call #" + std::to_string(expected.sequence) + ")";
}

void runTransfers(ShmTransport& shm, const std::vector<Transfer>& transfers) {
  Progress(shm, transfers).run();
}

int receiveFromAny(ShmTransport& shm, const Transfer& transfer) {
  return Progress(shm, {}).receiveFromAny(transfer);
}

namespace {

// A message preceded by a small header that describes it. The receiver
// takes the header first and then the message at the size the header
// announces (a receive of another size would be a provider error), so a
// message of an unexpected size still arrives whole and can be reported.
struct HeaderedMessage {
  bool isSend;
  int peer;
  void* header;               // sent from, or received into
  const void* payload;        // sends only
  size_t payloadBytes;        // sends only
};

// Posts every header of `messages`, in order (sends buffered), then the
// sends' payloads, in the same order, and waits for the headers received;
// then `receiveInto(i)` says where the payload of receive `messages[i]`
// goes and how long it is, and those receives are posted, in order, and
// everything is waited for. Headers before payloads on both sides, since
// messages between two ranks match in the order they are posted. A payload
// that fits with its header in a message the provider sends at once
// (eagerMessage()) travels in its header's message: one message, one wait;
// a larger one in pieces (segmentFor()). `payloadsInPlace`: the payloads
// are sent from the caller's memory, not copied first, which is only safe
// where every receiver posts its receives in the same call (an all-to-all).
void exchangeHeadered(FabricTransport& fabric, const std::vector<HeaderedMessage>& messages,
                      size_t headerBytes, bool payloadsInPlace,
                      const std::function<std::pair<void*, size_t>(size_t index)>& receiveInto,
                      const std::string& what) {
  // An all-to-all (its payloads in place) is a collective: it keeps to the
  // collectives' lane, and a send or receive to the point-to-point one.
  const auto lane = payloadsInPlace ? FabricTransport::Lane::Collective : FabricTransport::Lane::PointToPoint;
  // Every receive takes room for a header and an inline payload in one
  // message the provider sends at once; a payload that fits there travels
  // with its header, a larger one after it, at the size the header announces.
  const size_t room = std::max(fabric.eagerMessage(), headerBytes);
  const size_t inlineBytes = room - headerBytes;
  std::vector<std::unique_ptr<char[]>> arrived(messages.size());
  std::vector<size_t> arrivedBytes(messages.size());
  // Every header goes before any payload, in both passes on both sides:
  // messages between two ranks match in the order they are posted, and a
  // receiver learns a payload's size only from its header.
  std::vector<FabricTransport::Ticket> headers;
  for (size_t i = 0; i < messages.size(); ++i) {
    const HeaderedMessage& message = messages[i];
    const char* payload = static_cast<const char*>(message.payload);
    if (message.isSend) {
      std::vector<char> whole(static_cast<const char*>(message.header),
                              static_cast<const char*>(message.header) + headerBytes);
      if (message.payloadBytes <= inlineBytes) whole.insert(whole.end(), payload, payload + message.payloadBytes);
      fabric.postBufferedSend(message.peer, whole.data(), whole.size(), SIZE_MAX, lane);
    } else {
      arrived[i].reset(new char[room]);
      headers.push_back(fabric.postRecvUpTo(message.peer, arrived[i].get(), room, &arrivedBytes[i], lane));
    }
  }
  for (const HeaderedMessage& message : messages) {
    if (!message.isSend || message.payloadBytes <= inlineBytes) continue;
    const char* payload = static_cast<const char*>(message.payload);
    if (payloadsInPlace)
      forEachPiece(message.payloadBytes, fabric.segmentFor(message.payloadBytes), [&](size_t offset, size_t length) {
        fabric.postSend(message.peer, payload + offset, length, lane);
      });
    else
      fabric.postBufferedSend(message.peer, payload, message.payloadBytes, fabric.segmentFor(message.payloadBytes),
                              lane);
  }
  // Every header: now the payloads' sizes are known. (Payloads sent in
  // place wait for their receives, posted below and by the peers.)
  for (FabricTransport::Ticket header : headers) fabric.waitFor(header, what);
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].isSend) continue;
    std::memcpy(messages[i].header, arrived[i].get(), headerBytes);
    const std::pair<void*, size_t> payload = receiveInto(i);
    if (payload.second <= inlineBytes) {
      if (arrivedBytes[i] != headerBytes + payload.second)
        fail(ncclInternalError, what + ": rank " + std::to_string(messages[i].peer) + " sent a " +
                                    std::to_string(arrivedBytes[i]) + "-byte message announcing " +
                                    std::to_string(payload.second) + " bytes behind its header");
      std::memcpy(payload.first, arrived[i].get() + headerBytes, payload.second);
    } else {
      forEachPiece(payload.second, fabric.segmentFor(payload.second), [&](size_t offset, size_t length) {
        fabric.postRecv(messages[i].peer, static_cast<char*>(payload.first) + offset, length, lane);
      });
    }
  }
  fabric.waitAll(what);
}

}  // namespace

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
