// One communicator of the library a process group drives: the handle, the
// library that serves it, and the stream its calls are ordered on (null for
// host memory, which libmojoccl moves at once). A process group has one for
// CPU tensors and, on a machine with an accelerator, one for device tensors.
//
// No torch headers here: this file compiles in a second.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/ccl_library.h"

namespace torch_mojo {

class Communicator {
 public:
  Communicator(std::shared_ptr<CclLibrary> library, ncclStream_t stream = nullptr);
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // What rank 0 makes and the others receive through the store.
  ncclUniqueId newUniqueId() const;
  void init(const ncclUniqueId& id, int size, int rank);

  // Each throws CclError naming the call when the library refuses it, or
  // when the communicator was aborted.
  void allReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op);
  void reduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
              int root);
  void broadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root);
  void allGather(const void* send, void* recv, size_t sendCount, ncclDataType_t type);
  void reduceScatter(const void* send, void* recv, size_t recvCount, ncclDataType_t type,
                     ncclRedOp_t op);
  void send(const void* data, size_t count, ncclDataType_t type, int peer);
  void recv(void* data, size_t count, ncclDataType_t type, int peer);
  // Returns the rank the message came from; libmojoccl only.
  int recvFromAny(void* data, size_t count, ncclDataType_t type);
  // ncclAllToAllv (counts and displacements in elements, one per rank);
  // only where the library has it (hasAllToAllv()).
  bool hasAllToAllv() const { return library_->api().allToAllv != nullptr; }
  void allToAllv(const void* send, const std::vector<size_t>& sendCounts, const std::vector<size_t>& sendDispls,
                 void* recv, const std::vector<size_t>& recvCounts, const std::vector<size_t>& recvDispls,
                 ncclDataType_t type);
  // Wraps `calls` in ncclGroupStart/End, as sends and receives that must
  // progress together need.
  void group(const std::function<void()>& calls);

  // The ranks the library knows to have ended without leaving the
  // communicator; always empty with NCCL and RCCL, which do not say.
  std::vector<int> failedRanks();
  // How many of the communicator's ranks run on CPUs that overlap this
  // rank's, and how many CPUs they have together; {0, 0} where the library
  // does not say (NCCL, RCCL).
  struct CoreSharing {
    int ranks = 0;
    int cpus = 0;
  };
  CoreSharing coreSharing();
  // Connections and messages from outside the communicator it turned away
  // (docs/security.md); 0 where the library does not say.
  uint64_t rejected();
  // An error the library met on its own since the last call (a broken
  // connection, a device fault), or "" while all is well.
  std::string asyncError();
  // Ends a call in progress on another thread (the library returns soon);
  // an aborted communicator is not destroyed again.
  void abort();
  void destroy();

  bool initialised() const { return comm_ != nullptr; }
  const CclLibrary& library() const { return *library_; }
  ncclStream_t stream() const { return stream_; }

 private:
  // One library call, unless the communicator was aborted.
  template <typename Call>
  void run(const char* name, Call&& call);
  const CclApi& api() const { return library_->api(); }

  std::shared_ptr<CclLibrary> library_;
  ncclStream_t stream_;
  ncclComm_t comm_ = nullptr;
  int size_ = 0;
  std::mutex mutex_;
  const bool abortFreesComm_;
  std::atomic<bool> aborted_{false};
};

}  // namespace torch_mojo
