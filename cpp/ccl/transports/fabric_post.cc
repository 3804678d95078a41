// The fabric transport: posting messages (buffered sends, pieces, the
// staging region's slots) and handing them to the provider.
#include "transports/fabric.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <thread>

#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include "base/error.h"
#include "transports/shared_regions.h"

namespace mojoccl {

FabricTransport::Ticket FabricTransport::postSend(int peer, const void* data, size_t bytes, Lane lane) {
  std::lock_guard<std::mutex> lock(mutex_);
  return postOrCancel(peer, lane, true, static_cast<char*>(const_cast<void*>(data)), bytes, nullptr);
}

FabricTransport::Ticket FabricTransport::postRecv(int peer, void* data, size_t bytes, Lane lane) {
  std::lock_guard<std::mutex> lock(mutex_);
  return postOrCancel(peer, lane, false, static_cast<char*>(data), bytes, nullptr);
}

FabricTransport::Ticket FabricTransport::postRecvUpTo(int peer, void* data, size_t bytes, size_t* received,
                                                     Lane lane) {
  if (bytes > maxMessage_)
    fail(ncclInternalError, "a receive of up to " + std::to_string(bytes) + " bytes is more than one message (" +
                                std::to_string(maxMessage_) + " bytes)");
  std::lock_guard<std::mutex> lock(mutex_);
  return postOrCancel(peer, lane, false, static_cast<char*>(data), bytes, nullptr, received);
}

// Several pieces in flight keep the wire busy, and a reduction of one
// overlaps the transfer of the next. Over tcp (eager up to 128 KiB),
// between 2 nodes, eager pieces took the all-reduce of 256 KiB from 169 to
// 101 us, 1 MiB from 530 to 432 and 4 MiB from 2,300 to 1,700, the
// broadcast of 1 MiB from 194-243 to 143, the all-to-all of 256 KiB from
// 103 to 55 and a point-to-point swap of 256 KiB from 96-213 to 71; from
// 32 MiB they were as fast as 1 MiB pieces or up to 7% slower.
size_t FabricTransport::segmentFor(size_t bytes, size_t eagerPiecesUpTo) const {
  constexpr size_t kLargePiece = size_t{1} << 20;
  return bytes <= eagerPiecesUpTo ? std::min(eagerMessage_, kLargePiece) : kLargePiece;
}

void FabricTransport::postBufferedSend(int peer, const void* data, size_t bytes, size_t piece, Lane lane) {
  std::shared_ptr<std::vector<char>> copy;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    copy = spareCopy(bytes);
    if (!progressThread_.joinable()) progressThread_ = std::thread([this] { progressBufferedSends(); });
  }
  // Each piece goes as soon as it is copied, the lock free while the next
  // one is: the wire starts on the first while the rest is still copied.
  const char* from = static_cast<const char*>(data);
  try {
    forEachPiece(bytes, piece, [&](size_t offset, size_t length) {
      std::memcpy(copy->data() + offset, from + offset, length);
      std::lock_guard<std::mutex> lock(mutex_);
      postOrCancel(peer, lane, true, copy->data() + offset, length, copy);
      if (offset + length < bytes)
        bufferedPosted_.notify_one();
      else
        copy.reset();  // with the lock held: the last reference hands the copy back to the spares
    });
  } catch (const Error&) {
    std::lock_guard<std::mutex> lock(mutex_);
    copy.reset();
    throw;
  }
  // No wake-up after the last piece: the caller's next wait progresses it,
  // and wakes the progress thread if it is still in flight when that wait ends.
}

std::shared_ptr<std::vector<char>> FabricTransport::spareCopy(size_t bytes) {
  // The smallest spare that holds it, else a new one.
  auto best = spareCopies_.end();
  for (auto spare = spareCopies_.begin(); spare != spareCopies_.end(); ++spare)
    if ((*spare)->capacity() >= bytes && (best == spareCopies_.end() || (*spare)->capacity() < (*best)->capacity()))
      best = spare;
  std::unique_ptr<std::vector<char>> copy;
  if (best != spareCopies_.end()) {
    copy = std::move(*best);
    spareCopies_.erase(best);
  } else {
    copy = std::make_unique<std::vector<char>>();
  }
  copy->resize(bytes);
  return std::shared_ptr<std::vector<char>>(copy.release(), [this](std::vector<char>* done) {
    std::unique_ptr<std::vector<char>> back(done);
    if (done->capacity() > kLargestSpareCopy) return;
    if (spareCopies_.size() == kSpareCopies) spareCopies_.erase(spareCopies_.begin());  // the oldest
    spareCopies_.push_back(std::move(back));
  });
}

// A post that fails leaves the ranks out of step, as a failed wait does.
FabricTransport::Ticket FabricTransport::postOrCancel(int peer, Lane lane, bool isSend, char* base, size_t bytes,
                                                     const std::shared_ptr<std::vector<char>>& copy,
                                                     size_t* received) {
  try {
    return post(peer, lane, isSend, base, bytes, copy, received);
  } catch (const Error&) {
    cancelPending();
    throw;
  }
}

// Posts `bytes` in pieces of at most maxMessage_; an empty message still
// travels, as the receiver waits for it. Every piece of a buffered send
// holds its `copy`.
FabricTransport::Ticket FabricTransport::post(int peer, Lane lane, bool isSend, char* base, size_t bytes,
                                             const std::shared_ptr<std::vector<char>>& copy, size_t* received) {
  const bool buffered = copy != nullptr;
  if (!failure_.empty()) fail(ncclRemoteError, failure_);
  const Ticket ticket = ++lastTicket_;
  // Named only when something goes wrong: posting is on every message's path.
  auto what = [&] { return std::string(isSend ? "a send to" : "a receive from") + " rank " + std::to_string(peer); };
  size_t offset = 0;
  const auto start = std::chrono::steady_clock::now();
  do {
    size_t piece = std::min(maxMessage_, bytes - offset);
    const auto l = static_cast<size_t>(lane);
    uint64_t messageTag = isSend ? tag(rank_, lane, sent_[l][peer]++) : tag(peer, lane, received_[l][peer]++);
    pending_.push_back({{}, peer, isSend, piece, buffered, copy, messageTag, base + offset, -1});
    Request& request = pending_.back();
    request.received = received;
    request.ticket = ticket;
    (buffered ? buffered_ : waitedFor_) += 1;
    offset += piece;
    void* descriptor = descriptorFor(request.user, piece);
    if (descriptor == nullptr && staging_) {
      // Never waits for a slot: the messages that would free one may need
      // this rank's later posts (a receive after its sends) to complete.
      waitingForSlot_[isSend].push_back(&request);
      continue;
    }
    // A buffered send never waits for room in the provider's queue: its
    // caller may go on to wait for the very rank whose progress makes room
    // (over ofi_rxm the first message to a rank waits for the connection,
    // which that rank completes only while it reads its own endpoint). The
    // progress thread, or the next wait, submits it in its turn.
    if (buffered && (!unsubmitted_.empty() || !submit(request, request.user, descriptor, /*mayInject=*/true))) {
      unsubmitted_.push_back(&request);
      bufferedPosted_.notify_one();
      continue;
    }
    while (!buffered && !submit(request, request.user, descriptor, /*mayInject=*/true)) {
      progress(what());  // the queue is full: completions make room
      if (aborted_.load()) fail(ncclInvalidUsage, "the communicator was aborted");
      if (checkPeers_) checkPeers_({peer}, std::chrono::steady_clock::now() - start);
      if (std::chrono::steady_clock::now() - start > std::chrono::seconds(timeoutSeconds_))
        failTimedOut(what(), peer);
    }
    if (request.done) pending_.pop_back();  // injected: nothing will complete it
  } while (offset < bytes);
  submitStaged();
  return ticket;
}

// Hands one message to the provider; false when its queue is full. A
// small send may go inject (`mayInject`): the provider copies it at once
// and reports no completion, so the request is complete on return (over
// tcp, up to 64 bytes: a point-to-point swap of 8 bytes 9.2-9.7 us rather
// than 10.2-10.6).
bool FabricTransport::submit(Request& request, char* wire, void* descriptor, bool mayInject) {
  const fi_addr_t peer = addresses_[request.peer];
  if (mayInject && request.isSend && request.bytes <= injectBytes_) {
    const ssize_t result = keyed_ ? fi_tinjectdata(endpoint_, wire, request.bytes, key_, peer, request.tag)
                                  : fi_tinject(endpoint_, wire, request.bytes, peer, request.tag);
    if (result == 0) {
      complete(request, request.bytes, "");
      return true;
    }
    if (result != -FI_EAGAIN)
      fail(ncclSystemError, "posting a send to rank " + std::to_string(request.peer) + " failed: " +
                                library_.strerror(static_cast<int>(-result)));
    return false;
  }
  ssize_t result;
  if (!request.isSend)
    result = fi_trecv(endpoint_, wire, request.bytes, descriptor, directed_ ? peer : FI_ADDR_UNSPEC, request.tag, 0,
                      &request.context);
  else if (keyed_)
    result = fi_tsenddata(endpoint_, wire, request.bytes, descriptor, key_, peer, request.tag, &request.context);
  else
    result = fi_tsend(endpoint_, wire, request.bytes, descriptor, peer, request.tag, &request.context);
  if (result == -FI_EAGAIN) return false;
  if (result != 0)
    fail(ncclSystemError, std::string("posting a ") + (request.isSend ? "send to" : "receive from") + " rank " +
                              std::to_string(request.peer) + " failed: " + library_.strerror(static_cast<int>(-result)));
  return true;
}

// Staged messages go, in the order they were posted, as slots free up.
void FabricTransport::submitStaged() {
  if (!staging_ || (waitingForSlot_[0].empty() && waitingForSlot_[1].empty())) return;
  if (staging_->registration == nullptr) registerStaging();
  for (bool isSend : {false, true}) {
    std::deque<Request*>& queue = waitingForSlot_[isSend];
    std::vector<int>& free = staging_->freeSlots[isSend];
    while (!queue.empty() && !free.empty()) {
      Request& request = *queue.front();
      char* wire = staging_->slot(free.back());
      if (isSend) std::memcpy(wire, request.user, request.bytes);
      if (!submit(request, wire, staging_->descriptor)) break;  // tried again at the next progress
      request.slot = free.back();
      free.pop_back();
      queue.pop_front();
      ++staging_->staged;
    }
  }
}

}  // namespace mojoccl
