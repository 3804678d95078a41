// The calls of a GPU runtime that libmojoccl makes on device memory
// (cpp/ccl/device_runtime.cc), for the emulated device. Built twice: as the
// HIP runtime (soname libamdhip64.so.6) and, with EMULATED_CUDA, as the CUDA
// driver (soname libcuda.so.1), each with that runtime's names, so that
// loading one makes it "the runtime this process has loaded". Copies and
// kernels are queued on the emulated stream, in order with the rest of its
// work, as on a GPU stream.
//
// - Allocated memory is a shared memory file, so that another process can
//   map it from its IPC handle (the process id and file descriptor), as
//   the IPC calls map a peer's GPU memory.
// - Loading a module takes what the real runtime takes: an AMD GPU code
//   object for HIP (the kernel found by its descriptor, <name>.kd), PTX text
//   for CUDA (the kernel found by its .entry). A launch then runs the
//   kernel's own code compiled for the CPU (tests/gpu_kernel/on_cpu.mojo,
//   EMULATED_GPU_KERNEL_ON_CPU), with the grid's thread count, on the
//   arguments exactly as the caller packed them.
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "stream.h"

#define EXPORT extern "C" __attribute__((visibility("default")))
#ifdef EMULATED_CUDA
#define RUNTIME(cuda, hip) cuda
#else
#define RUNTIME(cuda, hip) hip
#endif

namespace {

struct Copy {
  void* destination;
  const void* source;
  size_t bytes;
};

struct Signal {
  std::mutex mutex;
  std::condition_variable reached;
  bool done = false;
};

}  // namespace

#ifdef EMULATED_CUDA
EXPORT int cuMemcpyAsync(void* destination, const void* source, size_t bytes, void* stream) {
#else
EXPORT int hipMemcpyAsync(void* destination, const void* source, size_t bytes, int /*kind*/, void* stream) {
#endif
  auto* target = static_cast<EmulatedStream*>(stream);
  target->enqueue(target, [](void* argument) {
    auto* copy = static_cast<Copy*>(argument);
    std::memcpy(copy->destination, copy->source, copy->bytes);
    delete copy;
  }, new Copy{destination, source, bytes});
  return 0;
}

EXPORT int RUNTIME(cuStreamSynchronize, hipStreamSynchronize)(void* stream) {
  auto* target = static_cast<EmulatedStream*>(stream);
  Signal signal;
  target->enqueue(target, [](void* argument) {
    auto* reached = static_cast<Signal*>(argument);
    std::lock_guard<std::mutex> lock(reached->mutex);
    reached->done = true;
    reached->reached.notify_all();
  }, &signal);
  std::unique_lock<std::mutex> lock(signal.mutex);
  signal.reached.wait(lock, [&] { return signal.done; });
  return 0;
}

namespace {
const char* errorText(int error) {
  switch (error) {
    case 2: return "out of memory (emulated)";
    case 209: return "no kernel image is available for execution on the device (emulated)";
    case 500: return "named symbol not found (emulated)";
    default: return "emulated GPU runtime error";
  }
}
}  // namespace

#ifdef EMULATED_CUDA
EXPORT int cuGetErrorString(int error, const char** text) {
  *text = errorText(error);
  return 0;
}

EXPORT int cuCtxGetCurrent(void** context) {
  static int theContext;
  *context = &theContext;
  return 0;
}
#else
EXPORT const char* hipGetErrorString(int error) { return errorText(error); }

EXPORT int hipGetLastError() { return 0; }

EXPORT int hipGetDevice(int* device) {
  *device = 0;
  return 0;
}
#endif

// ---- memory another process can map

namespace {

struct Handle {  // fills the 64 bytes of an IPC memory handle
  int32_t pid;
  int32_t fd;
  uint64_t bytes;
  char unused[48];
};

std::mutex mappingsMutex;
std::map<void*, Handle> mappings;  // allocated and opened memory

}  // namespace

EXPORT int RUNTIME(cuMemAlloc_v2, hipMalloc)(void** device, size_t bytes) {
  if (std::getenv("EMULATED_GPU_OUT_OF_MEMORY") != nullptr) return 2;  // for the tests: a full device
  int fd = memfd_create("emulated-hip", 0);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) return 2;  // out of memory
  void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (memory == MAP_FAILED) return 2;
  std::lock_guard<std::mutex> lock(mappingsMutex);
  mappings[memory] = Handle{getpid(), fd, bytes, {}};
  *device = memory;
  return 0;
}

EXPORT int RUNTIME(cuMemFree_v2, hipFree)(void* device) {
  std::lock_guard<std::mutex> lock(mappingsMutex);
  auto found = mappings.find(device);
  if (found == mappings.end()) return 1;
  munmap(device, found->second.bytes);
  close(found->second.fd);
  mappings.erase(found);
  return 0;
}

EXPORT int RUNTIME(cuIpcGetMemHandle, hipIpcGetMemHandle)(Handle* handle, void* device) {
  std::lock_guard<std::mutex> lock(mappingsMutex);
  auto found = mappings.find(device);
  if (found == mappings.end()) return 1;  // invalid value
  *handle = found->second;
  return 0;
}

EXPORT int RUNTIME(cuIpcOpenMemHandle_v2, hipIpcOpenMemHandle)(void** device, Handle handle, unsigned /*flags*/) {
  if (handle.pid == getpid()) return 1;  // as on a GPU: not in the process that made it
  std::string path = "/proc/" + std::to_string(handle.pid) + "/fd/" + std::to_string(handle.fd);
  int fd = open(path.c_str(), O_RDWR);
  if (fd < 0) return 1;
  void* memory = mmap(nullptr, handle.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (memory == MAP_FAILED) return 1;
  std::lock_guard<std::mutex> lock(mappingsMutex);
  mappings[memory] = Handle{getpid(), fd, handle.bytes, {}};
  *device = memory;
  return 0;
}

EXPORT int RUNTIME(cuIpcCloseMemHandle, hipIpcCloseMemHandle)(void* device) {
  return RUNTIME(cuMemFree_v2, hipFree)(device);
}

// ---- the kernel

namespace {

using KernelOnCpu = int32_t (*)(void*, const void*, int32_t, int64_t, int32_t, int32_t, int64_t, int64_t);

struct Module {
  std::string image;
};

struct Launch {
  KernelOnCpu kernel;
  void* dst;
  uint64_t sources[16];
  int32_t nsources;
  int64_t count;
  int32_t dtype, op;
  int64_t divisor;
  int64_t threads;
};

std::atomic<int64_t> launches{0};

}  // namespace

// An ELF image's machine (EM_CUDA 190, EM_AMDGPU 224), or 0 for text; and
// its size, from its section headers (they come last).
uint16_t elfMachine(const void* image) {
  const auto* header = static_cast<const unsigned char*>(image);
  if (std::memcmp(header, "\x7f" "ELF", 4) != 0) return 0;
  return static_cast<uint16_t>(header[18] | header[19] << 8);
}

size_t elfSize(const void* image) {
  const auto* header = static_cast<const unsigned char*>(image);
  uint64_t sectionHeaders;
  uint16_t entrySize, count;
  std::memcpy(&sectionHeaders, header + 40, 8);
  std::memcpy(&entrySize, header + 58, 2);
  std::memcpy(&count, header + 60, 2);
  return sectionHeaders + uint64_t(entrySize) * count;
}

// What the real runtime takes: for CUDA, machine code (a cubin) or PTX text
// for an sm_ target; for HIP, an AMD GPU code object.
EXPORT int RUNTIME(cuModuleLoadData, hipModuleLoadData)(Module** module, const void* image) {
  const uint16_t machine = elfMachine(image);
  if (machine == RUNTIME(190, 224)) {
    *module = new Module{std::string(static_cast<const char*>(image), elfSize(image))};
    return 0;
  }
  const std::string text = machine == 0 ? static_cast<const char*>(image) : "";
  if (!RUNTIME(text.find(".target sm_") != std::string::npos, false)) return 209;
  *module = new Module{text};
  return 0;
}

EXPORT int RUNTIME(cuModuleUnload, hipModuleUnload)(Module* module) {
  delete module;
  return 0;
}

// The kernel by its name in the image: a PTX .entry, a cubin's symbol, or an
// AMD code object's kernel descriptor (<name>.kd).
EXPORT int RUNTIME(cuModuleGetFunction, hipModuleGetFunction)(KernelOnCpu* function, Module* module,
                                                                const char* name) {
  const bool elf = elfMachine(module->image.data()) != 0;
  const std::string symbol = std::string(name) + RUNTIME(std::string(1, '\0'), ".kd");
  const std::string declared = elf ? symbol : ".entry " + std::string(name) + "(";
  if (module->image.find(declared) == std::string::npos) return 500;
  const char* path = std::getenv("EMULATED_GPU_KERNEL_ON_CPU");
  void* library = path != nullptr ? dlopen(path, RTLD_NOW) : nullptr;
  *function = library != nullptr ? reinterpret_cast<KernelOnCpu>(dlsym(library, "tm_gpu_reduce_on_cpu")) : nullptr;
  return *function != nullptr ? 0 : 500;
}

EXPORT int RUNTIME(cuLaunchKernel, hipModuleLaunchKernel)(KernelOnCpu function, unsigned gridX, unsigned gridY,
                                                         unsigned gridZ, unsigned blockX, unsigned blockY,
                                                         unsigned blockZ, unsigned /*sharedBytes*/, void* stream,
                                                         void** arguments, void** /*extra*/) {
  if (gridY != 1 || gridZ != 1 || blockY != 1 || blockZ != 1) return 1;
  // The arguments are read now: they live on the caller's stack.
  auto* launch = new Launch{function, *static_cast<void**>(arguments[0]), {},
                            *static_cast<int32_t*>(arguments[2]), *static_cast<int64_t*>(arguments[3]),
                            *static_cast<int32_t*>(arguments[4]), *static_cast<int32_t*>(arguments[5]),
                            *static_cast<int64_t*>(arguments[6]), int64_t(gridX) * blockX};
  std::memcpy(launch->sources, arguments[1], sizeof(launch->sources));
  auto* target = static_cast<EmulatedStream*>(stream);
  target->enqueue(target, [](void* argument) {
    auto* run = static_cast<Launch*>(argument);
    if (run->kernel(run->dst, run->sources, run->nsources, run->count, run->dtype, run->op, run->divisor,
                    run->threads) != 0)
      std::abort();  // a bad code would be a fault on a GPU
    launches.fetch_add(1);
    delete run;
  }, launch);
  return 0;
}

// For the tests: how many kernels ran in this process.
EXPORT int64_t emulatedKernelLaunches() { return launches.load(); }
