#include "base/bootstrap_wire.h"

#include <string.h>

#include <algorithm>

#include "base/error.h"

namespace mojoccl::wire {

PackedAddress PackedAddress::of(const SocketAddress& address) {
  PackedAddress packed{};
  if (address.length > sizeof(packed.bytes)) fail(ncclInternalError, "a socket address too long for the bootstrap");
  packed.length = address.length;
  memcpy(packed.bytes, &address.storage, address.length);
  return packed;
}

SocketAddress PackedAddress::unpack() const {
  SocketAddress address;
  address.length = length;
  memcpy(&address.storage, bytes, std::min<size_t>(length, sizeof(bytes)));
  return address;
}

namespace {

// The children of the subtree [rank, end): the ranks after `rank` in up to
// kFanOut runs of (nearly) equal length.
std::vector<Subtree> childrenOf(int rank, int end) {
  std::vector<Subtree> children;
  const int rest = end - rank - 1;
  const int count = std::min(kFanOut, rest);
  for (int i = 0; i < count; ++i)
    children.push_back({rank + 1 + static_cast<int>(int64_t{i} * rest / count),
                        rank + 1 + static_cast<int>(int64_t{i + 1} * rest / count)});
  return children;
}

}  // namespace

TreeLinks treeLinks(int rank, int nranks) {
  TreeLinks links;
  Subtree here{0, nranks};
  if (rank < 0 || rank >= nranks) fail(ncclInternalError, "the bootstrap's tree has no rank " + std::to_string(rank));
  while (here.rank != rank) {
    for (const Subtree& child : childrenOf(here.rank, here.end)) {
      if (rank >= child.rank && rank < child.end) {
        links.parent = here.rank;
        here = child;
        break;
      }
    }
  }
  links.end = here.end;
  links.children = childrenOf(here.rank, here.end);
  return links;
}

void sendMessage(Socket& socket, const Message& header, const void* data, Deadline deadline) {
  socket.sendAll(&header, sizeof(header), deadline);
  if (header.bytes > 0) socket.sendAll(data, header.bytes, deadline);
}

void sendFailure(Socket& socket, int32_t status, const std::string& message, Deadline deadline) {
  sendMessage(socket, Message{status, 0, 0, message.size()}, message.data(), deadline);
}

bool receiveMessage(Socket& socket, Message& header, std::vector<char>& data, Deadline deadline) {
  if (!socket.recvAll(&header, sizeof(header), deadline)) return false;
  data.resize(header.bytes);
  if (header.bytes > 0 && !socket.recvAll(data.data(), header.bytes, deadline)) return false;
  return true;
}

}  // namespace mojoccl::wire
