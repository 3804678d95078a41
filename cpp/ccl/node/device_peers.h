// Collectives of device memory within one node, on the GPUs themselves
// (MOJOCCL_DEVICE_PEERS=1). Every rank has a buffer on its GPU that the
// others map (device/device_ipc.h). A collective runs in chunks: each
// rank stages its part of the chunk in its buffer, and once every rank has,
// each reads the buffers it needs, straight from the peers' GPUs: the Mojo
// GPU kernel reduces them (all-reduce, reduce-scatter, reduce: every rank
// combines the buffers in rank order, so results are bit-identical across
// ranks, as on the host path) or the runtime copies them (all-gather,
// broadcast).
//
// The node's host collectives order the steps (a one-integer all-reduce
// after staging, and another after reading, so that no rank overwrites its
// buffer while a peer still reads it): a call is synchronous on its
// stream, like the staged path, but its data never leaves the GPUs.
#pragma once

#include <functional>
#include <memory>

#include "algorithms/call.h"
#include "device/device_ipc.h"
#include "mojoccl/nccl.h"
#include "node/node.h"
#include "node/topology.h"

namespace mojoccl {

class DevicePeers {
 public:
  // Collective over the node's ranks (the whole communicator), once: every
  // rank offers its buffer and maps the others', and the ranks take the
  // device path only if all of them managed to (a failure on one rank must
  // not leave the others waiting for it). Null, with the reason printed,
  // where some rank cannot; `setUp` numbers the set-up's own steps.
  static std::unique_ptr<DevicePeers> open(const Topology& topology, NodeCollectives& node, const Call& setUp);

  // `call` on device memory, synchronous on `stream`.
  void run(const Call& call, ncclStream_t stream);

 private:
  DevicePeers(const Topology& topology, NodeCollectives& node, std::unique_ptr<DeviceIpcBuffers> buffers)
      : topology_(topology), node_(node), buffers_(std::move(buffers)) {}
  // Every rank learns, before any rank reads another's buffer, whether all
  // issued this call (a mismatch is the same MismatchError as on the host path).
  void agreeOnCall(const Call& call);
  void barrier(const Call& call);
  // For each chunk of at most `chunk` of the call's elements: `stage` fills
  // this rank's buffer, then, once every rank's is full (and, at the first,
  // every rank agrees on the call), `read` reads them.
  void inChunks(const Call& call, size_t chunk, ncclStream_t stream, const std::function<void(size_t, size_t)>& stage,
                const std::function<void(size_t, size_t)>& read);

  const Topology& topology_;
  NodeCollectives& node_;
  std::unique_ptr<DeviceIpcBuffers> buffers_;
};

}  // namespace mojoccl
