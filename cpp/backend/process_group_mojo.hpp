// ProcessGroupMojo: the c10d backend `mojo`.
//
// One per process group. It checks tensors on the caller's thread, turns
// each torch.distributed call into a job of NCCL C API calls on one of its
// communicators (libmojoccl for CPU tensors; NCCL, RCCL or libmojoccl for
// the accelerator's), and runs the jobs in issue order on a worker thread of
// its own, so that async_op=True overlaps with the caller's compute.
//
// Accelerator tensors follow NCCL's stream rules through c10's
// device-generic stream and event API (no CUDA or HIP headers): a job
// waits for the caller's current stream with an event, its calls run on
// the group's communication stream, and its Work's future completes with
// stream semantics once they are enqueued. The job, and so the tensors it
// holds, stays until the stream passes its end event. Every job is in the flight recorder and in a short
// history that the process's watchdog (watchdog.hpp) reads: a job that
// outlives the group's timeout, or a fatal library error, ends the run with
// a report instead of a hang.
//
// A job has two parts: `issue` makes the library calls (inside
// ncclGroupStart/End they only queue), `finish` moves results into place
// once the calls have ended. That split is what lets a coalesced batch
// (startCoalescing ... endCoalescing) run as one library group.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "backend/store_watch.h"

#include "backend/ccl_library.h"
#include "backend/communicator.h"
#include "backend/flight_recorder.hpp"
#include "backend/job_trace.hpp"
#include "backend/work_mojo.hpp"

namespace c10d {
struct ProcessGroupStatus;
}

namespace torch_mojo {

// The accelerator a group serves besides the CPU, and the library for its
// tensors, found by torch_mojo.libraries in the user guide's order.
struct AcceleratorSetup {
  c10::Device device;
  std::string libraryPath;
  std::string libraryKind;  // "nccl", "rccl" or "mojoccl": names it in messages
};

// What the store a group is given holds. A job's store (torchrun's, or
// init_process_group's) under the group's prefix: the keys every group of
// the job reads go beneath that prefix, and all of them under this
// torchrun attempt's (its restarts keep the store). A group's own store
// (torchft's, one per quorum, served by another replica group's torchrun):
// everything stays under it, whatever this process's attempt.
enum class StoreScope { Job, Group };

class ProcessGroupMojo : public c10d::Backend {
 public:
  ProcessGroupMojo(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                   std::chrono::milliseconds timeout, std::vector<uint64_t> globalRanks = {},
                   std::optional<AcceleratorSetup> accelerator = std::nullopt,
                   StoreScope scope = StoreScope::Job);
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
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplitSizes,
                                               std::vector<int64_t>& inputSplitSizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  // As gloo's: rank 0 names the ranks that did not arrive within the
  // timeout (all of them with waitAllRanks), and every rank that did raises.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks = false) override;

  // c10d's hook for a backend's communication memory: the registered pool.
  bool supportsTensorAlloc(c10::DeviceIndex /*device*/) override { return true; }
  std::shared_ptr<c10::Allocator> getMemAllocator() override;
  at::Tensor allocateTensor(long size, at::TensorOptions options) override;

  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;

  // torch.distributed.shrink_group: a new group of the ranks not excluded,
  // made through this group's store, so that it works when the excluded
  // ranks are dead. SHRINK_ABORT first aborts this group: its calls in
  // progress fail instead of waiting for the dead.
  bool supportsShrinking() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranksToExclude,
                                           int shrinkFlags,
                                           const c10::intrusive_ptr<Options>& opts) override;
  // The group ranks known to have ended (torch_mojo.distributed.failed_ranks):
  // those that ended without leaving the group, which the library of its
  // CPU tensors knows (only libmojoccl tells), and those whose process
  // said it is ending (announceExit): not a rank that aborted the group to
  // go on without the others (a shrink, a timeout).
  std::vector<int> failedRanks();
  // Connections and messages from outside the group's communicator that
  // this rank turned away (torch_mojo.distributed.turned_away).
  uint64_t turnedAway() { return host_->rejected(); }
  // Says in the job's store that this process is ending (its interpreter
  // exits), before its groups are destroyed: its peers then count it as
  // failed, not as a rank that aborted the group to shrink it.
  static void announceExit();

  // What has gone wrong with this group, as ProcessGroupNCCL tells it: a
  // collective past its timeout, a peer's failure, another library error.
  c10d::ErrorType getError() override { return error_.load(); }

  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return sequence_.load(); }

  void abort() override;
  void shutdown() override;

  // Which library serves this group's CPU tensors, for tests.
  const std::string& libraryPath() const { return host_->library().path(); }
  int libraryVersion() const { return host_->library().version(); }

  // ---- what the watchdog (watchdog.cc) reads and does (job_trace.hpp)
  // A failure or timeout of this group raises in its caller instead of
  // ending the run: TORCH_MOJO_BACKEND_PG_WATCHDOG=raise does it for every
  // group, raiseErrorsInCaller(owner) for this one (torchcomms'
  // abort_process_on_timeout_or_error=False, torchft, which rebuilds the
  // group). `owner`, a string literal, names what asked; raisesInCaller()
  // returns it, or nullptr where nothing did.
  void raiseErrorsInCaller(const char* owner) { raisingOwner_.store(owner); }
  const char* raisesInCaller() const;
  // Runs where the watchdog is about to abort this group (a timeout, or
  // any failure where the run ends): torchcomms' abort hooks, where its
  // flight recorder dumps.
  void onFailure(std::function<void()> hook);
  void runFailureHook();
  using Clock = JobTrace::Clock;
  GroupHealth health();
  bool reported(uint64_t sequence);
  void markReported(uint64_t sequence);
  // A job that failed fatally waits for its report before its caller sees
  // the error; this lets it go (report mode; abort mode exits instead).
  void releaseFailedJob(uint64_t sequence);
  bool coordinationDue(std::chrono::milliseconds period);
  bool newRequest(uint64_t epoch);  // false if this request was seen already
  c10d::Store& store() { return *store_; }
  // True once the store's server has ended (store_watch.h): calls on the
  // store would only fail, each with a backtrace from torch's client.
  bool storeGone() const { return storeWatch_ != nullptr && storeWatch_->gone(); }
  int globalRank() const { return static_cast<int>(globalRanks_[rank_]); }
  const std::vector<uint64_t>& globalRanks() const { return globalRanks_; }
  // Ends the calls in progress (libmojoccl returns within ~50 ms); they
  // fail with `reason`, and so does every later call on the group.
  void abortCommunicator(const std::string& reason = "the communicator was aborted by the watchdog");
  // A collective outlived the timeout (what getError() then says).
  void noteTimeout() {
    auto none = c10d::ErrorType::SUCCESS;
    error_.compare_exchange_strong(none, c10d::ErrorType::TIMEOUT);
  }
  // The flight recorder's table of this group's ranks; its name and
  // description are known only once c10d has named the group.
  void recordGroupRanks();

 private:
  struct Job {
    c10::intrusive_ptr<WorkMojo> work;
    std::function<void(Communicator&)> issue;  // the library calls, on the job's communicator
    std::function<void()> finish;  // afterwards: results into place (may be empty)
    std::vector<c10::intrusive_ptr<WorkMojo>> members;  // a coalesced batch's own Works
    std::shared_ptr<CompletionEvent> done;              // what the flight recorder watches
    std::optional<size_t> recordId;
    Communicator* comm = nullptr;  // the host's or the device's
    // Device jobs: the caller's stream reached the job (recorded at issue).
    std::shared_ptr<c10::Event> ready;
    // What the watchdog reports, also once the short history has moved on.
    JobTrace trace;
    // A coalesced batch's member jobs (their records end with the batch).
    std::shared_ptr<std::vector<Job>> batch;
  };
  // The accelerator's communicator and the stream its collectives run on.
  struct DeviceChannel {
    c10::Device device;
    c10::Stream stream;
    std::unique_ptr<Communicator> comm;
  };

  // `profilingName` is NCCL's name for the call ("nccl:all_reduce"): what
  // the profiler and the flight recorder's analyser know.
  // `comm`: the communicator `issue` is given; by default its tensors' (the
  // one place that decides it).
  Job makeJob(c10d::OpType type, const char* profilingName, const std::string& description,
              const std::vector<at::Tensor>& inputs, std::vector<at::Tensor> outputs,
              std::function<void(Communicator&)> issue, std::function<void()> finish, int peer = -1,
              Communicator* comm = nullptr);
  // Queues a job behind earlier ones (or into the open coalesced batch); a
  // synchronous one on an idle group runs at once on the caller's thread.
  c10::intrusive_ptr<c10d::Work> submit(Job job, bool synchronous = false);
  // makeJob, then submit.
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char* profilingTitle,
                                         const std::string& description,
                                         const std::vector<at::Tensor>& inputs,
                                         std::vector<at::Tensor> outputs,
                                         std::function<void(Communicator&)> issue,
                                         std::function<void()> finish = nullptr,
                                         bool synchronous = false, int peer = -1);
  // `started` gets what the worker did for OpenMP before its first job
  // (openmp_yield.h), for the constructor to trace.
  void workerLoop(std::promise<std::string> started);
  void startRunning(const Job& job);  // with mutex_ held
  void execute(Job& job);             // runs the job; completes it unless it is on a device
  void runJob(Job& job);
  void issueOnDevice(Job& job);       // runJob on the communication stream
  // Bookkeeping once a job has ended, then its Works complete.
  void retire(Job& job, std::exception_ptr error);
  // Retires the device jobs the stream has passed; notes a library error.
  void pollDevice();
  JobTrace* traceOf(uint64_t sequence);  // with mutex_ held
  JobTrace traceOf(const Job& job);      // with mutex_ held: the history's, else the job's own
  void createCommunicator(Communicator& comm, c10d::Store& store, const std::string& key);
  // "[rank G] the group ... rank(s) that never checked in: ..." for the
  // ranks of this group that never reached createCommunicator, or "".
  std::string neverCheckedIn(c10d::Store& store, const std::string& key);
  void stopThreads();
  void closeCommunicators();
  // The error a failed job raises; a fatal library error is noted for the
  // watchdog first.
  std::exception_ptr classify(std::exception_ptr error);

  // A sparse COO tensor's SUM (collectives.cc).
  c10::intrusive_ptr<c10d::Work> allreduceSparse(std::vector<at::Tensor>& tensors,
                                                 const c10d::AllreduceOptions& opts);
  // All-gathers into one list of world-size tensors per input (allgather's
  // layout; allgather_coalesced's is the transpose).
  c10::intrusive_ptr<c10d::Work> allGatherLists(const std::vector<std::vector<at::Tensor>>& outputLists,
                                                const std::vector<at::Tensor>& inputs,
                                                const c10d::AllgatherOptions& opts);

  // Tensor checks, on the caller's thread. The communicator for a tensor:
  // the host's for CPU tensors, the device's for the group's accelerator.
  Communicator* communicatorFor(const at::Tensor& tensor) const;
  void checkTensor(const at::Tensor& tensor) const { communicatorFor(tensor); }
  const at::Tensor& onlyTensor(const std::vector<at::Tensor>& tensors, const char* call) const;
  void checkLike(const at::Tensor& tensor, const at::Tensor& reference, const char* what) const;
  void checkSameSize(const at::Tensor& tensor, const at::Tensor& reference, const char* what) const;
  // Shared by the single and coalesced forms.
  void checkAllGatherInto(const at::Tensor& output, const at::Tensor& input) const;
  void checkReduceScatterFrom(const at::Tensor& output, const at::Tensor& input) const;

  std::unique_ptr<Communicator> host_;
  std::unique_ptr<DeviceChannel> device_;  // none without an accelerator
  std::optional<AcceleratorSetup> accelerator_;  // what split() hands on
  struct LastSplit {
    const c10d::Store* store;
    std::vector<int> ranks;
    c10::weak_intrusive_ptr<c10d::Backend> group;
  };
  std::optional<LastSplit> lastSplit_;  // split() is asked once per device type
  uint64_t shrinks_ = 0;                 // each shrink's keys in the store are its own
  c10::intrusive_ptr<c10d::Store> store_;
  // Where what one process says of itself goes (its whereabouts, that it
  // is ending), for every group of the job to read (StoreScope).
  c10::intrusive_ptr<c10d::Store> jobStore_;
  std::shared_ptr<StoreWatch> storeWatch_;
  std::vector<uint64_t> globalRanks_;
  size_t groupId_;
  std::shared_ptr<c10d::ProcessGroupStatus> status_;
  bool watched_;  // TORCH_MOJO_BACKEND_PG_WATCHDOG is not off
  std::atomic<const char*> raisingOwner_{nullptr};
  std::function<void()> failureHook_;  // guarded by mutex_
  std::once_flag ranksRecorded_;
  std::atomic<std::chrono::milliseconds> timeout_;
  std::atomic<uint64_t> sequence_{0};
  std::atomic<c10d::ErrorType> error_{c10d::ErrorType::SUCCESS};
  uint64_t monitoredBarriers_ = 0;  // each one's keys in the store are its own

  // The batch between startCoalescing and endCoalescing (caller's thread).
  bool coalescing_ = false;
  std::vector<Job> coalesced_;

  std::mutex mutex_;  // guards the queue, the running job and the state below
  std::condition_variable workAvailable_;  // the worker waits for a job it may run
  std::deque<Job> queue_;
  std::deque<Job> inFlight_;  // device jobs enqueued on the stream, oldest first
  bool stopping_ = false;
  bool aborted_ = false;
  std::string abortReason_;
  bool running_ = false;
  uint64_t runningSequence_ = 0;
  JobTrace runningTrace_;
  std::deque<JobTrace> history_;  // the last collectives issued
  std::string fatalError_;        // set by classify() on the running job's thread
  std::string failure_;           // a fatal error, until the watchdog reports it
  JobTrace failed_;
  std::condition_variable failureReported_;
  uint64_t reportedUpTo_ = 0;     // the last sequence the watchdog reported
  uint64_t releasedUpTo_ = 0;     // the last failed job the watchdog let go
  Clock::time_point lastCoordination_;
  uint64_t epochSeen_ = 0;

  std::thread worker_;
};

}  // namespace torch_mojo
