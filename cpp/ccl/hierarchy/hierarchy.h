// The collectives of a communicator that spans nodes, composed of a part
// within each node (node/node.h, shared memory) and a part between the nodes
// (algorithms/network.h, libfabric): each node reduces or gathers to its
// lowest rank, its leader; the leaders run the collective among
// themselves; each leader hands the result back to its node. Where every
// node has the same number of ranks, large calls run on rails instead:
// local rank i of every node carries slice i between nodes, on its own
// endpoint (and NIC, MOJOCCL_FABRIC_DOMAIN), so that no rank and no NIC of
// a node sits idle while one leader moves all of its bytes.
//
// Every call first agrees across nodes (leader_frames.h); calls up to
// kFramedMaxBytes travel in the agreement's own frames (in_frames.cc),
// larger ones through the leaders (through_leaders.cc) or on rails
// (on_rails.cc), and the all-to-all has a class of its own (all_to_all.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "algorithms/call.h"
#include "algorithms/p2p.h"
#include "hierarchy/all_to_all.h"
#include "hierarchy/between_nodes.h"
#include "hierarchy/leader_frames.h"
#include "node/node.h"
#include "node/topology.h"

namespace mojoccl {

// Half types cross nodes in float32 and are rounded once, at the end, as on
// one node: the result does not depend on how ranks are placed.
inline ncclDataType_t acrossNodesType(ncclDataType_t type) {
  return type == ncclFloat16 || type == ncclBfloat16 ? ncclFloat32 : type;
}

class Hierarchy {
 public:
  Hierarchy(const Topology& topology, NodeCollectives& node, BetweenNodes network);

  void allReduce(const Call& call);
  void broadcast(const Call& call);
  void allGather(const Call& call);
  void reduceScatter(const Call& call);
  void reduce(const Call& call);
  // Agreement on `call` and nothing else, for a call whose data moves afterwards.
  void agree(const Call& call) { frames_.agree(call); }
  // The all-gather `gather` of up to kFramedMaxBytes in all, in the leaders'
  // frames, the ranks agreeing on `asked`: the one step of a call that
  // another path builds from a small all-gather.
  void allGatherAgreeingOn(const Call& asked, const Call& gather) { allGatherInFrames(asked, gather); }
  // `withinNode` (peers by local index) and `remote` (peers by rank): in
  // the leaders' frames, returning true, or, where the frames cannot carry
  // it, agreed on and left for the caller to run rank to rank.
  bool allToAll(const std::vector<Transfer>& withinNode, const std::vector<Transfer>& remote, const Call& call,
                const std::string& what);

 private:
  // ---- helpers every derived call is built from (hierarchy.cc)
  NetworkGroup leaders(const Call& call) { return network_.rail(topology_, call, 0); }
  NetworkGroup ourRail(const Call& call) { return network_.rail(topology_, call, topology_.localIndex); }
  // Rails carry a call where each rank's slice of it is this large.
  bool railsCarry(size_t sliceBytes) const;
  // The node's reduction of `count` elements of `call`'s type from `send`
  // into `sums` at the leader (AVG as SUM: the division comes once, at the end).
  void reduceToLeader(const Call& call, const void* send, void* sums, size_t count);
  // `count` elements of `call`'s type at `data` from the leader to its node.
  void broadcastFromLeader(const Call& call, void* data, size_t count);
  // The all-reduce among `group` of `count` elements at `data`, in place,
  // by the algorithm the cost model picks; AVG divides by the whole rank count.
  void allReduceBetweenNodes(const NetworkGroup& group, void* data, size_t count, const Call& call);
  // Down the binomial tree or along the chain, as the model chooses.
  void broadcastBetweenNodes(const NetworkGroup& group, void* data, size_t bytes, int rootNode);
  char* scratch(size_t bytes);

  // ---- in the leaders' frames: one exchange between nodes (in_frames.cc)
  void allReduceInFrames(const Call& call);
  void broadcastInFrames(const Call& call);
  void allGatherInFrames(const Call& asked, const Call& call);
  void reduceScatterInFrames(const Call& call);
  void reduceScatterInFramesByNodes(const Call& call);
  // The node's sums of `call`'s buffer (half types in float32) into `sums` at the leader.
  void nodeSumsAtLeader(const Call& call, char* sums);
  // The small all-reduce of `call` (ranks compare `asked`, what the caller
  // asked for), its result in acrossNodesType: in `resultHere` where the
  // rank is alone on its node and gives one, else in the scratch buffer.
  const char* allReduceInFramesResult(const Call& asked, const Call& call, void* resultHere = nullptr);
  // A leader alone on its node: no rank waits for a hand-out of the
  // result, so it goes straight into the caller's buffer.
  bool alone() const { return topology_.localRanks() == 1; }

  // ---- through the leaders (through_leaders.cc)
  // The all-reduce of `call` with its result in `result` on every rank
  // (half types in float32 between nodes), through the leaders or on rails.
  void allReduceInto(const Call& call, void* result);
  void allReduceThroughLeaders(const Call& call, void* result);
  void broadcastThroughLeaders(const Call& call);
  void allGatherThroughLeaders(const Call& call);
  void reduceScatterThroughLeaders(const Call& call);

  // ---- on rails (on_rails.cc)
  void allReduceOnRails(const Call& call, void* result);
  void broadcastOnRails(const Call& call);
  void allGatherOnRails(const Call& call);
  void reduceScatterOnRails(const Call& call);

  const Topology& topology_;
  NodeCollectives& node_;
  BetweenNodes network_;
  LeaderFrames frames_;
  AllToAllAcrossNodes allToAll_;
  std::vector<char> scratch_;
  std::vector<char> nodeSums_;     // a small reduce-scatter's node sums
  std::vector<float> wide_;        // half-type data in float32
  std::vector<char> railBuffer_;   // a rail all-reduce or broadcast that the node's ranks do not divide
};

}  // namespace mojoccl
