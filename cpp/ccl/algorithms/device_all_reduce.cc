// All-reduce of device memory within one node, on the GPUs themselves
// (MOJOCCL_DEVICE_PEERS=1): each rank copies its input, a chunk at a time,
// into its IPC-shared buffer (transports/device_ipc.h), and once every
// rank's chunk is there, the Mojo GPU kernel on each rank reads all of them
// and writes the sum into its own output. Every rank combines the buffers in
// rank order, so all ranks get bit-identical results, as on the host path.
//
// The host communicator orders the steps (a one-integer all-reduce after
// the copies, and another after the kernels, so that no rank overwrites its
// buffer while a peer still reads it): the call is synchronous on its
// stream, like the staged path, but the data never leaves the GPUs.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "../comm.h"
#include "../datatypes.h"
#include "../device_kernels.h"
#include "../device_runtime.h"
#include "../error.h"
#include "../transports/device_ipc.h"
#include "step.h"

namespace mojoccl {

namespace {
// Per rank: 64 MiB of device memory, reused by every call.
constexpr size_t kDeviceChunkBytes = 64u << 20;
}  // namespace

// Why this rank cannot take the device path, or "" if it can.
std::string Comm::devicePeersUnavailable() const {
  if (spansNodes()) return "the communicator spans nodes";
  if (size_ > kMaxDeviceSources)
    return "the GPU kernel reduces at most " + std::to_string(kMaxDeviceSources) + " ranks' buffers, not " +
           std::to_string(size_);
  try {
    return deviceKernelUnavailable();
  } catch (const Error& error) {
    return error.what();
  }
}

// Collective, once per communicator: the ranks agree on the path (all or
// none), then share their buffers' IPC handles.
void Comm::setUpDevicePeers() {
  devicePeersDecided_ = true;
  const std::string unavailable = devicePeersUnavailable();
  int32_t everyRankCan = unavailable.empty() ? 1 : 0;
  allReduce(&everyRankCan, &everyRankCan, 1, ncclInt32, ncclMin);
  if (!everyRankCan) {
    fprintf(stderr, "[mojoccl] rank %d: MOJOCCL_DEVICE_PEERS=1, but %s; device memory goes through host "
            "buffers\n", rank_, unavailable.empty() ? "another rank cannot read its peers' GPUs" :
                                                      unavailable.c_str());
    return;
  }
  auto buffers = std::make_unique<DeviceIpcBuffers>(kDeviceChunkBytes);
  std::vector<IpcHandle> handles(size_);
  const IpcHandle mine = buffers->handle();
  allGather(&mine, handles.data(), sizeof(IpcHandle), ncclInt8);
  buffers->open(handles, rank_);
  devicePeers_ = std::move(buffers);
}

// Every rank learns, before any data moves, whether all issued this call.
void Comm::agreeOnDeviceCall(const Call& call) {
  std::vector<CallSignature> calls(size_);
  const CallSignature mine = CallSignature::of(call);
  allGather(&mine, calls.data(), sizeof(CallSignature), ncclInt8);
  for (int rank = 1; rank < size_; ++rank)
    if (!calls[rank].sameCollective(calls[0])) throw MismatchError(mismatchText(rank, calls[rank], 0, calls[0]));
}

void Comm::deviceBarrier() {
  int32_t token = 0;
  allReduce(&token, &token, 1, ncclInt32, ncclMin);
}

void Comm::deviceAllReduce(const Call& call, ncclStream_t stream) {
  agreeOnDeviceCall(call);
  const DeviceRuntime& runtime = DeviceRuntime::get();
  const size_t elementBytes = datatypeSize(call.datatype);
  const size_t chunk = devicePeers_->bytes() / elementBytes;
  for (size_t done = 0; done < call.count; done += chunk) {
    const size_t count = std::min(chunk, call.count - done);
    const size_t offset = done * elementBytes;
    runtime.copy(devicePeers_->own(), static_cast<const char*>(call.send) + offset, count * elementBytes, stream);
    runtime.synchronize(stream);
    deviceBarrier();  // every rank's chunk is in its buffer
    reduceOnDevice(static_cast<char*>(call.recv) + offset, devicePeers_->all(), size_, count, call.datatype,
                   call.op, size_, stream);
    runtime.synchronize(stream);
    deviceBarrier();  // no rank reads a buffer any more
  }
}

}  // namespace mojoccl
