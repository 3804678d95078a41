// Shared-memory transport for the ranks of one node.
//
// One segment per node holds, for every local rank, a control block (three
// round counters and a small note per slot) and two staging slots. Ranks
// read each other's slots directly; a rank writes only its own. Algorithms
// number their steps ("rounds"); round r uses slot r % 2 and publishes its
// progress through the counters. Waiting spins briefly, then sleeps on a
// futex, so ranks that outnumber cores do not starve the peer they wait for.
//
// The transport knows nothing of collectives: what a slot or a note holds is
// the algorithms' business.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mojoccl {

class Bootstrap;

// The counters every rank publishes, in the order a round passes them.
enum class Stage : int { Posted = 0, Reduced = 1, Done = 2 };
constexpr int kStages = 3;
constexpr size_t kNoteBytes = 64;

struct ShmPeer {
  int commRank;
  int pid;
};

class ShmTransport {
 public:
  // Collective over `bootstrap`: every rank of the communicator calls it,
  // `peers` are the ranks of this node in local order, `self` is our index.
  ShmTransport(Bootstrap& bootstrap, std::vector<ShmPeer> peers, int self,
               const std::string& segmentName, size_t slotBytes,
               const std::atomic<bool>& aborted);
  ~ShmTransport();
  ShmTransport(const ShmTransport&) = delete;
  ShmTransport& operator=(const ShmTransport&) = delete;

  int size() const { return static_cast<int>(peers_.size()); }
  int self() const { return self_; }
  int commRank(int peer) const { return peers_[peer].commRank; }
  size_t slotBytes() const { return slotBytes_; }

  char* slot(int peer, uint32_t round) const;
  char* note(int peer, uint32_t round) const;

  void publish(Stage stage, uint32_t round);
  // Returns once `peer` has published `stage` for `round` (or a later one).
  // Throws if the communicator is aborted or the peer has gone.
  void await(int peer, Stage stage, uint32_t round) const;
  void awaitAll(Stage stage, uint32_t round) const;

 private:
  struct ControlBlock;
  ControlBlock& control(int peer) const;
  void checkPeer(int peer) const;
  bool peerExited(int peer) const;

  std::vector<ShmPeer> peers_;
  std::vector<int> pidfds_;  // -1: ourselves, or pidfd_open is unavailable
  int self_;
  size_t slotBytes_;
  size_t segmentBytes_ = 0;
  char* base_ = nullptr;
  char* slots_ = nullptr;
  int spins_;
  const std::atomic<bool>& aborted_;
};

}  // namespace mojoccl
