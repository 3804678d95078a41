#include "comm.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <unistd.h>

#include "algorithms/direct.h"
#include "algorithms/network.h"
#include "algorithms/step.h"
#include "algorithms/zero_copy.h"
#include "bootstrap.h"
#include "datatypes.h"
#include "env.h"
#include "error.h"
#include "kernels.h"
#include "transports/libfabric.h"
#include "transports/peer_watch.h"

namespace mojoccl {
namespace {

// Staging slot per rank (two per rank). Small enough to stay in cache while
// a chunk is copied in, reduced and copied out.
constexpr size_t kSlotBytes = 1 << 20;
// Up to this size one-shot all-reduce wins whatever the rank count; above it
// two-shot does once more than two ranks share the work.
constexpr size_t kOneShotMaxBytes = 64 << 10;
// A rail's slice at least this large: nodes of many ranks (a CPU rank per
// core) would otherwise cut a mid-size all-reduce into as many streams of
// small messages, each paying every step's latency.
constexpr size_t kMinRailSliceBytes = 64 << 10;

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
      zeroCopy_(envChoice("MOJOCCL_ZERO_COPY", "1", {"0", "1"}) == "1"),
      devicePeersRequested_(envChoice("MOJOCCL_DEVICE_PEERS", "0", {"0", "1"}) == "1") {
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
  groupIntoNodes(ranks);
  std::vector<ShmPeer> peers;
  for (int peer : nodes_[node_]) peers.push_back({peer, ranks[peer].pid});
  localIndex_ = static_cast<int>(std::find(nodes_[node_].begin(), nodes_[node_].end(), rank) -
                                 nodes_[node_].begin());
  shm_ = std::make_unique<ShmTransport>(bootstrap, peers, localIndex_, segmentName(id, ranks[rank].hostHash),
                                        kSlotBytes, aborted_);
  if (nodes_.size() > 1) openFabric(bootstrap);
  bootstrap.close();
}

void Comm::groupIntoNodes(const std::vector<RankInfo>& ranks) {
  nodeOfRank_.resize(ranks.size());
  for (const auto& info : ranks) {
    size_t node = 0;
    while (node < nodes_.size() && ranks[nodes_[node][0]].hostHash != info.hostHash) ++node;
    if (node == nodes_.size()) nodes_.emplace_back();
    nodes_[node].push_back(info.rank);
    nodeOfRank_[info.rank] = static_cast<int>(node);
  }
  node_ = nodeOfRank_[rank_];
}

void Comm::openFabric(Bootstrap& bootstrap) {
  // What could fail on one rank alone is checked first, and agreed on, so
  // that every rank fails with its message rather than wait for it.
  std::string failure;
  bool trace = false;
  int timeoutSeconds = 0;
  std::string railsSetting;
  try {
    if (envChoice("MOJOCCL_NET", "fabric", {"verbs", "fabric"}) == "verbs")
      fail(ncclInvalidUsage,
           "MOJOCCL_NET=verbs: this libmojoccl has no InfiniBand transport of its own; libfabric's "
           "verbs provider serves InfiniBand: set MOJOCCL_NET=fabric MOJOCCL_FABRIC_PROVIDER=verbs");
    trace = envChoice("MOJOCCL_IB_TRACE", "0", {"0", "1"}) == "1";
    timeoutSeconds = static_cast<int>(envInt("MOJOCCL_IB_TIMEOUT_S", 60, 1, 86400));
    forcedLocalRegistration();  // read here so that a bad value fails every rank at once
    stagingMegabytes();
    networkAlgorithms_ = NetworkAlgorithms::fromEnv();
    railsSetting = envChoice("MOJOCCL_NET_RAILS", "1", {"0", "1"});
    LibFabric::get();
  } catch (const Error& error) {
    failure = error.what();
  }
  bootstrap.agreeOnSuccess(failure.empty(), failure);
  bootstrap.requireSameSetting("MOJOCCL_NET_ALGO", NetworkAlgorithms::setting());
  bootstrap.requireSameSetting("MOJOCCL_NET_RAILS", railsSetting);
  rails_ = railsSetting == "1" && nodes_[0].size() > 1 &&
           std::all_of(nodes_.begin(), nodes_.end(), [&](const auto& node) { return node.size() == nodes_[0].size(); });
  fabric_ = std::make_unique<FabricTransport>(bootstrap, rank_, localIndex_, aborted_, timeoutSeconds);
  fabric_->traceRegistrations(trace);
  watch_ = std::make_unique<PeerWatch>(bootstrap, nodes_, node_, rank_, *shm_, timeoutSeconds);
  // A rank waiting on another node waits on no one here: the node's alarm
  // tells it that some rank died, the watch's news that a rank it waits on
  // left. That news travels on the watch's own connection and can overtake
  // the last messages the rank sent before it left, which arrive only as
  // this rank progresses the fabric: a rank that left is blamed once the
  // wait has gone that long without a completion.
  static constexpr auto kLastMessagesGrace = std::chrono::milliseconds(250);
  fabric_->checkPeersWith([this](const std::vector<int>& waitedOn, std::chrono::steady_clock::duration quiet) {
    shm_->checkNodeAlarm();
    if (quiet < kLastMessagesGrace) return;
    for (int peer : waitedOn)
      if (shm_->remoteDeparted(peer))
        fail(ncclRemoteError, "rank " + std::to_string(peer) + " destroyed or aborted its communicator");
  });
  if (trace) {
    std::string local;
    for (int peer : nodes_[node_]) local += (local.empty() ? "" : ",") + std::to_string(peer);
    const std::string carriers = rails_ ? "rail " + std::to_string(localIndex_) + " of " +
                                              std::to_string(nodes_[node_].size())
                                        : "leader " + std::to_string(leader());
    fprintf(stderr, "[mojoccl] rank %d: node %d of %zu (ranks %s, %s); between nodes: %s\n", rank_, node_,
            nodes_.size(), local.c_str(), carriers.c_str(), fabric_->describe().c_str());
  }
}

Comm::~Comm() = default;

void Comm::releaseTransports() {
  std::vector<int> failed = failedRanks();
  std::lock_guard<std::mutex> lock(transportsMutex_);
  failedAtRelease_ = std::move(failed);
  fabric_.reset();
  watch_.reset();
  shm_.reset();
  devicePeers_.reset();
}

std::vector<int> Comm::failedRanks() {
  std::lock_guard<std::mutex> lock(transportsMutex_);
  if (!shm_) return failedAtRelease_;
  std::vector<int> failed;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    const bool died = nodeOfRank_[peer] == node_ ? shm_->peerDied(shm_->indexOf(peer))
                                                 : shm_->remoteDied(peer);
    if (died) failed.push_back(peer);
  }
  return failed;
}

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
    // A peer on another node that stopped answering: say so where the
    // job's log shows it, whatever the caller does with the error.
    if (error.code() == ncclRemoteError && spansNodes())
      fprintf(stderr, "[mojoccl] rank %d, %s: %s\n", rank_, what.c_str(), error.what());
    // Any other failure leaves the ranks at different points of the call;
    // peers still waiting on this rank learn why at once.
    brokenBy_ = error.what();
    asyncError_.store(error.code());
    // An aborted communicator is one this rank left, not a failure of its own.
    if (shm_ && aborted_.load())
      shm_->markDeparted();
    else if (shm_)
      shm_->markFailed(error.what());
    throw Error(error.code(), "rank " + std::to_string(rank_) + ", " + what + ": " + error.what());
  }
}

// ---------------------------------------------------------------- one node

void Comm::local(const Call& call, size_t bytes, ZeroCopy zeroCopy, Staged staged) {
  // Every rank takes the same branch: `bytes` is checked to agree in the
  // first step of either.
  if (zeroCopy_ && bytes >= kZeroCopyMinBytes && zeroCopy(*shm_, rounds_, call)) return;
  staged(*shm_, rounds_, call);
}

void Comm::localAllReduce(const Call& call) {
  const size_t bytes = call.count * datatypeSize(call.datatype);
  bool oneShot = allReduceAlgorithm_ == AllReduceAlgorithm::OneShot ||
                 (allReduceAlgorithm_ == AllReduceAlgorithm::Auto &&
                  (shm_->size() <= 2 || bytes <= kOneShotMaxBytes));
  local(call, bytes, allReduceZeroCopy, oneShot ? allReduceOneShot : allReduceTwoShot);
}

void Comm::localReduce(const Call& call) {
  local(call, call.count * datatypeSize(call.datatype), reduceZeroCopy, reduceDirect);
}

void Comm::localBroadcast(const Call& call) {
  local(call, call.count * datatypeSize(call.datatype), broadcastZeroCopy, broadcastDirect);
}

void Comm::localAllGather(const Call& call) {
  local(call, call.count * datatypeSize(call.datatype) * shm_->size(), allGatherZeroCopy,
        allGatherDirect);
}

void Comm::localReduceScatter(const Call& call) {
  local(call, call.count * datatypeSize(call.datatype) * shm_->size(), reduceScatterZeroCopy,
        reduceScatterDirect);
}

// ------------------------------------------------------------ across nodes

char* Comm::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

NetworkGroup Comm::rail(const Call& call, int index) {
  std::vector<int> ranks;
  for (const auto& node : nodes_) ranks.push_back(node[index]);
  return {*fabric_, ranks, node_, call.describe() + " across nodes"};
}

namespace {
constexpr size_t kVerdictBytes = 512;

// Half types cross nodes in float32 and are rounded once, at the end, as on
// one node: the result does not depend on how ranks are placed.
ncclDataType_t acrossNodesType(ncclDataType_t type) {
  return type == ncclFloat16 || type == ncclBfloat16 ? ncclFloat32 : type;
}

// What a node's leader tells the other leaders about a call.
struct NodeReport {
  CallSignature signature;
  char problem[kVerdictBytes];  // the node's own disagreement, if any
};

void copyText(char* to, const std::string& text) { std::snprintf(to, kVerdictBytes, "%s", text.c_str()); }

// Room for any leader's frame: its node's report, then the data of a small
// all-reduce (halves cross in float32, at twice their bytes).
constexpr size_t kFrameRoom = sizeof(NodeReport) + 2 * kOneShotMaxBytes;
}  // namespace

std::string Comm::nodeDisagreement(const Call& call) {
  Step step(*shm_, rounds_, call);
  step.publishAndAwait();
  return step.disagreement();
}

// The first disagreement among the nodes' reports (`stride` bytes apart),
// or "": every leader finds the same.
std::string Comm::disagreementAcrossNodes(const char* reports, size_t stride) const {
  const auto* first = reinterpret_cast<const NodeReport*>(reports);
  for (size_t node = 0; node < nodes_.size(); ++node) {
    const auto* report = reinterpret_cast<const NodeReport*>(reports + node * stride);
    if (report->problem[0] != '\0') return report->problem;
    if (!report->signature.sameCollective(first->signature))
      return mismatchText(nodes_[node][0], report->signature, nodes_[0][0], first->signature);
  }
  return "";
}

// Before any data moves, every rank learns whether all ranks issued the same
// collective: each node compares its ranks' calls, the leaders compare the
// nodes', and each leader hands the verdict to its node. A mismatch then
// raises the same MismatchError on every rank, and the communicator stays
// usable, as within one node.
void Comm::agreeAcrossNodes(const Call& call) {
  reportInFrame(call);
  char verdict[kVerdictBytes] = {};
  if (isLeader()) copyText(verdict, exchangeNodeFrames(call, 0));
  localBroadcast({CallKind::Broadcast, verdict, verdict, kVerdictBytes, ncclInt8, ncclSum, leader(),
                  call.sequence});
  if (verdict[0] != '\0') throw MismatchError(verdict);
}

bool Comm::reportInFrame(const Call& call) {
  NodeReport& mine = *reinterpret_cast<NodeReport*>(frame(node_));
  mine = NodeReport{};
  mine.signature = CallSignature::of(call);
  copyText(mine.problem, nodeDisagreement(call));
  return mine.problem[0] == '\0';
}

char* Comm::frame(size_t node) {
  if (frames_.size() < nodes_.size() * kFrameRoom) frames_.resize(nodes_.size() * kFrameRoom);
  return frames_.data() + node * kFrameRoom;
}

// Each leader's frame (frame(node): its node's report, then `payloadBytes`
// of data) to every other leader; returns the first disagreement among the
// reports, or "". A leader in a small all-reduce and one in any other call
// exchange frames alike, and so meet.
std::string Comm::exchangeNodeFrames(const Call& call, size_t payloadBytes) {
  std::vector<char*> frames;
  for (size_t node = 0; node < nodes_.size(); ++node) frames.push_back(frame(node));
  std::vector<size_t> received;
  networkExchangeFrames(leaders(call), frames, sizeof(NodeReport) + payloadBytes, kFrameRoom, received);
  return disagreementAcrossNodes(frames[0], kFrameRoom);
}

// A small all-gather (up to 64 KiB in all, where a frame is one message)
// takes one exchange between nodes: each leader sends its node's report
// with the node's blocks behind it, puts every node's blocks in rank order,
// and hands its node the verdict and the result in one broadcast.
void Comm::smallAllGatherAcrossNodes(const Call& call) {
  const size_t block = call.count * datatypeSize(call.datatype);
  auto blocks = [&](size_t node) { return frame(node) + sizeof(NodeReport); };
  if (reportInFrame(call)) {
    Call inNode = call;
    inNode.recv = blocks(node_);
    localAllGather(inNode);
  }
  char* handBack = scratch(kVerdictBytes + block * size_);  // the verdict, then the result
  if (isLeader()) {
    copyText(handBack, exchangeNodeFrames(call, nodes_[node_].size() * block));
    if (handBack[0] == '\0')
      for (size_t node = 0; node < nodes_.size(); ++node)
        for (size_t i = 0; i < nodes_[node].size(); ++i)
          std::memcpy(handBack + kVerdictBytes + nodes_[node][i] * block, blocks(node) + i * block, block);
  }
  localBroadcast({CallKind::Broadcast, handBack, handBack, kVerdictBytes + block * size_, ncclInt8, ncclSum,
                  leader(), call.sequence});
  if (handBack[0] != '\0') throw MismatchError(handBack);
  std::memcpy(call.recv, handBack + kVerdictBytes, block * size_);
}

// A small broadcast (up to 64 KiB) takes one exchange between nodes: the
// root's node broadcasts within itself, then its leader's frame carries the
// data behind its report; every other leader hands its node the verdict and
// the data in one broadcast.
void Comm::smallBroadcastAcrossNodes(const Call& call) {
  const size_t bytes = call.count * datatypeSize(call.datatype);
  const int rootNode = nodeOfRank_[call.root];
  const bool rootHere = node_ == rootNode;
  if (reportInFrame(call) && rootHere) localBroadcast(call);
  const size_t handed = kVerdictBytes + (rootHere ? 0 : bytes);
  char* handBack = scratch(handed);  // the verdict, then the data
  if (isLeader()) {
    if (rootHere) std::memcpy(frame(node_) + sizeof(NodeReport), call.recv, bytes);
    copyText(handBack, exchangeNodeFrames(call, rootHere ? bytes : 0));
    if (!rootHere && handBack[0] == '\0')
      std::memcpy(handBack + kVerdictBytes, frame(rootNode) + sizeof(NodeReport), bytes);
  }
  localBroadcast({CallKind::Broadcast, handBack, handBack, handed, ncclInt8, ncclSum, leader(), call.sequence});
  if (handBack[0] != '\0') throw MismatchError(handBack);
  if (!rootHere) std::memcpy(call.recv, handBack + kVerdictBytes, bytes);
}

// A small all-reduce takes one exchange between nodes: each leader sends its
// node's report together with the node's partial result, and every leader
// combines all partials in node order (so all get the same bits). The
// leader hands its node the verdict and the result in one broadcast.
void Comm::smallAllReduceAcrossNodes(const Call& call) {
  keepResult(call.recv, smallAllReduceResult(call, call), call.count, call.datatype);
}

// A small reduce-scatter is the small all-reduce of the whole buffer, of
// which each rank keeps its block: one exchange between nodes, where the
// reduce-scatter ring takes an agreement and then its steps.
void Comm::smallReduceScatterAcrossNodes(const Call& call) {
  Call whole = call;
  whole.kind = CallKind::AllReduce;
  whole.count = call.count * size_;
  const char* result = smallAllReduceResult(call, whole);
  keepResult(call.recv, result + rank_ * call.count * datatypeSize(acrossNodesType(call.datatype)), call.count,
             call.datatype);
}

const char* Comm::smallAllReduceResult(const Call& asked, const Call& call) {
  const ncclDataType_t type = acrossNodesType(call.datatype);
  const size_t bytes = call.count * datatypeSize(type);
  auto partial = [&](size_t node) { return frame(node) + sizeof(NodeReport); };
  if (reportInFrame(asked)) {
    Call toLeader = call;
    toLeader.kind = CallKind::Reduce;
    toLeader.datatype = type;
    toLeader.op = call.op == ncclAvg ? ncclSum : call.op;
    toLeader.root = leader();
    if (type != call.datatype) {
      convert(partial(node_), ncclFloat32, call.send, call.datatype, call.count);
      toLeader.send = partial(node_);
    }
    toLeader.recv = partial(node_);
    localReduce(toLeader);
  }
  char* handBack = scratch(kVerdictBytes + bytes);  // the verdict, then the result
  if (isLeader()) {
    copyText(handBack, exchangeNodeFrames(asked, bytes));
    // AVG: the partial sums, summed and divided once by the rank count.
    if (handBack[0] == '\0') {
      std::vector<const void*> sources;
      for (size_t node = 0; node < nodes_.size(); ++node) sources.push_back(partial(node));
      mojoccl::reduce(handBack + kVerdictBytes, sources.data(), static_cast<int>(sources.size()), call.count,
                      type, call.op, size_);
    }
  }
  localBroadcast({CallKind::Broadcast, handBack, handBack, kVerdictBytes + bytes, ncclInt8, ncclSum,
                  leader(), asked.sequence});
  if (handBack[0] != '\0') throw MismatchError(handBack);
  return handBack + kVerdictBytes;
}

void Comm::keepResult(void* to, const char* result, size_t count, ncclDataType_t type) {
  if (acrossNodesType(type) != type)
    convert(to, type, result, ncclFloat32, count);
  else
    std::memcpy(to, result, count * datatypeSize(type));
}

void Comm::allReduceAcrossNodes(const Call& call, void* result) {
  if (acrossNodesType(call.datatype) != call.datatype) {
    if (wide_.size() < call.count) wide_.resize(call.count);
    convert(wide_.data(), ncclFloat32, call.send, call.datatype, call.count);
    Call wide = call;
    wide.datatype = ncclFloat32;
    wide.send = wide.recv = wide_.data();
    allReduceAcrossNodes(wide, wide_.data());
    convert(result, call.datatype, wide_.data(), ncclFloat32, call.count);
    return;
  }
  if (onRails() && call.count * datatypeSize(call.datatype) / nodes_[node_].size() >= kMinRailSliceBytes)
    return allReduceOnRails(call, result);
  // AVG sums everywhere and divides once, by the whole rank count.
  Call toLeader = call;
  toLeader.kind = CallKind::Reduce;
  toLeader.recv = result;
  toLeader.op = call.op == ncclAvg ? ncclSum : call.op;
  toLeader.root = leader();
  localReduce(toLeader);
  if (isLeader()) allReduceBetweenNodes(leaders(call), result, call.count, call);
  Call fromLeader = call;
  fromLeader.kind = CallKind::Broadcast;
  fromLeader.send = fromLeader.recv = result;
  fromLeader.root = leader();
  localBroadcast(fromLeader);
}

void Comm::allReduceBetweenNodes(const NetworkGroup& group, void* data, size_t count, const Call& call) {
  const ncclRedOp_t op = call.op == ncclAvg ? ncclSum : call.op;
  if (networkAlgorithms_.allReduce(group.size(), count * datatypeSize(call.datatype)) ==
      NetworkAllReduce::RecursiveDoubling)
    networkAllReduceRecursiveDoubling(group, data, count, call.datatype, op);
  else
    networkAllReduce(group, data, count, call.datatype, op);
  if (call.op == ncclAvg) {
    const void* sum[1] = {data};
    mojoccl::reduce(data, sum, 1, count, call.datatype, ncclAvg, size_);
  }
}

// Local rank i reduces slice i of its node's buffers (a reduce-scatter in
// shared memory), all-reduces it with local rank i of every other node,
// and the node's ranks gather the slices. Slices are equal; where the node's
// ranks do not divide the count, the call runs in a padded copy.
void Comm::allReduceOnRails(const Call& call, void* result) {
  const size_t size = datatypeSize(call.datatype);
  const int perNode = static_cast<int>(nodes_[node_].size());
  const size_t slice = (call.count + perNode - 1) / perNode;
  const bool even = slice * perNode == call.count;
  char* whole = static_cast<char*>(result);
  if (!even) {
    railBuffer_.resize(slice * perNode * size);
    whole = railBuffer_.data();
    std::memcpy(whole, call.send, call.count * size);
    std::memset(whole + call.count * size, 0, (slice * perNode - call.count) * size);
  }
  char* mine = whole + localIndex_ * slice * size;
  Call scatter = call;
  scatter.kind = CallKind::ReduceScatter;
  scatter.send = even ? call.send : whole;
  scatter.recv = mine;
  scatter.count = slice;
  scatter.op = call.op == ncclAvg ? ncclSum : call.op;
  localReduceScatter(scatter);
  allReduceBetweenNodes(rail(call, localIndex_), mine, slice, call);
  Call gather = call;
  gather.kind = CallKind::AllGather;
  gather.send = mine;
  gather.recv = whole;
  gather.count = slice;
  localAllGather(gather);
  if (!even) std::memcpy(result, whole, call.count * size);
}

void Comm::broadcastAcrossNodes(const Call& call) {
  const int rootNode = nodeOfRank_[call.root];
  if (node_ == rootNode) localBroadcast(call);
  if (isLeader())
    networkBroadcast(leaders(call), call.recv, call.count * datatypeSize(call.datatype), rootNode);
  if (node_ != rootNode) {
    Call fromLeader = call;
    fromLeader.send = call.recv;
    fromLeader.root = leader();
    localBroadcast(fromLeader);
  }
}

void Comm::allGatherAcrossNodes(const Call& call) {
  // Each node's blocks gather at its leader, in node order; the leaders
  // swap them, put them in rank order, and broadcast. Where each node's
  // ranks are consecutive (as launchers place them), node order is rank
  // order: they gather in the result itself, with no copy to reorder them.
  const size_t block = call.count * datatypeSize(call.datatype);
  const bool inPlace = nodesAreRankRanges();
  char* gathered = inPlace ? static_cast<char*>(call.recv) : scratch(block * size_);
  std::vector<char*> nodeBlocks;
  std::vector<size_t> nodeBytes;
  size_t offset = 0;
  for (const auto& node : nodes_) {
    nodeBlocks.push_back(gathered + offset);
    nodeBytes.push_back(node.size() * block);
    offset += nodeBytes.back();
  }
  Call inNode = call;
  inNode.recv = nodeBlocks[node_];
  localAllGather(inNode);
  if (isLeader()) {
    networkAllGather(leaders(call), nodeBlocks, nodeBytes);
    for (size_t node = 0; node < nodes_.size() && !inPlace; ++node)
      for (size_t i = 0; i < nodes_[node].size(); ++i)
        std::memcpy(static_cast<char*>(call.recv) + nodes_[node][i] * block, nodeBlocks[node] + i * block,
                    block);
  }
  Call fromLeader = call;
  fromLeader.kind = CallKind::Broadcast;
  fromLeader.send = call.recv;
  fromLeader.count = call.count * size_;
  fromLeader.root = leader();
  localBroadcast(fromLeader);
}

void Comm::reduceScatterAcrossNodes(const Call& call) {
  if (acrossNodesType(call.datatype) == call.datatype && nodesAreRankRanges()) return reduceScatterByNodes(call);
  // The whole all-reduce, of which this rank keeps its block.
  const size_t block = call.count * datatypeSize(call.datatype);
  Call whole = call;
  whole.kind = CallKind::AllReduce;
  whole.count = call.count * size_;
  char* result = scratch(block * size_);
  allReduceAcrossNodes(whole, result);
  std::memcpy(call.recv, result + rank_ * block, block);
}

// Each node's ranks are consecutive, nodes in rank order (as launchers
// place ranks by default): a node's blocks of a reduce-scatter are one
// range of the buffer.
bool Comm::nodesAreRankRanges() const {
  int expected = 0;
  for (const auto& node : nodes_)
    for (int rank : node)
      if (rank != expected++) return false;
  return true;
}

// The leaders reduce-scatter the node sums round the ring, each ending with
// its node's blocks: half the traffic of the whole all-reduce. Then each
// leader hands its node those blocks.
void Comm::reduceScatterByNodes(const Call& call) {
  const size_t size = datatypeSize(call.datatype);
  char* result = scratch(call.count * size_ * size);
  const ncclRedOp_t op = call.op == ncclAvg ? ncclSum : call.op;
  Call toLeader = call;
  toLeader.kind = CallKind::Reduce;
  toLeader.count = call.count * size_;
  toLeader.recv = result;
  toLeader.op = op;
  toLeader.root = leader();
  localReduce(toLeader);
  std::vector<Slice> byNode;
  for (const auto& node : nodes_) byNode.push_back({node.front() * call.count, (node.back() + 1) * call.count});
  const Slice ours = byNode[node_];
  if (isLeader()) {
    networkReduceScatter(leaders(call), result, byNode, 0, call.datatype, op, nullptr);
    if (call.op == ncclAvg) {
      const void* sum[1] = {bytesAt(result, ours.begin, size)};
      mojoccl::reduce(bytesAt(result, ours.begin, size), sum, 1, ours.end - ours.begin, call.datatype, ncclAvg, size_);
    }
  }
  Call fromLeader = call;
  fromLeader.kind = CallKind::Broadcast;
  fromLeader.send = fromLeader.recv = bytesAt(result, ours.begin, size);
  fromLeader.count = ours.end - ours.begin;
  fromLeader.root = leader();
  localBroadcast(fromLeader);
  std::memcpy(call.recv, bytesAt(result, rank_ * call.count, size), call.count * size);
}

void Comm::reduceAcrossNodes(const Call& call) {
  Call whole = call;
  whole.kind = CallKind::AllReduce;
  allReduceAcrossNodes(whole, rank_ == call.root ? call.recv : scratch(call.count * datatypeSize(call.datatype)));
}

// -------------------------------------------------------------- the calls

void Comm::collective(const Call& call, void (Comm::*withinNode)(const Call&),
                      void (Comm::*acrossNodes)(const Call&), bool agreesItself) {
  validate(call);
  run(call.describe() + " (call #" + std::to_string(call.sequence) + ")", [&] {
    if (!spansNodes()) return (this->*withinNode)(call);
    if (!agreesItself) agreeAcrossNodes(call);
    (this->*acrossNodes)(call);
  });
}

void Comm::allReduce(const void* send, void* recv, size_t count, ncclDataType_t datatype,
                     ncclRedOp_t op) {
  const bool small = count * datatypeSize(datatype) <= kOneShotMaxBytes;
  collective({CallKind::AllReduce, send, recv, count, datatype, op, 0, ++calls_}, &Comm::localAllReduce,
             small ? &Comm::smallAllReduceAcrossNodes : &Comm::allReduceAcrossNodesInPlace, small);
}

bool Comm::collectiveOnDevice(Call call, ncclStream_t stream) {
  // A communicator of one has no peers: its collectives are copies.
  if (!devicePeersRequested_ || size_ == 1) return false;
  if (!devicePeersDecided_) setUpDevicePeers();
  if (!devicePeers_) return false;
  call.sequence = ++calls_;
  validate(call);
  run(call.describe() + " on device memory (call #" + std::to_string(call.sequence) + ")",
      [&] { deviceCollective(call, stream); });
  return true;
}

void Comm::broadcast(const void* send, void* recv, size_t count, ncclDataType_t datatype, int root) {
  const bool small = count * datatypeSize(datatype) <= kOneShotMaxBytes && spansNodes();
  collective({CallKind::Broadcast, send, recv, count, datatype, ncclSum, root, ++calls_},
             &Comm::localBroadcast, small ? &Comm::smallBroadcastAcrossNodes : &Comm::broadcastAcrossNodes, small);
}

void Comm::allGather(const void* send, void* recv, size_t sendCount, ncclDataType_t datatype) {
  const bool small = sendCount * datatypeSize(datatype) * size_ <= kOneShotMaxBytes && spansNodes();
  collective({CallKind::AllGather, send, recv, sendCount, datatype, ncclSum, 0, ++calls_},
             &Comm::localAllGather, small ? &Comm::smallAllGatherAcrossNodes : &Comm::allGatherAcrossNodes, small);
}

void Comm::reduceScatter(const void* send, void* recv, size_t recvCount, ncclDataType_t datatype,
                         ncclRedOp_t op) {
  const bool small = recvCount * datatypeSize(datatype) * size_ <= kOneShotMaxBytes && spansNodes();
  collective({CallKind::ReduceScatter, send, recv, recvCount, datatype, op, 0, ++calls_},
             &Comm::localReduceScatter, small ? &Comm::smallReduceScatterAcrossNodes : &Comm::reduceScatterAcrossNodes,
             small);
}

void Comm::reduce(const void* send, void* recv, size_t count, ncclDataType_t datatype,
                  ncclRedOp_t op, int root) {
  collective({CallKind::Reduce, send, recv, count, datatype, op, root, ++calls_}, &Comm::localReduce,
             &Comm::reduceAcrossNodes);
}

void Comm::transfer(const std::vector<PointToPoint>& batch) {
  std::vector<Transfer> transfers;  // within this node: peer is the local index
  std::vector<Transfer> remote;     // across nodes: peer is the rank
  for (const auto& request : batch) {
    if (request.peer < 0 || request.peer >= size_)
      fail(ncclInvalidArgument, "peer " + std::to_string(request.peer) + " is outside 0.." +
                                    std::to_string(size_ - 1));
    if (datatypeSize(request.datatype) == 0)
      fail(ncclInvalidArgument, "unknown datatype " + std::to_string(request.datatype));
    if (request.count > 0 && request.buffer == nullptr)
      fail(ncclInvalidArgument, "a buffer pointer is NULL");
    const bool here = nodeOfRank_[request.peer] == node_;
    (here ? transfers : remote)
        .push_back({request.isSend, here ? shm_->indexOf(request.peer) : request.peer, request.buffer,
                    request.count, request.datatype, ++calls_});
  }
  std::string what = batch.size() == 1
                         ? std::string(batch[0].isSend ? "ncclSend to rank " : "ncclRecv from rank ") +
                               std::to_string(batch[0].peer)
                         : "a group of " + std::to_string(batch.size()) + " sends and receives";
  run(what, [&] {
    // Sends within the node are buffered and never wait for the network, so
    // they go first; then the messages between nodes.
    if (!transfers.empty()) runTransfers(*shm_, transfers);
    if (!remote.empty()) runRemoteTransfers(*fabric_, rank_, remote, what);
  });
}

int Comm::receiveFromAny(void* buffer, size_t count, ncclDataType_t datatype) {
  if (spansNodes())
    fail(ncclInvalidUsage, "a receive from any rank works within one node, and this communicator "
                           "spans " + std::to_string(nodes_.size()) + " nodes: pass the source rank");
  if (datatypeSize(datatype) == 0)
    fail(ncclInvalidArgument, "unknown datatype " + std::to_string(datatype));
  if (count > 0 && buffer == nullptr) fail(ncclInvalidArgument, "a buffer pointer is NULL");
  int source = -1;
  run("ncclRecv from any rank", [&] {
    source = shm_->commRank(mojoccl::receiveFromAny(*shm_, {false, -1, buffer, count, datatype, ++calls_}));
  });
  return source;
}

}  // namespace mojoccl
