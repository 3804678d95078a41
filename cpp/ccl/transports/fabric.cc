#include "fabric.h"

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>

#include <sched.h>
#include <sys/mman.h>

#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include "../settings.h"
#include "../error.h"
#include "../socket.h"
#include "shared_regions.h"

namespace mojoccl {
namespace {

// The tag: the sender's rank, then the lane, then a per-lane, per-direction
// message counter, 48 bits in all (what the providers we target offer).
constexpr int kCounterBits = 27;
constexpr int kLaneShift = kCounterBits;
constexpr int kSenderShift = kCounterBits + 1;
constexpr uint64_t kCounterMask = (uint64_t{1} << kCounterBits) - 1;
constexpr int kMaxRanks = 1 << 20;
constexpr size_t kAddressBytes = 256;

struct Address {
  uint32_t length;
  char bytes[kAddressBytes];
};

}  // namespace

FabricTransport::FabricTransport(Bootstrap& bootstrap, int rank, int localIndex,
                                 const std::atomic<bool>& aborted, int timeoutSeconds)
    : library_(LibFabric::get()),
      rank_(rank),
      aborted_(aborted),
      ranks_(bootstrap.ranks()),
      sent_{std::vector<uint32_t>(ranks_.size()), std::vector<uint32_t>(ranks_.size())},
      received_{std::vector<uint32_t>(ranks_.size()), std::vector<uint32_t>(ranks_.size())},
      rejections_("rank " + std::to_string(rank) + "'s fabric endpoint") {
  timeoutSeconds_ = timeoutSeconds;
  if (ranks_.size() > kMaxRanks)
    fail(ncclInvalidUsage, "libmojoccl's fabric transport serves at most " +
                               std::to_string(kMaxRanks) + " ranks");
  std::optional<SignalHandlersKept> handlers(std::in_place);  // while providers load
  const char wantsLimit = wantsTcpEagerLimit() ? 1 : 0;
  const std::vector<char> everyones = bootstrap.allGather(&wantsLimit, 1);
  const bool raiseLimit = std::all_of(everyones.begin(), everyones.end(), [](char yes) { return yes == 1; });
  FabricChoice choice = chooseFabric(library_, localIndex, raiseLimit);
  infoList_ = choice.list;
  info_ = choice.info;
  how_ = choice.how;
  std::string failure = choice.failure;
  bootstrap.agreeOnSuccess(failure.empty(), failure);
  if (!choice.warning.empty() && localIndex == 0) fprintf(stderr, "[mojoccl] WARNING: %s\n", choice.warning.c_str());
  // Ranks on different providers cannot reach each other: one choice for all.
  bootstrap.requireSameSetting("The libfabric provider (MOJOCCL_FABRIC_PROVIDER)", info_->fabric_attr->prov_name);

  auto check = [&](int result, const char* call) {
    if (result != 0)
      fail(ncclSystemError, std::string(call) + " failed: " + library_.strerror(-result) +
                                " (libfabric provider " + info_->fabric_attr->prov_name + ")");
  };
  Address mine{};
  try {
    objects_ = takeFabricEndpoint(library_, info_);
    fabric_ = objects_->fabric;
    domain_ = objects_->domain;
    cq_ = objects_->cq;
    av_ = objects_->av;
    endpoint_ = objects_->endpoint;
    canSleep_ = objects_->canSleep;
    size_t length = sizeof(mine.bytes);
    check(fi_getname(&endpoint_->fid, mine.bytes, &length), "fi_getname");
    mine.length = static_cast<uint32_t>(length);
    if (registersLocalBuffers(info_)) openStaging();
  } catch (const Error& error) {
    failure = error.what();
  }
  handlers.reset();
  bootstrap.agreeOnSuccess(failure.empty(), failure);

  std::vector<char> all = bootstrap.allGather(&mine, sizeof(mine));
  addresses_.resize(ranks_.size());
  for (size_t peer = 0; peer < ranks_.size(); ++peer) {
    const auto* address = reinterpret_cast<const Address*>(all.data() + peer * sizeof(Address));
    if (fi_av_insert(av_, address->bytes, 1, &addresses_[peer], 0, nullptr) != 1 && failure.empty())
      failure = "fi_av_insert could not add rank " + std::to_string(peer) + "'s address (" +
                ranks_[peer].hostname + ")";
  }
  bootstrap.agreeOnSuccess(failure.empty(), failure);
  maxMessage_ = std::min(info_->ep_attr->max_msg_size, kMaxPiece);
  if (staging_) maxMessage_ = std::min(maxMessage_, staging_->slotBytes);
  eagerMessage_ = std::min(maxMessage_, eagerBytes(info_));
  injectBytes_ = info_->tx_attr->inject_size;
  // A key as wide as the provider's completion data (8 bytes on tcp and
  // cxi, 4 on verbs and efa).
  const size_t keyBytes = std::min<size_t>(info_->domain_attr->cq_data_size, 8);
  keyed_ = keyBytes > 0;
  key_ = keyBytes >= 8 ? bootstrap.keys().fabric : bootstrap.keys().fabric & ((uint64_t{1} << (8 * keyBytes)) - 1);
  directed_ = (info_->caps & FI_DIRECTED_RECV) != 0 && directedReceives();
  if (!keyed_ && !directed_ && localIndex == 0)
    fprintf(stderr, "[mojoccl] WARNING: libfabric provider %s neither names a receive's source nor carries "
            "completion data: messages between nodes cannot be checked for strangers (docs/security.md)\n",
            info_->fabric_attr->prov_name);
  regionWatch_ = watchRegionFrees([this](uint64_t id) { forgetRegion(id); });
}

FabricTransport::~FabricTransport() {
  if (regionWatch_ != 0) unwatchRegionFrees(regionWatch_);
  {
    std::unique_lock<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  bufferedPosted_.notify_all();
  if (progressThread_.joinable()) progressThread_.join();
  // The last sends of a program must still reach their receivers.
  try {
    std::unique_lock<std::mutex> lock(mutex_);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutSeconds_);
    while (buffered_ > 0 && failure_.empty() && !aborted_.load() &&
           std::chrono::steady_clock::now() < deadline) {
      progress("ncclCommDestroy");
      if (checkPeers_) checkPeers_({}, {});  // no use waiting once a rank died
    }
  } catch (const Error&) {
  }
  for (auto& registration : registrations_) fi_close(&registration.second->fid);
  if (staging_) {
    if (traceRegistrations_ && staging_->registration)
      fprintf(stderr, "[mojoccl] rank %d: %llu messages went through the registered %zu-byte staging region\n",
              rank_, static_cast<unsigned long long>(staging_->staged), staging_->bytes);
    if (staging_->registration) fi_close(&staging_->registration->fid);
    if (staging_->base) munmap(staging_->base, staging_->bytes);
  }
  objects_.reset();
  fabricEndpointReleased();
  if (infoList_) library_.freeinfo(infoList_);
}

std::string FabricTransport::describe() const {
  FabricChoice chosen;
  chosen.info = info_;
  chosen.how = how_;
  return describeFabric(chosen, library_) + (objects_ && objects_->spare ? ", its endpoint the spare" : "");
}

uint64_t FabricTransport::tag(int sender, Lane lane, uint32_t counter) const {
  return (static_cast<uint64_t>(sender) << kSenderShift) | (static_cast<uint64_t>(lane) << kLaneShift) |
         (counter & kCounterMask);
}

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

std::string FabricTransport::providerName() const { return info_->fabric_attr->prov_name; }

std::string waitedAcrossNodes(const std::string& what, int rank, int peer, const RankInfo& peerInfo,
                              int timeoutSeconds) {
  return what + ": rank " + std::to_string(rank) + " waited " + std::to_string(timeoutSeconds) + " s for rank " +
         std::to_string(peer) + " (" + peerInfo.hostname + ", pid " + std::to_string(peerInfo.pid) +
         ") across nodes (MOJOCCL_IB_TIMEOUT_S=" + std::to_string(timeoutSeconds) + ")";
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
