// Device memory handed to libmojoccl with a stream, as NCCL's API hands GPU
// buffers. libmojoccl's algorithms move host memory, so a call on device
// memory goes through host buffers: the stream's earlier work ends, the
// inputs are copied out, the host collective runs, and the results are
// copied back before the call returns. The call is therefore synchronous
// on its stream, where NCCL's would only be enqueued on it.
//
// The copies use the runtime the process already loaded for its tensors
// (runtime.h).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "mojoccl/nccl.h"

namespace mojoccl {

class DeviceStaging {
 public:
  // A null stream means host memory: every buffer is used as it is.
  explicit DeviceStaging(ncclStream_t stream);
  ~DeviceStaging();
  DeviceStaging(const DeviceStaging&) = delete;
  DeviceStaging& operator=(const DeviceStaging&) = delete;

  // The host copy of the `bytes` at `data`, copied now.
  const void* input(const void* data, size_t bytes);
  // A host buffer for a result that finish() copies to `data`.
  void* output(void* data, size_t bytes);
  // Copies the results back; the stream is idle when it returns.
  void finish();

 private:
  struct Result {
    void* device;
    const void* host;
    size_t bytes;
  };
  void* hostBuffer(size_t bytes);

  ncclStream_t stream_;
  std::vector<std::unique_ptr<char[]>> buffers_;
  std::vector<Result> results_;
};

}  // namespace mojoccl
