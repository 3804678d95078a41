// The fabric transport: waiting, reading completions, and what a failed
// or turned-away message does.
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

void FabricTransport::waitAll(const std::string& what) {
  std::unique_lock<std::mutex> lock(mutex_);
  waitUntil([this] { return waitedFor_ == 0; }, what);
}

void FabricTransport::waitFor(Ticket ticket, const std::string& what) {
  std::unique_lock<std::mutex> lock(mutex_);
  // Completed requests leave pending_ at each progress: none of its pieces is left.
  waitUntil([&] {
    return std::none_of(pending_.begin(), pending_.end(),
                        [&](const Request& request) { return request.ticket == ticket && !request.done; });
  }, what);
}

void FabricTransport::poll(const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    progress(what);
  } catch (const Error&) {
    cancelPending();
    throw;
  }
}

void FabricTransport::waitUntil(const std::function<bool()>& done, const std::string& what) {
  waiting_ = true;
  try {
    auto lastProgress = std::chrono::steady_clock::now(), lastCheck = lastProgress;
    uint64_t seen = completed_;
    while (!done()) {
      if (!failure_.empty()) fail(ncclRemoteError, failure_);
      const bool sleep = canSleep_ && std::chrono::steady_clock::now() - lastProgress > kPollBeforeSleeping;
      progress(what, sleep);
      auto now = std::chrono::steady_clock::now();
      if (completed_ != seen) {
        seen = completed_;
        lastProgress = now;
        continue;
      }
      // Where ranks outnumber cores, the rank this one waits for may need its core.
      if (!sleep) sched_yield();
      if (aborted_.load()) fail(ncclInvalidUsage, "the communicator was aborted");
      if (checkPeers_ && now - lastCheck > std::chrono::milliseconds(1)) {
        lastCheck = now;
        checkPeers_(peersWaitedOn(), now - lastProgress);
      }
      if (now - lastProgress > std::chrono::seconds(timeoutSeconds_)) failTimedOut(what, oldestPeer());
    }
  } catch (const Error&) {
    waiting_ = false;
    cancelPending();
    throw;
  }
  waiting_ = false;
  if (buffered_ > 0) bufferedPosted_.notify_one();
}

// While buffered sends are in flight and no caller progresses the endpoint,
// this thread does, releasing the mutex between polls. A peer reading a
// large send (a rendezvous) gets its data only while this side polls, so it
// polls back to back (yielding its core) until kPollBeforeSleeping passes
// without a completion, then every 100 us.
void FabricTransport::progressBufferedSends() {
  std::unique_lock<std::mutex> lock(mutex_);
  auto lastProgress = std::chrono::steady_clock::now();
  uint64_t seen = completed_;
  while (!stopping_) {
    if (buffered_ == 0 || waiting_ || !failure_.empty()) {
      bufferedPosted_.wait(lock);
      lastProgress = std::chrono::steady_clock::now();
      continue;
    }
    try {
      progress("a buffered send");
    } catch (const Error& error) {
      failure_ = error.what();
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    if (completed_ != seen) seen = completed_, lastProgress = now;
    lock.unlock();
    if (now - lastProgress < kPollBeforeSleeping)
      sched_yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    lock.lock();
  }
}

int FabricTransport::oldestPeer() const {
  for (const auto& request : pending_)
    if (!request.done && !request.buffered) return request.peer;
  return pending_.empty() ? rank_ : pending_.front().peer;
}

std::vector<int> FabricTransport::peersWaitedOn() const {
  std::vector<int> peers;
  for (const auto& request : pending_)
    if (!request.done && !request.buffered && std::find(peers.begin(), peers.end(), request.peer) == peers.end())
      peers.push_back(request.peer);
  return peers;
}

void FabricTransport::failTimedOut(const std::string& what, int rank) {
  fail(ncclRemoteError, waitedAcrossNodes(what, rank_, rank, ranks_[rank], timeoutSeconds_));
}

// After a failure the ranks are out of step and the communicator unusable:
// nothing posted may still write into the caller's buffers.
void FabricTransport::cancelPending() {
  for (auto& request : pending_) {
    if (!request.done) fi_cancel(&endpoint_->fid, &request.context);
    if (!request.done && request.slot >= 0) staging_->freeSlots[request.isSend].push_back(request.slot);
  }
  for (auto& queue : waitingForSlot_) queue.clear();
  unsubmitted_.clear();
  toRepost_.clear();
  pending_.clear();
  waitedFor_ = buffered_ = 0;
}

void FabricTransport::progress(const std::string& what, bool sleep) {
  fi_cq_tagged_entry entries[16];
  ssize_t count = sleep ? fi_cq_sread(cq_, entries, 16, nullptr, kSleepMilliseconds) : fi_cq_read(cq_, entries, 16);
  if (count == -FI_ETIMEDOUT) count = -FI_EAGAIN;  // slept the whole time: nothing new
  if (count == -FI_EAVAIL) {
    fi_cq_err_entry error{};
    fi_cq_readerr(cq_, &error, 0);
    auto* request = reinterpret_cast<Request*>(error.op_context);
    // A message longer than the receive that carried another key: a
    // stranger's, turned away like any other. (One that says nothing of
    // its key is reported: a rank of ours may have sent it.)
    const bool anotherKey = keyed_ && (error.flags & FI_REMOTE_CQ_DATA) && error.data != key_;
    if (error.err == FI_ETRUNC && request && !request->isSend && anotherKey) {
      turnAway(*request);
      repostTurnedAway();
      return;
    }
    failRequest(error, what);
  }
  if (count < 0 && count != -FI_EAGAIN)
    fail(ncclSystemError, what + ": fi_cq_read failed: " + library_.strerror(static_cast<int>(-count)));
  for (ssize_t i = 0; i < count; ++i) {
    Request& request = *reinterpret_cast<Request*>(entries[i].op_context);
    if (!request.isSend && !sealed(entries[i].flags, entries[i].data))
      turnAway(request);
    else
      complete(request, entries[i].len, what);
  }
  if (count > 0) pending_.remove_if([](const Request& request) { return request.done; });
  repostTurnedAway();
  // Into the slots just freed, or again where the provider's queue was full.
  submitStaged();
  submitUnsubmitted();
}

void FabricTransport::submitUnsubmitted() {
  while (!unsubmitted_.empty()) {
    Request& request = *unsubmitted_.front();
    // Not inject: its completion removes it from pending_ as any other's.
    if (!submit(request, request.user, descriptorFor(request.user, request.bytes), /*mayInject=*/false)) return;
    unsubmitted_.pop_front();
  }
}

bool FabricTransport::sealed(uint64_t flags, uint64_t data) const {
  return !keyed_ || ((flags & FI_REMOTE_CQ_DATA) && data == key_);
}

void FabricTransport::turnAway(Request& request) {
  rejections_.record("a message tagged as from rank " + std::to_string(request.peer) +
                     " that did not carry this communicator's key");
  toRepost_.push_back(&request);
}

// Into the same buffer (or staging slot), with the same tag: the real
// message, when it comes, overwrites whatever the turned-away one left there.
void FabricTransport::repostTurnedAway() {
  while (!toRepost_.empty()) {
    Request& request = *toRepost_.front();
    const bool staged = request.slot >= 0;
    char* wire = staged ? staging_->slot(request.slot) : request.user;
    void* descriptor = staged ? staging_->descriptor : descriptorFor(request.user, request.bytes);
    if (!submit(request, wire, descriptor)) return;  // tried again at the next progress
    toRepost_.pop_front();
  }
}

void FabricTransport::complete(Request& request, size_t length, const std::string& what) {
  request.done = true;
  ++completed_;
  (request.buffered ? buffered_ : waitedFor_) -= 1;
  const bool upTo = request.received != nullptr;
  if (request.slot >= 0) {
    if (!request.isSend && (length == request.bytes || upTo))
      std::memcpy(request.user, staging_->slot(request.slot), length);
    staging_->freeSlots[request.isSend].push_back(request.slot);
  }
  if (upTo) {
    *request.received = length;
    return;
  }
  if (!request.isSend && length != request.bytes)
    fail(ncclInternalError, what + ": rank " + std::to_string(request.peer) + " sent " +
                                std::to_string(length) + " bytes where rank " + std::to_string(rank_) +
                                " expected " + std::to_string(request.bytes));
}

void FabricTransport::failRequest(const fi_cq_err_entry& error, const std::string& what) {
  // A rank known to have died explains a broken connection better, and the
  // news of a death on another node may come moments after the provider
  // sees its connection break (or cancels what was in flight on it).
  const auto deadline = std::chrono::steady_clock::now() + kDeathNewsGrace;
  while (checkPeers_) {
    checkPeers_({}, {});
    if (std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto* request = reinterpret_cast<Request*>(error.op_context);
  std::string peer = request ? "rank " + std::to_string(request->peer) + " (" +
                                   ranks_[request->peer].hostname + ")"
                             : "a peer";
  char detail[256] = {};
  fi_cq_strerror(cq_, error.prov_errno, error.err_data, detail, sizeof(detail));
  fail(ncclRemoteError, what + ": " + std::string(request && request->isSend ? "sending to " : "receiving from ") +
                            peer + " failed: " + library_.strerror(error.err) + " (" + detail + ")");
}

}  // namespace mojoccl
