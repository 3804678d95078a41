// WorkMojo: the Work each call of the process group returns. The group's
// worker thread completes it (work_queue.cc); on an accelerator its
// collectives end on the group's communication stream, which wait() makes
// the caller's stream wait for.
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace torch_mojo {

// A DistBackendError carrying `message`, as the Work of a failed call holds it.
std::exception_ptr distBackendError(const std::string& message);

class WorkMojo : public c10d::Work {
 public:
  // `device`: the accelerator whose stream the collective runs on; none for
  // CPU tensors, whose collectives end on the host.
  WorkMojo(int rank, c10d::OpType type, uint64_t sequence, std::string description,
           const char* profilingTitle, const std::vector<at::Tensor>& inputs,
           std::vector<at::Tensor> outputs, std::optional<c10::Device> device = std::nullopt);

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  uint64_t getSequencenumber() const override { return sequence_; }
  // A receive from any rank: the rank its message came from, once it is done.
  int sourceRank() const override;
  void reportSourceRank(std::shared_ptr<std::atomic<int>> source) { source_ = std::move(source); }
  // A finite timeout waits that long, then raises if the collective is
  // still running (it keeps running). On an accelerator: makes the current
  // stream wait for the collective, without blocking the host.
  bool wait(std::chrono::milliseconds timeout) override;
  // Device work: the current stream waits for the collective. (c10d's own
  // wait() calls this with the Work's mutex held, for host work too.)
  void synchronize() override;

  const std::string& description() const { return description_; }
  bool onDevice() const { return device_.has_value(); }
  // Device work: recorded on the communication stream after the calls.
  c10::Event& end() { return *end_; }
  // Device work, called once by the worker thread: the calls are enqueued
  // on `stream` (a failure to enqueue them goes to complete()).
  void issued(const c10::Stream& stream);
  // Called once by the worker thread when the job ends.
  void complete(std::exception_ptr error);

 private:
  uint64_t sequence_;
  std::string description_;  // "#3 all_reduce 1024 x float32 sum"
  std::vector<at::Tensor> outputs_;
  std::optional<c10::Device> device_;
  std::unique_ptr<c10::Event> end_;
  std::shared_ptr<std::atomic<int>> source_;  // set by a receive from any rank
  bool issued_ = false;  // guarded by Work's mutex_
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace torch_mojo
