// Shared-memory transport for the ranks of one node.
//
// One segment per node holds, for every local rank:
//   - a control block: round counters, a note per staging slot, a doorbell;
//   - two staging slots, for the direct collectives (algorithms/direct.cc);
//   - a channel to every other local rank, for point-to-point messages: a
//     ring of entries, each a note and a few KiB of inline data.
// Messages too large for an entry travel in buffers of their own, which the
// sender keeps and reuses for later messages to the same peer.
//
// A rank writes only what it owns and reads everyone's. Waiting spins
// briefly (ranks that outnumber cores then yield their core a while), then
// sleeps on a futex, so ranks that outnumber cores do not starve the peer
// they wait for. Every 50 ms of sleep a waiter checks that
// the communicator was not aborted and that the peer still runs.
//
// The transport knows nothing of collectives or messages: what slots,
// entries and notes hold is the algorithms' business. Its segment's layout
// is in shm_layout.h; the failure board every wait checks, in
// failure_board.cc.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "transports/shm_segment.h"

namespace mojoccl {

class Bootstrap;
struct Counter;

// Unlinks the large-message buffers in /dev/shm whose sending process has
// ended (this user's only). The node segment itself is unlinked at set-up.
void removeOrphanBuffers();

// The round counters every rank publishes, in the order a round passes them.
enum class Stage : int { Posted = 0, Reduced = 1, Done = 2 };
constexpr int kStages = 3;
constexpr size_t kNoteBytes = 128;

struct ShmPeer {
  int commRank;
  int pid;
};

class ShmTransport {
 public:
  // Collective over `bootstrap`: every rank of the communicator calls it,
  // `peers` are the ranks of this node in local order, `self` is our index.
  // `ranksOutnumberCores`: the job's ranks whose CPUs overlap ours are more
  // than those CPUs (Comm::coreSharing), so a wait must not hold a core.
  ShmTransport(Bootstrap& bootstrap, std::vector<ShmPeer> peers, int self,
               const std::string& segmentName, size_t slotBytes,
               const std::atomic<bool>& aborted, bool ranksOutnumberCores);
  ~ShmTransport();
  ShmTransport(const ShmTransport&) = delete;
  ShmTransport& operator=(const ShmTransport&) = delete;

  int size() const { return static_cast<int>(peers_.size()); }
  int self() const { return self_; }
  int commRank(int peer) const { return peers_[peer].commRank; }
  // The local index of communicator rank `commRank`, which must be on this node.
  int indexOf(int commRank) const;

  // ---- staging slots and rounds (direct collectives)
  size_t slotBytes() const { return slotBytes_; }
  char* slot(int peer, uint32_t round) const;
  char* note(int peer, uint32_t round) const;
  void publish(Stage stage, uint32_t round);
  // Returns once `peer` has published `stage` for `round` (or a later one).
  // Throws if the communicator is aborted or the peer has gone.
  void await(int peer, Stage stage, uint32_t round) const;
  void awaitAll(Stage stage, uint32_t round) const;

  // ---- the node's failure board (failure_board.cc)
  // Records why this rank's part of a collective failed: peers waiting on it
  // raise "rank N failed: <why>" within 50 ms instead of waiting on.
  void markFailed(const std::string& why);
  // This rank has left the communicator (destroyed or aborted it): peers
  // waiting on it raise "rank N destroyed or aborted its communicator".
  void markDeparted();

  // ---- the node's alarm: a rank of the communicator failed somewhere
  // Raised by the node's first rank (its PeerWatch, transports/peer_watch.h);
  // every wait of every rank of the node then fails with `why`. The first
  // alarm is the one reported.
  void raiseAlarm(const std::string& why);
  // Throws the alarm, if raised, or that the node's first rank exited
  // without leaving the communicator: what a rank waiting on another node
  // checks, as it waits on no one here.
  void checkNodeAlarm() const;
  // Ranks of other nodes that left the communicator (destroyed or aborted
  // it), as the node's PeerWatch hears of them: a rank waiting on one of
  // them fails at once, as it would waiting on a rank of this node.
  void recordRemoteDeparture(int commRank);
  bool remoteDeparted(int commRank) const;
  // Ranks of other nodes that ended without leaving, likewise: what
  // mojocclCommFailedRanks reports for them.
  void recordRemoteDeath(int commRank);
  bool remoteDied(int commRank) const;
  // Whether local `peer` left the communicator, and whether it ended
  // without leaving it.
  bool peerDeparted(int peer) const;
  bool peerDied(int peer) const;
  // A pidfd that becomes readable when `peer` ends; -1 for ourselves or
  // where pidfd_open is unavailable.
  int pidfd(int peer) const { return pidfds_[peer]; }
  int pid(int peer) const { return peers_[peer].pid; }

  // ---- channels (point-to-point)
  struct Entry {
    char* note;
    char* data;  // inlineBytes() of room
  };
  size_t inlineBytes() const { return entryBytes_ - kNoteBytes; }
  // The next free entry towards `peer`; false while its ring is full.
  bool claimSend(int peer, Entry* entry) const;
  void postSend(int peer);
  // The next entry `peer` posted to us; false while there is none.
  bool peekReceive(int peer, Entry* entry) const;
  void releaseReceive(int peer);

  // ---- buffers for messages larger than an entry
  struct Buffer {
    uint64_t serial;
    size_t capacity;
    char* data;
  };
  // A buffer of at least `bytes` towards `peer`, marked busy until the
  // receiver releases it.
  Buffer claimOutgoingBuffer(int peer, size_t bytes);
  const char* incomingBuffer(int peer, uint64_t serial, size_t capacity);
  void releaseIncomingBuffer(int peer, uint64_t serial);

  // ---- reading peers' private memory (cross-memory attach)
  // True when every rank of the node may read every other's memory with
  // process_vm_readv (same user, no ptrace restriction): agreed at set-up.
  bool canReadPeerMemory() const { return crossMemoryAttach_; }
  void readPeerMemory(int peer, uint64_t address, void* destination, size_t bytes) const;

  // ---- waiting for any channel to move
  uint32_t doorbell() const;
  // Sleeps until the doorbell moves past `seen` (or 50 ms pass), then checks
  // that `peers` are still there.
  void awaitDoorbell(uint32_t seen, const std::vector<int>& peers) const;

 private:
  struct ControlBlock;
  struct ChannelControl;
  struct BufferHeader;
  ControlBlock& control(int peer) const;
  ChannelControl& channel(int from, int to) const;
  char* entryAt(int from, int to, uint32_t index) const;
  std::string bufferName(int from, int to, uint64_t serial) const;
  void removeBuffersSentToUs();
  // At our end: drops our buffers (those unread are left to their reader).
  void retireBuffers();
  void checkPeer(int peer) const;
  // checkPeer(), except that a peer found gone may have delivered just
  // before it went: then `arrived()` is true and nothing is thrown.
  void checkPeerUnless(int peer, const std::function<bool()>& arrived) const;
  void checkAlarm() const;
  void wakeWaitersOnUs();
  bool peerExited(int peer) const;
  [[noreturn]] void failExited(int peer) const;  // "rank N (pid P) exited"
  bool probeCrossMemoryAttach(Bootstrap& bootstrap);

  std::vector<ShmPeer> peers_;
  int self_;
  std::string name_;
  size_t slotBytes_;
  size_t entryBytes_;
  uint32_t entries_;
  SharedSegment segment_;
  char* channels_ = nullptr;
  char* slots_ = nullptr;
  std::vector<int> pidfds_;  // -1: ourselves, or pidfd_open is unavailable
  template <typename Ready>
  bool spinFor(Ready ready) const;  // true once ready() is, before any sleep

  int spins_;
  int yields_;
  bool crossMemoryAttach_ = false;
  const std::atomic<bool>& aborted_;
  std::mutex alarmMutex_;  // the alarm is raised by a thread of its own

  struct Outgoing {
    uint64_t serial;
    SharedSegment segment;
  };
  std::vector<std::vector<Outgoing>> outgoing_;  // per peer
  uint64_t nextSerial_ = 1;
  std::map<std::pair<int, uint64_t>, SharedSegment> incoming_;
};

}  // namespace mojoccl
