// ProcessGroupMojo: the c10d backend `mojo`.
//
// One per process group. It checks and stages tensors, turns each
// torch.distributed call into calls of NCCL's C API on the library it loaded
// (libmojoccl for CPU tensors), and runs them in issue order on a worker
// thread of its own, so that async_op=True overlaps with the caller's
// compute. A monitor thread ends any collective that outlives the group's
// timeout by aborting the communicator, so a missing peer gives an error on
// every rank instead of a hang.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "backend/ccl_library.h"

namespace torch_mojo {

class WorkMojo : public c10d::Work {
 public:
  WorkMojo(int rank, c10d::OpType type, uint64_t sequence, const char* profilingTitle,
           const std::vector<at::Tensor>& inputs, std::vector<at::Tensor> outputs);

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  uint64_t getSequencenumber() const override { return sequence_; }

  // Called once by the worker thread when the collective ends.
  void complete(std::exception_ptr error);

 private:
  uint64_t sequence_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class ProcessGroupMojo : public c10d::Backend {
 public:
  ProcessGroupMojo(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                   std::chrono::milliseconds timeout);
  ~ProcessGroupMojo() override;

  const std::string getBackendName() const override { return "mojo"; }
  c10::intrusive_ptr<Options> getBackendOptions() override;
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_.store(timeout); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return sequence_.load(); }

  void abort() override;
  void shutdown() override;

  // Which library serves this group, for `torch-mojo info` and tests.
  const std::string& libraryPath() const { return library_->path(); }
  int libraryVersion() const { return library_->version(); }

 private:
  struct Job {
    c10::intrusive_ptr<WorkMojo> work;
    std::string description;  // "all_reduce 1024 x float32 sum"
    std::function<void()> run;
  };

  // Queues `run` (which calls the library) behind earlier collectives.
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char* profilingTitle,
                                         std::string description,
                                         const std::vector<at::Tensor>& inputs,
                                         std::vector<at::Tensor> outputs,
                                         std::function<void()> run);
  void workerLoop();
  void monitorLoop();
  void createCommunicator(const c10::intrusive_ptr<c10d::Store>& store);
  void stopThreads();
  void check(ncclResult_t result, const char* call) const;

  // Shared by the single and coalesced forms.
  void checkAllGatherInto(const at::Tensor& output, const at::Tensor& input) const;
  void allGatherInto(at::Tensor& output, const at::Tensor& input);
  void checkReduceScatterFrom(const at::Tensor& output, const at::Tensor& input) const;
  void reduceScatterFrom(at::Tensor& output, const at::Tensor& input, ncclRedOp_t op);

  std::shared_ptr<CclLibrary> library_;
  ncclComm_t comm_ = nullptr;
  std::atomic<std::chrono::milliseconds> timeout_;
  std::atomic<uint64_t> sequence_{0};

  std::mutex mutex_;  // guards the queue, the running job and the state below
  std::condition_variable queueChanged_;
  std::deque<Job> queue_;
  bool stopping_ = false;
  bool aborted_ = false;
  std::string abortReason_;
  std::string runningJob_;  // description of the collective in progress
  std::chrono::steady_clock::time_point runningSince_;
  bool running_ = false;

  std::thread worker_;
  std::thread monitor_;
};

}  // namespace torch_mojo
