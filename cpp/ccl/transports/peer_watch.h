// Notices a rank of the communicator that dies on any node, within moments,
// and tells every rank of every node.
//
// Within a node a waiting rank sees a peer's process end (its pidfd). A
// rank waiting on another node cannot, and without this would learn of the
// death only when MOJOCCL_IB_TIMEOUT_S runs out. So each node's first rank
// (its leader) keeps a TCP connection to every other node's leader and a
// thread that waits on those connections and on the pidfds of its node's
// ranks:
//   - a local rank that ends without leaving the communicator: the leader
//     raises its node's alarm and sends the news to the other leaders;
//   - news from another leader: raised as this node's alarm;
//   - another leader's connection closing before it left (its process
//     ended) or timing out (its node went down, TCP keepalive after
//     MOJOCCL_IB_TIMEOUT_S): raised as this node's alarm.
// The alarm (ShmTransport::raiseAlarm) makes every wait of the node's ranks
// fail, within shared memory and on the fabric, naming the rank that died,
// its host and its pid.
//
// Leaving is not dying: a rank that destroys or aborts its communicator
// marks itself departed, its leader tells the other leaders (within 100 ms),
// and only a rank that waits on it fails ("destroyed or aborted its
// communicator"), as within a node. Once a node's leader has left, that
// node's other ranks are no longer watched.
//
// A leader's connection begins with proof that it belongs to the
// communicator (base/seal.h); any other connection to a leader's port is closed
// and counted while accepting goes on.
#pragma once

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "base/bootstrap.h"
#include "base/seal.h"
#include "base/socket.h"
#include "transports/shm.h"

namespace mojoccl {

class PeerWatch {
 public:
  // Collective over `bootstrap`: every rank of the communicator calls it;
  // only leaders (the first rank of each of `nodes`) connect and watch.
  // With `frameLinks`, each pair of leaders makes a second connection, for
  // the frames of every call (transports/leader_sockets.h).
  PeerWatch(Bootstrap& bootstrap, const std::vector<std::vector<int>>& nodes, int node, int rank,
            ShmTransport& shm, int timeoutSeconds, bool frameLinks);
  // The second connections, by the other leader's rank (invalid for the
  // other ranks); once.
  std::vector<Socket> takeFrameLinks() { return std::move(frameLinks_); }
  ~PeerWatch();  // tells the other leaders that this rank left
  // Connections turned away while the leaders connected.
  uint64_t rejected() const { return rejections_.count(); }
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

 private:
  struct Leader {
    int rank;
    Socket socket;
    bool gone = false;  // it left, or its connection ended
  };
  void connectLeaders(Bootstrap& bootstrap, const std::vector<std::vector<int>>& nodes, int node,
                      int timeoutSeconds);
  // A leader's connection for `channel`: 0 the watch's, 1 the frames'.
  struct Link {
    int rank;
    uint32_t channel;
    bool operator==(const Link& other) const { return rank == other.rank && channel == other.channel; }
  };
  void acceptLeaders(Socket& listener, std::vector<Link> expected, uint64_t proof, Deadline deadline,
                     int timeoutSeconds);
  void keep(const Link& link, Socket socket);
  void watch();
  void watchLocalRanks();
  void readFrom(Leader& leader);
  void tellLeaders(uint32_t kind, int rank, const std::string& text);
  std::string describeRank(int rank) const;

  int rank_;
  ShmTransport& shm_;
  std::vector<RankInfo> ranks_;
  std::vector<Leader> leaders_;  // the other nodes' leaders
  uint32_t channels_ = 1;
  std::vector<Socket> frameLinks_;  // by rank
  std::vector<bool> localWatched_;  // per local rank: still to be watched
  int wakeup_[2] = {-1, -1};        // a pipe that ends the thread
  Rejections rejections_;
  std::thread thread_;
};

}  // namespace mojoccl
