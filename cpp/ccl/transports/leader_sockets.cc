#include "transports/leader_sockets.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace mojoccl {
namespace {

// Each message goes with its length in front.
using Length = uint64_t;

// A wait yields its core between tries this long without progress, then
// sleeps in poll(), as the fabric's waits do.
constexpr auto kPollBeforeSleeping = std::chrono::milliseconds(1);
constexpr int kSleepMilliseconds = 1;

// A connection that ends is blamed this long after, unless the peer watch's
// news (a rank that died or left, checkPeers) explains it first.
constexpr auto kLossExplainedWithin = std::chrono::seconds(1);

bool wouldBlock(ssize_t result) { return result < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR); }

}  // namespace

// Why a connection ended, and when it was seen.
struct LeaderSockets::Loss {
  std::string how;
  Clock::time_point seen;
};

struct LeaderSockets::Outgoing {
  int peer;
  int fd;
  Length length;
  const char* data;
  size_t sent = 0;  // of the length and the data
  Loss lost;
  bool done() const { return sent == sizeof(Length) + length; }
};

struct LeaderSockets::Incoming {
  int peer;
  int fd;
  Length length = 0;
  char* into;
  size_t room;
  size_t* received;
  size_t got = 0;  // of the length and the data
  Loss lost;
  bool done() const { return got >= sizeof(Length) && got == sizeof(Length) + length; }
};

LeaderSockets::LeaderSockets(std::vector<Socket> links, int rank, std::vector<RankInfo> ranks,
                             const std::atomic<bool>& aborted, int timeoutSeconds)
    : links_(std::move(links)), rank_(rank), ranks_(std::move(ranks)), aborted_(aborted), timeoutSeconds_(timeoutSeconds) {
  for (auto& link : links_) {
    if (!link.valid()) continue;
    int on = 1;
    setsockopt(link.fd(), IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    fcntl(link.fd(), F_SETFL, fcntl(link.fd(), F_GETFL) | O_NONBLOCK);
  }
}

void LeaderSockets::exchange(const std::vector<Send>& sends, const std::vector<Receive>& receives,
                             const std::string& what) {
  auto linkTo = [&](int peer) {
    if (peer < 0 || peer >= static_cast<int>(links_.size()) || !links_[peer].valid())
      fail(ncclInternalError, what + ": rank " + std::to_string(peer) + " is not another node's leader");
    return links_[peer].fd();
  };
  std::vector<Outgoing> outgoing;
  std::vector<Incoming> incoming;
  for (const Send& send : sends) outgoing.push_back({send.rank, linkTo(send.rank), send.bytes, send.data, 0, {}});
  for (const Receive& receive : receives)
    incoming.push_back({receive.rank, linkTo(receive.rank), 0, receive.into, receive.room, receive.received, 0, {}});
  size_t left = outgoing.size() + incoming.size();
  auto lastProgress = Clock::now(), lastCheck = lastProgress;
  while (left > 0) {
    bool moved = false;
    // Sends first: the peers' receives are waiting for them.
    for (auto& message : outgoing)
      if (!message.done() && message.lost.how.empty() && progress(message)) moved = true, left -= message.done();
    for (auto& message : incoming)
      if (!message.done() && message.lost.how.empty() && progress(message, what)) moved = true, left -= message.done();
    const auto now = Clock::now();
    for (const auto& message : outgoing) failIfUnexplained(message.peer, message.lost, now, what);
    for (const auto& message : incoming) failIfUnexplained(message.peer, message.lost, now, what);
    if (moved) {
      lastProgress = now;
      continue;
    }
    if (aborted_.load()) fail(ncclInvalidUsage, "the communicator was aborted");
    // Where ranks outnumber cores, the rank this one waits for may need its core.
    if (now - lastProgress < kPollBeforeSleeping)
      sched_yield();
    else
      waitQuietly(outgoing, incoming);
    // The peers whose messages have not moved yet, each way.
    auto waitedOn = [&] {
      std::vector<int> peers;
      for (const auto& message : outgoing)
        if (!message.done()) peers.push_back(message.peer);
      for (const auto& message : incoming)
        if (!message.done()) peers.push_back(message.peer);
      return peers;
    };
    if (checkPeers_ && now - lastCheck > std::chrono::milliseconds(1)) {
      lastCheck = now;
      checkPeers_(waitedOn(), now - lastProgress);
    }
    if (now - lastProgress > std::chrono::seconds(timeoutSeconds_)) {
      const int peer = waitedOn().front();
      fail(ncclRemoteError, waitedAcrossNodes(what, rank_, peer, ranks_[peer], timeoutSeconds_));
    }
  }
}

bool LeaderSockets::progress(Outgoing& message) {
  iovec parts[2];
  int count = 0;
  if (message.sent < sizeof(Length))
    parts[count++] = {reinterpret_cast<char*>(&message.length) + message.sent, sizeof(Length) - message.sent};
  const size_t dataSent = message.sent > sizeof(Length) ? message.sent - sizeof(Length) : 0;
  if (message.length > dataSent) parts[count++] = {const_cast<char*>(message.data) + dataSent, message.length - dataSent};
  msghdr header{};
  header.msg_iov = parts;
  header.msg_iovlen = count;
  const ssize_t sent = sendmsg(message.fd, &header, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (wouldBlock(sent)) return false;
  if (sent < 0) {
    message.lost = {std::strerror(errno), Clock::now()};
    return false;
  }
  message.sent += static_cast<size_t>(sent);
  return sent > 0;
}

bool LeaderSockets::progress(Incoming& message, const std::string& what) {
  const bool inLength = message.got < sizeof(Length);
  char* to = inLength ? reinterpret_cast<char*>(&message.length) + message.got
                      : message.into + (message.got - sizeof(Length));
  const size_t wanted = inLength ? sizeof(Length) - message.got : sizeof(Length) + message.length - message.got;
  const ssize_t got = recv(message.fd, to, wanted, MSG_DONTWAIT);
  if (wouldBlock(got)) return false;
  if (got <= 0) {
    message.lost = {got == 0 ? "the connection closed" : std::strerror(errno), Clock::now()};
    return false;
  }
  message.got += static_cast<size_t>(got);
  if (inLength && message.got == sizeof(Length)) {
    if (message.length > message.room)
      fail(ncclInternalError, what + ": rank " + std::to_string(message.peer) + " sent a frame of " +
                                  std::to_string(message.length) + " bytes where at most " +
                                  std::to_string(message.room) + " fit");
    *message.received = message.length;
  }
  return true;
}

// Sleeps until a connection that still has something to move is ready, or
// kSleepMilliseconds pass.
void LeaderSockets::waitQuietly(const std::vector<Outgoing>& sends, const std::vector<Incoming>& receives) {
  std::vector<pollfd> ready;
  for (const auto& message : sends)
    if (!message.done() && message.lost.how.empty()) ready.push_back({message.fd, POLLOUT, 0});
  for (const auto& message : receives)
    if (!message.done() && message.lost.how.empty()) ready.push_back({message.fd, POLLIN, 0});
  poll(ready.data(), ready.size(), kSleepMilliseconds);
}

void LeaderSockets::failIfUnexplained(int peer, const Loss& lost, Clock::time_point now, const std::string& what) const {
  if (lost.how.empty() || now - lost.seen < kLossExplainedWithin) return;
  const RankInfo& info = ranks_[peer];
  fail(ncclRemoteError, what + ": the connection to rank " + std::to_string(peer) + " (" + info.hostname + ", pid " +
                            std::to_string(info.pid) + ") was lost: " + lost.how);
}

}  // namespace mojoccl
