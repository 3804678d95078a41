#include "device/gpu_reduce.h"

#include <dirent.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

#include "base/error.h"
#include "device/runtime.h"

namespace mojoccl {

namespace {

constexpr unsigned kBlock = 256;
// Enough blocks to fill any current GPU; the kernel's grid-stride loop
// covers the rest.
constexpr size_t kMaxGrid = 4096;

struct LoadedKernel {
  void* function = nullptr;
  std::string unavailable;  // why not, when function is null
};

std::string readFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << file.rdbuf();
  return bytes.str();
}

// gpu_kernels/ beside this library.
std::string imagesDirectory() {
  Dl_info self{};
  dladdr(reinterpret_cast<void*>(&reduceOnDevice), &self);
  std::string library = self.dli_fname != nullptr ? self.dli_fname : "";
  return library.substr(0, library.rfind('/') + 1) + "gpu_kernels";
}

// reduce.<target><suffix> in `directory`, sorted.
std::vector<std::string> imagesIn(const std::string& directory, const std::string& suffix) {
  std::vector<std::string> names;
  if (DIR* listing = opendir(directory.c_str())) {
    while (dirent* entry = readdir(listing)) {
      std::string name = entry->d_name;
      if (name.rfind("reduce.", 0) == 0 && name.size() > suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
        names.push_back(name);
    }
    closedir(listing);
  }
  std::sort(names.begin(), names.end());
  return names;
}

LoadedKernel load(const DeviceRuntime& runtime) {
  const std::string directory = imagesDirectory();
  std::string tried;
  for (const std::string& suffix : runtime.imageSuffixes()) {
    for (const std::string& name : imagesIn(directory, suffix)) {
      const std::string stem = directory + "/" + name.substr(0, name.size() - suffix.size());
      std::string why, entry = readFile(stem + ".entry");
      entry.erase(entry.find_last_not_of(" \r\n") + 1);
      // PTX is text the driver reads up to its terminating NUL.
      void* module = entry.empty() ? nullptr : runtime.loadModule(readFile(directory + "/" + name) + '\0', &why);
      if (module != nullptr) {
        if (void* function = runtime.function(module, entry, &why)) return {function, ""};
        runtime.unloadModule(module);  // built apart from its .entry: try the next image
      }
      if (entry.empty()) why = "no entry point name in " + stem + ".entry";
      tried += (tried.empty() ? "" : ", ") + name + " (" + why + ")";
    }
  }
  if (tried.empty())
    return {nullptr, "no GPU kernel images for this GPU's vendor in " + directory +
                         ": torch-mojo was built without MAX (pip install max-core) or for the other GPU vendor"};
  return {nullptr, "this GPU loads none of the GPU kernel images in " + directory + ": " + tried +
                       "; rebuild torch-mojo with TORCH_MOJO_GPU_TARGETS naming this GPU's architecture"};
}

// One load per device (CUDA context), kept for the life of the process.
const LoadedKernel& kernelForCurrentDevice() {
  static std::mutex mutex;
  static std::map<uintptr_t, LoadedKernel> loaded;
  const DeviceRuntime& runtime = DeviceRuntime::get();
  const uintptr_t device = runtime.currentDevice();
  std::lock_guard<std::mutex> lock(mutex);
  auto found = loaded.find(device);
  if (found == loaded.end()) found = loaded.emplace(device, load(runtime)).first;
  return found->second;
}

}  // namespace

std::string deviceKernelUnavailable() { return kernelForCurrentDevice().unavailable; }

void reduceOnDevice(void* dst, const void* const* sources, int nsources, size_t count,
                    ncclDataType_t datatype, ncclRedOp_t op, int divisor, ncclStream_t stream) {
  if (nsources < 1 || nsources > kMaxDeviceSources)
    fail(ncclInternalError, "the GPU kernel takes 1 to " + std::to_string(kMaxDeviceSources) +
                                " sources, not " + std::to_string(nsources));
  if (count == 0) return;
  const LoadedKernel& kernel = kernelForCurrentDevice();
  if (kernel.function == nullptr) fail(ncclInvalidUsage, kernel.unavailable);
  // The kernel's parameters, in order (kernels/gpu_reduce.mojo).
  void* destination = dst;
  uint64_t addresses[kMaxDeviceSources] = {};
  for (int s = 0; s < nsources; ++s) addresses[s] = reinterpret_cast<uintptr_t>(sources[s]);
  int32_t sourceCount = nsources, dtype = datatype, operation = op;
  int64_t elements = static_cast<int64_t>(count), avgDivisor = divisor;
  void* arguments[] = {&destination, addresses, &sourceCount, &elements, &dtype, &operation, &avgDivisor};
  const size_t grid = std::min(kMaxGrid, (count + kBlock - 1) / kBlock);
  DeviceRuntime::get().launch(kernel.function, static_cast<unsigned>(grid), kBlock, arguments, stream);
}

}  // namespace mojoccl
