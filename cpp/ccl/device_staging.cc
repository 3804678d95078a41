#include "device_staging.h"

#include <dlfcn.h>

#include <string>

#include "error.h"

namespace mojoccl {

namespace {

// The two calls staging needs, from whichever runtime the process loaded.
// cuMemcpyAsync and hipMemcpyAsync infer the direction from the addresses
// (unified addressing), so one copy call serves both directions.
class DeviceRuntime {
 public:
  static const DeviceRuntime& get() {
    static const DeviceRuntime runtime;
    if (runtime.synchronize_ == nullptr)
      fail(ncclInvalidUsage,
           "libmojoccl was given device memory (a stream), but neither the CUDA driver "
           "(libcuda.so.1) nor the HIP runtime (libamdhip64.so) is loaded in this process; "
           "pass host memory with a NULL stream");
    return runtime;
  }

  void copy(void* destination, const void* source, size_t bytes, ncclStream_t stream) const {
    check(hipCopy_ != nullptr ? hipCopy_(destination, source, bytes, kHipMemcpyDefault, stream)
                              : cudaCopy_(destination, source, bytes, stream),
          "copy between device and host memory");
  }

  void synchronize(ncclStream_t stream) const { check(synchronize_(stream), "stream synchronize"); }

 private:
  static constexpr int kHipMemcpyDefault = 4;

  DeviceRuntime() {
    // Only a runtime already in the process: its tensors came from it.
    if (void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD)) {
      cudaCopy_ = reinterpret_cast<CudaCopyFn>(dlsym(cuda, "cuMemcpyAsync"));
      cudaErrorString_ = reinterpret_cast<CudaErrorFn>(dlsym(cuda, "cuGetErrorString"));
      setSynchronize(cuda, "cuStreamSynchronize", cudaCopy_ != nullptr, "the CUDA driver");
      return;
    }
    for (const char* soname : {"libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so"}) {
      void* hip = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
      if (hip == nullptr) continue;
      hipCopy_ = reinterpret_cast<HipCopyFn>(dlsym(hip, "hipMemcpyAsync"));
      hipErrorString_ = reinterpret_cast<HipErrorFn>(dlsym(hip, "hipGetErrorString"));
      setSynchronize(hip, "hipStreamSynchronize", hipCopy_ != nullptr, "the HIP runtime");
      return;
    }
  }

  // The runtime counts as found only with both of its calls.
  void setSynchronize(void* library, const char* symbol, bool canCopy, const char* name) {
    if (canCopy) synchronize_ = reinterpret_cast<SyncFn>(dlsym(library, symbol));
    name_ = name;
  }

  void check(int result, const char* what) const {
    if (result == 0) return;
    const char* text = nullptr;
    if (hipErrorString_ != nullptr) text = hipErrorString_(result);
    if (cudaErrorString_ != nullptr) cudaErrorString_(result, &text);
    fail(ncclUnhandledCudaError, std::string(what) + " failed in " + name_ + ": " +
                                     (text != nullptr ? text : "error " + std::to_string(result)));
  }

  using CudaCopyFn = int (*)(void*, const void*, size_t, void*);
  using HipCopyFn = int (*)(void*, const void*, size_t, int, void*);
  using SyncFn = int (*)(void*);
  using CudaErrorFn = int (*)(int, const char**);
  using HipErrorFn = const char* (*)(int);
  CudaCopyFn cudaCopy_ = nullptr;
  HipCopyFn hipCopy_ = nullptr;
  SyncFn synchronize_ = nullptr;
  CudaErrorFn cudaErrorString_ = nullptr;
  HipErrorFn hipErrorString_ = nullptr;
  const char* name_ = "";
};

}  // namespace

DeviceStaging::DeviceStaging(ncclStream_t stream) : stream_(stream) {
  if (stream_ != nullptr) DeviceRuntime::get();  // fails now if there is none
}

DeviceStaging::~DeviceStaging() = default;

void* DeviceStaging::hostBuffer(size_t bytes) {
  buffers_.emplace_back(new char[bytes > 0 ? bytes : 1]);
  return buffers_.back().get();
}

const void* DeviceStaging::input(const void* data, size_t bytes) {
  if (stream_ == nullptr || bytes == 0) return data;
  void* host = hostBuffer(bytes);
  const DeviceRuntime& runtime = DeviceRuntime::get();
  runtime.copy(host, data, bytes, stream_);  // after the stream's earlier work
  runtime.synchronize(stream_);
  return host;
}

void* DeviceStaging::output(void* data, size_t bytes) {
  if (stream_ == nullptr || bytes == 0) return data;
  void* host = hostBuffer(bytes);
  results_.push_back({data, host, bytes});
  return host;
}

void DeviceStaging::finish() {
  if (stream_ == nullptr) return;
  const DeviceRuntime& runtime = DeviceRuntime::get();
  for (const Result& result : results_) runtime.copy(result.device, result.host, result.bytes, stream_);
  // The host buffers go when this object does: the copies must end first.
  runtime.synchronize(stream_);
  results_.clear();
}

}  // namespace mojoccl
