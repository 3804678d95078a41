#include "backend/store_watch.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <mutex>

namespace torch_mojo {

namespace {

// A blocking connect with a short limit: the server is up (the group was
// just made through it), so it answers at once or not at all.
int connectTo(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return -1;
  int connected = -1;
  for (addrinfo* each = found; each != nullptr && connected < 0; each = each->ai_next) {
    int fd = socket(each->ai_family, each->ai_socktype | SOCK_CLOEXEC, each->ai_protocol);
    if (fd < 0) continue;
    timeval limit{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));  // bounds connect()
    int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));  // a host gone without a word shows too
    if (connect(fd, each->ai_addr, each->ai_addrlen) == 0)
      connected = fd;
    else
      close(fd);
  }
  freeaddrinfo(found);
  return connected;
}

}  // namespace

std::shared_ptr<StoreWatch> StoreWatch::of(const std::string& host, uint16_t port) {
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<StoreWatch>> watches;
  const std::string server = host + ":" + std::to_string(port);
  std::lock_guard<std::mutex> lock(mutex);
  // A watch that saw its server end is not handed to a group made through
  // a new server on the same address.
  if (auto watch = watches[server].lock(); watch != nullptr && !watch->gone()) return watch;
  const int fd = connectTo(host, port);
  if (fd < 0) return nullptr;
  std::shared_ptr<StoreWatch> watch(new StoreWatch(host, port, fd));
  watches[server] = watch;
  return watch;
}

StoreWatch::~StoreWatch() { close(socket_); }

bool StoreWatch::gone() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (gone_) return true;
  // The connection never carries a byte: anything readable is its end.
  pollfd end{socket_, POLLIN | POLLRDHUP, 0};
  if (poll(&end, 1, 0) <= 0) return false;
  const int fresh = connectTo(host_, port_);
  if (fresh < 0) return gone_ = true;
  close(socket_);
  socket_ = fresh;
  return false;
}

}  // namespace torch_mojo
