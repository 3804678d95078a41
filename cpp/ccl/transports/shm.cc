#include "transports/shm.h"

#include <errno.h>
#include <immintrin.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdlib>

#include <algorithm>

#include "base/bootstrap.h"
#include "base/error.h"
#include "transports/futex.h"
#include "transports/shm_layout.h"

namespace mojoccl {

namespace {

constexpr size_t kPage = 4096;
constexpr long kSleepNanoseconds = 50'000'000;
// About 20 us of handing the core over where no one else wants it (0.18 us
// a yield here) before sleeping: 1,000 did no better with 4 ranks on 2
// cores, and waste more where the peer is busy elsewhere.
constexpr int kYieldsWhenOutnumbered = 100;
// Channels get about this much per ordered pair of ranks in all, split
// into this many entries.
constexpr size_t kChannelBudget = 2 << 20;
constexpr uint32_t kEntries = 16;

size_t roundUp(size_t value, size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// A pidfd becomes readable when its process ends, zombie or not; kill(pid, 0)
// would still succeed on a zombie whose parent has not reaped it yet.
int openPidfd(int pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

}  // namespace


struct ShmTransport::ChannelControl {
  Counter posted;    // messages the sender has posted (written by the sender)
  Counter released;  // messages the receiver has consumed (written by the receiver)
};

ShmTransport::ShmTransport(Bootstrap& bootstrap, std::vector<ShmPeer> peers, int self,
                           const std::string& segmentName, size_t slotBytes,
                           const std::atomic<bool>& aborted, bool ranksOutnumberCores)
    : peers_(std::move(peers)), self_(self), name_(segmentName),
      slotBytes_(roundUp(slotBytes, kPage)), aborted_(aborted), outgoing_(peers_.size()) {
  const size_t n = peers_.size();
  entries_ = kEntries;
  entryBytes_ = std::clamp<size_t>(kChannelBudget / (n * n) / kEntries, 1024, 8192);
  entryBytes_ = roundUp(entryBytes_, kCacheLine);
  // Ranks that outnumber cores must leave the core quickly or the rank they
  // wait for cannot run: they spin little, then yield (spinFor); otherwise a
  // short spin avoids the futex round trip.
  spins_ = ranksOutnumberCores ? 64 : 20000;
  yields_ = ranksOutnumberCores ? kYieldsWhenOutnumbered : 0;

  const size_t controlBytes = roundUp(sizeof(ControlBlock) * n, kPage);
  const size_t channelBytes =
      roundUp(sizeof(ChannelControl) + entries_ * entryBytes_, kCacheLine);
  const size_t channelsBytes = roundUp(channelBytes * n * n, kPage);
  const size_t segmentBytes = controlBytes + channelsBytes + slotBytes_ * kSlots * n;

  // The node's first rank creates the segment, the others open it once it
  // exists, and it is unlinked as soon as everyone has it mapped: nothing is
  // left in /dev/shm even if a rank is killed.
  const bool leader = self_ == 0;
  std::string failure;
  if (leader) {
    SharedSegment::unlink(name_);  // a leftover of a killed job with the same id
    try {
      segment_ = SharedSegment::create(name_, segmentBytes);
    } catch (const Error& error) {
      failure = error.what();
    }
  }
  bootstrap.agreeOnSuccess(failure.empty(), failure);
  if (!leader) {
    try {
      segment_ = SharedSegment::open(name_, segmentBytes);
    } catch (const Error& error) {
      failure = error.what();
    }
  }
  bootstrap.agreeOnSuccess(failure.empty(), failure);
  if (leader) SharedSegment::unlink(name_);

  channels_ = segment_.data() + controlBytes;
  slots_ = channels_ + channelsBytes;
  removeOrphanBuffers();  // left by processes of this user that were killed
  for (const auto& peer : peers_) pidfds_.push_back(peer.pid == getpid() ? -1 : openPidfd(peer.pid));
  crossMemoryAttach_ = probeCrossMemoryAttach(bootstrap);
}

int ShmTransport::indexOf(int commRank) const {
  for (int peer = 0; peer < size(); ++peer)
    if (peers_[peer].commRank == commRank) return peer;
  fail(ncclInternalError, "rank " + std::to_string(commRank) + " is not on this node");
}

// Every rank reads a word of every other's memory; all must succeed.
bool ShmTransport::probeCrossMemoryAttach(Bootstrap& bootstrap) {
  static const uint64_t probe = 0x6d6f6a6f63636cull;  // lives as long as the library
  struct Offer {
    int32_t pid;
    uint64_t address;
  } mine{getpid(), reinterpret_cast<uint64_t>(&probe)};
  std::vector<char> offers = bootstrap.allGather(&mine, sizeof(mine));
  bool readable = true;
  for (int peer = 0; peer < size() && readable; ++peer) {
    if (peer == self_) continue;
    Offer theirs{};
    memcpy(&theirs, offers.data() + peers_[peer].commRank * sizeof(Offer), sizeof(Offer));
    uint64_t value = 0;
    iovec local{&value, sizeof(value)}, remote{reinterpret_cast<void*>(theirs.address), sizeof(value)};
    readable = process_vm_readv(theirs.pid, &local, 1, &remote, 1, 0) == sizeof(value) && value == probe;
  }
  char verdict = readable ? 1 : 0;
  std::vector<char> verdicts = bootstrap.allGather(&verdict, 1);
  return std::all_of(verdicts.begin(), verdicts.end(), [](char v) { return v == 1; });
}

void ShmTransport::readPeerMemory(int peer, uint64_t address, void* destination, size_t bytes) const {
  auto* to = static_cast<char*>(destination);
  while (bytes > 0) {
    iovec local{to, bytes}, remote{reinterpret_cast<void*>(address), bytes};
    ssize_t got = process_vm_readv(peers_[peer].pid, &local, 1, &remote, 1, 0);
    if (got <= 0) {
      if (got < 0 && errno == EINTR) continue;
      const int error = errno;
      checkPeer(peer);
      // No such process, and no exit seen yet: the peer is on its way out
      // (its memory goes before its exit is signalled).
      if (got < 0 && error == ESRCH) failExited(peer);
      errno = error;
      failSystem("process_vm_readv from rank " + std::to_string(peers_[peer].commRank));
    }
    to += got;
    address += static_cast<uint64_t>(got);
    bytes -= static_cast<size_t>(got);
  }
}

ShmTransport::~ShmTransport() {
  retireBuffers();
  for (int fd : pidfds_)
    if (fd >= 0) close(fd);
  if (segment_.data() != nullptr) markDeparted();
}

ShmTransport::ControlBlock& ShmTransport::control(int peer) const {
  return reinterpret_cast<ControlBlock*>(segment_.data())[peer];
}

// ------------------------------------------------------------- rounds

char* ShmTransport::slot(int peer, uint32_t round) const {
  return slots_ + (static_cast<size_t>(peer) * kSlots + round % kSlots) * slotBytes_;
}

char* ShmTransport::note(int peer, uint32_t round) const {
  return control(peer).notes[round % kSlots];
}

void ShmTransport::publish(Stage stage, uint32_t round) {
  mojoccl::publish(control(self_).stage[static_cast<int>(stage)], round);
}

void ShmTransport::await(int peer, Stage stage, uint32_t round) const {
  Counter& counter = control(peer).stage[static_cast<int>(stage)];
  if (spinFor([&] { return reached(counter.value.load(std::memory_order_acquire), round); })) return;
  while (true) {
    uint32_t seen = counter.value.load(std::memory_order_acquire);
    if (reached(seen, round)) return;
    sleepWhile(counter, seen, kSleepNanoseconds);
    auto arrived = [&] { return reached(counter.value.load(std::memory_order_acquire), round); };
    if (arrived()) return;
    checkPeerUnless(peer, arrived);
  }
}

void ShmTransport::awaitAll(Stage stage, uint32_t round) const {
  for (int peer = 0; peer < size(); ++peer)
    if (peer != self_) await(peer, stage, round);
}

// ----------------------------------------------------------- channels

ShmTransport::ChannelControl& ShmTransport::channel(int from, int to) const {
  const size_t channelBytes = roundUp(sizeof(ChannelControl) + entries_ * entryBytes_, kCacheLine);
  return *reinterpret_cast<ChannelControl*>(
      channels_ + (static_cast<size_t>(from) * size() + to) * channelBytes);
}

char* ShmTransport::entryAt(int from, int to, uint32_t index) const {
  char* first = reinterpret_cast<char*>(&channel(from, to)) + sizeof(ChannelControl);
  return first + static_cast<size_t>(index % entries_) * entryBytes_;
}

bool ShmTransport::claimSend(int peer, Entry* entry) const {
  ChannelControl& link = channel(self_, peer);
  uint32_t posted = link.posted.value.load(std::memory_order_relaxed);
  uint32_t released = link.released.value.load(std::memory_order_acquire);
  if (posted - released >= entries_) return false;
  char* at = entryAt(self_, peer, posted);
  *entry = Entry{at, at + kNoteBytes};
  return true;
}

void ShmTransport::postSend(int peer) {
  ChannelControl& link = channel(self_, peer);
  mojoccl::publish(link.posted, link.posted.value.load(std::memory_order_relaxed) + 1);
  ring(control(peer).doorbell);
}

bool ShmTransport::peekReceive(int peer, Entry* entry) const {
  ChannelControl& link = channel(peer, self_);
  uint32_t posted = link.posted.value.load(std::memory_order_acquire);
  uint32_t released = link.released.value.load(std::memory_order_relaxed);
  if (posted == released) return false;
  char* at = entryAt(peer, self_, released);
  *entry = Entry{at, at + kNoteBytes};
  return true;
}

void ShmTransport::releaseReceive(int peer) {
  ChannelControl& link = channel(peer, self_);
  mojoccl::publish(link.released, link.released.value.load(std::memory_order_relaxed) + 1);
  ring(control(peer).doorbell);
}

// ------------------------------------------------------------ waiting

// Ranks that outnumber cores hand their core over (sched_yield) for a while
// before they sleep: the rank waited for is most often runnable on it, and
// runs at once, where a futex wake costs a round trip through the kernel.
template <typename Ready>
bool ShmTransport::spinFor(Ready ready) const {
  for (int i = 0; i < spins_; ++i) {
    if (ready()) return true;
    _mm_pause();
  }
  for (int i = 0; i < yields_; ++i) {
    if (ready()) return true;
    sched_yield();
  }
  return ready();
}

uint32_t ShmTransport::doorbell() const {
  return control(self_).doorbell.value.load(std::memory_order_acquire);
}

void ShmTransport::awaitDoorbell(uint32_t seen, const std::vector<int>& peers) const {
  Counter& bell = control(self_).doorbell;
  if (spinFor([&] { return bell.value.load(std::memory_order_acquire) != seen; })) return;
  sleepWhile(bell, seen, kSleepNanoseconds);
  auto rang = [&] { return bell.value.load(std::memory_order_acquire) != seen; };
  if (rang()) return;
  for (int peer : peers)
    if (peer != self_) checkPeerUnless(peer, rang);
}

}  // namespace mojoccl
