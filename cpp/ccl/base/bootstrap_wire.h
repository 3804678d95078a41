// What the bootstrap's root (bootstrap_root.cc) and its ranks (bootstrap.cc)
// send each other, and the shape of the tree the ranks exchange over.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/bootstrap.h"
#include "base/socket.h"

namespace mojoccl::wire {

constexpr uint64_t kMagic = 0x4c43434f4a4f4d31ull;  // "MOJOCCL1"

// A socket address in a fixed size, as it travels.
struct PackedAddress {
  uint32_t length;
  char bytes[sizeof(sockaddr_in6)];

  static PackedAddress of(const SocketAddress& address);
  bool valid() const { return length > 0 && length <= sizeof(bytes); }
  SocketAddress unpack() const;
};

// What a unique id holds. It fits in NCCL's 128 bytes.
struct IdContents {
  uint64_t magic;
  uint64_t secret;
  PackedAddress root;
};
static_assert(sizeof(IdContents) <= NCCL_UNIQUE_ID_BYTES, "unique id too large");

// What each rank sends the root first: proof that it holds the unique id
// (SealKeys::hello), who it is, and where its children in the tree reach it
// (length 0 where it has none).
struct Hello {
  uint64_t magic;
  uint64_t proof;
  int32_t nranks;
  RankInfo info;
  PackedAddress listening;
};

// The root's answer to each rank, and every message on the tree: a
// non-zero status (an ncclResult_t) carries a failure's message of `bytes`
// characters instead of data. The root answers rank 0 with the table of
// ranks and every other rank with its parent's PackedAddress.
struct Message {
  int32_t status;
  uint32_t compare;    // the exchange's kind (Bootstrap::firstDifference), checked at every hop
  uint64_t partBytes;  // each rank's part, checked at every hop
  uint64_t bytes;      // what follows
};

// What a rank sends its parent when it connects.
struct TreeHello {
  uint64_t magic;
  uint64_t proof;  // SealKeys::hello
  int32_t rank;
  int32_t reserved;
};

// The bootstrap's tree: rank 0 at the top; each rank heads the ranks
// [rank, end), and splits those after it among up to kFanOut children,
// each heading a contiguous run. A subtree's parts are then contiguous in
// rank order, and no rank handles more than kFanOut + 1 others per step.
constexpr int kFanOut = 8;
struct TreeLinks {
  int parent = -1;  // -1 for rank 0
  int end = 0;      // this rank's subtree is [rank, end)
  std::vector<Subtree> children;
};
TreeLinks treeLinks(int rank, int nranks);

// Sends a Message and what follows it.
void sendMessage(Socket& socket, const Message& header, const void* data, Deadline deadline);
void sendFailure(Socket& socket, int32_t status, const std::string& message, Deadline deadline);
// Reads one; false where the peer closed the connection before it.
bool receiveMessage(Socket& socket, Message& header, std::vector<char>& data, Deadline deadline);

}  // namespace mojoccl::wire
