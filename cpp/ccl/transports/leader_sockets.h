// Each call's frames between the nodes' leaders on TCP connections of their
// own: where the fabric is libfabric's tcp provider, a frame crosses as one
// sendmsg() (its length, then its bytes), in about half of ofi_rxm's round trip (an 8-byte
// all-reduce between 2 nodes: benchmarks/investigations.md). The frames are the
// agreement on every call between nodes and the data of the small
// collectives (algorithms/network.h); all else stays on the fabric.
//
// The connections are made with the peer watch's, and proven as they are
// (transports/peer_watch.h): nothing but the leaders of this communicator
// writes to them. MOJOCCL_NET_FRAMES chooses (auto: these sockets where the
// provider is tcp, the fabric on RDMA providers, whose round trip is shorter).
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "base/bootstrap.h"
#include "base/socket.h"
#include "transports/fabric.h"

namespace mojoccl {

class LeaderSockets {
 public:
  // `links[r]`: the connection to the leader of rank r (invalid for others).
  LeaderSockets(std::vector<Socket> links, int rank, std::vector<RankInfo> ranks, const std::atomic<bool>& aborted,
                int timeoutSeconds);

  struct Send {
    int rank;
    const char* data;
    size_t bytes;
  };
  struct Receive {
    int rank;
    char* into;
    size_t room;       // a longer message is an error
    size_t* received;  // its length
  };
  // Moves every message side by side, one each way at a time per
  // connection, and returns once all have moved; `what` names the call in
  // errors. A send and a receive of the same pair go together.
  void exchange(const std::vector<Send>& sends, const std::vector<Receive>& receives, const std::string& what);

  // As FabricTransport's: called while a wait sees no progress.
  void checkPeersWith(FabricTransport::PeerCheck check) { checkPeers_ = std::move(check); }

 private:
  struct Loss;
  struct Outgoing;
  struct Incoming;
  // Moves what the connection takes now; true when anything moved.
  bool progress(Outgoing& message);
  bool progress(Incoming& message, const std::string& what);
  void waitQuietly(const std::vector<Outgoing>& sends, const std::vector<Incoming>& receives);
  void failIfUnexplained(int peer, const Loss& lost, Clock::time_point now, const std::string& what) const;

  std::vector<Socket> links_;
  int rank_;
  std::vector<RankInfo> ranks_;
  const std::atomic<bool>& aborted_;
  int timeoutSeconds_;
  FabricTransport::PeerCheck checkPeers_;
};

}  // namespace mojoccl
