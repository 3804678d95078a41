// The node's shared segment as ShmTransport lays it out: a control block
// per rank (its round counters, its doorbell, its part of the failure
// board), then the channels, then the staging slots. Private to shm.cc and
// failure_board.cc.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "transports/futex.h"
#include "transports/shm.h"

namespace mojoccl {

constexpr size_t kCacheLine = 64;
constexpr int kSlots = 2;

constexpr size_t kFailureBytes = 512;
constexpr uint32_t kMaxListed = 256;  // beyond them, MOJOCCL_IB_TIMEOUT_S tells

// Ranks of other nodes, appended by the node's PeerWatch thread alone and
// read by every rank of the node.
struct RankList {
  std::atomic<uint32_t> count;  // entries of `ranks` written
  std::atomic<int32_t> ranks[kMaxListed];

  void add(int rank) {
    uint32_t n = count.load();
    if (n == kMaxListed || contains(rank)) return;
    ranks[n].store(rank);
    count.store(n + 1, std::memory_order_release);
  }
  bool contains(int rank) const {
    uint32_t n = count.load(std::memory_order_acquire);
    for (uint32_t i = 0; i < n; ++i)
      if (ranks[i].load() == rank) return true;
    return false;
  }
};

struct ShmTransport::ControlBlock {
  Counter stage[kStages];
  Counter doorbell;                // rung when a channel to or from this rank moves
  std::atomic<uint32_t> departed;  // set when the rank leaves the communicator
  std::atomic<uint32_t> failed;    // set, after `failure`, when a collective failed here
  char failure[kFailureBytes];
  // The first rank's block only: the node's alarm, and the ranks of other
  // nodes known to have left, or to have ended without leaving.
  std::atomic<uint32_t> alarmed;  // after `alarm`
  char alarm[kFailureBytes];
  RankList departedElsewhere;
  RankList diedElsewhere;
  alignas(kCacheLine) char notes[kSlots][kNoteBytes];
};

}  // namespace mojoccl
