// The GPU runtime the process already loaded for its tensors: the CUDA
// driver (libcuda.so.1) on NVIDIA, the HIP runtime (libamdhip64) on AMD,
// found with dlopen(RTLD_NOLOAD). libmojoccl needs no GPU headers or
// libraries to build, and never loads a runtime of its own: device memory
// it is handed came from the one already there.
//
// Calls take the caller's current device (CUDA: the current context, HIP:
// the current device), as the vendor libraries do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mojoccl/nccl.h"

namespace mojoccl {

// cuIpcMemHandle / hipIpcMemHandle_t: 64 opaque bytes in both runtimes.
struct IpcHandle {
  char bytes[64];
};

class DeviceRuntime {
 public:
  // The loaded runtime; fails with ncclInvalidUsage when there is none.
  static const DeviceRuntime& get();

  bool isHip() const { return hip_; }
  // Suffixes of the GPU kernel images this runtime loads, best first:
  // machine code before PTX, which the driver must compile first.
  std::vector<std::string> imageSuffixes() const {
    return hip_ ? std::vector<std::string>{".hsaco"} : std::vector<std::string>{".cubin", ".ptx"};
  }

  // Copies in either direction (unified addressing), ordered on `stream`.
  void copy(void* destination, const void* source, size_t bytes, ncclStream_t stream) const;
  void synchronize(ncclStream_t stream) const;

  void* allocate(size_t bytes) const;
  void release(void* device) const;
  IpcHandle ipcHandle(void* device) const;
  void* openIpc(const IpcHandle& handle) const;
  void closeIpc(void* device) const;

  // Names the current device (context) for caches of loaded modules.
  uintptr_t currentDevice() const;
  // nullptr, with `why` set, when the image does not load (another GPU architecture).
  void* loadModule(const std::string& image, std::string* why) const;
  // nullptr, with `why` set, when the module has no such kernel.
  void* function(void* module, const std::string& name, std::string* why) const;
  void unloadModule(void* module) const;
  void launch(void* function, unsigned grid, unsigned block, void** arguments, ncclStream_t stream) const;

 private:
  DeviceRuntime();
  void check(int result, const std::string& what) const;
  // The text of a failed call's code. HIP also keeps it as the thread's
  // last error, which torch's next kernel launch check would raise as its
  // own: this reads it off, since libmojoccl reports or handles the failure.
  std::string failure(int result) const;
  template <typename Fn>
  void bind(Fn& slot, void* library, const char* cudaName, const char* hipName);

  bool hip_ = false;
  const char* name_ = "";
  // The two runtimes' calls have the same shapes, but for the copy.
  int (*copy_)(void*, const void*, size_t, void*) = nullptr;
  int (*hipCopy_)(void*, const void*, size_t, int, void*) = nullptr;
  int (*synchronize_)(void*) = nullptr;
  int (*allocate_)(void**, size_t) = nullptr;
  int (*release_)(void*) = nullptr;
  int (*ipcHandle_)(IpcHandle*, void*) = nullptr;
  int (*openIpc_)(void**, IpcHandle, unsigned) = nullptr;
  int (*closeIpc_)(void*) = nullptr;
  int (*currentContext_)(void**) = nullptr;  // CUDA
  int (*currentDevice_)(int*) = nullptr;     // HIP
  int (*loadModule_)(void**, const void*) = nullptr;
  int (*function_)(void**, void*, const char*) = nullptr;
  int (*unloadModule_)(void*) = nullptr;
  int (*hipLastError_)() = nullptr;
  int (*launch_)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*,
                 void**, void**) = nullptr;
  int (*cudaErrorString_)(int, const char**) = nullptr;
  const char* (*hipErrorString_)(int) = nullptr;
};

}  // namespace mojoccl
