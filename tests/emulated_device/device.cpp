// An accelerator for tests on machines without one: torch's PrivateUse1
// device, named `mojo` as torch-mojo-backend names its own, whose memory is
// host memory and whose streams are host threads.
//
// What makes it useful is that its streams are asynchronous, as a GPU's
// are: copies into and between its tensors are queued on the current
// stream and run later on that stream's thread, each after a short delay,
// so that code that forgets to order one stream after another reads or
// writes memory too early and gets wrong values. Events mark a point in a
// stream; a stream blocked on an event waits for it on its own thread.
// Other operators run on the CPU once the current stream has drained.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "stream.h"

namespace emulated {

using c10::DeviceType;

// How long each queued copy waits before it runs: long enough that a
// missing wait between streams shows, short enough for tests.
std::chrono::microseconds copyDelay() {
  static const long micros = [] {
    const char* value = std::getenv("EMULATED_DEVICE_COPY_DELAY_US");
    return value != nullptr ? std::atol(value) : 2000L;
  }();
  return std::chrono::microseconds(micros);
}

class Stream : public EmulatedStream {
 public:
  Stream() : thread_([this] { run(); }) { enqueue = &enqueueWork; }

  void push(std::function<void()> work) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(work));
    }
    changed_.notify_all();
  }

  bool idle() {
    std::lock_guard<std::mutex> lock(mutex_);
    return queue_.empty() && !running_;
  }

  void synchronize() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return queue_.empty() && !running_; });
  }

 private:
  static void enqueueWork(EmulatedStream* stream, void (*work)(void*), void* argument) {
    static_cast<Stream*>(stream)->push([work, argument] { work(argument); });
  }

  void run() {
    while (true) {
      std::function<void()> work;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [this] { return !queue_.empty(); });
        work = std::move(queue_.front());
        queue_.pop_front();
        running_ = true;
      }
      work();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        running_ = false;
      }
      changed_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> queue_;
  bool running_ = false;
  std::thread thread_;  // runs until the process exits
};

// Stream 0 is the default stream; 1..kPoolSize are the pool's.
constexpr int kPoolSize = 4;

Stream& streamById(c10::StreamId id) {
  static Stream* streams = new Stream[kPoolSize + 1];  // never destroyed: threads run to exit
  TORCH_CHECK(id >= 0 && id <= kPoolSize, "no emulated stream ", id);
  return streams[id];
}

thread_local c10::StreamId currentStream = 0;

// An event marks a point in a stream; `recorded` counts the marks asked
// for, `reached` the ones a stream has passed.
struct Event {
  std::mutex mutex;
  std::condition_variable changed;
  uint64_t recorded = 0;
  uint64_t reached = 0;
};

void waitFor(Event& event, uint64_t version) {
  std::unique_lock<std::mutex> lock(event.mutex);
  event.changed.wait(lock, [&] { return event.reached >= version; });
}

class GuardImpl final : public c10::impl::DeviceGuardImplInterface {
 public:
  DeviceType type() const override { return DeviceType::PrivateUse1; }
  c10::Device exchangeDevice(c10::Device device) const override { return getDevice(); }
  c10::Device getDevice() const override { return c10::Device(DeviceType::PrivateUse1, 0); }
  void setDevice(c10::Device device) const override {
    TORCH_CHECK(device.index() <= 0, "the emulated device has one device, index 0");
  }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }

  c10::Stream getStream(c10::Device device) const override { return make(currentStream); }
  c10::Stream getDefaultStream(c10::Device) const override { return make(0); }
  c10::Stream getStreamFromGlobalPool(c10::Device, bool) const override {
    static std::atomic<int> next{0};
    return make(1 + next++ % kPoolSize);
  }
  c10::Stream getNewStream(c10::Device device, int) const override {
    return getStreamFromGlobalPool(device, false);
  }
  c10::Stream exchangeStream(c10::Stream stream) const override {
    c10::Stream previous = make(currentStream);
    currentStream = stream.id();
    return previous;
  }
  void* getStreamNativeHandle(const c10::Stream stream) const override {
    return static_cast<EmulatedStream*>(&streamById(stream.id()));
  }
  bool queryStream(const c10::Stream& stream) const override { return streamById(stream.id()).idle(); }
  void synchronizeStream(const c10::Stream& stream) const override {
    streamById(stream.id()).synchronize();
  }
  void synchronizeDevice(const c10::DeviceIndex) const override {
    for (int id = 0; id <= kPoolSize; ++id) streamById(id).synchronize();
  }

  void record(void** handle, const c10::Stream& stream, const c10::DeviceIndex,
              const c10::EventFlag) const override {
    if (*handle == nullptr) *handle = new Event();
    auto* event = static_cast<Event*>(*handle);
    uint64_t version;
    {
      std::lock_guard<std::mutex> lock(event->mutex);
      version = ++event->recorded;
    }
    streamById(stream.id()).push([event, version] {
      {
        std::lock_guard<std::mutex> lock(event->mutex);
        event->reached = std::max(event->reached, version);
      }
      event->changed.notify_all();
    });
  }
  void block(void* handle, const c10::Stream& stream) const override {
    if (handle == nullptr) return;  // never recorded: nothing to wait for
    auto* event = static_cast<Event*>(handle);
    uint64_t version;
    {
      std::lock_guard<std::mutex> lock(event->mutex);
      version = event->recorded;
    }
    streamById(stream.id()).push([event, version] { waitFor(*event, version); });
  }
  bool queryEvent(void* handle) const override {
    if (handle == nullptr) return true;
    auto* event = static_cast<Event*>(handle);
    std::lock_guard<std::mutex> lock(event->mutex);
    return event->reached >= event->recorded;
  }
  void synchronizeEvent(void* handle) const override {
    if (handle == nullptr) return;
    auto* event = static_cast<Event*>(handle);
    uint64_t version;
    {
      std::lock_guard<std::mutex> lock(event->mutex);
      version = event->recorded;
    }
    waitFor(*event, version);
  }
  void destroyEvent(void* handle, const c10::DeviceIndex) const noexcept override {
    // A stream may still hold work that marks it: leak rather than race
    // (a few bytes per event, in tests only).
    (void)handle;
  }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}

 private:
  static c10::Stream make(c10::StreamId id) {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(DeviceType::PrivateUse1, 0), id);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

class Allocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    void* memory = std::malloc(bytes > 0 ? bytes : 1);
    TORCH_CHECK(memory != nullptr, "the emulated device is out of memory");
    return {memory, memory, &std::free, c10::Device(DeviceType::PrivateUse1, 0)};
  }
  void copy_data(void* destination, const void* source, std::size_t count) const override {
    std::memcpy(destination, source, count);
  }
};

Allocator allocator;
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &allocator);

// The device tensor's memory seen as a CPU tensor (it is host memory).
at::Tensor hostView(const at::Tensor& tensor) {
  return at::from_blob(tensor.data_ptr(), tensor.sizes(), tensor.strides(),
                       tensor.options().device(at::kCPU));
}

c10::Stream current() { return GuardImpl().getStream(c10::Device(DeviceType::PrivateUse1, 0)); }

at::Tensor copyFrom(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  Stream& stream = streamById(current().id());
  if (dst.is_cpu()) {  // device to host: synchronous, as for pageable memory
    stream.synchronize();
    dst.copy_(hostView(self));
    return dst;
  }
  // Into the device: queued. The source is read when the copy runs, so a
  // host source is taken now (as a GPU's staged host-to-device copy does).
  at::Tensor source = self.is_cpu() ? self.clone() : self;
  at::Tensor target = dst;
  auto delay = copyDelay();
  stream.push([source, target, delay] {
    std::this_thread::sleep_for(delay);
    hostView(target).copy_(source.is_cpu() ? source : hostView(source));
  });
  return dst;
}

at::Tensor copyFromAndResize(const at::Tensor& self, const at::Tensor& dst) {
  if (self.sizes() != dst.sizes()) {
    streamById(current().id()).synchronize();  // nothing queued may still use the old memory
    const_cast<at::Tensor&>(dst).resize_(self.sizes());
  }
  return copyFrom(self, dst, false);
}

at::Tensor empty(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                 std::optional<at::Layout>, std::optional<at::Device>, std::optional<bool>,
                 std::optional<at::MemoryFormat> memoryFormat) {
  return at::detail::empty_generic(size, &allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memoryFormat);
}

at::Tensor emptyStrided(c10::IntArrayRef size, c10::IntArrayRef stride,
                        std::optional<at::ScalarType> dtype, std::optional<at::Layout>,
                        std::optional<at::Device>, std::optional<bool>) {
  return at::detail::empty_strided_generic(size, stride, &allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

// Every other operator: on the CPU, once the current stream has drained
// (inputs are read, and outputs written back, through copyFrom).
void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  streamById(current().id()).synchronize();
  at::native::cpu_fallback(op, stack);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty);
  m.impl("empty_strided", emptyStrided);
  m.impl("_copy_from", copyFrom);
  m.impl("_copy_from_and_resize", copyFromAndResize);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("resize_", at::native::resize_);  // generic: through the storage's allocator
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}

}  // namespace emulated
