// A communicator: the ranks that run collectives together, and the
// transports and algorithms that serve them.
//
// Ranks are grouped into nodes (equal host hashes). Within a node they share
// memory; when the communicator spans nodes, collectives are hierarchical:
// each node reduces or gathers to its lowest rank (its leader) through shared
// memory, the leaders run the collective among themselves over libfabric,
// and each leader hands the result back to its node. Where every node has
// the same number of ranks, a large all-reduce runs on rails instead: local
// rank i of every node carries slice i between nodes, on its own endpoint
// (and NIC, MOJOCCL_FABRIC_DOMAIN), so that no rank and no NIC of a node
// sits idle while one leader moves all of its bytes.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include <vector>

#include "algorithms/call.h"
#include "algorithms/network.h"
#include "algorithms/network_choice.h"
#include "algorithms/p2p.h"
#include "algorithms/step.h"
#include "bootstrap.h"
#include "mojoccl/nccl.h"
#include "transports/device_ipc.h"
#include "transports/fabric.h"
#include "transports/leader_sockets.h"
#include "transports/peer_watch.h"
#include "transports/shm.h"

namespace mojoccl {

enum class AllReduceAlgorithm { Auto, OneShot, TwoShot };

// Up to this size one-shot all-reduce wins whatever the rank count; above it
// two-shot does once more than two ranks share the work. Between nodes, calls
// up to this size travel in the leaders' frames.
constexpr size_t kOneShotMaxBytes = 64 << 10;

class Comm {
 public:
  // Collective over the `nranks` processes that pass the same `id`.
  Comm(const ncclUniqueId& id, int nranks, int rank);
  ~Comm();

  int rank() const { return rank_; }
  int size() const { return size_; }

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
  // (algorithms/device_peers.cc); false when the caller should stage the
  // call through host memory instead.
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
  int nodeCount() const { return static_cast<int>(nodes_.size()); }
  int localRanks() const { return static_cast<int>(nodes_[node_].size()); }
  int localIndex() const { return localIndex_; }
  // The ranks of this machine whose CPUs overlap this rank's (itself
  // included), and how many CPUs they may run on between them: what the
  // process group needs to know whether torch's threads outnumber the cores.
  int coreSharers() const { return coreSharers_; }
  int sharedCpus() const { return sharedCpus_; }
  // Connections and messages from outside the communicator turned away (seal.h).
  uint64_t rejected();

  // Calls in progress; ncclCommAbort waits for them before freeing the comm.
  std::atomic<int> activeCalls{0};

 private:
  template <typename Describe, typename Algorithm>
  void run(Describe what, Algorithm algorithm);
  void validate(const Call& call) const;
  void findCoreSharers(const std::vector<RankInfo>& ranks);
  bool ranksOutnumberCores() const;  // waits must not hold a core
  void groupIntoNodes(const std::vector<RankInfo>& ranks);
  void openFabric(Bootstrap& bootstrap);

  // ---- within this node (shared memory)
  using Staged = void (*)(ShmTransport&, uint32_t&, const Call&);
  using ZeroCopy = bool (*)(ShmTransport&, uint32_t&, const Call&);
  // Large messages try `zeroCopy` first, which declines when some buffer it
  // must read is private; `staged` always works.
  void local(const Call& call, size_t bytes, ZeroCopy zeroCopy, Staged staged);
  void localAllReduce(const Call& call);
  void localReduce(const Call& call);
  void localBroadcast(const Call& call);
  void localAllGather(const Call& call);
  void localReduceScatter(const Call& call);

  // ---- across nodes (shared memory, then libfabric between leaders;
  // comm_across_nodes.cc)
  bool spansNodes() const { return fabric_ != nullptr; }
  int leader() const { return nodes_[node_][0]; }
  bool isLeader() const { return leader() == rank_; }
  // Local rank `index` of every node, in node order; rail 0 is the leaders.
  NetworkGroup rail(const Call& call, int index);
  NetworkGroup leaders(const Call& call) { return rail(call, 0); }
  // Every node has the same number of ranks, more than one, and
  // MOJOCCL_NET_RAILS does not turn rails off.
  bool onRails() const { return rails_; }
  void agreeAcrossNodes(const Call& call);
  std::string nodeDisagreement(const Call& call);
  std::string disagreementAcrossNodes(const char* reports, size_t stride) const;
  void smallAllReduceAcrossNodes(const Call& call);
  void smallReduceScatterAcrossNodes(const Call& call);
  // Nodes of consecutive ranks, exchanging directly: each leader receives
  // from every other only its node's blocks of their partial sums.
  void smallReduceScatterByNodes(const Call& call);
  // The node's sums of `call`'s buffer (its count, AVG as SUM, half types
  // in float32) into `sums` at the node's leader.
  void reduceToLeader(const Call& call, char* sums);
  // The small all-reduce of `call` (ranks compare `asked`, what the caller
  // asked for), its result in the scratch buffer, in acrossNodesType.
  const char* smallAllReduceResult(const Call& asked, const Call& call);
  // `count` elements of such a result into `to`, as `type`.
  static void keepResult(void* to, const char* result, size_t count, ncclDataType_t type);
  void smallAllGatherAcrossNodes(const Call& call);
  void smallBroadcastAcrossNodes(const Call& call);
  bool nodesAreRankRanges() const;
  void reduceScatterByNodes(const Call& call);
  std::string exchangeNodeFrames(const Call& call, size_t payloadBytes);
  std::string sendOwnFrames(const Call& call, const std::function<size_t(size_t node, char* payload)>& fill);
  char* frame(size_t node);  // each node's report (and data), in frames_
  // Writes this node's report on `call` into our frame (the node's ranks
  // compare their calls first); true when they agree.
  bool reportInFrame(const Call& call);
  // The same where the node's ranks have compared their calls already.
  bool reportInFrame(const Call& call, const std::string& nodeProblem);
  // The all-reduce of `call` with its result in `result` on every rank.
  void allReduceAcrossNodes(const Call& call, void* result);
  void allReduceAcrossNodesInPlace(const Call& call) { allReduceAcrossNodes(call, call.recv); }
  // The same on rails: a reduce-scatter within the node, each slice's
  // all-reduce on its rail, an all-gather within the node.
  void allReduceOnRails(const Call& call, void* result);
  // The all-reduce among the members of `group` of `count` elements at `data`, in place,
  // by the algorithm the cost model picks; AVG divides by the whole rank count.
  void allReduceBetweenNodes(const NetworkGroup& group, void* data, size_t count, const Call& call);
  void broadcastAcrossNodes(const Call& call);
  // Down the binomial tree or along the chain, as the model chooses.
  void broadcastBetweenNodes(const NetworkGroup& group, void* data, size_t bytes, int rootNode);
  // On rails: local rank i of every node carries slice i from the root's
  // node on its rail, then each node gathers its rails' slices.
  void broadcastOnRails(const Call& call);
  void allGatherAcrossNodes(const Call& call);
  // Nodes of consecutive ranks on rails: local rank i of every node swaps
  // its block on its rail, then each node gathers its rails' blocks.
  void allGatherOnRails(const Call& call);
  void reduceScatterAcrossNodes(const Call& call);
  // Nodes of consecutive ranks on rails: each node reduce-scatters, so that
  // local rank i holds its node's sums of block i of every node, which it
  // reduce-scatters on its rail.
  void reduceScatterOnRails(const Call& call);
  void reduceAcrossNodes(const Call& call);

  // ---- the all-to-all between nodes (comm_all_to_all.cc): `withinNode`
  // by shared memory, `remote` in the leaders' frames or on the fabric.
  struct AllToAllCounts;
  struct AllToAllHandout;
  void allToAllAcrossNodes(const std::vector<Transfer>& withinNode, const std::vector<Transfer>& remote,
                           const Call& call, const std::string& what);
  bool allToAllTakesFrames() const;
  void writeAllToAllSlot(char* slot, const std::vector<const Transfer*>& sendTo,
                         const std::vector<const Transfer*>& receiveFrom, const Call& call) const;
  std::string takeLocalPartsFromSlots(const Step& step, const AllToAllCounts& counts,
                                      const std::vector<const Transfer*>& sendTo,
                                      const std::vector<const Transfer*>& receiveFrom, const Call& call) const;
  bool sendsFitInFrames(const AllToAllCounts& counts, size_t element) const;
  void exchangeAllToAllFrames(const Call& call, const Step& step, const AllToAllCounts& counts, bool inFrames,
                              AllToAllHandout& handout);
  template <typename Visit>
  size_t forEachPartFromNodes(const AllToAllCounts& counts, AllToAllHandout& handout, size_t element, bool compact,
                              Visit visit) const;
  void packFromFrames(const Call& call, const AllToAllCounts& counts, AllToAllHandout& handout, char* into,
                      bool compact);
  std::string takePartsFromFrames(const Call& call, const AllToAllCounts& counts, AllToAllHandout& handout,
                                  const char* data, bool compact,
                                  const std::vector<const Transfer*>& receiveFrom) const;
  // Checks `call`, then runs it within the node, or across nodes once every
  // rank agrees on it (`agreesItself`: `acrossNodes` finds that out itself).
  void collective(const Call& call, void (Comm::*withinNode)(const Call&),
                  void (Comm::*acrossNodes)(const Call&), bool agreesItself = false);
  char* scratch(size_t bytes);

  // ---- device memory within the node (algorithms/device_peers.cc)
  std::string devicePeersUnavailable() const;
  void setUpDevicePeers();
  void agreeOnDeviceCall(const Call& call);
  void deviceBarrier();
  // For each chunk of at most `chunk` of the call's elements: `stage` fills
  // this rank's buffer, then, once every rank's is full (and, at the first,
  // every rank agrees on the call), `read` reads them.
  void inDeviceChunks(const Call& call, size_t chunk, ncclStream_t stream,
                      const std::function<void(size_t, size_t)>& stage,
                      const std::function<void(size_t, size_t)>& read);
  void deviceCollective(const Call& call, ncclStream_t stream);

  int rank_;
  int size_;
  AllReduceAlgorithm allReduceAlgorithm_;
  NetworkAlgorithms networkAlgorithms_;  // between nodes (MOJOCCL_NET_ALGO)
  // Up to this many nodes (MOJOCCL_NET_DIRECT_NODES, 16 unless set) the
  // leaders exchange directly, every leader with every other in one step:
  // the frames (each call's agreement, and its data up to kOneShotMaxBytes)
  // and a larger all-gather's blocks. Past it the frames go by Bruck's
  // all-gather, in ceil(log2 n) steps of one message, and the blocks round
  // the ring, each leader with two peers (docs/performance.md, "The
  // leaders' frames at many nodes"). Read when the communicator spans nodes.
  int directNodes_ = 0;
  bool zeroCopy_;  // MOJOCCL_ZERO_COPY: read peers' buffers in place when possible
  std::vector<std::vector<int>> nodes_;  // each node's ranks; nodes ordered by their lowest rank
  std::vector<int> nodeOfRank_;
  int node_ = 0;  // ours
  int localIndex_ = 0;   // our place among our node's ranks
  int coreSharers_ = 1;  // the job's ranks on this host whose CPUs overlap ours (us included)
  int sharedCpus_ = 0;   // the CPUs of those ranks together (0: their masks are unknown)
  bool rails_ = false;
  std::vector<char> railBuffer_;  // a rail all-reduce or broadcast that the node's ranks do not divide
  // They go in the reverse order of these lines (releaseTransports() too):
  // the fabric first, delivering this rank's last sends, then the watch,
  // which tells the other nodes that this rank left, and only then the
  // frames' sockets, whose end of file that news explains.
  std::unique_ptr<ShmTransport> shm_;
  std::unique_ptr<LeaderSockets> leaderSockets_;  // a leader's, where frames go on sockets (MOJOCCL_NET_FRAMES)
  std::unique_ptr<PeerWatch> watch_;         // only when the communicator spans nodes
  std::unique_ptr<FabricTransport> fabric_;  // likewise
  std::mutex transportsMutex_;               // failedRanks() may race with releaseTransports()
  std::vector<int> failedAtRelease_;
  uint64_t rejectedAtRelease_ = 0;
  bool devicePeersRequested_;                // MOJOCCL_DEVICE_PEERS=1
  bool devicePeersDecided_ = false;
  std::unique_ptr<DeviceIpcBuffers> devicePeers_;  // when every rank can read its peers' GPUs
  std::vector<char> scratch_;
  std::vector<char> frames_;  // what the leaders exchange to agree on a call
  std::vector<char> outgoingFrames_;  // a frame for each leader, where they differ
  std::vector<char> nodeSums_;        // a small reduce-scatter's node sums
  std::vector<float> wide_;  // half-type data in float32, across nodes
  ReceiveRoom receiveRoom_;  // what the algorithms between nodes receive into
  uint32_t rounds_ = 0;
  uint64_t calls_ = 0;
  std::atomic<bool> aborted_{false};
  std::atomic<ncclResult_t> asyncError_{ncclSuccess};
  std::string brokenBy_;  // set when an error left the ranks out of step
};

}  // namespace mojoccl
