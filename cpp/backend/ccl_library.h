// The collective library a process group drives, loaded with dlopen and
// called only through NCCL's C API. NCCL, RCCL and libmojoccl all answer
// this table, so the process group never knows which one it has.
//
// No torch headers here: this file compiles in a second.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "mojoccl/nccl.h"

namespace torch_mojo {

// A failed library call: "ncclAllReduce failed: <reason>: <details>".
class CclError : public std::runtime_error {
 public:
  CclError(ncclResult_t code, const std::string& message)
      : std::runtime_error(message), code(code) {}
  ncclResult_t code;
};

struct CclApi {
  ncclResult_t (*getVersion)(int*);
  ncclResult_t (*getUniqueId)(ncclUniqueId*);
  ncclResult_t (*commInitRank)(ncclComm_t*, int, ncclUniqueId, int);
  ncclResult_t (*commDestroy)(ncclComm_t);
  ncclResult_t (*commAbort)(ncclComm_t);
  ncclResult_t (*commGetAsyncError)(ncclComm_t, ncclResult_t*);
  const char* (*getErrorString)(ncclResult_t);
  const char* (*getLastError)(ncclComm_t);
  ncclResult_t (*commCount)(const ncclComm_t, int*);
  ncclResult_t (*commUserRank)(const ncclComm_t, int*);
  ncclResult_t (*allReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            ncclStream_t);
  ncclResult_t (*broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                            ncclStream_t);
  ncclResult_t (*allGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, ncclStream_t);
  ncclResult_t (*reduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                ncclComm_t, ncclStream_t);
  ncclResult_t (*reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t,
                         ncclStream_t);
  ncclResult_t (*send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, ncclStream_t);
  ncclResult_t (*recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, ncclStream_t);
  ncclResult_t (*groupStart)();
  ncclResult_t (*groupEnd)();
  // Optional (NCCL 2.19+): null when the library lacks them.
  ncclResult_t (*memAlloc)(void**, size_t);
  ncclResult_t (*memFree)(void*);
  // libmojoccl's own: a receive from any rank; the ranks that failed; the
  // ranks that share this rank's cores; what it turned away.
  ncclResult_t (*recvAny)(void*, size_t, ncclDataType_t, int*, ncclComm_t, ncclStream_t);
  ncclResult_t (*failedRanks)(ncclComm_t, int*, int*);
  ncclResult_t (*coreSharing)(ncclComm_t, int*, int*);
  ncclResult_t (*rejected)(ncclComm_t, uint64_t*);  // what came from outside the communicator
  ncclResult_t (*settingInt)(const char*, int64_t*);  // a MOJOCCL_* integer, validated
  // RCCL's and libmojoccl's (not NCCL's): an all-to-all.
  ncclResult_t (*allToAllv)(const void*, const size_t*, const size_t*, void*, const size_t*, const size_t*,
                            ncclDataType_t, ncclComm_t, ncclStream_t);
};

class CclLibrary {
 public:
  // Loads the library at `path` (absolute) and resolves the whole table.
  // `kind` names it in messages: "mojoccl", "nccl" or "rccl".
  CclLibrary(const std::string& path, const std::string& kind);
  ~CclLibrary();
  CclLibrary(const CclLibrary&) = delete;
  CclLibrary& operator=(const CclLibrary&) = delete;

  const CclApi& api() const { return api_; }
  const std::string& path() const { return path_; }
  const std::string& kind() const { return kind_; }
  int version() const { return version_; }

  // Throws CclError naming `call` when `result` is not ncclSuccess.
  void check(ncclResult_t result, const char* call, ncclComm_t comm) const;
  // libmojoccl's value of the integer setting `name` (settings.cc's table:
  // one reading, one validation); throws CclError for a value it refuses.
  int64_t settingInt(const char* name) const;

 private:
  void* handle_ = nullptr;
  CclApi api_{};
  std::string path_;
  std::string kind_;
  int version_ = 0;
};

// The library for CPU tensors: libmojoccl, installed in lib/ beside the
// torch_mojo._C module. Loaded once per process.
std::shared_ptr<CclLibrary> hostCollectiveLibrary();

}  // namespace torch_mojo
