// Collectives of device memory within one node, on the GPUs themselves
// (MOJOCCL_DEVICE_PEERS=1). Every rank has a buffer on its GPU that the
// others map (transports/device_ipc.h). A collective runs in chunks: each
// rank stages its part of the chunk in its buffer, and once every rank has,
// each reads the buffers it needs, straight from the peers' GPUs: the Mojo
// GPU kernel reduces them (all-reduce, reduce-scatter, reduce: every rank
// combines the buffers in rank order, so results are bit-identical across
// ranks, as on the host path) or the runtime copies them (all-gather,
// broadcast).
//
// The host communicator orders the steps (a one-integer all-reduce after
// staging, and another after reading, so that no rank overwrites its buffer
// while a peer still reads it): a call is synchronous on its stream, like
// the staged path, but its data never leaves the GPUs.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "../comm.h"
#include "../datatypes.h"
#include "../device/gpu_reduce.h"
#include "../device/runtime.h"
#include "../error.h"
#include "../transports/device_ipc.h"
#include "step.h"

namespace mojoccl {

namespace {
// Per rank: 64 MiB of device memory, reused by every call.
constexpr size_t kDeviceBufferBytes = 64u << 20;
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

// Collective, once per communicator: every rank offers its buffer's IPC
// handle and maps the others', and the ranks take the device path only if
// all of them managed to (a failure on one rank must not leave the others
// waiting for it).
void Comm::setUpDevicePeers() {
  devicePeersDecided_ = true;
  std::string why = devicePeersUnavailable();
  std::unique_ptr<DeviceIpcBuffers> buffers;
  struct Offer {
    IpcHandle handle;
    int32_t ready;
  } mine{};
  if (why.empty()) {
    try {
      buffers = std::make_unique<DeviceIpcBuffers>(kDeviceBufferBytes);
      mine = {buffers->handle(), 1};
    } catch (const Error& error) {
      why = error.what();
    }
  }
  std::vector<Offer> offers(size_);
  allGather(&mine, offers.data(), sizeof(Offer), ncclInt8);
  const bool allOffered = std::all_of(offers.begin(), offers.end(), [](const Offer& o) { return o.ready == 1; });
  if (allOffered) {
    std::vector<IpcHandle> handles;
    for (const Offer& offer : offers) handles.push_back(offer.handle);
    try {
      buffers->open(handles, rank_);
    } catch (const Error& error) {
      why = error.what();
    }
  }
  int32_t everyRankCan = allOffered && why.empty() ? 1 : 0;
  allReduce(&everyRankCan, &everyRankCan, 1, ncclInt32, ncclMin);
  if (!everyRankCan) {
    fprintf(stderr, "[mojoccl] rank %d: MOJOCCL_DEVICE_PEERS=1, but %s; device memory goes through host "
            "buffers\n", rank_, why.empty() ? "another rank cannot share its GPU memory" : why.c_str());
    return;
  }
  devicePeers_ = std::move(buffers);
}

// Every rank learns, before any rank reads another's buffer, whether all issued
// this call (a mismatch is the same MismatchError as on the host path).
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

void Comm::inDeviceChunks(const Call& call, size_t chunk, ncclStream_t stream,
                          const std::function<void(size_t, size_t)>& stage,
                          const std::function<void(size_t, size_t)>& read) {
  const DeviceRuntime& runtime = DeviceRuntime::get();
  // One pass even for an empty call: the ranks agree on every call.
  for (size_t first = 0; first == 0 || first < call.count; first += chunk) {
    const size_t n = std::min(chunk, call.count - first);
    if (n > 0) stage(first, n);
    runtime.synchronize(stream);
    // Every rank's part is in its buffer. Before the first read, the
    // all-gather of the call's signature is that barrier.
    if (first == 0)
      agreeOnDeviceCall(call);
    else
      deviceBarrier();
    if (n == 0) return;
    read(first, n);
    runtime.synchronize(stream);
    deviceBarrier();  // no rank reads a buffer any more
  }
}

void Comm::deviceCollective(const Call& call, ncclStream_t stream) {
  const DeviceRuntime& runtime = DeviceRuntime::get();
  const size_t element = datatypeSize(call.datatype);
  const size_t capacity = devicePeers_->bytes() / element;  // elements per buffer
  const char* send = static_cast<const char*>(call.send);
  char* recv = static_cast<char*>(call.recv);
  char* own = devicePeers_->own();
  auto copy = [&](void* to, const void* from, size_t n) { runtime.copy(to, from, n * element, stream); };
  auto peer = [&](int rank, size_t at) { return static_cast<const char*>(devicePeers_->all()[rank]) + at * element; };
  // Every rank's buffer from element `at` on, in rank order, reduced into `to`.
  auto reduceBuffers = [&](void* to, size_t at, size_t n) {
    const void* sources[kMaxDeviceSources];
    for (int rank = 0; rank < size_; ++rank) sources[rank] = peer(rank, at);
    reduceOnDevice(to, sources, size_, n, call.datatype, call.op, size_, stream);
  };
  auto stageSend = [&](size_t first, size_t n) { copy(own, send + first * element, n); };

  switch (call.kind) {
    case CallKind::AllReduce:
      return inDeviceChunks(call, capacity, stream, stageSend,
                            [&](size_t first, size_t n) { reduceBuffers(recv + first * element, 0, n); });
    case CallKind::Reduce:
      return inDeviceChunks(call, capacity, stream, stageSend, [&](size_t first, size_t n) {
        if (rank_ == call.root) reduceBuffers(recv + first * element, 0, n);
      });
    case CallKind::ReduceScatter:
      // A chunk holds the same elements of every rank's slice, slice by slice.
      return inDeviceChunks(
          call, capacity / size_, stream,
          [&](size_t first, size_t n) {
            for (int slice = 0; slice < size_; ++slice)
              copy(own + slice * n * element, send + (slice * call.count + first) * element, n);
          },
          [&](size_t first, size_t n) { reduceBuffers(recv + first * element, rank_ * n, n); });
    case CallKind::AllGather:
      return inDeviceChunks(call, capacity, stream, stageSend, [&](size_t first, size_t n) {
        for (int rank = 0; rank < size_; ++rank) copy(recv + (rank * call.count + first) * element, peer(rank, 0), n);
      });
    case CallKind::Broadcast:
      return inDeviceChunks(
          call, capacity, stream,
          [&](size_t first, size_t n) {
            if (rank_ == call.root) stageSend(first, n);
          },
          [&](size_t first, size_t n) { copy(recv + first * element, peer(call.root, 0), n); });
  }
}

}  // namespace mojoccl
