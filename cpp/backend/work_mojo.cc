// WorkMojo, and the error a failed call's Work holds.
#include "backend/work_mojo.hpp"

#include <c10/util/Exception.h>

namespace torch_mojo {

std::exception_ptr distBackendError(const std::string& message) {
  try {
    C10_THROW_ERROR(DistBackendError, message);
  } catch (...) {
    return std::current_exception();
  }
}

WorkMojo::WorkMojo(int rank, c10d::OpType type, uint64_t sequence, std::string description,
                   const char* profilingTitle, const std::vector<at::Tensor>& inputs,
                   std::vector<at::Tensor> outputs, std::optional<c10::Device> device)
    : Work(rank, type, profilingTitle, inputs),
      sequence_(sequence),
      description_(std::move(description)),
      outputs_(std::move(outputs)),
      device_(device),
      // A device future records events on the streams it completes on, so
      // that its waiters order their streams after the collective (NCCL's).
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()),
          device ? std::vector<c10::Device>{*device} : std::vector<c10::Device>{})) {
  if (device_) end_ = std::make_unique<c10::Event>(device_->type());
}

bool WorkMojo::wait(std::chrono::milliseconds timeout) {
  if (device_) {
    TORCH_CHECK(timeout <= std::chrono::milliseconds(0), "work.wait(timeout=",
                std::chrono::duration<double>(timeout).count(), " s) is not supported for ",
                device_->str(), " collectives: wait() makes the current stream wait without "
                "blocking the host; call it without a timeout (the process group's timeout "
                "still applies)");
    synchronize();
    return true;
  }
  if (timeout > std::chrono::milliseconds(0)) {
    std::unique_lock<std::mutex> lock(mutex_);
    bool done = cv_.wait_for(lock, timeout, [this] { return completed_; });
    TORCH_CHECK(done, "work.wait(timeout=", std::chrono::duration<double>(timeout).count(),
                " s): collective ", description_, " has not completed; it keeps running "
                "(call wait() again to wait for it, or look for a rank that did not issue it)");
  }
  return Work::wait(std::chrono::milliseconds(0));  // rethrows the collective's error
}

int WorkMojo::sourceRank() const {
  TORCH_CHECK(source_ != nullptr, "sourceRank() is known only for a receive without a source rank");
  const int source = source_->load();
  TORCH_CHECK(source >= 0, "sourceRank(): the receive has not completed; wait() for it first");
  return source;
}

void WorkMojo::synchronize() {
  if (!device_) return;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [this] { return issued_ || completed_; });
    if (exception_) std::rethrow_exception(exception_);
  }
  c10::impl::VirtualGuardImpl guard(device_->type());
  end_->block(guard.getStream(*device_));
}

void WorkMojo::issued(const c10::Stream& stream) {
  {
    // The future's event goes on the stream the collective runs on.
    c10::StreamGuard onStream(stream);
    future_->markCompleted(c10::IValue(outputs_));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  issued_ = true;
  cv_.notify_all();
}

void WorkMojo::complete(std::exception_ptr error) {
  // The future first: whoever wait() releases may read it at once. A device
  // future completed when the collective was enqueued.
  if (!future_->completed()) {
    if (error)
      future_->setError(error);
    else
      future_->markCompleted(c10::IValue(outputs_));
  }
  finish(error);
}

}  // namespace torch_mojo
