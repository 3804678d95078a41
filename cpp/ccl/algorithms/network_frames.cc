// The leaders' frames (each call's agreement, and a small call's data):
// to every other leader directly, or by Bruck's all-gather; on the
// leaders' sockets where the group has them, else on the fabric in pieces
// the provider sends at once.
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
