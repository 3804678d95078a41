#include "device/staging.h"

#include "device/runtime.h"

namespace mojoccl {

DeviceStaging::DeviceStaging(ncclStream_t stream) : stream_(stream) {
  if (stream_ != nullptr) DeviceRuntime::get();  // fails now if there is none
}

DeviceStaging::~DeviceStaging() = default;

void* DeviceStaging::hostBuffer(size_t bytes) {
  buffers_.emplace_back(new char[bytes > 0 ? bytes : 1]);
  return buffers_.back().get();
}

const void* DeviceStaging::input(const void* data, size_t bytes) {
  if (stream_ == nullptr || bytes == 0) return data;
  void* host = hostBuffer(bytes);
  const DeviceRuntime& runtime = DeviceRuntime::get();
  runtime.copy(host, data, bytes, stream_);  // after the stream's earlier work
  runtime.synchronize(stream_);
  return host;
}

void* DeviceStaging::output(void* data, size_t bytes) {
  if (stream_ == nullptr || bytes == 0) return data;
  void* host = hostBuffer(bytes);
  results_.push_back({data, host, bytes});
  return host;
}

void DeviceStaging::finish() {
  if (stream_ == nullptr) return;
  const DeviceRuntime& runtime = DeviceRuntime::get();
  for (const Result& result : results_) runtime.copy(result.device, result.host, result.bytes, stream_);
  // The host buffers go when this object does: the copies must end first.
  runtime.synchronize(stream_);
  results_.clear();
}

}  // namespace mojoccl
