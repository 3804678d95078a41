// TCP sockets for the bootstrap: addresses, interface choice, and blocking
// transfers that give up at a deadline instead of hanging.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace mojoccl {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;

  std::string toString() const;  // "10.0.0.5:41234" or "[fe80::1]:41234"
};

// The address other ranks reach this host on (port 0). MOJOCCL_SOCKET_IFNAME
// selects the interface as NCCL_SOCKET_IFNAME does ("eth0", a prefix "eth",
// "^docker" to exclude, "=eth0" for an exact name); by default, an up
// non-loopback interface with a default route, then any up non-loopback one,
// then loopback.
SocketAddress chooseBootstrapAddress();

// Whether interface `name` matches a MOJOCCL_SOCKET_IFNAME value.
bool matchesIfname(const std::string& name, std::string spec);

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { close(); }

  // Listens on `address` (port 0 picks a free one); `address` gets the port.
  static Socket listenOn(SocketAddress& address);
  // Connects, retrying refused connections until `deadline`.
  static Socket connectTo(const SocketAddress& address, Deadline deadline);

  // Waits for a connection; an invalid Socket when `deadline` passes first.
  Socket accept(Deadline deadline);
  void sendAll(const void* data, size_t bytes, Deadline deadline);
  // False when the peer closed the connection before the first byte.
  bool recvAll(void* data, size_t bytes, Deadline deadline);

  bool valid() const { return fd_ >= 0; }
  // "127.0.0.1:41234": the other end, for messages ("?" when unknown).
  std::string peerName() const;
  int fd() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void close();

 private:
  int fd_ = -1;
};

// Milliseconds left until `deadline`, at least 0, for poll().
int millisecondsLeft(Deadline deadline);

// Accepts connections on `listener` until `finished()` or `deadline`, each
// of which must send a greeting of `greetingBytes` within kGreetingTime.
// Greetings are read without blocking, so no connection can hold up the
// others: one that greets goes to `greeted` (which keeps the socket or
// turns it away), one that closes first or says nothing in time to
// `silent`; at most kMostCallers wait at once (the oldest goes to `silent`),
// and a failed accept (the process out of file descriptors) is skipped.
// False when the deadline came first.
constexpr auto kGreetingTime = std::chrono::seconds(2);
constexpr size_t kMostCallers = 64;
bool acceptGreeted(Socket& listener, size_t greetingBytes, Deadline deadline,
                   const std::function<bool()>& finished,
                   const std::function<void(Socket&, const std::vector<char>&)>& greeted,
                   const std::function<void(Socket&, const std::string& why)>& silent);

}  // namespace mojoccl
