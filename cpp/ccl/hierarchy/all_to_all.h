// The all-to-all between nodes, in one exchange between the nodes' leaders
// where it is small. The node's ranks first compare their calls in one step
// in shared memory, each with its counts and, where they fit its slot, its
// sends in that step's slot. The leaders then exchange frames, as for every
// collective between nodes: every rank learns whether all ranks issued the
// call, and a node whose ranks send little to other nodes
// (kFramedMaxBytes in all) sends it inside its frames. A node that sends
// more sends rank to rank on the fabric after them. Each node chooses for
// itself and its frames say which, so no rank needs another node's counts
// in advance. Each leader hands its node the verdict and what came in
// frames in one broadcast.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "algorithms/call.h"
#include "algorithms/p2p.h"
#include "algorithms/step.h"
#include "hierarchy/between_nodes.h"
#include "hierarchy/leader_frames.h"
#include "node/node.h"
#include "node/topology.h"

namespace mojoccl {

class AllToAllAcrossNodes {
 public:
  AllToAllAcrossNodes(const Topology& topology, NodeCollectives& node, LeaderFrames& frames, BetweenNodes& network)
      : topology_(topology), node_(node), frames_(frames), network_(network) {}

  // Whether an all-to-all takes the frames (else it agrees, then goes rank
  // to rank): the same answer on every rank, from the communicator's shape.
  bool takesFrames() const;
  // `withinNode` by shared memory (peers by local index), `remote` in the
  // leaders' frames or on the fabric (peers by rank).
  void run(const std::vector<Transfer>& withinNode, const std::vector<Transfer>& remote, const Call& call,
           const std::string& what);

 private:
  struct Counts;
  struct Handout;
  // Our counts, and our sends where `sendsInSlot` (a rank alone on its
  // node sends from its own buffers).
  void writeSlot(char* slot, const std::vector<const Transfer*>& sendTo,
                 const std::vector<const Transfer*>& receiveFrom, const Call& call, bool sendsInSlot) const;
  std::string takeLocalPartsFromSlots(const Step& step, const Counts& counts, const std::vector<const Transfer*>& sendTo,
                                      const std::vector<const Transfer*>& receiveFrom, const Call& call) const;
  bool sendsFitInFrames(const Counts& counts, size_t element) const;
  // `sendOf(local rank, to)`: where that rank's send to `to` lies.
  void exchangeFrames(const Call& call, const Counts& counts, bool inFrames,
                      const std::function<const char*(size_t, int)>& sendOf, Handout& handout);
  const char* sendsInFrame(size_t node);
  template <typename Visit>
  size_t forEachPartFromNodes(const Counts& counts, Handout& handout, size_t element, bool compact, Visit visit) const;
  void packFromFrames(const Call& call, const Counts& counts, Handout& handout, char* into, bool compact);
  std::string takePartsFromFrames(const Call& call, const Counts& counts, Handout& handout, const char* data,
                                  bool compact, const std::vector<const Transfer*>& receiveFrom);

  const Topology& topology_;
  NodeCollectives& node_;
  LeaderFrames& frames_;
  BetweenNodes& network_;
  std::vector<char> handoutStorage_;  // a Handout's bytes, kept from call to call
};

}  // namespace mojoccl
