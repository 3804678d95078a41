// The C API: NCCL's entry points, each a thin shell around Comm that turns
// exceptions into ncclResult_t codes and ncclGetLastError() text.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "base/bootstrap.h"
#include "base/datatypes.h"
#include "base/error.h"
#include "base/settings.h"
#include "comm.h"
#include "device/staging.h"
#include "mojoccl/nccl.h"
#include "transports/fabric.h"
#include "transports/libfabric.h"
#include "transports/shared_regions.h"

#define MOJOCCL_API extern "C" __attribute__((visibility("default")))

using mojoccl::CallKind;
using mojoccl::Comm;
using mojoccl::datatypeSize;
using mojoccl::DeviceStaging;
using mojoccl::Error;

struct ncclComm {
  Comm impl;
  ncclComm(const ncclUniqueId& id, int nranks, int rank) : impl(id, nranks, rank) {}
};

namespace {

thread_local std::string lastError;

// Calls queued between ncclGroupStart and ncclGroupEnd on this thread: a
// collective, or one send or receive (consecutive ones on a communicator
// run together, which is what lets a group exchange in both directions).
struct QueuedCall {
  ncclComm_t comm;
  std::function<void(Comm&)> collective;  // empty for a send or receive
  Comm::PointToPoint transfer;
  ncclStream_t stream = nullptr;  // a transfer's: set for device memory
};
thread_local int groupDepth = 0;
thread_local std::vector<QueuedCall> groupCalls;

template <typename Body>
ncclResult_t guarded(Body body) {
  try {
    body();
    return ncclSuccess;
  } catch (const Error& error) {
    lastError = error.what();
    return error.code();
  } catch (const std::bad_alloc&) {
    lastError = "out of host memory";
    return ncclSystemError;
  } catch (const std::exception& error) {
    lastError = error.what();
    return ncclInternalError;
  }
}

// Counts the call as active on `comm`, so that ncclCommAbort can wait for it.
class ActiveCall {
 public:
  explicit ActiveCall(Comm& comm) : comm_(comm) { comm_.activeCalls.fetch_add(1); }
  ~ActiveCall() { comm_.activeCalls.fetch_sub(1); }

 private:
  Comm& comm_;
};

void runQueued(const std::vector<QueuedCall>& calls) {
  for (size_t i = 0; i < calls.size();) {
    ActiveCall active(calls[i].comm->impl);
    if (calls[i].collective) {
      calls[i].collective(calls[i].comm->impl);
      ++i;
      continue;
    }
    std::vector<Comm::PointToPoint> batch;
    std::vector<std::unique_ptr<DeviceStaging>> staging;
    size_t j = i;
    for (; j < calls.size() && !calls[j].collective && calls[j].comm == calls[i].comm; ++j) {
      Comm::PointToPoint transfer = calls[j].transfer;
      staging.push_back(std::make_unique<DeviceStaging>(calls[j].stream));
      const size_t bytes = transfer.count * datatypeSize(transfer.datatype);
      transfer.buffer = transfer.isSend
                            ? const_cast<void*>(staging.back()->input(transfer.buffer, bytes))
                            : staging.back()->output(transfer.buffer, bytes);
      batch.push_back(transfer);
    }
    calls[i].comm->impl.transfer(batch);
    for (auto& each : staging) each->finish();
    i = j;
  }
}

ncclResult_t enqueue(ncclComm_t comm, QueuedCall call) {
  if (comm == nullptr) {
    lastError = "comm is NULL";
    return ncclInvalidArgument;
  }
  call.comm = comm;
  if (groupDepth > 0) {
    groupCalls.push_back(std::move(call));
    return ncclSuccess;
  }
  return guarded([&] { runQueued({call}); });
}

// Device memory that stays on the GPUs (MOJOCCL_DEVICE_PEERS=1), when it can.
bool onDevice(Comm& comm, ncclStream_t stream, const mojoccl::Call& call) {
  return stream != nullptr && comm.collectiveOnDevice(call, stream);
}

// `body` runs on host views of the call's buffers (the buffers themselves
// for host memory, a NULL stream). Outside a group it runs at once, on the
// caller's thread, with no copy of it: the process group has already queued
// the call once, on its own worker. Only a group keeps it, until ncclGroupEnd.
template <typename Body>
ncclResult_t collective(ncclComm_t comm, ncclStream_t stream, const Body& body) {
  auto staged = [stream, body](Comm& c) {
    DeviceStaging staging(stream);
    body(c, staging);
    staging.finish();
  };
  if (comm == nullptr || groupDepth > 0) return enqueue(comm, QueuedCall{nullptr, staged, {}});
  return guarded([&] {
    ActiveCall active(comm->impl);
    staged(comm->impl);
  });
}

ncclResult_t pointToPoint(ncclComm_t comm, ncclStream_t stream, Comm::PointToPoint transfer) {
  return enqueue(comm, QueuedCall{nullptr, nullptr, transfer, stream});
}

}  // namespace

MOJOCCL_API ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = MOJOCCL_VERSION_CODE;
  return ncclSuccess;
}

MOJOCCL_API ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (uniqueId == nullptr) return ncclInvalidArgument;
  return guarded([&] { *uniqueId = mojoccl::createUniqueId(); });
}

MOJOCCL_API ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                          int rank) {
  if (comm == nullptr) return ncclInvalidArgument;
  *comm = nullptr;
  return guarded([&] { *comm = new ncclComm(commId, nranks, rank); });
}

MOJOCCL_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

MOJOCCL_API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  comm->impl.abort();
  // Waits poll the abort flag at least every 50 ms; let calls in progress
  // leave before their transports go away.
  auto giveUp = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (comm->impl.activeCalls.load() > 0 && std::chrono::steady_clock::now() < giveUp)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (comm->impl.activeCalls.load() == 0) comm->impl.releaseTransports();
  // The small comm object itself stays: abort usually comes from another
  // thread than the one issuing calls, and a late call must find "aborted",
  // not freed memory.
  return ncclSuccess;
}

MOJOCCL_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (comm == nullptr || asyncError == nullptr) return ncclInvalidArgument;
  *asyncError = comm->impl.asyncError();
  return ncclSuccess;
}

MOJOCCL_API const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled device error";
    case ncclSystemError: return "unhandled system error (run out of memory, a failed system call, ...)";
    case ncclInternalError: return "internal error - please report this issue to the torch-mojo developers";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "operation in progress";
    default: return "unknown result code";
  }
}

MOJOCCL_API const char* ncclGetLastError(ncclComm_t /*comm: NCCL ignores it too*/) {
  return lastError.c_str();
}

// libmojoccl's own: every MOJOCCL_* variable it reads, a line each:
// "name<TAB>integer|choice|text<TAB>default<TAB>what it accepts".
MOJOCCL_API const char* mojocclSettings(void) {
  static const std::string lines = mojoccl::describeSettings();
  return lines.c_str();
}

MOJOCCL_API ncclResult_t mojocclSettingInt(const char* name, int64_t* value) {
  return guarded([&] {
    if (name == nullptr || value == nullptr) mojoccl::fail(ncclInvalidArgument, "mojocclSettingInt: no name or value");
    *value = mojoccl::settingInt(name);
  });
}

// libmojoccl's own: which provider and domain a communicator spanning nodes
// would open on this rank, the `localRank`th of its node, as text
// ("tcp;ofi_rxm on lo (libfabric 1.17, ...)"); when it could not,
// ncclInvalidUsage and ncclGetLastError() say why.
MOJOCCL_API ncclResult_t mojocclDescribeFabric(int localRank, char* text, size_t size) {
  return guarded([&] {
    if (text == nullptr || size == 0) mojoccl::fail(ncclInvalidArgument, "mojocclDescribeFabric: no buffer");
    const mojoccl::LibFabric& library = mojoccl::LibFabric::get();
    mojoccl::FabricChoice choice =
        mojoccl::chooseFabric(library, localRank < 0 ? 0 : localRank, mojoccl::wantsTcpEagerLimit());
    std::string description = choice.info ? mojoccl::describeFabric(choice, library) : "";
    if (choice.list) library.freeinfo(choice.list);
    if (!choice.failure.empty()) mojoccl::fail(ncclInvalidUsage, choice.failure);
    snprintf(text, size, "%s", description.c_str());
  });
}

MOJOCCL_API const char* mojocclFabricAutoProviders(void) {
  static const std::string providers = [] {
    std::string text;
    for (const std::string& name : mojoccl::autoProviders()) text += (text.empty() ? "" : ",") + name;
    return text;
  }();
  return providers.c_str();
}

MOJOCCL_API ncclResult_t mojocclPredictAllReduce(int nodes, size_t bytes, const char* algorithm, char* chosen,
                                                 size_t size, double* seconds) {
  return guarded([&] {
    if (nodes < 1 || chosen == nullptr || size == 0 || seconds == nullptr)
      mojoccl::fail(ncclInvalidArgument, "mojocclPredictAllReduce: nodes < 1, or no room for the answer");
    const auto algorithms = mojoccl::NetworkAlgorithms::fromEnv();
    const auto which = algorithm ? mojoccl::networkAlgorithmNamed(algorithm, algorithm)
                                 : algorithms.allReduce(nodes, bytes);
    snprintf(chosen, size, "%s", mojoccl::nameOf(which).c_str());
    *seconds = algorithms.model().seconds(which, nodes, bytes);
  });
}

MOJOCCL_API ncclResult_t mojocclPredictBroadcast(int nodes, size_t bytes, char* chosen, size_t size,
                                                 double* seconds) {
  return guarded([&] {
    if (nodes < 1 || chosen == nullptr || size == 0 || seconds == nullptr)
      mojoccl::fail(ncclInvalidArgument, "mojocclPredictBroadcast: nodes < 1, or no room for the answer");
    const auto algorithms = mojoccl::NetworkAlgorithms::fromEnv();
    const auto which = algorithms.broadcast(nodes, bytes);
    snprintf(chosen, size, "%s", mojoccl::nameOf(which).c_str());
    *seconds = algorithms.model().broadcastSeconds(which, nodes, bytes);
  });
}

MOJOCCL_API ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return ncclInvalidArgument;
  *count = comm->impl.size();
  return ncclSuccess;
}

MOJOCCL_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return ncclInvalidArgument;
  *rank = comm->impl.rank();
  return ncclSuccess;
}

MOJOCCL_API ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  if (ptr == nullptr) return ncclInvalidArgument;
  return guarded([&] { *ptr = mojoccl::allocateSharedRegion(size); });
}

MOJOCCL_API ncclResult_t ncclMemFree(void* ptr) {
  return guarded([&] { mojoccl::freeSharedRegion(ptr); });
}

MOJOCCL_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size,
                                          void** handle) {
  if (comm == nullptr || handle == nullptr) return ncclInvalidArgument;
  return guarded([&] {
    if (!mojoccl::describeBuffer(buff, size).shared())
      mojoccl::fail(ncclInvalidArgument, "ncclCommRegister: the buffer is not ncclMemAlloc memory "
                                         "(libmojoccl shares only memory it allocated)");
    *handle = buff;
  });
}

MOJOCCL_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* /*handle*/) {
  return comm == nullptr ? ncclInvalidArgument : ncclSuccess;
}

MOJOCCL_API ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                       ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                       ncclStream_t stream) {
  return collective(comm, stream, [=](Comm& c, DeviceStaging& staged) {
    if (onDevice(c, stream, {CallKind::AllReduce, sendbuff, recvbuff, count, datatype, op, 0, 0})) return;
    const size_t bytes = count * datatypeSize(datatype);
    c.allReduce(staged.input(sendbuff, bytes), staged.output(recvbuff, bytes), count, datatype, op);
  });
}

MOJOCCL_API ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                       ncclDataType_t datatype, int root, ncclComm_t comm,
                                       ncclStream_t stream) {
  return collective(comm, stream, [=](Comm& c, DeviceStaging& staged) {
    if (onDevice(c, stream, {CallKind::Broadcast, sendbuff, recvbuff, count, datatype, ncclSum, root, 0}))
      return;
    const size_t bytes = count * datatypeSize(datatype);
    // Only the root's sendbuff is read (others may pass anything).
    const void* source = c.rank() == root ? staged.input(sendbuff, bytes) : sendbuff;
    c.broadcast(source, staged.output(recvbuff, bytes), count, datatype, root);
  });
}

MOJOCCL_API ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                       ncclDataType_t datatype, ncclComm_t comm,
                                       ncclStream_t stream) {
  return collective(comm, stream, [=](Comm& c, DeviceStaging& staged) {
    if (onDevice(c, stream, {CallKind::AllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, 0}))
      return;
    const size_t bytes = sendcount * datatypeSize(datatype);
    c.allGather(staged.input(sendbuff, bytes), staged.output(recvbuff, bytes * c.size()), sendcount,
                datatype);
  });
}

MOJOCCL_API ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                           ncclDataType_t datatype, ncclRedOp_t op,
                                           ncclComm_t comm, ncclStream_t stream) {
  return collective(comm, stream, [=](Comm& c, DeviceStaging& staged) {
    if (onDevice(c, stream, {CallKind::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0, 0}))
      return;
    const size_t bytes = recvcount * datatypeSize(datatype);
    c.reduceScatter(staged.input(sendbuff, bytes * c.size()), staged.output(recvbuff, bytes),
                    recvcount, datatype, op);
  });
}

MOJOCCL_API ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                    ncclDataType_t datatype, ncclRedOp_t op, int root,
                                    ncclComm_t comm, ncclStream_t stream) {
  return collective(comm, stream, [=](Comm& c, DeviceStaging& staged) {
    if (onDevice(c, stream, {CallKind::Reduce, sendbuff, recvbuff, count, datatype, op, root, 0})) return;
    const size_t bytes = count * datatypeSize(datatype);
    // Only the root's recvbuff is written: another rank's stays as it was.
    void* target = c.rank() == root ? staged.output(recvbuff, bytes) : recvbuff;
    c.reduce(staged.input(sendbuff, bytes), target, count, datatype, op, root);
  });
}

MOJOCCL_API ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,
                                  int peer, ncclComm_t comm, ncclStream_t stream) {
  return pointToPoint(comm, stream, {true, peer, const_cast<void*>(sendbuff), count, datatype});
}

MOJOCCL_API ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                  ncclComm_t comm, ncclStream_t stream) {
  return pointToPoint(comm, stream, {false, peer, recvbuff, count, datatype});
}

MOJOCCL_API ncclResult_t ncclAllToAllv(const void* sendbuff, const size_t sendcounts[], const size_t sdispls[],
                                       void* recvbuff, const size_t recvcounts[], const size_t rdispls[],
                                       ncclDataType_t datatype, ncclComm_t comm, ncclStream_t stream) {
  if (comm != nullptr && (sendcounts == nullptr || sdispls == nullptr || recvcounts == nullptr || rdispls == nullptr)) {
    lastError = "ncclAllToAllv: sendcounts, sdispls, recvcounts and rdispls need an entry per rank";
    return ncclInvalidArgument;
  }
  return collective(comm, stream, [=](Comm& c, DeviceStaging& staged) {
    const size_t size = datatypeSize(datatype);
    if (size == 0) mojoccl::fail(ncclInvalidArgument, "unknown datatype " + std::to_string(datatype));
    // The extent of each buffer that the parts cover, staged whole.
    size_t sendExtent = 0, recvExtent = 0;
    for (int peer = 0; peer < c.size(); ++peer) {
      sendExtent = std::max(sendExtent, (sdispls[peer] + sendcounts[peer]) * size);
      recvExtent = std::max(recvExtent, (rdispls[peer] + recvcounts[peer]) * size);
    }
    const char* send = static_cast<const char*>(staged.input(sendbuff, sendExtent));
    char* recv = static_cast<char*>(staged.output(recvbuff, recvExtent));
    // In place (the buffers overlap), parts received could overwrite parts
    // not yet sent, here or on their way between nodes: they go from a copy.
    std::vector<char> sendCopy;
    if (sendExtent > 0 && recvExtent > 0 && send < recv + recvExtent && recv < send + sendExtent) {
      sendCopy.assign(send, send + sendExtent);
      send = sendCopy.data();
    }
    std::vector<Comm::PointToPoint> exchange;
    for (int peer = 0; peer < c.size(); ++peer) {
      exchange.push_back({true, peer, const_cast<char*>(send) + sdispls[peer] * size, sendcounts[peer], datatype});
      exchange.push_back({false, peer, recv + rdispls[peer] * size, recvcounts[peer], datatype});
    }
    c.transfer(exchange, Comm::Exchange::Collective);
  });
}

MOJOCCL_API ncclResult_t mojocclRecvAny(void* recvbuff, size_t count, ncclDataType_t datatype,
                                        int* peer, ncclComm_t comm, ncclStream_t stream) {
  return guarded([&] {
    if (comm == nullptr || peer == nullptr)
      mojoccl::fail(ncclInvalidArgument, "mojocclRecvAny: comm or peer is NULL");
    if (stream != nullptr || groupDepth > 0)
      mojoccl::fail(ncclInvalidUsage, "mojocclRecvAny takes host memory (stream NULL), outside "
                                      "ncclGroupStart/End");
    ActiveCall active(comm->impl);
    *peer = comm->impl.receiveFromAny(recvbuff, count, datatype);
  });
}

MOJOCCL_API ncclResult_t mojocclWireSendRecv(const void* sendbuff, int to, void* recvbuff, int from, size_t bytes,
                                             ncclComm_t comm) {
  return guarded([&] {
    if (comm == nullptr) mojoccl::fail(ncclInvalidArgument, "mojocclWireSendRecv: comm is NULL");
    if (groupDepth > 0) mojoccl::fail(ncclInvalidUsage, "mojocclWireSendRecv runs outside ncclGroupStart/End");
    ActiveCall active(comm->impl);
    comm->impl.wireSendRecv(sendbuff, to, recvbuff, from, bytes);
  });
}

MOJOCCL_API ncclResult_t mojocclCommFailedRanks(ncclComm_t comm, int* ranks, int* count) {
  return guarded([&] {
    if (comm == nullptr || ranks == nullptr || count == nullptr)
      mojoccl::fail(ncclInvalidArgument, "mojocclCommFailedRanks: comm, ranks or count is NULL");
    std::vector<int> failed = comm->impl.failedRanks();
    std::copy(failed.begin(), failed.end(), ranks);
    *count = static_cast<int>(failed.size());
  });
}

MOJOCCL_API ncclResult_t mojocclCommNodes(ncclComm_t comm, int* nodes, int* localRanks, int* localRank) {
  return guarded([&] {
    if (comm == nullptr || nodes == nullptr || localRanks == nullptr || localRank == nullptr)
      mojoccl::fail(ncclInvalidArgument, "mojocclCommNodes: comm, nodes, localRanks or localRank is NULL");
    *nodes = comm->impl.nodeCount();
    *localRanks = comm->impl.localRanks();
    *localRank = comm->impl.localIndex();
  });
}

MOJOCCL_API ncclResult_t mojocclCommCoreSharing(ncclComm_t comm, int* ranks, int* cpus) {
  return guarded([&] {
    if (comm == nullptr || ranks == nullptr || cpus == nullptr)
      mojoccl::fail(ncclInvalidArgument, "mojocclCommCoreSharing: comm, ranks or cpus is NULL");
    *ranks = comm->impl.coreSharers();
    *cpus = comm->impl.sharedCpus();
  });
}

MOJOCCL_API ncclResult_t mojocclCommRejected(ncclComm_t comm, uint64_t* count) {
  return guarded([&] {
    if (comm == nullptr || count == nullptr) mojoccl::fail(ncclInvalidArgument, "mojocclCommRejected: comm or count is NULL");
    *count = comm->impl.rejected();
  });
}

MOJOCCL_API ncclResult_t mojocclCommSetupSeconds(ncclComm_t comm, double* seconds, int* count) {
  return guarded([&] {
    if (comm == nullptr || seconds == nullptr || count == nullptr)
      mojoccl::fail(ncclInvalidArgument, "mojocclCommSetupSeconds: comm, seconds or count is NULL");
    *count = std::max(0, std::min(*count, static_cast<int>(mojoccl::Comm::kSetupPhases)));
    std::copy(comm->impl.setupSeconds(), comm->impl.setupSeconds() + *count, seconds);
  });
}

MOJOCCL_API ncclResult_t mojocclCommSetupTraffic(ncclComm_t comm, int* rounds, uint64_t* bytes) {
  return guarded([&] {
    if (comm == nullptr || rounds == nullptr || bytes == nullptr)
      mojoccl::fail(ncclInvalidArgument, "mojocclCommSetupTraffic: comm, rounds or bytes is NULL");
    *rounds = comm->impl.setupRounds();
    *bytes = comm->impl.setupBytes();
  });
}

MOJOCCL_API ncclResult_t mojocclPreloadFabric(void) {
  return guarded([] { mojoccl::LibFabric::preload(); });
}

MOJOCCL_API ncclResult_t mojocclRehearseBootstrap(const ncclUniqueId* id, const mojocclRehearsal* plan,
                                                  double* seconds, int* results, char* messages,
                                                  size_t messageBytes) {
  return guarded([&] {
    if (id == nullptr || plan == nullptr || seconds == nullptr || results == nullptr)
      mojoccl::fail(ncclInvalidArgument, "mojocclRehearseBootstrap: id, plan, seconds or results is NULL");
    const auto rehearsed = mojoccl::rehearseBootstrap(*id, *plan);
    for (size_t i = 0; i < rehearsed.size(); ++i) {
      seconds[i] = rehearsed[i].seconds;
      results[i] = rehearsed[i].status;
      if (messages != nullptr && messageBytes > 0)
        snprintf(messages + i * messageBytes, messageBytes, "%s", rehearsed[i].message.c_str());
    }
  });
}

MOJOCCL_API ncclResult_t ncclGroupStart(void) {
  ++groupDepth;
  return ncclSuccess;
}

MOJOCCL_API ncclResult_t ncclGroupEnd(void) {
  if (groupDepth == 0) {
    lastError = "ncclGroupEnd without a matching ncclGroupStart";
    return ncclInvalidUsage;
  }
  if (--groupDepth > 0) return ncclSuccess;
  std::vector<QueuedCall> calls;
  calls.swap(groupCalls);
  // In issue order; the first failure ends the group, as the calls after it
  // would wait on ranks that have stopped.
  return guarded([&] { runQueued(calls); });
}
