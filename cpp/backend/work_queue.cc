// The queue of jobs behind the Works a group returns: each group's
// worker thread runs its jobs in issue order, on the host or by enqueuing
// them on the accelerator's communication stream, and retires them.
#include "backend/process_group_mojo.hpp"

#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <torch/csrc/distributed/c10d/logger.hpp>

#include "backend/openmp_yield.h"
#include "backend/watchdog.hpp"

namespace torch_mojo {

using c10d::OpType;

// ------------------------------------------------------- jobs and threads

ProcessGroupMojo::Job ProcessGroupMojo::makeJob(OpType type, const char* profilingName,
                                                const std::string& description,
                                                const std::vector<at::Tensor>& inputs,
                                                std::vector<at::Tensor> outputs,
                                                std::function<void(Communicator&)> issue,
                                                std::function<void()> finish, int peer,
                                                Communicator* comm) {
  const uint64_t sequence = ++sequence_;
  if (comm == nullptr) {
    comm = !inputs.empty() ? communicatorFor(inputs[0])
           : !outputs.empty() ? communicatorFor(outputs[0])
                              : host_.get();
  }
  const bool deviceJob = device_ && comm == device_->comm.get();
  auto work = c10::make_intrusive<WorkMojo>(
      rank_, type, sequence, "#" + std::to_string(sequence) + " (" + description + ")", profilingName, inputs,
      outputs, deviceJob ? std::optional<c10::Device>(device_->device) : std::nullopt);
  Job job{work, std::move(issue), std::move(finish), {}, std::make_shared<CompletionEvent>(), {}};
  job.comm = comm;
  job.trace = JobTrace{sequence, description, Clock::now(), JobTrace::State::Queued,
                    deviceJob ? device_->device.str() : "cpu", type == OpType::BARRIER};
  if (deviceJob) {
    // The job runs after what the caller's current stream holds now, its
    // own preparation (contiguous copies, buffers) included.
    c10::impl::VirtualGuardImpl guard(device_->device.type());
    job.ready = std::make_shared<c10::Event>(device_->device.type());
    job.ready->record(guard.getStream(device_->device));
  }
  if (!watched_) return job;
  recordGroupRanks();
  // As the flight recorder's analyser expects: "nccl:send 0->1", "nccl:recv 1<-0".
  const bool isP2P =
      type == OpType::SEND || type == OpType::RECV || type == OpType::RECVANYSOURCE;
  std::string name = profilingName;
  if (type == OpType::SEND) name += " " + std::to_string(rank_) + "->" + std::to_string(peer);
  if (type == OpType::RECV) name += " " + std::to_string(rank_) + "<-" + std::to_string(peer);
  static std::atomic<size_t> collectives{0}, transfers{0}, ops{0};
  job.recordId = flight_recorder::record(
      groupId_, {getGroupUid(), getGroupDesc()}, isP2P ? 0 : ++collectives, isP2P ? ++transfers : 0,
      ++ops, name, inputs, outputs, job.done.get(), timeout_.load(), status_, isP2P);
  std::lock_guard<std::mutex> lock(mutex_);
  status_->lastEnqueuedSeq = static_cast<int64_t>(sequence);
  status_->lastEnqueuedWorkName = name;
  history_.push_back(job.trace);
  if (history_.size() > 8) history_.pop_front();
  return job;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::submit(Job job, bool synchronous) {
  c10::intrusive_ptr<c10d::Work> work = job.work;
  if (coalescing_) {
    coalesced_.push_back(std::move(job));
    return work;
  }
  bool runHere = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(!stopping_, "the mojo process group was shut down");
    // A blocking call on an idle group runs on the caller's thread: two
    // thread hand-offs would cost more than a small collective itself.
    if (synchronous && queue_.empty() && !running_) {
      startRunning(job);
      runHere = true;
    } else {
      queue_.push_back(std::move(job));
    }
  }
  if (runHere)
    execute(job);
  else
    workAvailable_.notify_one();
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::enqueue(
    OpType type, const char* profilingTitle, const std::string& description,
    const std::vector<at::Tensor>& inputs, std::vector<at::Tensor> outputs,
    std::function<void(Communicator&)> issue, std::function<void()> finish, bool synchronous,
    int peer) {
  return submit(makeJob(type, profilingTitle, description, inputs, std::move(outputs),
                        std::move(issue), std::move(finish), peer),
                synchronous);
}

void ProcessGroupMojo::startCoalescing() {
  TORCH_CHECK(!coalescing_, "startCoalescing called twice without endCoalescing");
  coalescing_ = true;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::endCoalescing() {
  TORCH_CHECK(coalescing_, "endCoalescing without startCoalescing");
  coalescing_ = false;
  auto jobs = std::make_shared<std::vector<Job>>(std::move(coalesced_));
  coalesced_.clear();
  std::vector<at::Tensor> outputs;
  std::vector<c10::intrusive_ptr<WorkMojo>> members;
  for (const auto& job : *jobs) {
    members.push_back(job.work);
    for (const auto& tensor : job.work->result()) outputs.push_back(tensor);
  }
  // Its members' communicator, whose outputs it has (a batch of sends has
  // none): all members must use the same.
  Communicator* comm = jobs->empty() ? host_.get() : jobs->front().comm;
  for (const auto& job : *jobs)
    TORCH_CHECK_VALUE(job.comm == comm, "a coalesced batch mixes ", jobs->front().trace.device,
                      " and ", job.trace.device,
                      " tensors; the tensors of one batch must all be on one device");
  // One library group: sends and receives of the batch progress together.
  Job batch = makeJob(
      OpType::COALESCED, "nccl:coalesced", c10::str("coalesced batch of ", jobs->size()), {},
      outputs,
      [jobs](Communicator& comm) {
        comm.group([&] {
          for (auto& job : *jobs) job.issue(comm);
        });
      },
      [jobs] {
        for (auto& job : *jobs)
          if (job.finish) job.finish();
      },
      -1, comm);
  batch.members = std::move(members);
  batch.batch = jobs;
  return submit(std::move(batch));
}

void ProcessGroupMojo::runJob(Job& job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_) std::rethrow_exception(distBackendError(abortReason_));
  }
  // Below autograd, as a library that writes device memory directly is:
  // results land in the caller's tensors (views of a multi-output op's
  // outputs among them) without counting as in-place autograd operations.
  at::AutoDispatchBelowADInplaceOrView belowAutograd;
  job.issue(*job.comm);
  if (job.finish) job.finish();
}

void ProcessGroupMojo::startRunning(const Job& job) {
  running_ = true;
  runningSequence_ = job.work->getSequencenumber();
  runningTrace_ = job.trace;
  if (JobTrace* trace = traceOf(runningSequence_)) trace->state = JobTrace::State::Running;
  status_->lastStartedSeq = static_cast<int64_t>(runningSequence_);
}

JobTrace* ProcessGroupMojo::traceOf(uint64_t sequence) {
  for (auto& trace : history_)
    if (trace.sequence == sequence) return &trace;
  return nullptr;
}

JobTrace ProcessGroupMojo::traceOf(const Job& job) {
  const JobTrace* recorded = traceOf(job.work->getSequencenumber());
  return recorded != nullptr ? *recorded : job.trace;
}

void ProcessGroupMojo::issueOnDevice(Job& job) {
  const c10::Stream& stream = device_->stream;
  c10::DeviceGuard onDevice(device_->device);
  c10::StreamGuard onStream(stream);  // the copies of `finish` go on it too
  job.ready->block(stream);
  try {
    runJob(job);
  } catch (...) {
    // Calls enqueued before the failure (a group's first ones) still use the
    // job's tensors: they go only once the stream has passed them. A stream
    // that never gets there is the watchdog's, as this job is running.
    job.work->end().record(stream);
    job.work->end().synchronize();
    throw;
  }
  for (auto& member : job.members) member->end().record(stream);
  job.work->end().record(stream);
}

void ProcessGroupMojo::execute(Job& job) {
  std::exception_ptr error;
  try {
    if (job.ready)
      issueOnDevice(job);
    else
      runJob(job);
  } catch (...) {
    error = classify(std::current_exception());
    std::lock_guard<std::mutex> lock(mutex_);
    // After an abort the library only knows "aborted"; say why. The abort
    // has decided what happens: the watchdog has nothing more to report.
    if (aborted_) {
      error = distBackendError(abortReason_);
      fatalError_.clear();
    }
  }
  if (job.ready && !error) {
    // Enqueued on the stream: the caller may go on; the job (and the
    // tensors it holds) waits in flight until the stream passes its end.
    try {
      for (auto& member : job.members) member->issued(device_->stream);
      job.work->issued(device_->stream);
    } catch (...) {
      error = std::current_exception();  // a device error recording the future's event
    }
  }
  if (job.ready && !error) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      running_ = false;
      inFlight_.push_back(std::move(job));
    }
    workAvailable_.notify_one();
    return;
  }
  bool stopping;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    running_ = false;
    stopping = stopping_;
  }
  if (stopping) workAvailable_.notify_one();  // a worker waiting to stop waits for this job
  retire(job, error);
}

void ProcessGroupMojo::pollDevice() {
  while (true) {
    Job job;
    std::exception_ptr error;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (inFlight_.empty()) return;
      // One stream: jobs end in the order they were enqueued.
      std::string failure;
      try {
        if (!inFlight_.front().work->end().query()) {
          if (aborted_) return;  // the worker retires what is left as it stops
          failure = device_->comm->asyncError();
          if (failure.empty()) return;  // still running
        }
      } catch (const std::exception& deviceError) {
        failure = deviceError.what();  // a device fault, reported by the runtime
      }
      if (!failure.empty()) {
        fatalError_ = c10::str(device_->comm->library().kind(), " reported an error: ", failure);
        error = distBackendError(fatalError_);
      }
      job = std::move(inFlight_.front());
      inFlight_.pop_front();
    }
    // As ProcessGroupNCCL does: the kernels still queued behind a failed
    // collective are stopped before their tensors are released.
    if (error) device_->comm->abort();
    retire(job, error);
  }
}

void ProcessGroupMojo::retire(Job& job, std::exception_ptr error) {
  job.done->done.store(true);
  flight_recorder::retire(job.recordId);
  if (job.batch) {
    for (auto& member : *job.batch) {
      member.done->done.store(true);
      flight_recorder::retire(member.recordId);
    }
  }
  bool queued;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t sequence = job.work->getSequencenumber();
    const auto ended = error ? JobTrace::State::Failed : JobTrace::State::Completed;
    JobTrace* trace = traceOf(sequence);
    if (trace != nullptr) trace->state = ended;
    if (job.batch)
      for (const auto& member : *job.batch)
        if (JobTrace* memberTrace = traceOf(member.work->getSequencenumber())) memberTrace->state = ended;
    status_->lastCompletedSeq = static_cast<int64_t>(sequence);
    if (!fatalError_.empty() && watched_) {
      // The ranks are out of step: the watchdog reports it (and, in its
      // default mode, ends the run) before the caller sees the error.
      failure_ = fatalError_;
      failed_ = trace != nullptr ? *trace : JobTrace{sequence, job.work->description()};
      Watchdog::get().wake();
      failureReported_.wait(lock, [&] { return releasedUpTo_ >= sequence; });
    }
    fatalError_.clear();
    queued = !queue_.empty();
  }
  // Only when a job waits: waking threads for nothing costs a core's time
  // that the peers' ranks need.
  if (queued) workAvailable_.notify_one();
  for (auto& member : job.members) member->complete(error);
  job.work->complete(error);
}

void ProcessGroupMojo::workerLoop(std::promise<std::string> started) {
  // How often device jobs in flight are checked for their end.
  constexpr auto kDevicePoll = std::chrono::milliseconds(1);
  std::string openMp;
  try {
    const Communicator::CoreSharing sharing = host_->coreSharing();
    openMp = yieldOpenMpToOtherRanks(sharing.ranks, sharing.cpus);
  } catch (const std::exception&) {
    // A library that cannot say where its ranks are leaves OpenMP as it is.
  }
  started.set_value(openMp);
  // This thread's device, once: runtimes that restore "the current device"
  // after an event call would otherwise make one on device 0.
  if (device_) c10::impl::VirtualGuardImpl(device_->device.type()).uncheckedSetDevice(device_->device);
  while (true) {
    pollDevice();
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // One job at a time, whether it runs here or on a caller's thread.
      auto runnable = [this] { return !running_ && !queue_.empty(); };
      auto finished = [this] {
        return stopping_ && !running_ && queue_.empty() && (inFlight_.empty() || aborted_);
      };
      auto wake = [&] { return runnable() || finished(); };
      if (inFlight_.empty())  // until there is a job to run, or one in flight to poll
        workAvailable_.wait(lock, [&] { return wake() || !inFlight_.empty(); });
      else
        workAvailable_.wait_for(lock, kDevicePoll, wake);
      if (finished()) {
        // After an abort, what is still in flight ends with the abort's reason.
        std::deque<Job> abandoned;
        abandoned.swap(inFlight_);
        fatalError_.clear();  // the abort has decided already: nothing left to report
        lock.unlock();
        for (auto& left : abandoned) retire(left, distBackendError(abortReason_));
        return;
      }
      if (!runnable()) continue;
      job = std::move(queue_.front());
      queue_.pop_front();
      startRunning(job);
    }
    execute(job);
  }
}

}  // namespace torch_mojo
