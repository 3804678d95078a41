// The fabric transport: the endpoint it opens, the addresses of every
// rank it learns, what it closes (posting: fabric_post.cc; waiting and
// completions: fabric_progress.cc; registered memory: fabric_memory.cc).
#include "transports/fabric.h"

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

#include "base/error.h"
#include "base/settings.h"
#include "base/socket.h"
#include "transports/shared_regions.h"

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

std::string FabricTransport::providerName() const { return info_->fabric_attr->prov_name; }

std::string waitedAcrossNodes(const std::string& what, int rank, int peer, const RankInfo& peerInfo,
                              int timeoutSeconds) {
  return what + ": rank " + std::to_string(rank) + " waited " + std::to_string(timeoutSeconds) + " s for rank " +
         std::to_string(peer) + " (" + peerInfo.hostname + ", pid " + std::to_string(peerInfo.pid) +
         ") across nodes (MOJOCCL_IB_TIMEOUT_S=" + std::to_string(timeoutSeconds) + ")";
}

}  // namespace mojoccl
