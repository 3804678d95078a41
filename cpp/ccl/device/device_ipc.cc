#include "device/device_ipc.h"

namespace mojoccl {

DeviceIpcBuffers::DeviceIpcBuffers(size_t bytes)
    : bytes_(bytes), buffers_{DeviceRuntime::get().allocate(bytes)} {}

DeviceIpcBuffers::~DeviceIpcBuffers() {
  const DeviceRuntime& runtime = DeviceRuntime::get();
  for (size_t rank = 0; rank < buffers_.size(); ++rank) {
    if (static_cast<int>(rank) == self_)
      runtime.release(buffers_[rank]);
    else
      runtime.closeIpc(buffers_[rank]);
  }
}

IpcHandle DeviceIpcBuffers::handle() const { return DeviceRuntime::get().ipcHandle(own()); }

void DeviceIpcBuffers::open(const std::vector<IpcHandle>& handles, int self) {
  void* mine = buffers_[0];
  buffers_.assign(handles.size(), nullptr);
  self_ = self;
  buffers_[self] = mine;
  for (size_t rank = 0; rank < handles.size(); ++rank)
    if (static_cast<int>(rank) != self) buffers_[rank] = DeviceRuntime::get().openIpc(handles[rank]);
}

}  // namespace mojoccl
