#include "transports/peer_watch.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace mojoccl {
namespace {

// `rank` left the communicator, or died (`text` says how).
enum FrameKind : uint32_t { kLeft = 1, kDied = 2 };

struct Frame {
  uint32_t kind;
  int32_t rank;
  uint32_t textBytes;  // the text follows
};
constexpr uint32_t kMaxText = 1024;

// What a leader sends first on each connection to a later node's leader:
// proof that it belongs to this communicator (base/seal.h), its rank, and what
// the connection is for.
struct Handshake {
  uint64_t magic;
  uint64_t proof;  // SealKeys::peerWatch
  int32_t rank;
  uint32_t channel;  // 0: the watch; 1: the frames (leader_sockets.h)
};
static_assert(sizeof(Handshake) == 24, "the handshake is 24 bytes on the wire");
constexpr uint64_t kHandshakeMagic = 0x4843544157434a4dull;  // "MJCWATCH"

struct ListenAddress {
  uint32_t length;
  sockaddr_storage storage;
};

// A node that goes down closes nothing: TCP keepalive finds it within about
// the fabric's own timeout.
void keepAlive(int fd, int timeoutSeconds) {
  int on = 1, idle = std::max(1, timeoutSeconds / 3), interval = std::max(1, timeoutSeconds / 6), probes = 3;
  unsigned int userTimeout = static_cast<unsigned int>(timeoutSeconds) * 1000;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &userTimeout, sizeof(userTimeout));
}

Deadline soon() { return Clock::now() + std::chrono::seconds(2); }

// How often local ranks' departures are looked for (deaths wake the watch).
constexpr int kDeparturePollMs = 100;

// A death is told this long after it is seen: what a rank sent just before
// it exited is still on its way, and its receivers should have it.
void letTheWireDrain() { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }

}  // namespace

PeerWatch::PeerWatch(Bootstrap& bootstrap, const std::vector<std::vector<int>>& nodes, int node, int rank,
                     ShmTransport& shm, int timeoutSeconds, bool frameLinks)
    : rank_(rank),
      shm_(shm),
      ranks_(bootstrap.ranks()),
      channels_(frameLinks ? 2 : 1),
      frameLinks_(ranks_.size()),
      rejections_("rank " + std::to_string(rank) + "'s peer watch") {
  connectLeaders(bootstrap, nodes, node, timeoutSeconds);
  if (nodes[node][0] != rank_) return;
  if (pipe2(wakeup_, O_CLOEXEC) != 0) failSystem("pipe2");
  localWatched_.assign(shm_.size(), true);
  localWatched_[shm_.self()] = false;
  thread_ = std::thread([this] { watch(); });
}

// Each leader connects to the leaders of later nodes and accepts those of
// earlier ones. Every rank takes part in the bootstrap's exchanges.
void PeerWatch::connectLeaders(Bootstrap& bootstrap, const std::vector<std::vector<int>>& nodes, int node,
                               int timeoutSeconds) {
  const bool leader = nodes[node][0] == rank_;
  ListenAddress mine{};
  Socket listener;
  std::string failure;
  if (leader) {
    try {
      SocketAddress address = chooseBootstrapAddress();
      listener = Socket::listenOn(address);
      mine.length = address.length;
      mine.storage = address.storage;
    } catch (const Error& error) {
      failure = error.what();
    }
  }
  bootstrap.agreeOnSuccess(failure.empty(), failure);
  std::vector<char> all = bootstrap.allGather(&mine, sizeof(mine));
  if (leader) {
    const Deadline deadline = Clock::now() + std::chrono::seconds(timeoutSeconds);
    try {
      for (size_t later = node + 1; later < nodes.size(); ++later) {
        const int peer = nodes[later][0];
        const auto* theirs = reinterpret_cast<const ListenAddress*>(all.data() + peer * sizeof(ListenAddress));
        SocketAddress address;
        address.storage = theirs->storage;
        address.length = theirs->length;
        for (uint32_t channel = 0; channel < channels_; ++channel) {
          Socket socket = Socket::connectTo(address, deadline);
          const Handshake handshake{kHandshakeMagic, bootstrap.keys().peerWatch, rank_, channel};
          socket.sendAll(&handshake, sizeof(handshake), deadline);
          keep({peer, channel}, std::move(socket));
        }
      }
      std::vector<Link> earlierLinks;
      for (int earlier = 0; earlier < node; ++earlier)
        for (uint32_t channel = 0; channel < channels_; ++channel) earlierLinks.push_back({nodes[earlier][0], channel});
      acceptLeaders(listener, earlierLinks, bootstrap.keys().peerWatch, deadline, timeoutSeconds);
      for (auto& other : leaders_) keepAlive(other.socket.fd(), timeoutSeconds);
    } catch (const Error& error) {
      failure = "connecting the nodes' leaders: " + std::string(error.what());
    }
  }
  bootstrap.agreeOnSuccess(failure.empty(), failure);
}

// Takes the connections of the leaders in `expected`, each of which must
// present `proof` and its rank. Any other connection (a stranger, a process
// of another job, a second claim of a rank) is closed and counted, and
// accepting goes on: a stranger can neither take a leader's place nor end
// the job's set-up.
void PeerWatch::acceptLeaders(Socket& listener, std::vector<Link> expected, uint64_t proof, Deadline deadline,
                              int timeoutSeconds) {
  auto turnAway = [&](Socket& socket, const std::string& why) {
    rejections_.record("a connection from " + socket.peerName() + " (" + why + ")");
  };
  auto greeted = [&](Socket& socket, const std::vector<char>& greeting) {
    Handshake said;
    memcpy(&said, greeting.data(), sizeof(said));
    const auto awaited = std::find(expected.begin(), expected.end(), Link{said.rank, said.channel});
    if (said.magic != kHandshakeMagic || said.proof != proof) {
      turnAway(socket, "not of this communicator");
    } else if (awaited == expected.end()) {
      turnAway(socket, "it claimed rank " + std::to_string(said.rank) + ", not a leader still expected");
    } else {
      expected.erase(awaited);
      keep({said.rank, said.channel}, std::move(socket));
    }
  };
  if (!acceptGreeted(listener, sizeof(Handshake), deadline, [&] { return expected.empty(); }, greeted, turnAway))
    fail(ncclRemoteError, "the leaders of earlier nodes did not all connect within MOJOCCL_IB_TIMEOUT_S=" +
                              std::to_string(timeoutSeconds) + " s");
}

void PeerWatch::keep(const Link& link, Socket socket) {
  if (link.channel == 0)
    leaders_.push_back({link.rank, std::move(socket)});
  else
    frameLinks_[link.rank] = std::move(socket);
}

PeerWatch::~PeerWatch() {
  if (thread_.joinable()) {
    char stop = 1;
    if (write(wakeup_[1], &stop, 1) != 1) {
      // The pipe cannot be full or closed: the thread is still reading it.
    }
    thread_.join();
  }
  tellLeaders(kLeft, rank_, "");
  for (int fd : wakeup_)
    if (fd >= 0) close(fd);
}

std::string PeerWatch::describeRank(int rank) const {
  const RankInfo& info = ranks_[rank];
  return "rank " + std::to_string(rank) + " (host " + info.hostname + ", pid " + std::to_string(info.pid) + ")";
}

// Sleeps in poll() until something happens (a connection speaks or closes,
// a local process ends, the destructor writes to the pipe) or it is time to
// look for local ranks that left.
void PeerWatch::watch() {
  for (;;) {
    std::vector<pollfd> polled{{wakeup_[0], POLLIN, 0}};
    std::vector<size_t> leaderOf{0};  // polled[i], 1 <= i < sockets, is leaders_[leaderOf[i]]'s
    for (size_t i = 0; i < leaders_.size(); ++i) {
      if (leaders_[i].gone) continue;
      polled.push_back({leaders_[i].socket.fd(), POLLIN, 0});
      leaderOf.push_back(i);
    }
    const size_t sockets = polled.size();
    for (int peer = 0; peer < shm_.size(); ++peer)
      if (localWatched_[peer] && shm_.pidfd(peer) >= 0) polled.push_back({shm_.pidfd(peer), POLLIN, 0});
    int ready = poll(polled.data(), polled.size(), kDeparturePollMs);
    if (ready < 0 && errno != EINTR) return;  // nothing more can be watched
    if (polled[0].revents != 0) return;
    for (size_t i = 1; i < sockets; ++i)
      if (polled[i].revents != 0) readFrom(leaders_[leaderOf[i]]);
    watchLocalRanks();
  }
}

void PeerWatch::watchLocalRanks() {
  for (int peer = 0; peer < shm_.size(); ++peer) {
    if (!localWatched_[peer]) continue;
    if (shm_.peerDeparted(peer)) {
      localWatched_[peer] = false;
      tellLeaders(kLeft, shm_.commRank(peer), "");
    } else if (shm_.peerDied(peer)) {
      localWatched_[peer] = false;
      const std::string text = describeRank(shm_.commRank(peer)) + " exited";
      letTheWireDrain();
      // Other nodes first: this node's ranks fail at the alarm and may close
      // their endpoints, which the others would otherwise see before the news.
      tellLeaders(kDied, shm_.commRank(peer), text);
      shm_.raiseAlarm(text);
    }
  }
}

void PeerWatch::readFrom(Leader& leader) {
  Frame frame{};
  std::string text;
  std::string trouble;  // why the connection ended, when it did
  try {
    if (!leader.socket.recvAll(&frame, sizeof(frame), soon())) {
      trouble = "exited";
    } else if (frame.kind == kLeft) {
      shm_.recordRemoteDeparture(frame.rank);
      if (frame.rank == leader.rank) leader.gone = true;  // its connection closes next
      return;
    } else if (frame.kind == kDied && frame.textBytes <= kMaxText) {
      text.resize(frame.textBytes);
      if (!leader.socket.recvAll(&text[0], text.size(), soon())) trouble = "exited";
      else shm_.recordRemoteDeath(frame.rank);
    } else {
      trouble = "sent a message the peer watch does not know";
    }
  } catch (const Error& error) {
    trouble = "can no longer be reached (" + std::string(error.what()) + ")";
  }
  if (!trouble.empty()) {
    leader.gone = true;
    shm_.recordRemoteDeath(leader.rank);
    text = describeRank(leader.rank) + " " + trouble;
    letTheWireDrain();
  }
  shm_.raiseAlarm(text);
}

void PeerWatch::tellLeaders(uint32_t kind, int rank, const std::string& text) {
  const Frame frame{kind, rank, static_cast<uint32_t>(std::min<size_t>(text.size(), kMaxText))};
  for (auto& other : leaders_) {
    if (other.gone) continue;
    try {
      other.socket.sendAll(&frame, sizeof(frame), soon());
      other.socket.sendAll(text.data(), frame.textBytes, soon());
    } catch (const Error&) {
      // Its own connection's end tells the watch all it needs.
    }
  }
}

}  // namespace mojoccl
