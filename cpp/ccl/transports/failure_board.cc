// The node's failure board: what each rank of the node tells the others
// about itself (its collective failed, and why; it left the communicator),
// the node's alarm (a rank failed somewhere, raised by the node's first
// rank's PeerWatch), the ranks of other nodes known to have left or died,
// and the checks every wait makes against it.
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <string.h>

#include <cstdio>
#include <mutex>
#include <string>

#include "base/error.h"
#include "transports/shm.h"
#include "transports/shm_layout.h"

namespace mojoccl {

void ShmTransport::markDeparted() {
  ControlBlock& mine = control(self_);
  mine.departed.store(1);
  wakeWaitersOnUs();
}

void ShmTransport::wakeWaitersOnUs() {
  ControlBlock& mine = control(self_);
  for (auto& counter : mine.stage) futexWakeAll(&counter.value);
  for (int peer = 0; peer < size(); ++peer)
    if (peer != self_) ring(control(peer).doorbell);  // whoever waits on us looks again
}

void ShmTransport::markFailed(const std::string& why) {
  ControlBlock& mine = control(self_);
  if (mine.failed.load()) return;  // the first failure is the one to report
  snprintf(mine.failure, kFailureBytes, "%s", why.c_str());
  mine.failed.store(1, std::memory_order_release);
  wakeWaitersOnUs();
}

void ShmTransport::raiseAlarm(const std::string& why) {
  std::lock_guard<std::mutex> lock(alarmMutex_);
  ControlBlock& node = control(0);
  if (node.alarmed.load()) return;
  snprintf(node.alarm, kFailureBytes, "%s", why.c_str());
  node.alarmed.store(1, std::memory_order_release);
  for (int peer = 0; peer < size(); ++peer) {
    for (auto& counter : control(peer).stage) futexWakeAll(&counter.value);
    ring(control(peer).doorbell);
  }
}

void ShmTransport::checkAlarm() const {
  const ControlBlock& node = control(0);
  if (node.alarmed.load(std::memory_order_acquire))
    fail(ncclRemoteError, std::string(node.alarm, strnlen(node.alarm, kFailureBytes)));
}

void ShmTransport::checkNodeAlarm() const {
  if (aborted_.load()) fail(ncclInvalidUsage, "the communicator was aborted");
  checkAlarm();
  if (self_ != 0 && peerDied(0)) failExited(0);
}

bool ShmTransport::peerDeparted(int peer) const { return control(peer).departed.load() != 0; }

bool ShmTransport::peerDied(int peer) const { return !peerDeparted(peer) && peerExited(peer); }

void ShmTransport::recordRemoteDeparture(int commRank) { control(0).departedElsewhere.add(commRank); }

bool ShmTransport::remoteDeparted(int commRank) const {
  return control(0).departedElsewhere.contains(commRank);
}

void ShmTransport::recordRemoteDeath(int commRank) { control(0).diedElsewhere.add(commRank); }

bool ShmTransport::remoteDied(int commRank) const { return control(0).diedElsewhere.contains(commRank); }

void ShmTransport::checkPeerUnless(int peer, const std::function<bool()>& arrived) const {
  try {
    checkPeer(peer);
  } catch (const Error&) {
    // What the peer wrote before it left or ended is visible once its going is.
    if (!arrived()) throw;
  }
}

bool ShmTransport::peerExited(int peer) const {
  int fd = pidfds_[peer];
  if (fd < 0) return kill(peers_[peer].pid, 0) != 0 && errno == ESRCH;
  pollfd entry{fd, POLLIN, 0};
  return poll(&entry, 1, 0) > 0;
}

void ShmTransport::checkPeer(int peer) const {
  if (aborted_.load()) fail(ncclInvalidUsage, "the communicator was aborted");
  checkAlarm();
  const ShmPeer& who = peers_[peer];
  if (control(peer).failed.load(std::memory_order_acquire))
    fail(ncclRemoteError, "rank " + std::to_string(who.commRank) + " failed: " +
                              std::string(control(peer).failure, strnlen(control(peer).failure, kFailureBytes)));
  if (control(peer).departed.load())
    fail(ncclRemoteError, "rank " + std::to_string(who.commRank) +
                              " destroyed or aborted its communicator");
  if (peerExited(peer)) failExited(peer);
}

void ShmTransport::failExited(int peer) const {
  const ShmPeer& who = peers_[peer];
  fail(ncclRemoteError, "rank " + std::to_string(who.commRank) + " (pid " + std::to_string(who.pid) + ") exited");
}

}  // namespace mojoccl
