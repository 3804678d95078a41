#include "base/socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/settings.h"

namespace mojoccl {

void failSystem(const std::string& what) {
  fail(ncclSystemError, what + ": " + strerror(errno));
}

std::string SocketAddress::toString() const {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (storage.ss_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(&storage);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  auto* in6 = reinterpret_cast<const sockaddr_in6*>(&storage);
  inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
  port = ntohs(in6->sin6_port);
  return "[" + std::string(host) + "]:" + std::to_string(port);
}

int millisecondsLeft(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

namespace {

struct Interface {
  std::string name;
  SocketAddress address;
  bool loopback;
};

std::vector<Interface> upInterfaces() {
  std::vector<Interface> found;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) failSystem("getifaddrs");
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || !(it->ifa_flags & IFF_UP)) continue;
    int family = it->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    if (family == AF_INET6) {
      auto* in6 = reinterpret_cast<sockaddr_in6*>(it->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr)) continue;  // needs a scope id
    }
    Interface entry{it->ifa_name, {}, (it->ifa_flags & IFF_LOOPBACK) != 0};
    entry.address.length = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    memcpy(&entry.address.storage, it->ifa_addr, entry.address.length);
    found.push_back(entry);
  }
  freeifaddrs(list);
  // IPv4 first: it is what clusters' bootstrap networks use.
  std::stable_sort(found.begin(), found.end(), [](const Interface& a, const Interface& b) {
    return a.address.storage.ss_family == AF_INET && b.address.storage.ss_family != AF_INET;
  });
  return found;
}

std::string defaultRouteInterface() {
  std::ifstream routes("/proc/net/route");
  std::string line;
  std::getline(routes, line);  // header
  while (std::getline(routes, line)) {
    std::istringstream fields(line);
    std::string name, destination;
    fields >> name >> destination;
    if (destination == "00000000") return name;
  }
  return "";
}

}  // namespace

// NCCL_SOCKET_IFNAME syntax: comma-separated prefixes, "^" excludes,
// "=" makes every entry an exact name.
bool matchesIfname(const std::string& name, std::string spec) {
  bool exclude = !spec.empty() && spec[0] == '^';
  if (exclude) spec.erase(0, 1);
  bool exact = !spec.empty() && spec[0] == '=';
  if (exact) spec.erase(0, 1);
  bool listed = false;
  std::istringstream entries(spec);
  std::string entry;
  while (std::getline(entries, entry, ',')) {
    if (entry.empty()) continue;
    if (exact ? name == entry : name.compare(0, entry.size(), entry) == 0) listed = true;
  }
  return exclude ? !listed : listed;
}

SocketAddress chooseBootstrapAddress() {
  auto interfaces = upInterfaces();
  std::string spec = settingText("MOJOCCL_SOCKET_IFNAME");
  if (!spec.empty()) {
    std::string names;
    for (const auto& it : interfaces) {
      if (matchesIfname(it.name, spec)) return it.address;
      if (names.find(it.name) == std::string::npos) names += (names.empty() ? "" : ", ") + it.name;
    }
    fail(ncclInvalidArgument, "MOJOCCL_SOCKET_IFNAME=" + spec +
                                  " matches no interface that is up with an address; "
                                  "this host has: " + names);
  }
  std::string routed = defaultRouteInterface();
  for (const auto& it : interfaces)
    if (!it.loopback && it.name == routed) return it.address;
  for (const auto& it : interfaces)
    if (!it.loopback) return it.address;
  for (const auto& it : interfaces)
    if (it.loopback) return it.address;
  fail(ncclSystemError, "no network interface is up; set MOJOCCL_SOCKET_IFNAME");
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.release();
  }
  return *this;
}

std::string Socket::peerName() const {
  SocketAddress address;
  address.length = sizeof(address.storage);
  if (getpeername(fd_, reinterpret_cast<sockaddr*>(&address.storage), &address.length) != 0) return "?";
  return address.toString();
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Socket Socket::listenOn(SocketAddress& address) {
  Socket sock(::socket(address.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) failSystem("socket");
  int one = 1;
  setsockopt(sock.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(sock.fd(), reinterpret_cast<sockaddr*>(&address.storage), address.length) != 0)
    failSystem("bind " + address.toString());
  // Every rank of a large job reaches the bootstrap root at once: as long
  // a queue as the kernel allows (it caps this at net.core.somaxconn).
  if (::listen(sock.fd(), 65535) != 0) failSystem("listen");
  socklen_t length = address.length;
  if (getsockname(sock.fd(), reinterpret_cast<sockaddr*>(&address.storage), &length) != 0)
    failSystem("getsockname");
  return sock;
}

static void configureConnected(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

Socket Socket::connectTo(const SocketAddress& address, Deadline deadline) {
  auto pause = std::chrono::milliseconds(10);
  while (true) {
    Socket sock(::socket(address.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!sock.valid()) failSystem("socket");
    if (::connect(sock.fd(), reinterpret_cast<const sockaddr*>(&address.storage),
                  address.length) == 0) {
      configureConnected(sock.fd());
      return sock;
    }
    // EADDRNOTAVAIL: this host is out of local ports for the moment (many
    // ranks' connections opening and closing at once).
    bool retry = errno == ECONNREFUSED || errno == ETIMEDOUT || errno == EAGAIN || errno == EINTR ||
                 errno == ENETUNREACH || errno == EHOSTUNREACH || errno == EADDRNOTAVAIL;
    if (!retry) failSystem("connect to " + address.toString());
    if (Clock::now() + pause > deadline)
      fail(ncclRemoteError, "could not reach " + address.toString() + " before the timeout: " +
                                strerror(errno));
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
}

static bool waitReady(int fd, short events, Deadline deadline) {
  while (true) {
    pollfd entry{fd, events, 0};
    int ready = poll(&entry, 1, millisecondsLeft(deadline));
    if (ready > 0) return true;
    if (ready == 0) return false;
    if (errno != EINTR) failSystem("poll");
  }
}

Socket Socket::accept(Deadline deadline) {
  if (!waitReady(fd_, POLLIN, deadline)) return Socket();
  Socket peer(::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC));
  if (!peer.valid()) failSystem("accept");
  configureConnected(peer.fd());
  return peer;
}

void Socket::sendAll(const void* data, size_t bytes, Deadline deadline) {
  auto* cursor = static_cast<const char*>(data);
  while (bytes > 0) {
    if (!waitReady(fd_, POLLOUT, deadline))
      fail(ncclRemoteError, "timed out sending to a peer");
    ssize_t sent = ::send(fd_, cursor, bytes, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      failSystem("send");
    }
    cursor += sent;
    bytes -= static_cast<size_t>(sent);
  }
}

bool Socket::recvAll(void* data, size_t bytes, Deadline deadline) {
  auto* cursor = static_cast<char*>(data);
  size_t received = 0;
  while (received < bytes) {
    if (!waitReady(fd_, POLLIN, deadline))
      fail(ncclRemoteError, "timed out waiting for a peer");
    ssize_t got = ::recv(fd_, cursor + received, bytes - received, 0);
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      // A peer that exits with data it never read resets the connection
      // instead of closing it: it is gone all the same.
      if (errno != ECONNRESET) failSystem("recv");
      got = 0;
    }
    if (got == 0) {
      if (received == 0) return false;
      fail(ncclRemoteError, "a peer closed its connection in the middle of a message");
    }
    received += static_cast<size_t>(got);
  }
  return true;
}

bool acceptGreeted(Socket& listener, size_t greetingBytes, Deadline deadline,
                   const std::function<bool()>& finished,
                   const std::function<void(Socket&, const std::vector<char>&)>& greeted,
                   const std::function<void(Socket&, const std::string& why)>& silent) {
  struct Caller {
    Socket socket;
    Deadline by;
    std::vector<char> greeting;
  };
  std::vector<Caller> callers;
  while (!finished()) {
    if (Clock::now() > deadline) return false;
    std::vector<pollfd> polled{{listener.fd(), POLLIN, 0}};
    for (auto& caller : callers) polled.push_back({caller.socket.fd(), POLLIN, 0});
    ::poll(polled.data(), polled.size(), std::min(100, millisecondsLeft(deadline)));
    for (size_t i = 0; i < callers.size() && !finished(); ++i) {
      Caller& caller = callers[i];
      if (polled[i + 1].revents != 0) {
        const size_t have = caller.greeting.size();
        caller.greeting.resize(greetingBytes);
        const ssize_t got = ::recv(caller.socket.fd(), caller.greeting.data() + have, greetingBytes - have, MSG_DONTWAIT);
        caller.greeting.resize(have + static_cast<size_t>(std::max<ssize_t>(got, 0)));
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
          silent(caller.socket, "it closed before it said who it is");
          caller.socket.close();
          continue;
        }
      }
      if (caller.greeting.size() == greetingBytes) {
        greeted(caller.socket, caller.greeting);
        caller.socket.close();  // a no-op where `greeted` kept it
      } else if (Clock::now() > caller.by) {
        silent(caller.socket, "it said nothing for " + std::to_string(kGreetingTime.count()) + " s");
        caller.socket.close();
      }
    }
    callers.erase(std::remove_if(callers.begin(), callers.end(),
                                 [](const Caller& caller) { return !caller.socket.valid(); }),
                  callers.end());
    if ((polled[0].revents & POLLIN) && !finished()) {
      Socket socket(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!socket.valid()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // out of descriptors: a moment for some to close
        continue;
      }
      configureConnected(socket.fd());
      if (callers.size() == kMostCallers) {
        silent(callers.front().socket, "more than " + std::to_string(kMostCallers) + " connections waited at once");
        callers.erase(callers.begin());
      }
      callers.push_back({std::move(socket), Clock::now() + kGreetingTime, {}});
    }
  }
  return true;
}

}  // namespace mojoccl
