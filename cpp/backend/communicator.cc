#include "backend/communicator.h"

namespace torch_mojo {

Communicator::Communicator(std::shared_ptr<CclLibrary> library, ncclStream_t stream)
    : library_(std::move(library)),
      stream_(stream),
      // NCCL and RCCL free the communicator in ncclCommAbort and return from
      // every other call at once: a call must not race with the abort, so
      // both take a lock. libmojoccl keeps an aborted communicator for late
      // calls, and its calls wait for their peers: the abort must reach a
      // call in progress, so it takes none.
      abortFreesComm_(library_->kind() != "mojoccl") {}

ncclUniqueId Communicator::newUniqueId() const {
  ncclUniqueId id{};
  library_->check(api().getUniqueId(&id), "ncclGetUniqueId", nullptr);
  return id;
}

void Communicator::init(const ncclUniqueId& id, int size, int rank) {
  library_->check(api().commInitRank(&comm_, size, id, rank), "ncclCommInitRank", comm_);
  size_ = size;
}

template <typename Call>
void Communicator::run(const char* name, Call&& call) {
  std::unique_lock<std::mutex> lock(mutex_, std::defer_lock);
  if (abortFreesComm_) lock.lock();
  if (aborted_)
    throw CclError(ncclInternalError, std::string(name) + " failed: the communicator was aborted");
  library_->check(call(), name, comm_);
}

void Communicator::allReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                             ncclRedOp_t op) {
  run("ncclAllReduce", [&] { return api().allReduce(send, recv, count, type, op, comm_, stream_); });
}

void Communicator::reduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                          ncclRedOp_t op, int root) {
  run("ncclReduce", [&] { return api().reduce(send, recv, count, type, op, root, comm_, stream_); });
}

void Communicator::broadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                             int root) {
  run("ncclBroadcast", [&] { return api().broadcast(send, recv, count, type, root, comm_, stream_); });
}

void Communicator::allGather(const void* send, void* recv, size_t sendCount, ncclDataType_t type) {
  run("ncclAllGather", [&] { return api().allGather(send, recv, sendCount, type, comm_, stream_); });
}

void Communicator::reduceScatter(const void* send, void* recv, size_t recvCount,
                                 ncclDataType_t type, ncclRedOp_t op) {
  run("ncclReduceScatter",
      [&] { return api().reduceScatter(send, recv, recvCount, type, op, comm_, stream_); });
}

void Communicator::send(const void* data, size_t count, ncclDataType_t type, int peer) {
  run("ncclSend", [&] { return api().send(data, count, type, peer, comm_, stream_); });
}

int Communicator::recvFromAny(void* data, size_t count, ncclDataType_t type) {
  if (api().recvAny == nullptr)
    throw CclError(ncclInvalidUsage, library_->path() + " has no receive from any rank (only "
                                     "libmojoccl has): pass the source rank");
  int peer = -1;
  run("mojocclRecvAny", [&] { return api().recvAny(data, count, type, &peer, comm_, stream_); });
  return peer;
}

void Communicator::recv(void* data, size_t count, ncclDataType_t type, int peer) {
  run("ncclRecv", [&] { return api().recv(data, count, type, peer, comm_, stream_); });
}

void Communicator::allToAllv(const void* send, const std::vector<size_t>& sendCounts,
                             const std::vector<size_t>& sendDispls, void* recv, const std::vector<size_t>& recvCounts,
                             const std::vector<size_t>& recvDispls, ncclDataType_t type) {
  run("ncclAllToAllv", [&] {
    return api().allToAllv(send, sendCounts.data(), sendDispls.data(), recv, recvCounts.data(), recvDispls.data(),
                           type, comm_, stream_);
  });
}

void Communicator::group(const std::function<void()>& calls) {
  run("ncclGroupStart", [&] { return api().groupStart(); });
  calls();
  run("ncclGroupEnd", [&] { return api().groupEnd(); });
}

std::string Communicator::asyncError() {
  std::unique_lock<std::mutex> lock(mutex_, std::defer_lock);
  if (abortFreesComm_) lock.lock();
  ncclResult_t state = ncclSuccess;
  if (comm_ == nullptr || aborted_ || api().commGetAsyncError(comm_, &state) != ncclSuccess ||
      state == ncclSuccess || state == ncclInProgress)
    return "";
  const char* details = api().getLastError(comm_);
  return details != nullptr && details[0] != '\0' ? details : api().getErrorString(state);
}

std::vector<int> Communicator::failedRanks() {
  std::unique_lock<std::mutex> lock(mutex_, std::defer_lock);
  if (abortFreesComm_) lock.lock();
  if (comm_ == nullptr || api().failedRanks == nullptr) return {};
  std::vector<int> ranks(size_);
  int count = 0;
  library_->check(api().failedRanks(comm_, ranks.data(), &count), "mojocclCommFailedRanks", comm_);
  ranks.resize(count);
  return ranks;
}

Communicator::CoreSharing Communicator::coreSharing() {
  CoreSharing sharing;
  if (comm_ == nullptr || aborted_ || api().coreSharing == nullptr) return sharing;
  library_->check(api().coreSharing(comm_, &sharing.ranks, &sharing.cpus), "mojocclCommCoreSharing", comm_);
  return sharing;
}

uint64_t Communicator::rejected() {
  std::unique_lock<std::mutex> lock(mutex_, std::defer_lock);
  if (abortFreesComm_) lock.lock();
  uint64_t count = 0;
  if (comm_ == nullptr || api().rejected == nullptr) return count;
  library_->check(api().rejected(comm_, &count), "mojocclCommRejected", comm_);
  return count;
}

void Communicator::abort() {
  std::unique_lock<std::mutex> lock(mutex_, std::defer_lock);
  if (abortFreesComm_) lock.lock();
  if (comm_ != nullptr && !aborted_.exchange(true)) api().commAbort(comm_);
}

void Communicator::destroy() {
  if (comm_ != nullptr && !aborted_) api().commDestroy(comm_);
  comm_ = nullptr;
}

}  // namespace torch_mojo
