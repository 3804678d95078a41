#include "backend/communicator.h"

namespace torch_mojo {

ncclUniqueId Communicator::newUniqueId() const {
  ncclUniqueId id{};
  check(api().getUniqueId(&id), "ncclGetUniqueId");
  return id;
}

void Communicator::init(const ncclUniqueId& id, int size, int rank) {
  check(api().commInitRank(&comm_, size, id, rank), "ncclCommInitRank");
}

void Communicator::allReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                             ncclRedOp_t op) {
  check(api().allReduce(send, recv, count, type, op, comm_, stream_), "ncclAllReduce");
}

void Communicator::reduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                          ncclRedOp_t op, int root) {
  check(api().reduce(send, recv, count, type, op, root, comm_, stream_), "ncclReduce");
}

void Communicator::broadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                             int root) {
  check(api().broadcast(send, recv, count, type, root, comm_, stream_), "ncclBroadcast");
}

void Communicator::allGather(const void* send, void* recv, size_t sendCount, ncclDataType_t type) {
  check(api().allGather(send, recv, sendCount, type, comm_, stream_), "ncclAllGather");
}

void Communicator::reduceScatter(const void* send, void* recv, size_t recvCount,
                                 ncclDataType_t type, ncclRedOp_t op) {
  check(api().reduceScatter(send, recv, recvCount, type, op, comm_, stream_), "ncclReduceScatter");
}

void Communicator::send(const void* data, size_t count, ncclDataType_t type, int peer) {
  check(api().send(data, count, type, peer, comm_, stream_), "ncclSend");
}

void Communicator::recv(void* data, size_t count, ncclDataType_t type, int peer) {
  check(api().recv(data, count, type, peer, comm_, stream_), "ncclRecv");
}

void Communicator::group(const std::function<void()>& calls) {
  check(api().groupStart(), "ncclGroupStart");
  calls();
  check(api().groupEnd(), "ncclGroupEnd");
}

std::string Communicator::asyncError() const {
  ncclResult_t state = ncclSuccess;
  if (comm_ == nullptr || api().commGetAsyncError(comm_, &state) != ncclSuccess ||
      state == ncclSuccess || state == ncclInProgress)
    return "";
  const char* details = api().getLastError(comm_);
  return details != nullptr && details[0] != '\0' ? details : api().getErrorString(state);
}

void Communicator::abort() {
  if (comm_ != nullptr && !aborted_.exchange(true)) api().commAbort(comm_);
}

void Communicator::destroy() {
  if (comm_ != nullptr && !aborted_) api().commDestroy(comm_);
  comm_ = nullptr;
}

}  // namespace torch_mojo
