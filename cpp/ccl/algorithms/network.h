// Collectives among a group of ranks on different nodes (one per node, in
// the hierarchical algorithms), built from the fabric transport's messages.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "algorithms/layout.h"
#include "algorithms/network_choice.h"
#include "mojoccl/nccl.h"
#include "transports/fabric.h"
#include "transports/leader_sockets.h"

namespace mojoccl {

// Where algorithms receive what they fold into their data, kept by the
// communicator from call to call: a fresh buffer costs zeroing and a page
// fault every 4 KiB (between 2 nodes, 23% of an all-reduce of 64 MiB).
class ReceiveRoom {
 public:
  // Room `which` (0 or 1: a ring receives into one while it folds from the
  // other) of at least `bytes`; what it held is not kept.
  char* get(int which, size_t bytes) {
    if (buffers_[which].size() < bytes) buffers_[which].resize(bytes);
    return buffers_[which].data();
  }

 private:
  std::vector<char> buffers_[2];
};

struct NetworkGroup {
  FabricTransport& fabric;
  ReceiveRoom& room;
  std::vector<int> ranks;  // communicator ranks, in group order
  int self;                // our index in `ranks`
  std::string what;        // the caller's operation, for errors
  LeaderSockets* sockets = nullptr;  // where the frames go instead of the fabric (leaders only)
  int size() const { return static_cast<int>(ranks.size()); }
  int next() const { return ranks[(self + 1) % size()]; }  // round the ring
  int previous() const { return ranks[(self + size() - 1) % size()]; }
};

// `slice` (in elements) cut into the segments a message of it travels in
// (FabricTransport::segmentFor; one, if empty: an empty message still
// travels). Sender and receiver cut the same slice alike.
std::vector<Slice> segmentSlices(const NetworkGroup& group, Slice slice, size_t elementSize);

// Ring all-reduce in place: a reduce-scatter then an all-gather, each slice
// reduced by one rank in ring order, so every rank ends with the same bits.
// `op` must not be ncclAvg (the caller divides once, by the whole count).
void networkAllReduce(const NetworkGroup& group, void* data, size_t count, ncclDataType_t datatype,
                      ncclRedOp_t op);

// Recursive doubling all-reduce in place: log2(size) exchanges of the
// whole buffer with members 1, 2, 4, ... away, each pair combining the same
// two operands in the same order (so every member ends with the same bits).
// Members past the largest power of two first fold their data into a
// partner and get the result back at the end. Fewer steps than the ring,
// more bytes: for mid sizes on many nodes (algorithms/network_choice.h).
void networkAllReduceRecursiveDoubling(const NetworkGroup& group, void* data, size_t count,
                                       ncclDataType_t datatype, ncclRedOp_t op);

// Rabenseifner's all-reduce in place: a reduce-scatter by recursive halving
// (log2(size) swaps of half, a quarter, ... of the buffer, each member
// reducing the half it keeps), then an all-gather by recursive doubling
// of the whole parts. The ring's bytes in log2(size) steps each way; each
// part is reduced by one member, so every member ends with the same bits.
// Members past the largest power of two fold in first, as in recursive
// doubling.
void networkAllReduceRabenseifner(const NetworkGroup& group, void* data, size_t count, ncclDataType_t datatype,
                                  ncclRedOp_t op);

// The all-reduce down two binary trees in place (algorithms/network_tree.cc):
// each reduces half the buffer to its root and broadcasts it back down,
// pipelined in segments; about 2 log2(size) steps for any size, every
// member sending about twice the buffer. The result is the roots' bits on
// every member.
void networkAllReduceTree(const NetworkGroup& group, void* data, size_t count, ncclDataType_t datatype,
                          ncclRedOp_t op);

// What the trees ask of their busiest member, for the cost model
// (algorithms/network_choice.h): the deeper tree's levels below its root,
// and the halves of the buffer a member sends and folds in, at most.
struct TreeLoad {
  int levels;
  int halvesSent;
  int halvesReduced;
};
TreeLoad treeLoad(int members);

// Where a reduce-scatter round the ring reads and writes.
struct RingBuffers {
  const void* source;  // this member's operand, every slice; only read
  void* partial;       // the other slices' partial sums, at their offsets
  void* result;        // this member's slice, whole at the end, from its start
};

// Reduce-scatter round the ring, pipelined in segments: member m ends with
// slices[(m + shift) % size] reduced over every member's source, in its
// result. The buffers may be one (in place: result then points at the
// slice within it). `whole(piece)` is called for each segment of that
// slice as it becomes whole, while the rest still travels. Every member
// passes the same slices.
void networkReduceScatter(const NetworkGroup& group, const RingBuffers& buffers, const std::vector<Slice>& slices,
                          int shift, ncclDataType_t datatype, ncclRedOp_t op, const std::function<void(Slice)>& whole);

// Reduce-scatter by recursive halving, in place: log2(p) swaps of half, a
// quarter, ... of the buffer (p the largest power of two up to the size),
// member m ending with slices[m] reduced over every member. The slices
// must follow one another in member order. Where the size is not a power
// of two, member 2i hands member 2i + 1 its data first (for i < size - p)
// and gets its slice back at the end. Fewer steps than the ring from 4
// members, the same bytes (algorithms/network_choice.h).
void networkReduceScatterHalving(const NetworkGroup& group, void* data, const std::vector<Slice>& slices,
                                 ncclDataType_t datatype, ncclRedOp_t op);

// `bytes` from group member `root` to every other member, in place,
// pipelined in segments: `shape` Tree, down a binomial tree (log2(size)
// rounds, the root sending log2(size) copies); Ring, along the members
// from the root, each passing each segment on to the next (size - 1
// rounds, every member sending at most one copy).
void networkBroadcast(const NetworkGroup& group, void* data, size_t bytes, int root, NetworkAlgorithm shape);

// Every member's block (of its own size) to every member, in place:
// blocks[i] is where member i's block lies in `data` (in bytes); ours is
// read, the others are written. Directly: each member sends its block to
// every other one, one step of size - 1 messages.
void networkAllGather(const NetworkGroup& group, char* data, const std::vector<Slice>& blocks);

// The same round the ring: size - 1 steps, each member sending and
// receiving one block per step (passing each segment on as it lands), the
// same bytes as directly, but two peers per member rather than all of
// them: for many members.
void networkAllGatherRing(const NetworkGroup& group, char* data, const std::vector<Slice>& blocks);

// Every member sends every other its frame (`sendBytes` from
// frames[self]: what it says of the call at the front, its data behind),
// in pieces the provider sends without a rendezvous (one, for most
// frames); frames[i] receives member i's, of up to `roomBytes`, and
// received[i] its length. Members that disagree on the call, and so on the
// size, still exchange whole frames: the next call finds them in step.
// The first receives are posted before the sends, so that a frame finds
// its receive waiting. One step, size - 1 messages sent per member.
void networkExchangeFrames(const NetworkGroup& group, const std::vector<char*>& frames, size_t sendBytes,
                           size_t roomBytes, std::vector<size_t>& received);

// The same exchange with a frame of its own for each member: outgoing[i]
// (of outgoingBytes[i]) goes to member i; frames[i] receives member i's.
void networkSendFrames(const NetworkGroup& group, const std::vector<const char*>& outgoing,
                       const std::vector<size_t>& outgoingBytes, const std::vector<char*>& frames, size_t roomBytes,
                       std::vector<size_t>& received);

// The same frames to the same places, by Bruck's all-gather: ceil(log2
// size) steps, each sending one message (the frames a member holds that
// its partner lacks, each with its length) and receiving one. For many
// members, where size - 1 messages per member cost more than the steps.
void networkGatherFrames(const NetworkGroup& group, const std::vector<char*>& frames, size_t sendBytes,
                         size_t roomBytes, std::vector<size_t>& received);

}  // namespace mojoccl
