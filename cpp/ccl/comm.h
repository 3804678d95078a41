// A communicator: the ranks that run collectives together. It sets up the
// transports, checks each call, and hands it to the node's collectives
// (node/node.h) or, when it spans nodes, to the hierarchy
// (hierarchy/hierarchy.h), which composes a node part and a network part.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "algorithms/call.h"
#include "algorithms/p2p.h"
#include "base/bootstrap.h"
#include "hierarchy/hierarchy.h"
#include "mojoccl/nccl.h"
#include "node/device_peers.h"
#include "node/node.h"
#include "node/topology.h"
#include "rank_order.h"
#include "transports/fabric.h"
#include "transports/leader_sockets.h"
#include "transports/peer_watch.h"
#include "transports/shm.h"

namespace mojoccl {

class SetupClock;  // comm.cc

class Comm {
 public:
  // Collective over the `nranks` processes that pass the same `id`.
  Comm(const ncclUniqueId& id, int nranks, int rank);
  ~Comm();

  int rank() const { return topology_.rank; }
  int size() const { return topology_.size; }

  void allReduce(const void* send, void* recv, size_t count, ncclDataType_t datatype,
                 ncclRedOp_t op);
  void broadcast(const void* send, void* recv, size_t count, ncclDataType_t datatype, int root);
  void allGather(const void* send, void* recv, size_t sendCount, ncclDataType_t datatype);
  void reduceScatter(const void* send, void* recv, size_t recvCount, ncclDataType_t datatype,
                     ncclRedOp_t op);
  void reduce(const void* send, void* recv, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
              int root);

  // `call` (its sequence set here) on device memory, on the GPUs of one
  // node, when MOJOCCL_DEVICE_PEERS=1 and every rank can
  // (node/device_peers.h); false when the caller should stage the call
  // through host memory instead.
  bool collectiveOnDevice(Call call, ncclStream_t stream);

  // A send or receive as the caller asked for it (peer = communicator rank).
  struct PointToPoint {
    bool isSend;
    int peer;
    void* buffer;
    size_t count;
    ncclDataType_t datatype;
  };
  // Buffered: every send between nodes is copied first and never waits for
  // its receiver, so that sends and receives issued in any order, in any
  // calls, cannot deadlock. Collective: every rank runs its part of the
  // same exchange now (an all-to-all), so every receive is posted in this
  // call and a send between nodes goes from the caller's buffer as it is.
  enum class Exchange { Buffered, Collective };
  // Runs a batch of sends and receives together (one group's worth).
  void transfer(const std::vector<PointToPoint>& batch, Exchange exchange = Exchange::Buffered);
  // A receive from whichever rank's message comes first; returns its rank.
  // Within one node only (the ranks of other nodes are not watched).
  int receiveFromAny(void* buffer, size_t count, ncclDataType_t datatype);
  // `bytes` to `to` and from `from`, ranks on other nodes, straight on the
  // fabric endpoint (mojocclWireSendRecv).
  void wireSendRecv(const void* send, int to, void* recv, int from, size_t bytes);

  // From any thread: makes every wait of this communicator fail promptly.
  void abort() { aborted_.store(true); }
  // After abort(), once no call is active: unmaps shared memory and frees
  // the device buffer (an aborted communicator is never destroyed).
  void releaseTransports();
  // The ranks known to have ended without leaving the communicator (killed,
  // crashed, their node lost), ascending: what mojocclCommFailedRanks
  // reports. After an abort, those known when it released the transports.
  std::vector<int> failedRanks();
  ncclResult_t asyncError() const { return asyncError_.load(); }
  // The communicator's shape: its nodes, the ranks of ours, our place there.
  int nodeCount() const { return static_cast<int>(topology_.nodes.size()); }
  int localRanks() const { return topology_.localRanks(); }
  int localIndex() const { return topology_.localIndex; }
  // The ranks of this machine whose CPUs overlap this rank's (itself
  // included), and how many CPUs they may run on between them: what the
  // process group needs to know whether torch's threads outnumber the cores.
  int coreSharers() const { return coreSharers_; }
  int sharedCpus() const { return sharedCpus_; }
  // Connections and messages from outside the communicator turned away (seal.h).
  uint64_t rejected();
  // How long this rank's set-up took, phase by phase (mojocclCommSetupSeconds).
  enum SetupPhase { kSetupBootstrap, kSetupSharedMemory, kSetupSettings, kSetupFabric, kSetupPeerWatch, kSetupPhases };
  const double* setupSeconds() const { return setupSeconds_; }
  // The set-up's exchanges over the bootstrap's tree, and this rank's bytes in its all-gathers.
  int setupRounds() const { return setupRounds_; }
  uint64_t setupBytes() const { return setupBytes_; }

  // Calls in progress; ncclCommAbort waits for them before freeing the comm.
  std::atomic<int> activeCalls{0};

 private:
  template <typename Describe, typename Algorithm>
  void run(Describe what, Algorithm algorithm);
  void validate(const Call& call) const;
  void findCoreSharers(const std::vector<RankInfo>& ranks);
  bool ranksOutnumberCores() const;  // waits must not hold a core
  void openFabric(Bootstrap& bootstrap, SetupClock& setup);
  // The settings every rank must share, read and compared at set-up.
  struct AgreedSettings {
    AllReduceAlgorithm allReduceAlgorithm;  // MOJOCCL_ALGO
    bool zeroCopy;                          // MOJOCCL_ZERO_COPY
    bool devicePeers;                       // MOJOCCL_DEVICE_PEERS
    bool deterministic;                     // MOJOCCL_DETERMINISTIC
  };
  AgreedSettings agreeOnSettings(Bootstrap& bootstrap);
  bool spansNodes() const { return hierarchy_ != nullptr; }
  // Checks `call`, then runs it within the node, or across nodes.
  void collective(const Call& call, void (NodeCollectives::*withinNode)(const Call&),
                  void (Hierarchy::*acrossNodes)(const Call&));

  Topology topology_;
  int coreSharers_ = 1;  // the job's ranks on this host whose CPUs overlap ours (us included)
  int sharedCpus_ = 0;   // the CPUs of those ranks together (0: their masks are unknown)
  // They go in the reverse order of these lines (releaseTransports() too):
  // the fabric first, delivering this rank's last sends, then the watch,
  // which tells the other nodes that this rank left, and only then the
  // frames' sockets, whose end of file that news explains.
  std::unique_ptr<ShmTransport> shm_;
  std::unique_ptr<LeaderSockets> leaderSockets_;  // a leader's, where frames go on sockets (MOJOCCL_NET_FRAMES)
  std::unique_ptr<PeerWatch> watch_;         // only when the communicator spans nodes
  std::unique_ptr<FabricTransport> fabric_;  // likewise
  // What runs the calls: built on the transports, released before them.
  std::unique_ptr<NodeCollectives> node_;
  std::unique_ptr<Hierarchy> hierarchy_;     // only when the communicator spans nodes
  std::unique_ptr<RankOrderReductions> rankOrder_;  // MOJOCCL_DETERMINISTIC=1
  std::mutex transportsMutex_;               // failedRanks() may race with releaseTransports()
  std::vector<int> failedAtRelease_;
  uint64_t rejectedAtRelease_ = 0;
  double setupSeconds_[kSetupPhases] = {};
  int setupRounds_ = 0;
  uint64_t setupBytes_ = 0;
  bool devicePeersRequested_ = false;        // MOJOCCL_DEVICE_PEERS=1
  bool devicePeersDecided_ = false;
  std::unique_ptr<DevicePeers> devicePeers_;  // when every rank can read its peers' GPUs
  uint64_t calls_ = 0;
  std::atomic<bool> aborted_{false};
  std::atomic<ncclResult_t> asyncError_{ncclSuccess};
  std::string brokenBy_;  // set when an error left the ranks out of step
};

}  // namespace mojoccl
