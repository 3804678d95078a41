// Memory that the other ranks of a node can map: what ncclMemAlloc hands
// out. Collectives on buffers inside such regions let peers read (and
// write) them in place, with no staging copy.
//
// Each region is a memfd: it has no name to leak in /dev/shm, and a peer of
// the same user maps it through /proc/<pid>/fd/<fd>. Its memory lives until
// the owner frees it and every peer has dropped its mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace mojoccl {

// How a peer finds a buffer: the owner's process, the region and the offset.
// pid 0 means the buffer is not in a shared region.
struct RegionDescriptor {
  int32_t pid;
  int32_t fd;
  uint64_t id;  // unique per region: fds are reused, ids are not
  uint64_t regionBytes;
  uint64_t offset;

  bool shared() const { return pid != 0; }
};

void* allocateSharedRegion(size_t bytes);
void freeSharedRegion(void* pointer);

// The descriptor of [pointer, pointer + bytes) if it lies within one shared
// region of this process; a descriptor with pid 0 otherwise.
RegionDescriptor describeBuffer(const void* pointer, size_t bytes);

// A peer's buffer, mapped into this process (mappings are cached per region).
char* mapPeerBuffer(const RegionDescriptor& descriptor);

// Caches of per-region state elsewhere (a network's memory registrations)
// hear of a region's end just before it is unmapped.
using RegionFreed = std::function<void(uint64_t id)>;
uint64_t watchRegionFrees(RegionFreed callback);  // returns a handle for unwatch
void unwatchRegionFrees(uint64_t handle);

}  // namespace mojoccl
