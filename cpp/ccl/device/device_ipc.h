// GPU memory shared by the ranks of one node: each rank allocates a buffer
// on its device, and maps every other rank's through the runtime's IPC
// handles (cuIpcOpenMemHandle / hipIpcOpenMemHandle), so that a kernel on
// any rank can read all of them. The handles travel over the host
// communicator; this class knows nothing of collectives.
#pragma once

#include <cstddef>
#include <vector>

#include "device/runtime.h"

namespace mojoccl {

class DeviceIpcBuffers {
 public:
  // Allocates this rank's buffer on the current device.
  explicit DeviceIpcBuffers(size_t bytes);
  ~DeviceIpcBuffers();
  DeviceIpcBuffers(const DeviceIpcBuffers&) = delete;
  DeviceIpcBuffers& operator=(const DeviceIpcBuffers&) = delete;

  // What the other ranks need to map this rank's buffer.
  IpcHandle handle() const;
  // Maps the others' buffers: `handles` in rank order, this rank's at `self`.
  void open(const std::vector<IpcHandle>& handles, int self);

  size_t bytes() const { return bytes_; }
  char* own() const { return static_cast<char*>(buffers_[self_]); }
  // Every rank's buffer in rank order, as this process addresses it.
  const void* const* all() const { return buffers_.data(); }

 private:
  size_t bytes_;
  int self_ = 0;
  std::vector<void*> buffers_;  // before open(): this rank's alone
};

}  // namespace mojoccl
