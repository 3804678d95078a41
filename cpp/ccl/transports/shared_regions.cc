#include "transports/shared_regions.h"

#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <string>

#include "base/error.h"

namespace mojoccl {
namespace {

struct Region {
  size_t bytes;
  int fd;
  uint64_t id;
};

struct Mapping {
  char* base;
  size_t bytes;
};

std::mutex& registryMutex() {
  static std::mutex mutex;
  return mutex;
}

// This process's regions by base address.
std::map<uintptr_t, Region>& ownRegions() {
  static std::map<uintptr_t, Region> regions;
  return regions;
}

// Peers' regions mapped here, by region id.
std::map<uint64_t, Mapping>& peerMappings() {
  static std::map<uint64_t, Mapping> mappings;
  return mappings;
}

// Listeners of watchRegionFrees. Their own lock: a listener takes its
// owner's lock, which may be held while describeBuffer() runs.
struct Listeners {
  std::mutex mutex;
  std::map<uint64_t, RegionFreed> byHandle;
  uint64_t nextHandle = 1;
};

Listeners& listeners() {
  static Listeners all;
  return all;
}

}  // namespace

uint64_t watchRegionFrees(RegionFreed callback) {
  Listeners& all = listeners();
  std::lock_guard<std::mutex> lock(all.mutex);
  all.byHandle[all.nextHandle] = std::move(callback);
  return all.nextHandle++;
}

void unwatchRegionFrees(uint64_t handle) {
  Listeners& all = listeners();
  std::lock_guard<std::mutex> lock(all.mutex);
  all.byHandle.erase(handle);
}

void* allocateSharedRegion(size_t bytes) {
  if (bytes == 0) fail(ncclInvalidArgument, "ncclMemAlloc of 0 bytes");
  int fd = memfd_create("mojoccl-region", MFD_CLOEXEC);
  if (fd < 0) failSystem("memfd_create");
  int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (rc != 0) {
    close(fd);
    fail(ncclSystemError, "cannot reserve " + std::to_string(bytes >> 20) +
                              " MiB of shared memory for ncclMemAlloc: " + strerror(rc));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    close(fd);
    failSystem("mmap for ncclMemAlloc");
  }
  uint64_t id = 0;
  if (getrandom(&id, sizeof(id), 0) != sizeof(id)) id = reinterpret_cast<uintptr_t>(base) ^ getpid();
  std::lock_guard<std::mutex> lock(registryMutex());
  ownRegions()[reinterpret_cast<uintptr_t>(base)] = Region{bytes, fd, id};
  return base;
}

void freeSharedRegion(void* pointer) {
  uint64_t id = describeBuffer(pointer, 0).id;
  if (id != 0) {
    Listeners& all = listeners();
    std::lock_guard<std::mutex> lock(all.mutex);
    for (auto& listener : all.byHandle) listener.second(id);
  }
  std::lock_guard<std::mutex> lock(registryMutex());
  auto found = ownRegions().find(reinterpret_cast<uintptr_t>(pointer));
  if (found == ownRegions().end())
    fail(ncclInvalidArgument, "ncclMemFree of a pointer ncclMemAlloc did not return");
  munmap(pointer, found->second.bytes);
  close(found->second.fd);
  ownRegions().erase(found);
}

RegionDescriptor describeBuffer(const void* pointer, size_t bytes) {
  auto address = reinterpret_cast<uintptr_t>(pointer);
  std::lock_guard<std::mutex> lock(registryMutex());
  auto& regions = ownRegions();
  auto after = regions.upper_bound(address);
  if (after == regions.begin()) return RegionDescriptor{};
  auto region = std::prev(after);
  uint64_t offset = address - region->first;
  if (offset + bytes > region->second.bytes) return RegionDescriptor{};
  return RegionDescriptor{static_cast<int32_t>(getpid()), region->second.fd, region->second.id,
                          region->second.bytes, offset};
}

char* mapPeerBuffer(const RegionDescriptor& descriptor) {
  std::lock_guard<std::mutex> lock(registryMutex());
  auto& mappings = peerMappings();
  auto found = mappings.find(descriptor.id);
  if (found == mappings.end()) {
    std::string path =
        "/proc/" + std::to_string(descriptor.pid) + "/fd/" + std::to_string(descriptor.fd);
    int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0)
      failSystem("open " + path + " (the shared buffer of a peer process; ranks of a node "
                 "must run as the same user and see each other's /proc)");
    void* base = mmap(nullptr, descriptor.regionBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) failSystem("mmap of a peer's shared buffer");
    found = mappings.emplace(descriptor.id, Mapping{static_cast<char*>(base), descriptor.regionBytes}).first;
  }
  return found->second.base + descriptor.offset;
}

}  // namespace mojoccl
