#include "device/runtime.h"

#include <dlfcn.h>

#include "base/error.h"

namespace mojoccl {

namespace {
constexpr int kHipMemcpyDefault = 4;
constexpr unsigned kIpcLazyEnablePeerAccess = 1;  // same value in CUDA and HIP
}  // namespace

const DeviceRuntime& DeviceRuntime::get() {
  static const DeviceRuntime runtime;
  if (runtime.synchronize_ == nullptr || (runtime.copy_ == nullptr && runtime.hipCopy_ == nullptr))
    fail(ncclInvalidUsage,
         "libmojoccl was given device memory (a stream), but neither the CUDA driver "
         "(libcuda.so.1) nor the HIP runtime (libamdhip64.so) is loaded in this process; "
         "pass host memory with a NULL stream");
  return runtime;
}

template <typename Fn>
void DeviceRuntime::bind(Fn& slot, void* library, const char* cudaName, const char* hipName) {
  slot = reinterpret_cast<Fn>(dlsym(library, hip_ ? hipName : cudaName));
}

DeviceRuntime::DeviceRuntime() {
  // Only a runtime already in the process: its tensors came from it.
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  for (const char* soname : {"libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so"}) {
    if (library != nullptr) break;
    library = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
    hip_ = library != nullptr;
  }
  if (library == nullptr) return;
  name_ = hip_ ? "the HIP runtime" : "the CUDA driver";
  if (hip_)
    hipCopy_ = reinterpret_cast<decltype(hipCopy_)>(dlsym(library, "hipMemcpyAsync"));
  else
    copy_ = reinterpret_cast<decltype(copy_)>(dlsym(library, "cuMemcpyAsync"));
  // CUDA's versioned names are the ones its header maps the plain names to.
  bind(synchronize_, library, "cuStreamSynchronize", "hipStreamSynchronize");
  bind(allocate_, library, "cuMemAlloc_v2", "hipMalloc");
  bind(release_, library, "cuMemFree_v2", "hipFree");
  bind(ipcHandle_, library, "cuIpcGetMemHandle", "hipIpcGetMemHandle");
  bind(openIpc_, library, "cuIpcOpenMemHandle_v2", "hipIpcOpenMemHandle");
  bind(closeIpc_, library, "cuIpcCloseMemHandle", "hipIpcCloseMemHandle");
  bind(loadModule_, library, "cuModuleLoadData", "hipModuleLoadData");
  bind(function_, library, "cuModuleGetFunction", "hipModuleGetFunction");
  bind(unloadModule_, library, "cuModuleUnload", "hipModuleUnload");
  bind(launch_, library, "cuLaunchKernel", "hipModuleLaunchKernel");
  if (hip_) {
    currentDevice_ = reinterpret_cast<decltype(currentDevice_)>(dlsym(library, "hipGetDevice"));
    hipLastError_ = reinterpret_cast<decltype(hipLastError_)>(dlsym(library, "hipGetLastError"));
    hipErrorString_ = reinterpret_cast<decltype(hipErrorString_)>(dlsym(library, "hipGetErrorString"));
  } else {
    currentContext_ = reinterpret_cast<decltype(currentContext_)>(dlsym(library, "cuCtxGetCurrent"));
    cudaErrorString_ = reinterpret_cast<decltype(cudaErrorString_)>(dlsym(library, "cuGetErrorString"));
  }
}

std::string DeviceRuntime::failure(int result) const {
  if (hipLastError_ != nullptr) hipLastError_();
  const char* text = nullptr;
  if (hipErrorString_ != nullptr) text = hipErrorString_(result);
  if (cudaErrorString_ != nullptr) cudaErrorString_(result, &text);
  return text != nullptr ? text : "error " + std::to_string(result);
}

void DeviceRuntime::check(int result, const std::string& what) const {
  if (result != 0)
    fail(ncclUnhandledCudaError, what + " failed in " + name_ + ": " + failure(result));
}

template <typename Fn>
static Fn required(Fn call, const char* what, const char* runtime) {
  if (call == nullptr)
    fail(ncclInvalidUsage, std::string(runtime) + " in this process lacks " + what);
  return call;
}

void DeviceRuntime::copy(void* destination, const void* source, size_t bytes,
                         ncclStream_t stream) const {
  check(hipCopy_ != nullptr ? hipCopy_(destination, source, bytes, kHipMemcpyDefault, stream)
                            : copy_(destination, source, bytes, stream),
        "copy between device and host memory");
}

void DeviceRuntime::synchronize(ncclStream_t stream) const {
  check(synchronize_(stream), "stream synchronize");
}

void* DeviceRuntime::allocate(size_t bytes) const {
  void* device = nullptr;
  check(required(allocate_, "memory allocation", name_)(&device, bytes),
        "allocating " + std::to_string(bytes) + " bytes of device memory");
  return device;
}

void DeviceRuntime::release(void* device) const {
  if (device != nullptr && release_ != nullptr) release_(device);
}

IpcHandle DeviceRuntime::ipcHandle(void* device) const {
  IpcHandle handle{};
  check(required(ipcHandle_, "IPC memory handles", name_)(&handle, device), "IPC handle of device memory");
  return handle;
}

void* DeviceRuntime::openIpc(const IpcHandle& handle) const {
  void* device = nullptr;
  check(required(openIpc_, "IPC memory handles", name_)(&device, handle, kIpcLazyEnablePeerAccess),
        "opening a peer's device memory");
  return device;
}

void DeviceRuntime::closeIpc(void* device) const {
  if (device != nullptr && closeIpc_ != nullptr) closeIpc_(device);
}

uintptr_t DeviceRuntime::currentDevice() const {
  if (hip_) {
    int device = 0;
    check(required(currentDevice_, "hipGetDevice", name_)(&device), "hipGetDevice");
    return static_cast<uintptr_t>(device) + 1;
  }
  void* context = nullptr;
  check(required(currentContext_, "cuCtxGetCurrent", name_)(&context), "cuCtxGetCurrent");
  return reinterpret_cast<uintptr_t>(context);
}

void* DeviceRuntime::loadModule(const std::string& image, std::string* why) const {
  void* module = nullptr;
  int result = required(loadModule_, "module loading", name_)(&module, image.data());
  if (result == 0) return module;
  *why = failure(result);
  return nullptr;
}

void* DeviceRuntime::function(void* module, const std::string& name, std::string* why) const {
  void* function = nullptr;
  int result = required(function_, "module functions", name_)(&function, module, name.c_str());
  if (result == 0) return function;
  *why = "no kernel " + name + ": " + failure(result);
  return nullptr;
}

void DeviceRuntime::unloadModule(void* module) const {
  if (unloadModule_ != nullptr) unloadModule_(module);
}

void DeviceRuntime::launch(void* function, unsigned grid, unsigned block, void** arguments,
                           ncclStream_t stream) const {
  check(required(launch_, "kernel launches", name_)(function, grid, 1, 1, block, 1, 1, 0, stream,
                                                    arguments, nullptr),
        "launching the reduction kernel");
}

}  // namespace mojoccl
