// A communicator: the ranks that run collectives together, and the
// transports and algorithms that serve them.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include <vector>

#include "algorithms/call.h"
#include "algorithms/p2p.h"
#include "mojoccl/nccl.h"
#include "transports/shm.h"

namespace mojoccl {

enum class AllReduceAlgorithm { Auto, OneShot, TwoShot };

class Comm {
 public:
  // Collective over the `nranks` processes that pass the same `id`.
  Comm(const ncclUniqueId& id, int nranks, int rank);
  ~Comm();

  int rank() const { return rank_; }
  int size() const { return size_; }

  void allReduce(const void* send, void* recv, size_t count, ncclDataType_t datatype,
                 ncclRedOp_t op);
  void broadcast(const void* send, void* recv, size_t count, ncclDataType_t datatype, int root);
  void allGather(const void* send, void* recv, size_t sendCount, ncclDataType_t datatype);
  void reduceScatter(const void* send, void* recv, size_t recvCount, ncclDataType_t datatype,
                     ncclRedOp_t op);
  void reduce(const void* send, void* recv, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
              int root);

  // A send or receive as the caller asked for it (peer = communicator rank).
  struct PointToPoint {
    bool isSend;
    int peer;
    void* buffer;
    size_t count;
    ncclDataType_t datatype;
  };
  // Runs a batch of sends and receives together (one group's worth).
  void transfer(const std::vector<PointToPoint>& batch);

  // From any thread: makes every wait of this communicator fail promptly.
  void abort() { aborted_.store(true); }
  // After abort(), once no call is active: unmaps shared memory.
  void releaseTransports() { shm_.reset(); }
  ncclResult_t asyncError() const { return asyncError_.load(); }

  // Calls in progress; ncclCommAbort waits for them before freeing the comm.
  std::atomic<int> activeCalls{0};

 private:
  template <typename Algorithm>
  void run(const std::string& what, Algorithm algorithm);
  void validate(const Call& call) const;
  using Staged = void (*)(ShmTransport&, uint32_t&, const Call&);
  using ZeroCopy = bool (*)(ShmTransport&, uint32_t&, const Call&);
  // Large messages try `zeroCopy` first, which declines when some buffer it
  // must read is private; `staged` always works.
  void runCollective(const Call& call, size_t bytes, ZeroCopy zeroCopy, Staged staged);

  int rank_;
  int size_;
  AllReduceAlgorithm allReduceAlgorithm_;
  bool zeroCopy_;  // MOJOCCL_ZERO_COPY: read peers' buffers in place when possible
  std::unique_ptr<ShmTransport> shm_;
  uint32_t rounds_ = 0;
  uint64_t calls_ = 0;
  std::atomic<bool> aborted_{false};
  std::atomic<ncclResult_t> asyncError_{ncclSuccess};
  std::string brokenBy_;  // set when an error left the ranks out of step
};

}  // namespace mojoccl
