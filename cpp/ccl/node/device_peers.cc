#include "node/device_peers.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "algorithms/step.h"
#include "base/datatypes.h"
#include "base/error.h"
#include "device/device_ipc.h"
#include "device/gpu_reduce.h"
#include "device/runtime.h"

namespace mojoccl {

namespace {
// Per rank: 64 MiB of device memory, reused by every call.
constexpr size_t kDeviceBufferBytes = 64u << 20;

// Why this rank cannot take the device path, or "" if it can.
std::string unavailable(const Topology& topology) {
  if (topology.size > kMaxDeviceSources)
    return "the GPU kernel reduces at most " + std::to_string(kMaxDeviceSources) + " ranks' buffers, not " +
           std::to_string(topology.size);
  try {
    return deviceKernelUnavailable();
  } catch (const Error& error) {
    return error.what();
  }
}

void explainHostPath(const Topology& topology, const std::string& why) {
  fprintf(stderr, "[mojoccl] rank %d: MOJOCCL_DEVICE_PEERS=1, but %s; device memory goes through host buffers\n",
          topology.rank, why.c_str());
}

}  // namespace

std::unique_ptr<DevicePeers> DevicePeers::open(const Topology& topology, NodeCollectives& node, const Call& setUp) {
  // The same on every rank: no rank waits for the others' answer.
  if (topology.nodes.size() > 1) {
    explainHostPath(topology, "the communicator spans nodes");
    return nullptr;
  }
  std::string why = unavailable(topology);
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
  std::vector<Offer> offers(topology.size);
  node.allGather({CallKind::AllGather, &mine, offers.data(), sizeof(Offer), ncclInt8, ncclSum, 0, setUp.sequence});
  const bool allOffered = std::all_of(offers.begin(), offers.end(), [](const Offer& o) { return o.ready == 1; });
  if (allOffered) {
    std::vector<IpcHandle> handles;
    for (const Offer& offer : offers) handles.push_back(offer.handle);
    try {
      buffers->open(handles, topology.rank);
    } catch (const Error& error) {
      why = error.what();
    }
  }
  int32_t everyRankCan = allOffered && why.empty() ? 1 : 0;
  node.allReduce({CallKind::AllReduce, &everyRankCan, &everyRankCan, 1, ncclInt32, ncclMin, 0, setUp.sequence});
  if (!everyRankCan) {
    explainHostPath(topology, why.empty() ? "another rank cannot share its GPU memory" : why);
    return nullptr;
  }
  return std::unique_ptr<DevicePeers>(new DevicePeers(topology, node, std::move(buffers)));
}

void DevicePeers::agreeOnCall(const Call& call) {
  const int ranks = topology_.size;
  std::vector<CallSignature> calls(ranks);
  const CallSignature mine = CallSignature::of(call);
  node_.allGather({CallKind::AllGather, &mine, calls.data(), sizeof(CallSignature), ncclInt8, ncclSum, 0,
                   call.sequence});
  for (int rank = 1; rank < ranks; ++rank)
    if (!calls[rank].sameCollective(calls[0])) throw MismatchError(mismatchText(rank, calls[rank], 0, calls[0]));
}

void DevicePeers::barrier(const Call& call) {
  int32_t token = 0;
  node_.allReduce({CallKind::AllReduce, &token, &token, 1, ncclInt32, ncclMin, 0, call.sequence});
}

void DevicePeers::inChunks(const Call& call, size_t chunk, ncclStream_t stream,
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
      agreeOnCall(call);
    else
      barrier(call);
    if (n == 0) return;
    read(first, n);
    runtime.synchronize(stream);
    barrier(call);  // no rank reads a buffer any more
  }
}

void DevicePeers::run(const Call& call, ncclStream_t stream) {
  const DeviceRuntime& runtime = DeviceRuntime::get();
  const size_t element = datatypeSize(call.datatype);
  const size_t capacity = buffers_->bytes() / element;  // elements per buffer
  const char* send = static_cast<const char*>(call.send);
  char* recv = static_cast<char*>(call.recv);
  char* own = buffers_->own();
  auto copy = [&](void* to, const void* from, size_t n) { runtime.copy(to, from, n * element, stream); };
  auto peer = [&](int rank, size_t at) { return static_cast<const char*>(buffers_->all()[rank]) + at * element; };
  // Every rank's buffer from element `at` on, in rank order, reduced into `to`.
  auto reduceBuffers = [&](void* to, size_t at, size_t n) {
    const void* sources[kMaxDeviceSources];
    for (int rank = 0; rank < topology_.size; ++rank) sources[rank] = peer(rank, at);
    reduceOnDevice(to, sources, topology_.size, n, call.datatype, call.op, topology_.size, stream);
  };
  auto stageSend = [&](size_t first, size_t n) { copy(own, send + first * element, n); };

  switch (call.kind) {
    case CallKind::AllReduce:
      return inChunks(call, capacity, stream, stageSend,
                            [&](size_t first, size_t n) { reduceBuffers(recv + first * element, 0, n); });
    case CallKind::Reduce:
      return inChunks(call, capacity, stream, stageSend, [&](size_t first, size_t n) {
        if (topology_.rank == call.root) reduceBuffers(recv + first * element, 0, n);
      });
    case CallKind::ReduceScatter:
      // A chunk holds the same elements of every rank's slice, slice by slice.
      return inChunks(
          call, capacity / topology_.size, stream,
          [&](size_t first, size_t n) {
            for (int slice = 0; slice < topology_.size; ++slice)
              copy(own + slice * n * element, send + (slice * call.count + first) * element, n);
          },
          [&](size_t first, size_t n) { reduceBuffers(recv + first * element, topology_.rank * n, n); });
    case CallKind::AllGather:
      return inChunks(call, capacity, stream, stageSend, [&](size_t first, size_t n) {
        for (int rank = 0; rank < topology_.size; ++rank) copy(recv + (rank * call.count + first) * element, peer(rank, 0), n);
      });
    case CallKind::Broadcast:
      return inChunks(
          call, capacity, stream,
          [&](size_t first, size_t n) {
            if (topology_.rank == call.root) stageSend(first, n);
          },
          [&](size_t first, size_t n) { copy(recv + first * element, peer(call.root, 0), n); });
    case CallKind::AllToAll:
      break;  // through host memory: the communicator never hands it here
  }
  fail(ncclInternalError, call.describe() + " has no path on device peers");
}

}  // namespace mojoccl
