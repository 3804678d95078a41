// Point-to-point transfers over the shared-memory channels.
//
// Sends are buffered: a send copies its message into shared memory (inline
// in a channel entry, or a buffer of its own when larger) and is done; the
// receiver copies it out. A send therefore never waits for its receiver
// (unless 16 of its messages are still unreceived), and sends and receives
// issued in any order, in both directions at once, cannot deadlock.
//
// A batch (the transfers of one ncclGroupStart/End) progresses all its
// transfers together; messages between two ranks in one direction arrive in
// the order they were sent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mojoccl/nccl.h"
#include "transports/fabric.h"
#include "transports/shm.h"

namespace mojoccl {

struct Transfer {
  bool isSend;
  int peer;      // local index of the other rank (ourselves is allowed); across nodes, its rank
  void* buffer;  // read by a send, written by a receive
  size_t count;
  ncclDataType_t datatype;
  uint64_t sequence;  // the call number, for messages
};

// Runs every transfer to completion. A receive that finds a message of
// another size or datatype than it expects consumes it and, once the rest of
// the batch is done, throws an error naming both sides.
void runTransfers(ShmTransport& shm, const std::vector<Transfer>& transfers);

// "point-to-point mismatch: rank S sent N x type (its call #c), rank R
// expected M x type (its call #d)": a message of another size or datatype
// than its receive, wherever it travelled (`sentCall` 0: not known).
std::string transferMismatch(int sender, size_t sentCount, uint32_t sentType, uint64_t sentCall, int receiver,
                             const Transfer& expected);

// MPI_ANY_SOURCE within a node: receives the first message waiting from any
// other rank of the node (`transfer.peer` is ignored) and returns the local
// index of its sender. A message of another size or datatype is consumed
// and reported, as by runTransfers.
int receiveFromAny(ShmTransport& shm, const Transfer& transfer);

// The same between nodes: `peer` is then a communicator rank and `self` ours.
// Sends are buffered as within a node, unless `collective` says that every
// rank posts its receives for them in the same call (an all-to-all): they
// then go from the caller's buffer.
void runRemoteTransfers(FabricTransport& fabric, int self, const std::vector<Transfer>& transfers,
                        const std::string& what, bool collective);

}  // namespace mojoccl
