#include "transports/shm_segment.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "base/error.h"

namespace mojoccl {

namespace {

std::string describeShmSpace() {
  struct statvfs stats {};
  if (statvfs("/dev/shm", &stats) != 0) return "";
  auto freeMiB = static_cast<unsigned long long>(stats.f_bavail) * stats.f_frsize >> 20;
  return " (/dev/shm has " + std::to_string(freeMiB) + " MiB free)";
}

char* mapShared(int fd, size_t bytes, const std::string& name) {
  void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int error = errno;
  close(fd);
  if (mapped == MAP_FAILED)
    fail(ncclSystemError, "mmap of shared memory " + name + ": " + strerror(error));
  return static_cast<char*>(mapped);
}

}  // namespace

SharedSegment SharedSegment::create(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) failSystem("shm_open(" + name + ")");
  int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (rc != 0) {
    close(fd);
    shm_unlink(name.c_str());
    fail(ncclSystemError, "cannot reserve " + std::to_string((bytes + (1 << 20) - 1) >> 20) +
                              " MiB of shared memory: " + strerror(rc) + describeShmSpace() +
                              "; give the job a larger /dev/shm");
  }
  return SharedSegment(mapShared(fd, bytes, name), bytes);
}

SharedSegment SharedSegment::open(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0)
    fail(ncclSystemError, "shm_open(" + name + "): " + strerror(errno) +
                              " (ranks that share a host id must share /dev/shm; set "
                              "MOJOCCL_HOSTID differently for ranks in separate containers)");
  return SharedSegment(mapShared(fd, bytes, name), bytes);
}

void SharedSegment::unlink(const std::string& name) { shm_unlink(name.c_str()); }

SharedSegment& SharedSegment::operator=(SharedSegment&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(data_, size_);
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

SharedSegment::~SharedSegment() {
  if (data_ != nullptr) munmap(data_, size_);
}

}  // namespace mojoccl
