// Node-to-node transport over libfabric: one reliable-datagram endpoint
// (FI_EP_RDM) per rank, tagged messages, one completion queue.
//
// Messages between two ranks are matched in the order they were posted: the
// tag carries the sender's rank and a per-direction message counter, so no
// provider ordering guarantee is needed. A wait that sees no progress from a
// peer for MOJOCCL_IB_TIMEOUT_S seconds prints a line naming the operation
// and the peer, and throws.
//
// Point-to-point sends are buffered, as within a node: the message is copied
// and the send returns, so sends and receives issued in any order cannot
// deadlock. Large messages need both sides' progress (rendezvous), so a
// thread progresses buffered sends while no caller is waiting.
//
// Sealed: receives take messages only from the communicator's ranks'
// addresses (FI_DIRECTED_RECV, where the provider has it), and every message
// carries the communicator's key (base/seal.h) as its remote completion data,
// checked before the message counts: a message without it (a stranger's
// endpoint, a process of another job) is turned away, counted, and its
// receive posted again, so it never reaches a result.
//
// The transport knows nothing of collectives: algorithms/network*.cc build
// them from these messages.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include "base/bootstrap.h"
#include "base/seal.h"
#include "transports/fabric_choice.h"
#include "transports/fabric_endpoint.h"
#include "transports/libfabric.h"

namespace mojoccl {

// A message of `units` (bytes, or elements) cut into pieces of `piece`
// units: `body(offset, count)` for the rest first, if any, then for each
// whole piece, in order; once with count 0 for an empty message. Sender
// and receiver cut a message alike. The rest goes first so that a message
// never ends in a small piece: over tcp, libfabric 1.17's ofi_rxm at
// times left a small last piece behind large ones undelivered (its send
// complete, its receive pending) until another message came on the
// connection (docs/multinode.md).
template <typename Body>
void forEachPiece(size_t units, size_t piece, Body body) {
  size_t offset = units % piece;
  if (offset > 0 || units == 0) body(0, offset);
  for (; offset < units; offset += piece) body(offset, piece);
}

// "<what>: rank R waited T s for rank P (host, pid) across nodes (MOJOCCL_IB_TIMEOUT_S=T)"
std::string waitedAcrossNodes(const std::string& what, int rank, int peer, const RankInfo& peerInfo,
                              int timeoutSeconds);

// Large messages go in pieces of at most this size, so that one transfer
// never ties up a provider's bounce buffers for long.
constexpr size_t kMaxPiece = size_t{16} << 20;

class FabricTransport {
 public:
  // Collective over `bootstrap`: every rank of the communicator opens an
  // endpoint and learns everyone's address. A failure on any rank (no such
  // provider, no libfabric) fails all of them with its message.
  // `timeoutSeconds`: MOJOCCL_IB_TIMEOUT_S, read (and agreed on) by the caller.
  // `localIndex`: the rank's place among its node's ranks, which picks its
  // domain from a list (fabric_choice.h).
  FabricTransport(Bootstrap& bootstrap, int rank, int localIndex, const std::atomic<bool>& aborted,
                  int timeoutSeconds);
  ~FabricTransport();
  FabricTransport(const FabricTransport&) = delete;
  FabricTransport& operator=(const FabricTransport&) = delete;

  // Each pair of ranks has two lanes, each its own sequence of messages:
  // the collectives' and the point-to-point calls'. A send that the user
  // has not received yet (sends are buffered) so never meets a
  // collective's receive, nor a collective's message the user's receive.
  enum class Lane : uint32_t { Collective = 0, PointToPoint = 1 };

  // Posts a message that completes in waitAll(), or waitFor() its ticket;
  // the buffer must stay valid until then.
  using Ticket = uint64_t;
  Ticket postSend(int peer, const void* data, size_t bytes, Lane lane = Lane::Collective);
  // A message of another size than `bytes` is an error.
  Ticket postRecv(int peer, void* data, size_t bytes, Lane lane = Lane::Collective);
  // A receive that takes one message of up to `bytes`, whose length goes to
  // `*received`: what ranks that may disagree exchange in one message (a
  // call's signature at the front, its data behind), each receiving into
  // room for the largest. At most maxMessage() bytes.
  Ticket postRecvUpTo(int peer, void* data, size_t bytes, size_t* received, Lane lane = Lane::Collective);
  size_t maxMessage() const { return maxMessage_; }
  // The largest message the provider sends without a rendezvous round trip
  // (ofi_rxm: its buffer, FI_OFI_RXM_BUFFER_SIZE, less room for its header;
  // net: as ofi_rxm's over tcp); maxMessage() where the provider says
  // nothing of it.
  size_t eagerMessage() const { return eagerMessage_; }
  // The pieces a message of `bytes` moves fastest in, several in flight:
  // up to `eagerPiecesUpTo`, eagerMessage() (at most 1 MiB); past that,
  // 1 MiB. Sender and receiver cut a message alike.
  static constexpr size_t kEagerPiecesUpTo = size_t{8} << 20;
  size_t segmentFor(size_t bytes, size_t eagerPiecesUpTo = kEagerPiecesUpTo) const;
  // Copies the message and posts it, in messages of `piece` bytes (as
  // forEachPiece cuts it: the receiver posts as many), each as soon as it
  // is copied: it completes on its own.
  void postBufferedSend(int peer, const void* data, size_t bytes, size_t piece = SIZE_MAX,
                        Lane lane = Lane::Collective);
  // Progresses every message posted with postSend/postRecv to completion.
  // `what` names the operation in errors ("ncclAllReduce(...) across nodes").
  void waitAll(const std::string& what);
  // Progresses them until the message of `ticket` is complete: what a
  // pipelined algorithm waits for before it uses that piece.
  void waitFor(Ticket ticket, const std::string& what);
  // Reads the completions there are, without waiting: what a rank busy
  // with something else (a reduction) calls now and then, since some
  // providers (tcp) move data only while their completion queue is read.
  void poll(const std::string& what);

  // Called about every millisecond while a wait makes no progress, with the
  // ranks it waits on and how long it has gone without a completion; throws
  // to end the wait (a rank that died or left elsewhere, transports/peer_watch.h).
  using PeerCheck = std::function<void(const std::vector<int>& waitedOn,
                                       std::chrono::steady_clock::duration quiet)>;
  void checkPeersWith(PeerCheck check) { checkPeers_ = std::move(check); }

  // "tcp;ofi_rxm on lo (libfabric 1.17, /usr/lib/.../libfabric.so.1)"
  std::string describe() const;
  // "tcp;ofi_rxm", "cxi", "verbs;ofi_rxm"...
  std::string providerName() const;
  // Prints a line for each memory region registered (MOJOCCL_IB_TRACE).
  void traceRegistrations(bool on) { traceRegistrations_ = on; }
  // Messages turned away: not from a rank of the communicator, or without its key.
  uint64_t rejected() const { return rejections_.count(); }

 private:
  struct Request {
    fi_context2 context;  // first: libfabric hands back its address
    int peer;
    bool isSend;
    size_t bytes;
    bool buffered;
    std::shared_ptr<std::vector<char>> copy;  // a buffered send's message
    uint64_t tag;
    char* user;  // the message in the caller's memory (or `copy`)
    int slot;    // of the staging region once it has one, or -1
    bool done = false;
    size_t* received = nullptr;  // postRecvUpTo's: a shorter message is taken
    Ticket ticket = 0;           // of the post it is a piece of
  };
  // Where a provider needs registered buffers (FI_MR_LOCAL), memory that
  // is not an ncclMemAlloc region travels through this region, registered
  // once, at its first use: sends are copied into a slot, receives land in
  // one and are copied out at completion. Sends and receives have slots of their own, so that
  // posted receives can never starve the sends that would complete them.
  struct StagingRegion {
    char* base = nullptr;
    size_t bytes = 0;
    size_t slotBytes = 0;
    fid_mr* registration = nullptr;
    void* descriptor = nullptr;
    std::vector<int> freeSlots[2];  // [0] receives, [1] sends
    uint64_t staged = 0;            // messages that went through it
    char* slot(int index) const { return base + index * slotBytes; }
  };
  void openStaging();
  void registerStaging();  // at the first staged message
  bool submit(Request& request, char* wire, void* descriptor, bool mayInject = false);
  // Whether a receive's message carries the communicator's key.
  bool sealed(uint64_t flags, uint64_t data) const;
  // A receive whose message was turned away waits for the real one.
  void turnAway(Request& request);
  void repostTurnedAway();
  void submitStaged();
  void submitUnsubmitted();
  // With mutex_ held, as every function below.
  Ticket post(int peer, Lane lane, bool isSend, char* base, size_t bytes,
              const std::shared_ptr<std::vector<char>>& copy, size_t* received = nullptr);
  Ticket postOrCancel(int peer, Lane lane, bool isSend, char* base, size_t bytes,
                      const std::shared_ptr<std::vector<char>>& copy, size_t* received = nullptr);
  // Progresses until `done()`, with waitAll's checks (mutex_ held).
  void waitUntil(const std::function<bool()>& done, const std::string& what);
  void complete(Request& request, size_t length, const std::string& what);
  // Reads the completions there are; with `sleep`, first waits up to
  // kSleepMilliseconds for one.
  void progress(const std::string& what, bool sleep = false);
  [[noreturn]] void failRequest(const fi_cq_err_entry& error, const std::string& what);
  void cancelPending();
  [[noreturn]] void failTimedOut(const std::string& what, int peer);
  int oldestPeer() const;  // of the requests waited for
  std::vector<int> peersWaitedOn() const;
  void progressBufferedSends();
  uint64_t tag(int sender, Lane lane, uint32_t counter) const;
  // The registration of the ncclMemAlloc region holding [data, data + bytes),
  // made at its first use and kept until the region is freed; null for other
  // memory, or where the provider registers nothing.
  void* descriptorFor(const void* data, size_t bytes);
  int registerMemory(const void* base, size_t bytes, fid_mr** mr);
  void forgetRegion(uint64_t id);

  const LibFabric& library_;
  int rank_;
  const std::atomic<bool>& aborted_;
  std::vector<RankInfo> ranks_;
  fi_info* infoList_ = nullptr;  // what fi_getinfo offered
  fi_info* info_ = nullptr;      // the one in use
  std::string how_;              // how the provider was chosen, for describe()
  std::unique_ptr<FabricEndpoint> objects_;  // what the pointers below name
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_av* av_ = nullptr;
  fid_ep* endpoint_ = nullptr;
  std::vector<fi_addr_t> addresses_;
  std::vector<uint32_t> sent_[2], received_[2];  // messages posted per lane and peer, each way
  size_t maxMessage_;
  size_t eagerMessage_;
  size_t injectBytes_ = 0;  // the largest send the provider takes inject
  uint64_t key_;            // the communicator's (SealKeys::fabric), as much as the provider carries
  bool keyed_ = false;      // the provider carries remote completion data
  bool directed_ = false;   // receives name their source (FI_DIRECTED_RECV)
  Rejections rejections_;
  std::deque<Request*> toRepost_;  // turned away, their receives not yet posted again
  int timeoutSeconds_;
  PeerCheck checkPeers_;
  // A wait polls (yielding its core between polls) this long without a
  // completion, then sleeps on the completion queue where the provider
  // gives it a wait object.
  static constexpr auto kPollBeforeSleeping = std::chrono::milliseconds(1);
  static constexpr int kSleepMilliseconds = 1;
  // How long a failed message waits for the peer watch's news of a death
  // before it reports the provider's own error.
  static constexpr auto kDeathNewsGrace = std::chrono::milliseconds(200);
  bool canSleep_ = false;

  // Buffered sends' copies once their sends complete, for the next ones:
  // a fresh large buffer costs a page fault every 4 KiB. Before pending_,
  // whose requests hand them back as they go (mutex_ held, or at the end).
  std::vector<std::unique_ptr<std::vector<char>>> spareCopies_;
  static constexpr size_t kSpareCopies = 4;
  static constexpr size_t kLargestSpareCopy = size_t{256} << 20;
  std::shared_ptr<std::vector<char>> spareCopy(size_t bytes);  // of `bytes`, to fill; mutex_ held

  // libfabric is used from one thread at a time (FI_THREAD_DOMAIN).
  std::mutex mutex_;
  std::condition_variable bufferedPosted_;
  std::list<Request> pending_;  // stable addresses: libfabric holds them
  uint64_t completed_ = 0;      // requests completed since the transport was made
  size_t waitedFor_ = 0;        // posted with postSend/postRecv and not yet complete
  Ticket lastTicket_ = 0;
  size_t buffered_ = 0;         // buffered sends not yet complete
  bool waiting_ = false;        // a caller is in waitAll(), progressing everything
  bool stopping_ = false;
  std::string failure_;  // what stopped the progress thread
  std::thread progressThread_;

  std::unique_ptr<StagingRegion> staging_;  // only where buffers must be registered
  std::deque<Request*> waitingForSlot_[2];   // staged messages not yet posted: [0] receives, [1] sends
  std::deque<Request*> unsubmitted_;         // buffered sends the provider had no room for yet, in order

  // ncclMemAlloc regions registered with the domain, by region id.
  std::map<uint64_t, fid_mr*> registrations_;
  uint64_t nextKey_ = 1;  // for providers that take the application's keys
  uint64_t regionWatch_ = 0;
  bool traceRegistrations_ = false;
};

}  // namespace mojoccl
