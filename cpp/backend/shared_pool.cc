#include "backend/shared_pool.h"

#include <stdexcept>
#include <string>

namespace torch_mojo {

namespace {

constexpr size_t kAlignment = 64;
constexpr size_t kMinArenaBytes = 64 << 20;
constexpr size_t kArenaGranularity = 2 << 20;

size_t roundUp(size_t value, size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

}  // namespace

SharedPool::SharedPool(std::shared_ptr<CclLibrary> library) : library_(std::move(library)) {
  if (library_->api().memAlloc == nullptr || library_->api().memFree == nullptr)
    throw std::runtime_error(library_->path() + " has no ncclMemAlloc: it cannot share memory");
}

void* SharedPool::carve(Arena& arena, size_t bytes) {
  // Best fit: the smallest free block that holds `bytes`.
  auto best = arena.free.end();
  for (auto it = arena.free.begin(); it != arena.free.end(); ++it)
    if (it->second >= bytes && (best == arena.free.end() || it->second < best->second)) best = it;
  if (best == arena.free.end()) return nullptr;
  size_t offset = best->first;
  size_t left = best->second - bytes;
  arena.free.erase(best);
  if (left > 0) arena.free[offset + bytes] = left;
  live_[arena.base + offset] = Block{static_cast<size_t>(&arena - arenas_.data()), offset, bytes};
  allocatedBytes_ += bytes;
  return arena.base + offset;
}

void* SharedPool::allocate(size_t bytes) {
  bytes = roundUp(std::max<size_t>(bytes, 1), kAlignment);
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& arena : arenas_)
    if (void* block = carve(arena, bytes)) return block;
  size_t arenaBytes = std::max(kMinArenaBytes, roundUp(bytes, kArenaGranularity));
  void* base = nullptr;
  library_->check(library_->api().memAlloc(&base, arenaBytes), "ncclMemAlloc", nullptr);
  arenas_.push_back(Arena{static_cast<char*>(base), arenaBytes, {{0, arenaBytes}}});
  return carve(arenas_.back(), bytes);
}

void SharedPool::release(void* pointer) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = live_.find(pointer);
  if (found == live_.end()) return;
  Block block = found->second;
  live_.erase(found);
  allocatedBytes_ -= block.bytes;
  auto& free = arenas_[block.arena].free;
  auto inserted = free.emplace(block.offset, block.bytes).first;
  // Merge with the free neighbours on both sides.
  auto next = std::next(inserted);
  if (next != free.end() && inserted->first + inserted->second == next->first) {
    inserted->second += next->second;
    free.erase(next);
  }
  if (inserted != free.begin()) {
    auto previous = std::prev(inserted);
    if (previous->first + previous->second == inserted->first) {
      previous->second += inserted->second;
      free.erase(inserted);
    }
  }
}

SharedPool::Stats SharedPool::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t reserved = 0;
  for (const auto& arena : arenas_) reserved += arena.bytes;
  return Stats{reserved, allocatedBytes_, arenas_.size()};
}

std::shared_ptr<SharedPool> SharedPool::forHost() {
  static std::mutex mutex;
  static std::shared_ptr<SharedPool> pool;
  std::lock_guard<std::mutex> lock(mutex);
  if (!pool) pool = std::make_shared<SharedPool>(hostCollectiveLibrary());
  return pool;
}

}  // namespace torch_mojo
