#include "shm.h"

#include <errno.h>
#include <fcntl.h>
#include <immintrin.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <thread>

#include "../bootstrap.h"
#include "../error.h"

namespace mojoccl {

namespace {

constexpr size_t kCacheLine = 64;
constexpr size_t kPage = 4096;
constexpr int kSlots = 2;

struct alignas(kCacheLine) Counter {
  std::atomic<uint32_t> value;
  std::atomic<uint32_t> waiters;
};

// Wrap-around safe "value has reached target".
bool reached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;
}

void futexWait(std::atomic<uint32_t>* word, uint32_t expected, long nanoseconds) {
  timespec timeout{0, nanoseconds};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &timeout, nullptr, 0);
}

void futexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

size_t roundUp(size_t value, size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// A pidfd becomes readable when its process ends, zombie or not; kill(pid, 0)
// would still succeed on a zombie whose parent has not reaped it yet.
int openPidfd(int pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

int usableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
}

std::string describeShmSpace() {
  struct statvfs stats {};
  if (statvfs("/dev/shm", &stats) != 0) return "";
  auto freeMiB = static_cast<unsigned long long>(stats.f_bavail) * stats.f_frsize >> 20;
  return " (/dev/shm has " + std::to_string(freeMiB) + " MiB free)";
}

}  // namespace

struct ShmTransport::ControlBlock {
  Counter stage[kStages];
  std::atomic<uint32_t> departed;  // set when the rank leaves the communicator
  alignas(kCacheLine) char notes[kSlots][kNoteBytes];
};

ShmTransport::ShmTransport(Bootstrap& bootstrap, std::vector<ShmPeer> peers, int self,
                           const std::string& segmentName, size_t slotBytes,
                           const std::atomic<bool>& aborted)
    : peers_(std::move(peers)), self_(self), slotBytes_(roundUp(slotBytes, kPage)),
      aborted_(aborted) {
  // Ranks that outnumber cores must yield quickly or the rank they wait for
  // cannot run; otherwise a short spin avoids the futex round trip.
  spins_ = size() > usableCores() ? 64 : 20000;

  const size_t controlBytes = roundUp(sizeof(ControlBlock) * size(), kPage);
  segmentBytes_ = controlBytes + slotBytes_ * kSlots * size();
  const bool leader = self_ == 0;

  // The node's first rank creates the segment, the others open it once it
  // exists, and it is unlinked as soon as everyone has it mapped: nothing is
  // left in /dev/shm even if a rank is killed.
  std::string failure;
  int fd = -1;
  if (leader) {
    shm_unlink(segmentName.c_str());
    fd = shm_open(segmentName.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
      failure = "shm_open(" + segmentName + "): " + strerror(errno);
    } else {
      int rc = posix_fallocate(fd, 0, static_cast<off_t>(segmentBytes_));
      if (rc != 0)
        failure = "cannot reserve " + std::to_string(segmentBytes_ >> 20) +
                  " MiB of shared memory: " + strerror(rc) + describeShmSpace() +
                  "; give the job a larger /dev/shm";
    }
  }
  bootstrap.agreeOnSuccess(failure.empty(), failure);
  if (!leader) {
    fd = shm_open(segmentName.c_str(), O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0)
      failure = "shm_open(" + segmentName + "): " + strerror(errno) +
                " (ranks that share a host id must share /dev/shm; set MOJOCCL_HOSTID "
                "differently for ranks in separate containers)";
  }
  if (failure.empty()) {
    void* mapped = mmap(nullptr, segmentBytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mapped == MAP_FAILED)
      failure = std::string("mmap of the shared-memory segment: ") + strerror(errno);
    else
      base_ = static_cast<char*>(mapped);
  }
  if (fd >= 0) close(fd);
  bootstrap.agreeOnSuccess(failure.empty(), failure);
  if (leader) shm_unlink(segmentName.c_str());
  slots_ = base_ + controlBytes;
  for (const auto& peer : peers_) pidfds_.push_back(peer.pid == getpid() ? -1 : openPidfd(peer.pid));
}

ShmTransport::~ShmTransport() {
  for (int fd : pidfds_)
    if (fd >= 0) close(fd);
  if (base_ == nullptr) return;
  control(self_).departed.store(1);
  for (auto& counter : control(self_).stage) futexWakeAll(&counter.value);
  munmap(base_, segmentBytes_);
}

ShmTransport::ControlBlock& ShmTransport::control(int peer) const {
  return reinterpret_cast<ControlBlock*>(base_)[peer];
}

char* ShmTransport::slot(int peer, uint32_t round) const {
  return slots_ + (static_cast<size_t>(peer) * kSlots + round % kSlots) * slotBytes_;
}

char* ShmTransport::note(int peer, uint32_t round) const {
  return control(peer).notes[round % kSlots];
}

void ShmTransport::publish(Stage stage, uint32_t round) {
  Counter& counter = control(self_).stage[static_cast<int>(stage)];
  counter.value.store(round, std::memory_order_seq_cst);
  if (counter.waiters.load(std::memory_order_seq_cst) > 0) futexWakeAll(&counter.value);
}

void ShmTransport::await(int peer, Stage stage, uint32_t round) const {
  Counter& counter = control(peer).stage[static_cast<int>(stage)];
  if (reached(counter.value.load(std::memory_order_acquire), round)) return;
  for (int i = 0; i < spins_; ++i) {
    _mm_pause();
    if (reached(counter.value.load(std::memory_order_acquire), round)) return;
  }
  while (true) {
    // Announce the sleep before the last look, so that a publisher either
    // sees us waiting or we see its value (both are sequentially consistent).
    counter.waiters.fetch_add(1, std::memory_order_seq_cst);
    uint32_t seen = counter.value.load(std::memory_order_seq_cst);
    if (!reached(seen, round)) futexWait(&counter.value, seen, 50'000'000);
    counter.waiters.fetch_sub(1, std::memory_order_seq_cst);
    if (reached(counter.value.load(std::memory_order_acquire), round)) return;
    checkPeer(peer);
  }
}

void ShmTransport::awaitAll(Stage stage, uint32_t round) const {
  for (int peer = 0; peer < size(); ++peer)
    if (peer != self_) await(peer, stage, round);
}

bool ShmTransport::peerExited(int peer) const {
  int fd = pidfds_[peer];
  if (fd < 0) return kill(peers_[peer].pid, 0) != 0 && errno == ESRCH;
  pollfd entry{fd, POLLIN, 0};
  return poll(&entry, 1, 0) > 0;
}

void ShmTransport::checkPeer(int peer) const {
  if (aborted_.load()) fail(ncclInvalidUsage, "the communicator was aborted");
  const ShmPeer& who = peers_[peer];
  if (control(peer).departed.load())
    fail(ncclRemoteError, "rank " + std::to_string(who.commRank) +
                              " destroyed or aborted its communicator");
  if (peerExited(peer))
    fail(ncclRemoteError, "rank " + std::to_string(who.commRank) + " (pid " +
                              std::to_string(who.pid) + ") exited");
}

}  // namespace mojoccl
