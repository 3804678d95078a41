// The three calls of the HIP runtime that libmojoccl's device staging makes
// (cpp/ccl/device_staging.cc), for the emulated device: built with the
// soname libamdhip64.so.6, so that loading it makes it "the HIP runtime this
// process has loaded". Copies are queued on the emulated stream, in order
// with the rest of its work, as hipMemcpyAsync queues them on a GPU stream.
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "stream.h"

#define EXPORT extern "C" __attribute__((visibility("default")))

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

EXPORT int hipMemcpyAsync(void* destination, const void* source, size_t bytes, int /*kind*/,
                          void* stream) {
  auto* target = static_cast<EmulatedStream*>(stream);
  target->enqueue(target, [](void* argument) {
    auto* copy = static_cast<Copy*>(argument);
    std::memcpy(copy->destination, copy->source, copy->bytes);
    delete copy;
  }, new Copy{destination, source, bytes});
  return 0;
}

EXPORT int hipStreamSynchronize(void* stream) {
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

EXPORT const char* hipGetErrorString(int /*error*/) { return "emulated HIP runtime error"; }
