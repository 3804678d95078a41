#include "ccl_library.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>

#include <mutex>

namespace torch_mojo {

namespace {

template <typename Function>
void resolve(void* handle, const std::string& path, const char* name, Function& slot) {
  void* symbol = dlsym(handle, name);
  if (symbol == nullptr)
    throw std::runtime_error(path + " has no " + name +
                             ": it is not a collective library with NCCL's C API");
  slot = reinterpret_cast<Function>(symbol);
}

// The directory this library (torch_mojo/lib/libtorch_mojo_backend.so) was
// loaded from, where libmojoccl.so lies beside it.
std::string libraryDirectory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&libraryDirectory), &info) == 0 || info.dli_fname == nullptr)
    throw std::runtime_error("cannot tell where libtorch_mojo_backend.so was loaded from");
  std::string file = info.dli_fname;
  return file.substr(0, file.find_last_of('/'));
}

}  // namespace

CclLibrary::CclLibrary(const std::string& path, const std::string& kind) : kind_(kind) {
  char resolved[PATH_MAX];
  path_ = realpath(path.c_str(), resolved) != nullptr ? resolved : path;
  handle_ = dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr)
    throw std::runtime_error("cannot load the collective library " + path_ + ": " + dlerror());
  resolve(handle_, path_, "ncclGetVersion", api_.getVersion);
  resolve(handle_, path_, "ncclGetUniqueId", api_.getUniqueId);
  resolve(handle_, path_, "ncclCommInitRank", api_.commInitRank);
  resolve(handle_, path_, "ncclCommDestroy", api_.commDestroy);
  resolve(handle_, path_, "ncclCommAbort", api_.commAbort);
  resolve(handle_, path_, "ncclCommGetAsyncError", api_.commGetAsyncError);
  resolve(handle_, path_, "ncclGetErrorString", api_.getErrorString);
  resolve(handle_, path_, "ncclGetLastError", api_.getLastError);
  resolve(handle_, path_, "ncclCommCount", api_.commCount);
  resolve(handle_, path_, "ncclCommUserRank", api_.commUserRank);
  resolve(handle_, path_, "ncclAllReduce", api_.allReduce);
  resolve(handle_, path_, "ncclBroadcast", api_.broadcast);
  resolve(handle_, path_, "ncclAllGather", api_.allGather);
  resolve(handle_, path_, "ncclReduceScatter", api_.reduceScatter);
  resolve(handle_, path_, "ncclReduce", api_.reduce);
  resolve(handle_, path_, "ncclSend", api_.send);
  resolve(handle_, path_, "ncclRecv", api_.recv);
  resolve(handle_, path_, "ncclGroupStart", api_.groupStart);
  resolve(handle_, path_, "ncclGroupEnd", api_.groupEnd);
  api_.memAlloc = reinterpret_cast<decltype(api_.memAlloc)>(dlsym(handle_, "ncclMemAlloc"));
  api_.memFree = reinterpret_cast<decltype(api_.memFree)>(dlsym(handle_, "ncclMemFree"));
  api_.recvAny = reinterpret_cast<decltype(api_.recvAny)>(dlsym(handle_, "mojocclRecvAny"));
  api_.failedRanks =
      reinterpret_cast<decltype(api_.failedRanks)>(dlsym(handle_, "mojocclCommFailedRanks"));
  api_.coreSharing = reinterpret_cast<decltype(api_.coreSharing)>(dlsym(handle_, "mojocclCommCoreSharing"));
  api_.rejected = reinterpret_cast<decltype(api_.rejected)>(dlsym(handle_, "mojocclCommRejected"));
  api_.settingInt = reinterpret_cast<decltype(api_.settingInt)>(dlsym(handle_, "mojocclSettingInt"));
  api_.allToAllv = reinterpret_cast<decltype(api_.allToAllv)>(dlsym(handle_, "ncclAllToAllv"));
  check(api_.getVersion(&version_), "ncclGetVersion", nullptr);
}

CclLibrary::~CclLibrary() {
  // Never dlclose: communicators' threads may still run library code at exit.
}

void CclLibrary::check(ncclResult_t result, const char* call, ncclComm_t comm) const {
  if (result == ncclSuccess) return;
  // The library's own text says what happened; the generic string for the
  // result code is the fallback.
  const char* details = api_.getLastError(comm);
  bool detailed = details != nullptr && details[0] != '\0';
  throw CclError(result, std::string(call) + " failed: " +
                             (detailed ? details : api_.getErrorString(result)));
}

int64_t CclLibrary::settingInt(const char* name) const {
  if (api_.settingInt == nullptr) throw CclError(ncclInvalidUsage, path_ + " is not libmojoccl: it has no " + name);
  int64_t value = 0;
  check(api_.settingInt(name, &value), "mojocclSettingInt", nullptr);
  return value;
}

std::shared_ptr<CclLibrary> hostCollectiveLibrary() {
  static std::once_flag once;
  static std::shared_ptr<CclLibrary> library;
  std::call_once(once, [] {
    library = std::make_shared<CclLibrary>(libraryDirectory() + "/libmojoccl.so", "mojoccl");
  });
  return library;
}

}  // namespace torch_mojo
