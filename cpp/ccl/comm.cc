#include "comm.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <unistd.h>

#include "base/bootstrap.h"
#include "base/datatypes.h"
#include "base/error.h"
#include "base/settings.h"
#include "transports/libfabric.h"
#include "transports/peer_watch.h"

namespace mojoccl {
namespace {

// Staging slot per rank (two per rank). Small enough to stay in cache while
// a chunk is copied in, reduced and copied out.
constexpr size_t kSlotBytes = 1 << 20;

std::string segmentName(const ncclUniqueId& id, uint64_t hostHash) {
  uint64_t hash = hostHash;
  for (unsigned char byte : id.internal) hash = (hash ^ byte) * 1099511628211ull;
  char name[64];
  snprintf(name, sizeof(name), "/mojoccl-%d-%016llx", static_cast<int>(getuid()),
           static_cast<unsigned long long>(hash));
  return name;
}

// MOJOCCL_NET_FRAMES. Where the provider is TCP itself, the leaders' own
// sockets carry a frame in about half of its round trip; RDMA providers are
// faster than both. `auto` stops at kFrameSocketsMaxNodes nodes: each
// leader then holds a second connection to every other one, and file
// descriptors are often limited to 1,024.
bool framesOnSockets(const std::string& setting, const FabricTransport& fabric, size_t nodes) {
  constexpr size_t kFrameSocketsMaxNodes = 128;
  if (setting != "auto") return setting == "socket";
  const std::string provider = fabric.providerName();
  const std::string core = provider.substr(0, provider.find(';'));
  const bool tcp = core == "tcp" || core == "net" || core == "sockets" || core == "udp";
  return tcp && nodes <= kFrameSocketsMaxNodes;
}

}  // namespace

// Adds the time since the last lap to `phase`.
class SetupClock {
 public:
  explicit SetupClock(double* seconds) : seconds_(seconds) {}
  void lap(int phase) {
    const auto now = std::chrono::steady_clock::now();
    seconds_[phase] += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }

 private:
  double* seconds_;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

Comm::Comm(const ncclUniqueId& id, int nranks, int rank) {
  if (nranks < 1) fail(ncclInvalidArgument, "nranks must be at least 1, got " + std::to_string(nranks));
  if (rank < 0 || rank >= nranks)
    fail(ncclInvalidArgument, "rank " + std::to_string(rank) + " is outside 0.." +
                                  std::to_string(nranks - 1));
  SetupClock setup(setupSeconds_);
  int64_t timeout = settingInt("MOJOCCL_BOOTSTRAP_TIMEOUT_S");
  // A little longer than the root's own limit, so that its explanation of
  // who is missing arrives before this rank gives up on its own.
  Bootstrap bootstrap(id, describeThisRank(rank), nranks,
                      Clock::now() + std::chrono::seconds(timeout + 10));

  const auto& ranks = bootstrap.ranks();
  topology_ = Topology::of(ranks, rank);
  findCoreSharers(ranks);
  setup.lap(kSetupBootstrap);
  std::vector<ShmPeer> peers;
  for (int peer : topology_.ours()) peers.push_back({peer, ranks[peer].pid});
  shm_ = std::make_unique<ShmTransport>(bootstrap, peers, topology_.localIndex, segmentName(id, ranks[rank].hostHash),
                                        kSlotBytes, aborted_, ranksOutnumberCores());
  setup.lap(kSetupSharedMemory);
  const AgreedSettings settings = agreeOnSettings(bootstrap);
  devicePeersRequested_ = settings.devicePeers;
  node_ = std::make_unique<NodeCollectives>(*shm_, settings.allReduceAlgorithm, settings.zeroCopy);
  setup.lap(kSetupSettings);
  if (topology_.nodes.size() > 1) openFabric(bootstrap, setup);
  if (settings.deterministic)
    rankOrder_ = std::make_unique<RankOrderReductions>(topology_, *node_, hierarchy_.get(), fabric_.get());
  setupRounds_ = bootstrap.rounds();
  setupBytes_ = bootstrap.bytesGathered();
  bootstrap.close();
}

// Ranks that chose differently would take different steps (another
// algorithm within the node, another order of sums, device memory on one
// rank and host memory on another): a bad value, or values that differ,
// fail every rank at once.
Comm::AgreedSettings Comm::agreeOnSettings(Bootstrap& bootstrap) {
  const char* names[] = {"MOJOCCL_ALGO", "MOJOCCL_ZERO_COPY", "MOJOCCL_DEVICE_PEERS", "MOJOCCL_DETERMINISTIC"};
  std::vector<std::pair<std::string, std::string>> values;
  std::string failure;
  try {
    for (const char* name : names) values.emplace_back(name, settingChoice(name));
  } catch (const Error& error) {
    failure = error.what();
  }
  bootstrap.agreeOnSuccess(failure.empty(), failure);
  bootstrap.requireSameSettings(values);
  const std::string& algorithm = values[0].second;
  return {algorithm == "one_shot"   ? AllReduceAlgorithm::OneShot
          : algorithm == "two_shot" ? AllReduceAlgorithm::TwoShot
                                    : AllReduceAlgorithm::Auto,
          values[1].second == "1", values[2].second == "1", values[3].second == "1"};
}

// By the real host name, not MOJOCCL_HOSTID: "nodes" of one machine share its cores.
void Comm::findCoreSharers(const std::vector<RankInfo>& ranks) {
  const RankInfo& me = ranks[topology_.rank];
  uint64_t together[16] = {};
  coreSharers_ = 0;
  for (const auto& info : ranks) {
    if (strncmp(info.hostname, me.hostname, sizeof(me.hostname)) != 0) continue;
    bool overlaps = false;
    for (int word = 0; word < 16; ++word) overlaps |= (info.cpus[word] & me.cpus[word]) != 0;
    if (!overlaps) continue;
    ++coreSharers_;
    for (int word = 0; word < 16; ++word) together[word] |= info.cpus[word];
  }
  sharedCpus_ = 0;
  for (uint64_t word : together) sharedCpus_ += __builtin_popcountll(word);
}

// Where no rank's affinity mask could be read (sharedCpus_ 0), the node's
// ranks against the machine's CPUs.
bool Comm::ranksOutnumberCores() const {
  if (sharedCpus_ > 0) return coreSharers_ > sharedCpus_;
  return static_cast<long>(topology_.localRanks()) > sysconf(_SC_NPROCESSORS_ONLN);
}

uint64_t Comm::rejected() {
  std::lock_guard<std::mutex> lock(transportsMutex_);
  if (!shm_) return rejectedAtRelease_;
  return (watch_ ? watch_->rejected() : 0) + (fabric_ ? fabric_->rejected() : 0);
}

void Comm::openFabric(Bootstrap& bootstrap, SetupClock& setup) {
  // What could fail on one rank alone is checked first, and agreed on, so
  // that every rank fails with its message rather than wait for it.
  std::string failure;
  bool trace = false;
  int timeoutSeconds = 0;
  std::string railsSetting, framesSetting;
  NetworkAlgorithms algorithms;
  int directNodes = 0;
  try {
    if (settingChoice("MOJOCCL_NET") == "verbs")
      fail(ncclInvalidUsage,
           "MOJOCCL_NET=verbs: this libmojoccl has no InfiniBand transport of its own; libfabric's "
           "verbs provider serves InfiniBand: set MOJOCCL_NET=fabric MOJOCCL_FABRIC_PROVIDER=verbs");
    trace = settingOn("MOJOCCL_IB_TRACE");
    timeoutSeconds = static_cast<int>(settingInt("MOJOCCL_IB_TIMEOUT_S"));
    forcedLocalRegistration();  // read here so that a bad value fails every rank at once
    stagingMegabytes();
    algorithms = NetworkAlgorithms::fromEnv();
    directNodes = static_cast<int>(settingInt("MOJOCCL_NET_DIRECT_NODES"));
    railsSetting = settingChoice("MOJOCCL_NET_RAILS");
    framesSetting = settingChoice("MOJOCCL_NET_FRAMES");
    LibFabric::get();
  } catch (const Error& error) {
    failure = error.what();
  }
  bootstrap.agreeOnSuccess(failure.empty(), failure);
  bootstrap.requireSameSettings({{"MOJOCCL_NET_ALGO", NetworkAlgorithms::setting()},
                                 {"MOJOCCL_NET_RAILS", railsSetting},
                                 {"MOJOCCL_NET_DIRECT_NODES", std::to_string(directNodes)},
                                 {"MOJOCCL_NET_FRAMES", framesSetting}});
  const auto& nodes = topology_.nodes;
  const bool rails = railsSetting == "1" && nodes[0].size() > 1 &&
                     std::all_of(nodes.begin(), nodes.end(), [&](const auto& node) { return node.size() == nodes[0].size(); });
  const int rank = topology_.rank;
  fabric_ = std::make_unique<FabricTransport>(bootstrap, rank, topology_.localIndex, aborted_, timeoutSeconds);
  // Frames go in pieces, and segments are cut, by this size: ranks that
  // cut differently would not meet.
  bootstrap.requireSameSetting("The provider's eager message size (FI_OFI_RXM_EAGER_LIMIT, FI_OFI_RXM_BUFFER_SIZE)",
                               std::to_string(fabric_->eagerMessage()));
  fabric_->traceRegistrations(trace);
  setup.lap(kSetupFabric);
  const bool frameSockets = framesOnSockets(framesSetting, *fabric_, nodes.size());
  watch_ = std::make_unique<PeerWatch>(bootstrap, nodes, topology_.node, rank, *shm_, timeoutSeconds, frameSockets);
  if (frameSockets && topology_.isLeader())
    leaderSockets_ = std::make_unique<LeaderSockets>(watch_->takeFrameLinks(), rank, bootstrap.ranks(), aborted_,
                                                     timeoutSeconds);
  // A rank waiting on another node waits on no one here: the node's alarm
  // tells it that some rank died, the watch's news that a rank it waits on
  // left. That news travels on the watch's own connection and can overtake
  // the last messages the rank sent before it left, which arrive only as
  // this rank progresses the fabric: a rank that left is blamed once the
  // wait has gone that long without a completion.
  static constexpr auto kLastMessagesGrace = std::chrono::milliseconds(250);
  auto checkPeers = [this](const std::vector<int>& waitedOn, std::chrono::steady_clock::duration quiet) {
    shm_->checkNodeAlarm();
    if (quiet < kLastMessagesGrace) return;
    for (int peer : waitedOn)
      if (shm_->remoteDeparted(peer))
        fail(ncclRemoteError, "rank " + std::to_string(peer) + " destroyed or aborted its communicator");
  };
  fabric_->checkPeersWith(checkPeers);
  if (leaderSockets_) leaderSockets_->checkPeersWith(checkPeers);
  setup.lap(kSetupPeerWatch);
  hierarchy_ = std::make_unique<Hierarchy>(
      topology_, *node_, BetweenNodes{*fabric_, leaderSockets_.get(), algorithms, directNodes, rails, {}});
  if (trace) {
    std::string local;
    for (int peer : topology_.ours()) local += (local.empty() ? "" : ",") + std::to_string(peer);
    const std::string carriers = rails ? "rail " + std::to_string(topology_.localIndex) + " of " +
                                             std::to_string(topology_.localRanks())
                                       : "leader " + std::to_string(topology_.leader());
    fprintf(stderr, "[mojoccl] rank %d: node %d of %zu (ranks %s, %s); between nodes: %s; frames on %s\n", rank,
            topology_.node, nodes.size(), local.c_str(), carriers.c_str(), fabric_->describe().c_str(),
            frameSockets ? "the leaders' sockets" : "the fabric");
  }
}

Comm::~Comm() = default;

void Comm::releaseTransports() {
  std::vector<int> failed = failedRanks();
  const uint64_t rejectedBefore = rejected();
  std::lock_guard<std::mutex> lock(transportsMutex_);
  failedAtRelease_ = std::move(failed);
  rejectedAtRelease_ = rejectedBefore;
  devicePeers_.reset();
  rankOrder_.reset();
  hierarchy_.reset();
  node_.reset();
  fabric_.reset();
  watch_.reset();
  leaderSockets_.reset();
  shm_.reset();
}

std::vector<int> Comm::failedRanks() {
  std::lock_guard<std::mutex> lock(transportsMutex_);
  if (!shm_) return failedAtRelease_;
  std::vector<int> failed;
  for (int peer = 0; peer < topology_.size; ++peer) {
    if (peer == topology_.rank) continue;
    const bool died = topology_.onOurNode(peer) ? shm_->peerDied(shm_->indexOf(peer)) : shm_->remoteDied(peer);
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
  if (rooted && (call.root < 0 || call.root >= topology_.size))
    fail(ncclInvalidArgument, "root " + std::to_string(call.root) + " is outside 0.." +
                                  std::to_string(topology_.size - 1));
  // Only the root reads a broadcast's send buffer or writes a reduce's receive buffer.
  bool needsSend = call.kind != CallKind::Broadcast || call.root == topology_.rank;
  bool needsRecv = call.kind != CallKind::Reduce || call.root == topology_.rank;
  if (call.count > 0 && ((needsRecv && call.recv == nullptr) || (needsSend && call.send == nullptr)))
    fail(ncclInvalidArgument, "a buffer pointer is NULL");
}

// `what()` names the call in errors: built only when one is raised, since
// formatting it costs a small collective a tenth of its time.
template <typename Describe, typename Algorithm>
void Comm::run(Describe what, Algorithm algorithm) {
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
      fprintf(stderr, "[mojoccl] rank %d, %s: %s\n", topology_.rank, what().c_str(), error.what());
    // Any other failure leaves the ranks at different points of the call;
    // peers still waiting on this rank learn why at once.
    brokenBy_ = error.what();
    asyncError_.store(error.code());
    // An aborted communicator is one this rank left, not a failure of its own.
    if (shm_ && aborted_.load())
      shm_->markDeparted();
    else if (shm_)
      shm_->markFailed(error.what());
    throw Error(error.code(), "rank " + std::to_string(topology_.rank) + ", " + what() + ": " + error.what());
  }
}

// -------------------------------------------------------------- the calls

void Comm::collective(const Call& call, void (NodeCollectives::*withinNode)(const Call&),
                      void (Hierarchy::*acrossNodes)(const Call&)) {
  validate(call);
  run([&] { return call.describe() + " (call #" + std::to_string(call.sequence) + ")"; }, [&] {
    if (rankOrder_ && rankOrder_->takes(call)) return rankOrder_->run(call);
    if (hierarchy_) return ((*hierarchy_).*acrossNodes)(call);
    ((*node_).*withinNode)(call);
  });
}

void Comm::allReduce(const void* send, void* recv, size_t count, ncclDataType_t datatype, ncclRedOp_t op) {
  collective({CallKind::AllReduce, send, recv, count, datatype, op, 0, ++calls_}, &NodeCollectives::allReduce,
             &Hierarchy::allReduce);
}

void Comm::broadcast(const void* send, void* recv, size_t count, ncclDataType_t datatype, int root) {
  collective({CallKind::Broadcast, send, recv, count, datatype, ncclSum, root, ++calls_}, &NodeCollectives::broadcast,
             &Hierarchy::broadcast);
}

void Comm::allGather(const void* send, void* recv, size_t sendCount, ncclDataType_t datatype) {
  collective({CallKind::AllGather, send, recv, sendCount, datatype, ncclSum, 0, ++calls_}, &NodeCollectives::allGather,
             &Hierarchy::allGather);
}

void Comm::reduceScatter(const void* send, void* recv, size_t recvCount, ncclDataType_t datatype, ncclRedOp_t op) {
  collective({CallKind::ReduceScatter, send, recv, recvCount, datatype, op, 0, ++calls_},
             &NodeCollectives::reduceScatter, &Hierarchy::reduceScatter);
}

void Comm::reduce(const void* send, void* recv, size_t count, ncclDataType_t datatype, ncclRedOp_t op, int root) {
  collective({CallKind::Reduce, send, recv, count, datatype, op, root, ++calls_}, &NodeCollectives::reduce,
             &Hierarchy::reduce);
}

bool Comm::collectiveOnDevice(Call call, ncclStream_t stream) {
  // A communicator of one has no peers: its collectives are copies.
  if (!devicePeersRequested_ || topology_.size == 1) return false;
  // The GPU kernel rounds a half type once: the rank-order sum goes through host memory.
  if (rankOrder_ && rankOrder_->takes(call)) return false;
  // Numbered only once taken: a call staged through host memory instead
  // takes its number there, so that every call counts once.
  call.sequence = calls_ + 1;
  if (!devicePeersDecided_) {
    devicePeersDecided_ = true;
    run([] { return std::string("setting up MOJOCCL_DEVICE_PEERS"); },
        [&] { devicePeers_ = DevicePeers::open(topology_, *node_, call); });
  }
  if (!devicePeers_) return false;
  ++calls_;
  validate(call);
  run([&] { return call.describe() + " on device memory (call #" + std::to_string(call.sequence) + ")"; },
      [&] { devicePeers_->run(call, stream); });
  return true;
}

void Comm::transfer(const std::vector<PointToPoint>& batch, Exchange exchange) {
  std::vector<Transfer> transfers;  // within this node: peer is the local index
  std::vector<Transfer> remote;     // across nodes: peer is the rank
  // Each send and receive is a call of its own; an all-to-all is one.
  const bool collective = exchange == Exchange::Collective;
  const uint64_t exchangeCall = collective ? ++calls_ : 0;
  for (const auto& request : batch) {
    if (request.peer < 0 || request.peer >= topology_.size)
      fail(ncclInvalidArgument, "peer " + std::to_string(request.peer) + " is outside 0.." +
                                    std::to_string(topology_.size - 1));
    if (datatypeSize(request.datatype) == 0)
      fail(ncclInvalidArgument, "unknown datatype " + std::to_string(request.datatype));
    if (request.count > 0 && request.buffer == nullptr)
      fail(ncclInvalidArgument, "a buffer pointer is NULL");
    const bool here = topology_.onOurNode(request.peer);
    (here ? transfers : remote)
        .push_back({request.isSend, here ? shm_->indexOf(request.peer) : request.peer, request.buffer,
                    request.count, request.datatype, collective ? exchangeCall : ++calls_});
  }
  std::string what = collective ? "ncclAllToAllv"
                     : batch.size() == 1
                         ? std::string(batch[0].isSend ? "ncclSend to rank " : "ncclRecv from rank ") +
                               std::to_string(batch[0].peer)
                         : "a group of " + std::to_string(batch.size()) + " sends and receives";
  run([&] { return what; }, [&] {
    // An all-to-all is one collective of the node's ranks; between nodes it
    // agrees on the call first, its small sends in the same frames up to
    // MOJOCCL_NET_DIRECT_NODES nodes (of not too many ranks), else rank to rank.
    const Call call{CallKind::AllToAll, nullptr, nullptr, 0, collective ? batch[0].datatype : ncclInt8, ncclSum, 0,
                    exchangeCall};
    if (collective && spansNodes() && hierarchy_->allToAll(transfers, remote, call, what)) return;
    // Within the node first (sends there never wait for the network), then
    // between nodes even after a part of the wrong size here: the other
    // nodes' ranks wait for ours. Then the first mismatch is thrown.
    std::string mismatch;
    try {
      if (collective)
        node_->allToAll(call, transfers);
      else if (!transfers.empty())
        runTransfers(*shm_, transfers);
    } catch (const MismatchError& error) {
      mismatch = error.what();
    }
    if (!remote.empty()) runRemoteTransfers(*fabric_, topology_.rank, remote, what, collective);
    if (!mismatch.empty()) throw MismatchError(mismatch);
  });
}

int Comm::receiveFromAny(void* buffer, size_t count, ncclDataType_t datatype) {
  if (spansNodes())
    fail(ncclInvalidUsage, "a receive from any rank works within one node, and this communicator "
                           "spans " + std::to_string(topology_.nodes.size()) + " nodes: pass the source rank");
  if (datatypeSize(datatype) == 0)
    fail(ncclInvalidArgument, "unknown datatype " + std::to_string(datatype));
  if (count > 0 && buffer == nullptr) fail(ncclInvalidArgument, "a buffer pointer is NULL");
  int source = -1;
  run([] { return std::string("ncclRecv from any rank"); }, [&] {
    source = shm_->commRank(mojoccl::receiveFromAny(*shm_, {false, -1, buffer, count, datatype, ++calls_}));
  });
  return source;
}

// One message to `to` and one from `from`, posted on the fabric endpoint as
// they are: no header, no copy, no agreement. The provider's own
// point-to-point in the process a benchmark measures libmojoccl in.
void Comm::wireSendRecv(const void* send, int to, void* recv, int from, size_t bytes) {
  for (int peer : {to, from})
    if (!spansNodes() || peer < 0 || peer >= topology_.size || topology_.onOurNode(peer))
      fail(ncclInvalidUsage, "mojocclWireSendRecv: rank " + std::to_string(peer) +
                                 " is not a rank of this communicator on another node");
  if (bytes > 0 && (send == nullptr || recv == nullptr)) fail(ncclInvalidArgument, "a buffer pointer is NULL");
  const std::string what = "mojocclWireSendRecv to rank " + std::to_string(to) + " from rank " + std::to_string(from);
  run([&] { return what; }, [&] {
    fabric_->postRecv(from, recv, bytes);
    fabric_->postSend(to, send, bytes);
    fabric_->waitAll(what);
  });
}

}  // namespace mojoccl
