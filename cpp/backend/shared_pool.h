// The registered-memory pool: tensors whose memory the other ranks of the
// node can read in place (libmojoccl's ncclMemAlloc), so that collectives
// on them need no staging copy.
//
// A caching allocator, as torch's CUDA one is over cudaMalloc: it takes
// large arenas from the library and hands out 64-byte aligned blocks, which
// return to the pool when their tensor dies. Arenas are kept until the
// process ends. No torch headers here.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backend/ccl_library.h"

namespace torch_mojo {

class SharedPool {
 public:
  explicit SharedPool(std::shared_ptr<CclLibrary> library);
  SharedPool(const SharedPool&) = delete;
  SharedPool& operator=(const SharedPool&) = delete;

  void* allocate(size_t bytes);
  void release(void* pointer);

  struct Stats {
    size_t reservedBytes;   // taken from the library
    size_t allocatedBytes;  // in live blocks
    size_t arenas;
  };
  Stats stats();

  // The pool of the host library (libmojoccl), shared by every process group.
  static std::shared_ptr<SharedPool> forHost();

 private:
  struct Arena {
    char* base;
    size_t bytes;
    std::map<size_t, size_t> free;  // offset -> size, coalesced
  };
  void* carve(Arena& arena, size_t bytes);

  std::shared_ptr<CclLibrary> library_;
  std::mutex mutex_;
  std::vector<Arena> arenas_;
  struct Block {
    size_t arena;
    size_t offset;
    size_t bytes;
  };
  std::unordered_map<void*, Block> live_;
  size_t allocatedBytes_ = 0;
};

}  // namespace torch_mojo
