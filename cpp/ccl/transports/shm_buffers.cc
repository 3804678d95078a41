// The buffers of messages too large for a channel's entry (transports/shm.h):
// each a shared-memory segment of its own, which its sender keeps and reuses
// for later messages to the same peer, named so that any later process of
// the user can tell an orphan from a message in flight.
#include "transports/shm.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <functional>

namespace mojoccl {
namespace {

// A page at the start of each buffer holds its header.
constexpr size_t kBufferHeaderBytes = 4096;
// Buffers for large messages are at least this large, so that they can be
// reused for messages of similar sizes.
constexpr size_t kMinBufferBytes = 1 << 20;

size_t nextPowerOfTwo(size_t value) {
  size_t power = 1;
  while (power < value) power <<= 1;
  return power;
}

}  // namespace

struct ShmTransport::BufferHeader {
  std::atomic<uint32_t> busy;     // 1 from claim by the sender to release by the receiver
  std::atomic<uint32_t> retired;  // the sender dropped it: receivers unmap it
};

// "<segment>-p<sender pid>-r<receiver pid>-<from>to<to>-<serial>": the
// pids let any later process of this user tell an orphan (both ends gone)
// from a message in flight, which may outlive its sender.
std::string ShmTransport::bufferName(int from, int to, uint64_t serial) const {
  return name_ + "-p" + std::to_string(peers_[from].pid) + "-r" + std::to_string(peers_[to].pid) + "-" +
         std::to_string(from) + "to" + std::to_string(to) + "-" + std::to_string(serial);
}

namespace {

// A process that ended, or has ended and waits to be reaped (a zombie).
bool processGone(int pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  FILE* stat = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (stat == nullptr) return false;
  char state = '?';
  int scanned = std::fscanf(stat, "%*d (%*[^)]) %c", &state);
  std::fclose(stat);
  return scanned == 1 && state == 'Z';
}

// Calls `visit` with the name (no leading '/') of each of this user's
// message buffers in /dev/shm.
void forEachBuffer(const std::function<void(const std::string&)>& visit) {
  const std::string prefix = "mojoccl-" + std::to_string(getuid()) + "-";
  DIR* directory = opendir("/dev/shm");
  if (directory == nullptr) return;
  while (dirent* entry = readdir(directory)) {
    std::string name = entry->d_name;
    if (name.compare(0, prefix.size(), prefix) == 0 && name.find("-p", prefix.size()) != std::string::npos)
      visit(name);
  }
  closedir(directory);
}

// The pid after `mark` ("-p" or "-r") in a buffer's name; 0 if none.
int pidAfter(const std::string& name, const char* mark) {
  size_t at = name.find(mark);
  return at == std::string::npos ? 0 : std::atoi(name.c_str() + at + 2);
}

}  // namespace

void removeOrphanBuffers() {
  forEachBuffer([](const std::string& name) {
    int sender = pidAfter(name, "-p"), receiver = pidAfter(name, "-r");
    if (sender > 0 && processGone(sender) && (receiver <= 0 || processGone(receiver)))
      SharedSegment::unlink("/" + name);
  });
}

void ShmTransport::removeBuffersSentToUs() {
  const std::string ours = name_.substr(1) + "-p";  // this communicator's
  const std::string toUs = "-r" + std::to_string(getpid()) + "-";
  forEachBuffer([&](const std::string& name) {
    if (name.compare(0, ours.size(), ours) == 0 && name.find(toUs) != std::string::npos)
      SharedSegment::unlink("/" + name);
  });
}

ShmTransport::Buffer ShmTransport::claimOutgoingBuffer(int peer, size_t bytes) {
  auto& pool = outgoing_[peer];
  auto header = [](const Outgoing& buffer) {
    return reinterpret_cast<BufferHeader*>(buffer.segment.data());
  };
  auto capacity = [](const Outgoing& buffer) { return buffer.segment.size() - kBufferHeaderBytes; };
  Outgoing* best = nullptr;
  for (auto& buffer : pool)
    if (header(buffer)->busy.load(std::memory_order_acquire) == 0 && capacity(buffer) >= bytes &&
        (best == nullptr || capacity(buffer) < capacity(*best)))
      best = &buffer;
  if (best == nullptr) {
    // Idle buffers too small for today's messages only hold memory.
    pool.erase(std::remove_if(pool.begin(), pool.end(),
                              [&](const Outgoing& buffer) {
                                bool drop = header(buffer)->busy.load() == 0 && capacity(buffer) < bytes;
                                if (drop) {
                                  header(buffer)->retired.store(1, std::memory_order_release);
                                  SharedSegment::unlink(bufferName(self_, peer, buffer.serial));
                                }
                                return drop;
                              }),
               pool.end());
    uint64_t serial = nextSerial_++;
    size_t size = kBufferHeaderBytes + std::max(kMinBufferBytes, nextPowerOfTwo(bytes));
    pool.push_back(Outgoing{serial, SharedSegment::create(bufferName(self_, peer, serial), size)});
    best = &pool.back();
  }
  header(*best)->busy.store(1, std::memory_order_relaxed);
  return Buffer{best->serial, capacity(*best), best->segment.data() + kBufferHeaderBytes};
}

const char* ShmTransport::incomingBuffer(int peer, uint64_t serial, size_t capacity) {
  // Forget buffers the sender has dropped, but any that still holds a
  // message: a sender that ended retires every buffer, read or not, and
  // the name of one this rank has mapped is gone (unlinked below).
  auto key = std::make_pair(peer, serial);
  for (auto it = incoming_.begin(); it != incoming_.end();) {
    auto* header = reinterpret_cast<BufferHeader*>(it->second.data());
    bool dropped = it->first != key && header->retired.load(std::memory_order_acquire) &&
                   header->busy.load(std::memory_order_acquire) == 0;
    it = dropped ? incoming_.erase(it) : std::next(it);
  }
  auto found = incoming_.find(key);
  if (found == incoming_.end()) {
    std::string name = bufferName(peer, self_, serial);
    found = incoming_.emplace(key, SharedSegment::open(name, kBufferHeaderBytes + capacity)).first;
    SharedSegment::unlink(name);  // both ends have it mapped: nothing can leak now
  }
  return found->second.data() + kBufferHeaderBytes;
}

void ShmTransport::releaseIncomingBuffer(int peer, uint64_t serial) {
  auto found = incoming_.find(std::make_pair(peer, serial));
  if (found == incoming_.end()) return;
  reinterpret_cast<BufferHeader*>(found->second.data())->busy.store(0, std::memory_order_release);
}

void ShmTransport::retireBuffers() {
  for (int peer = 0; peer < size(); ++peer)
    for (auto& buffer : outgoing_[peer]) {
      auto* header = reinterpret_cast<BufferHeader*>(buffer.segment.data());
      header->retired.store(1);
      // A message the peer has not read yet outlives us, as a socket's
      // last bytes outlive its sender: the peer removes it when it reads
      // it, or at its own end.
      bool unread = header->busy.load() != 0 && !peerDeparted(peer) && !peerExited(peer);
      if (!unread) SharedSegment::unlink(bufferName(self_, peer, buffer.serial));  // if never opened
    }
  removeBuffersSentToUs();  // messages we never took, from peers gone before us
  removeOrphanBuffers();    // any of this user's whose sender and receiver are both gone
}

}  // namespace mojoccl
