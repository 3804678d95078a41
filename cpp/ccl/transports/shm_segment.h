// A named POSIX shared-memory segment, mapped into this process.
#pragma once

#include <cstddef>
#include <string>

namespace mojoccl {

class SharedSegment {
 public:
  SharedSegment() = default;
  // Creates `name` with `bytes` reserved up front: a full /dev/shm is an
  // error here, with the free space in the message, not a SIGBUS later.
  static SharedSegment create(const std::string& name, size_t bytes);
  static SharedSegment open(const std::string& name, size_t bytes);
  static void unlink(const std::string& name);

  SharedSegment(SharedSegment&& other) noexcept { *this = std::move(other); }
  SharedSegment& operator=(SharedSegment&& other) noexcept;
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;
  ~SharedSegment();

  char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  SharedSegment(char* data, size_t size) : data_(data), size_(size) {}
  char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace mojoccl
