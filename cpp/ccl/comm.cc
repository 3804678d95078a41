#include "comm.h"

#include <cstdio>
#include <unistd.h>

#include "algorithms/direct.h"
#include "algorithms/zero_copy.h"
#include "bootstrap.h"
#include "datatypes.h"
#include "env.h"
#include "error.h"

namespace mojoccl {
namespace {

// Staging slot per rank (two per rank). Small enough to stay in cache while
// a chunk is copied in, reduced and copied out.
constexpr size_t kSlotBytes = 1 << 20;
// Up to this size one-shot all-reduce wins whatever the rank count; above it
// two-shot does once more than two ranks share the work.
constexpr size_t kOneShotMaxBytes = 64 << 10;

AllReduceAlgorithm allReduceAlgorithmFromEnv() {
  std::string choice = envChoice("MOJOCCL_ALGO", "auto", {"auto", "one_shot", "two_shot"});
  if (choice == "one_shot") return AllReduceAlgorithm::OneShot;
  if (choice == "two_shot") return AllReduceAlgorithm::TwoShot;
  return AllReduceAlgorithm::Auto;
}

std::string segmentName(const ncclUniqueId& id, uint64_t hostHash) {
  uint64_t hash = hostHash;
  for (unsigned char byte : id.internal) hash = (hash ^ byte) * 1099511628211ull;
  char name[64];
  snprintf(name, sizeof(name), "/mojoccl-%d-%016llx", static_cast<int>(getuid()),
           static_cast<unsigned long long>(hash));
  return name;
}

}  // namespace

Comm::Comm(const ncclUniqueId& id, int nranks, int rank)
    : rank_(rank),
      size_(nranks),
      allReduceAlgorithm_(allReduceAlgorithmFromEnv()),
      zeroCopy_(envChoice("MOJOCCL_ZERO_COPY", "1", {"0", "1"}) == "1") {
  if (nranks < 1) fail(ncclInvalidArgument, "nranks must be at least 1, got " + std::to_string(nranks));
  if (rank < 0 || rank >= nranks)
    fail(ncclInvalidArgument, "rank " + std::to_string(rank) + " is outside 0.." +
                                  std::to_string(nranks - 1));
  int64_t timeout = envInt("MOJOCCL_BOOTSTRAP_TIMEOUT_S", 120, 1, 86400);
  // A little longer than the root's own limit, so that its explanation of
  // who is missing arrives before this rank gives up on its own.
  Bootstrap bootstrap(id, describeThisRank(rank), nranks,
                      Clock::now() + std::chrono::seconds(timeout + 10));

  const auto& ranks = bootstrap.ranks();
  std::vector<ShmPeer> peers;
  for (const auto& info : ranks) {
    if (info.hostHash != ranks[0].hostHash)
      fail(ncclInvalidUsage, std::string("rank ") + std::to_string(info.rank) + " runs on " +
                                 info.hostname + " and rank 0 on " + ranks[0].hostname +
                                 ": this libmojoccl runs a communicator within one node "
                                 "(shared memory); the node-to-node transport is not built in");
    peers.push_back({info.rank, info.pid});
  }
  shm_ = std::make_unique<ShmTransport>(bootstrap, peers, rank, segmentName(id, ranks[0].hostHash),
                                        kSlotBytes, aborted_);
  bootstrap.close();
}

Comm::~Comm() = default;

void Comm::validate(const Call& call) const {
  if (datatypeSize(call.datatype) == 0)
    fail(ncclInvalidArgument, "unknown datatype " + std::to_string(call.datatype));
  bool reduces = call.kind == CallKind::AllReduce || call.kind == CallKind::ReduceScatter ||
                 call.kind == CallKind::Reduce;
  if (reduces && (call.op < 0 || call.op >= ncclNumOps))
    fail(ncclInvalidArgument, "unknown reduction op " + std::to_string(call.op));
  bool rooted = call.kind == CallKind::Broadcast || call.kind == CallKind::Reduce;
  if (rooted && (call.root < 0 || call.root >= size_))
    fail(ncclInvalidArgument, "root " + std::to_string(call.root) + " is outside 0.." +
                                  std::to_string(size_ - 1));
  // Only the root reads a broadcast's send buffer or writes a reduce's receive buffer.
  bool needsSend = call.kind != CallKind::Broadcast || call.root == rank_;
  bool needsRecv = call.kind != CallKind::Reduce || call.root == rank_;
  if (call.count > 0 && ((needsRecv && call.recv == nullptr) || (needsSend && call.send == nullptr)))
    fail(ncclInvalidArgument, "a buffer pointer is NULL");
}

template <typename Algorithm>
void Comm::run(const std::string& what, Algorithm algorithm) {
  if (aborted_.load()) fail(ncclInvalidUsage, "the communicator was aborted");
  if (!brokenBy_.empty())
    fail(ncclInvalidUsage, "the communicator is unusable after an earlier error (" + brokenBy_ +
                               "); destroy it and create a new one");
  try {
    algorithm();
  } catch (const MismatchError&) {
    throw;  // already names both sides
  } catch (const Error& error) {
    // Any other failure leaves the ranks at different points of the call;
    // peers still waiting on this rank learn why at once.
    brokenBy_ = error.what();
    asyncError_.store(error.code());
    if (shm_) shm_->markFailed(error.what());
    throw Error(error.code(), "rank " + std::to_string(rank_) + ", " + what + ": " + error.what());
  }
}

void Comm::runCollective(const Call& call, size_t bytes, ZeroCopy zeroCopy, Staged staged) {
  validate(call);
  run(call.describe() + " (call #" + std::to_string(call.sequence) + ")", [&] {
    // Every rank takes the same branch: `bytes` is checked to agree in the
    // first step of either.
    if (zeroCopy_ && bytes >= kZeroCopyMinBytes && zeroCopy(*shm_, rounds_, call)) return;
    staged(*shm_, rounds_, call);
  });
}

void Comm::allReduce(const void* send, void* recv, size_t count, ncclDataType_t datatype,
                     ncclRedOp_t op) {
  const size_t bytes = count * datatypeSize(datatype);
  bool oneShot = allReduceAlgorithm_ == AllReduceAlgorithm::OneShot ||
                 (allReduceAlgorithm_ == AllReduceAlgorithm::Auto &&
                  (size_ <= 2 || bytes <= kOneShotMaxBytes));
  runCollective({CallKind::AllReduce, send, recv, count, datatype, op, 0, ++calls_}, bytes,
                allReduceZeroCopy, oneShot ? allReduceOneShot : allReduceTwoShot);
}

void Comm::broadcast(const void* send, void* recv, size_t count, ncclDataType_t datatype, int root) {
  runCollective({CallKind::Broadcast, send, recv, count, datatype, ncclSum, root, ++calls_},
                count * datatypeSize(datatype), broadcastZeroCopy, broadcastDirect);
}

void Comm::allGather(const void* send, void* recv, size_t sendCount, ncclDataType_t datatype) {
  runCollective({CallKind::AllGather, send, recv, sendCount, datatype, ncclSum, 0, ++calls_},
                sendCount * datatypeSize(datatype) * size_, allGatherZeroCopy, allGatherDirect);
}

void Comm::reduceScatter(const void* send, void* recv, size_t recvCount, ncclDataType_t datatype,
                         ncclRedOp_t op) {
  runCollective({CallKind::ReduceScatter, send, recv, recvCount, datatype, op, 0, ++calls_},
                recvCount * datatypeSize(datatype) * size_, reduceScatterZeroCopy,
                reduceScatterDirect);
}

void Comm::reduce(const void* send, void* recv, size_t count, ncclDataType_t datatype,
                  ncclRedOp_t op, int root) {
  runCollective({CallKind::Reduce, send, recv, count, datatype, op, root, ++calls_},
                count * datatypeSize(datatype), reduceZeroCopy, reduceDirect);
}

void Comm::transfer(const std::vector<PointToPoint>& batch) {
  std::vector<Transfer> transfers;
  for (const auto& request : batch) {
    if (request.peer < 0 || request.peer >= size_)
      fail(ncclInvalidArgument, "peer " + std::to_string(request.peer) + " is outside 0.." +
                                    std::to_string(size_ - 1));
    if (datatypeSize(request.datatype) == 0)
      fail(ncclInvalidArgument, "unknown datatype " + std::to_string(request.datatype));
    if (request.count > 0 && request.buffer == nullptr)
      fail(ncclInvalidArgument, "a buffer pointer is NULL");
    // One node: local index and communicator rank coincide.
    transfers.push_back({request.isSend, request.peer, request.buffer, request.count,
                         request.datatype, ++calls_});
  }
  std::string what = batch.size() == 1
                         ? std::string(batch[0].isSend ? "ncclSend to rank " : "ncclRecv from rank ") +
                               std::to_string(batch[0].peer)
                         : "a group of " + std::to_string(batch.size()) + " sends and receives";
  run(what, [&] { runTransfers(*shm_, transfers); });
}

}  // namespace mojoccl
