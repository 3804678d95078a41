// How algorithms cut messages: into rounds of at most one slot, and into
// one slice per rank.
#pragma once

#include <algorithm>
#include <cstddef>

namespace mojoccl {

// Calls `body(offset, count)` for each chunk of at most `perRound` elements;
// once with count 0 for an empty message, so that ranks still meet and
// compare their calls.
template <typename Body>
inline void forEachChunk(size_t total, size_t perRound, Body body) {
  size_t offset = 0;
  do {
    size_t count = std::min(perRound, total - offset);
    body(offset, count);
    offset += count;
  } while (offset < total);
}

struct Slice {
  size_t begin;
  size_t end;
};

// Slice `part` of `count` elements cut into `parts`, starting on 64-byte
// boundaries so that each rank's kernel runs on whole vectors.
inline Slice sliceOf(size_t count, int parts, int part, size_t elementSize) {
  size_t unit = std::max<size_t>(1, 64 / elementSize);
  size_t units = (count + unit - 1) / unit;
  size_t perPart = (units + parts - 1) / parts * unit;
  size_t begin = std::min(count, perPart * part);
  return {begin, std::min(count, begin + perPart)};
}

inline const char* bytesAt(const void* base, size_t elements, size_t elementSize) {
  return static_cast<const char*>(base) + elements * elementSize;
}
inline char* bytesAt(void* base, size_t elements, size_t elementSize) {
  return static_cast<char*>(base) + elements * elementSize;
}

}  // namespace mojoccl
