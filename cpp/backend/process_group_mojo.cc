#include "backend/process_group_mojo.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <set>

#include <ATen/Functions.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/ScalarType.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <torch/csrc/distributed/c10d/logger.hpp>

#include "backend/shared_pool.h"
#include "backend/watchdog.hpp"

namespace torch_mojo {

namespace {

using c10d::OpType;

std::string dtypeName(const at::Tensor& tensor) {
  return std::string(c10::getDtypeNames(tensor.scalar_type()).first);
}

// torch dtypes and the NCCL datatype that carries them. bool travels as
// uint8, with its reductions mapped as ProcessGroupNCCL maps them.
ncclDataType_t ncclDatatypeOf(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::kBool:
    case at::kByte: return ncclUint8;
    case at::kChar: return ncclInt8;
    case at::kInt: return ncclInt32;
    case at::kUInt32: return ncclUint32;
    case at::kLong: return ncclInt64;
    case at::kUInt64: return ncclUint64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    default:
      TORCH_CHECK_TYPE(false, "the mojo backend does not support ", dtypeName(tensor),
                       " tensors; it supports bool, uint8, int8, int32, uint32, int64, uint64, "
                       "float16, bfloat16, float32 and float64");
  }
}

const char* reduceOpName(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM: return "sum";
    case c10d::ReduceOp::AVG: return "avg";
    case c10d::ReduceOp::PRODUCT: return "product";
    case c10d::ReduceOp::MIN: return "min";
    case c10d::ReduceOp::MAX: return "max";
    case c10d::ReduceOp::BAND: return "band";
    case c10d::ReduceOp::BOR: return "bor";
    case c10d::ReduceOp::BXOR: return "bxor";
    case c10d::ReduceOp::PREMUL_SUM: return "premul_sum";
    default: return "unknown";
  }
}

ncclRedOp_t ncclRedOpOf(const c10d::ReduceOp& reduceOp, const at::Tensor& tensor) {
  const bool isBool = tensor.scalar_type() == at::kBool;
  switch (reduceOp.op_) {
    case c10d::ReduceOp::SUM: return isBool ? ncclMax : ncclSum;  // logical OR
    case c10d::ReduceOp::PRODUCT: return isBool ? ncclMin : ncclProd;  // logical AND
    case c10d::ReduceOp::MIN: return ncclMin;
    case c10d::ReduceOp::MAX: return ncclMax;
    case c10d::ReduceOp::AVG:
      TORCH_CHECK_TYPE(!isBool, "ReduceOp.AVG is not supported on bool tensors (as with NCCL); "
                                "use SUM for a logical OR or convert the tensor to an integer type");
      return ncclAvg;
    case c10d::ReduceOp::PREMUL_SUM:
      TORCH_CHECK_VALUE(false, "ReduceOp.PREMUL_SUM is not supported by the mojo backend; "
                               "multiply the tensor by the factor, then reduce with SUM");
    default:
      TORCH_CHECK_VALUE(false, "ReduceOp.", c10::str(reduceOpName(reduceOp.op_)),
                        " is not supported by the mojo backend; use SUM, AVG, PRODUCT, MIN or MAX");
  }
}

void checkRoot(int64_t root, int size, const char* call) {
  TORCH_CHECK_VALUE(root >= 0 && root < size, call, " root ", root,
                    " is not a rank of this group of ", size);
}

std::string describe(const char* op, const at::Tensor& tensor, const char* extra = nullptr) {
  std::string text = c10::str(op, " ", tensor.numel(), " x ", dtypeName(tensor));
  return extra != nullptr ? text + " " + extra : text;
}

// Where a collective may write `output`: itself when contiguous, else a
// fresh buffer whose contents copyBack() moves into `output` afterwards.
at::Tensor writableBuffer(const at::Tensor& output) {
  return output.is_contiguous() ? output : at::empty_like(output, at::MemoryFormat::Contiguous);
}

void copyBack(const at::Tensor& output, const at::Tensor& buffer) {
  if (!buffer.is_same(output)) const_cast<at::Tensor&>(output).copy_(buffer);
}

// Rows [begin, begin + rows) of `tensor` along its first dimension.
at::Tensor rows(const at::Tensor& tensor, int64_t begin, int64_t count) {
  return tensor.dim() == 0 ? tensor : tensor.narrow(0, begin, count);
}

bool traceEnabled() {
  const char* value = std::getenv("TORCH_MOJO_BACKEND_TRACE");
  return value == nullptr || std::strcmp(value, "0") != 0;
}

// "[TRACE] collectives via <path> (<library> version <code>)", once per
// library and process: which file the guide's search order found.
void traceLibrary(const CclLibrary& library) {
  static std::mutex mutex;
  static std::set<std::string> reported;
  std::lock_guard<std::mutex> lock(mutex);
  if (!traceEnabled() || !reported.insert(library.path()).second) return;
  std::fprintf(stderr, "[TRACE] collectives via %s (%s version %d)\n", library.path().c_str(),
               library.kind().c_str(), library.version());
  std::fflush(stderr);
}

std::exception_ptr distBackendError(const std::string& message) {
  try {
    C10_THROW_ERROR(DistBackendError, message);
  } catch (...) {
    return std::current_exception();
  }
}

}  // namespace

at::Tensor sharedTensor(int64_t numel, const at::TensorOptions& options) {
  TORCH_CHECK_VALUE(numel >= 0, "a tensor needs a size of 0 or more, got ", numel);
  TORCH_CHECK_VALUE(!options.has_device() || options.device().is_cpu(),
                    "the registered pool holds CPU tensors; got device ", options.device());
  c10::Allocator* allocator = sharedPoolAllocator().get();
  const size_t bytes =
      static_cast<size_t>(numel) * c10::elementSize(c10::typeMetaToScalarType(options.dtype()));
  c10::Storage storage(c10::Storage::use_byte_size_t(), bytes, allocator->allocate(bytes), allocator,
                       /*resizable=*/false);
  return at::empty({0}, options.device(at::kCPU)).set_(storage, 0, {numel}, {1});
}

namespace {

class PoolAllocator final : public c10::Allocator {
 public:
  PoolAllocator() : pool_(SharedPool::forHost()) {}

  c10::DataPtr allocate(size_t bytes) override {
    void* block = pool_->allocate(bytes);
    return {block, new Block{pool_, block}, &releaseBlock, c10::Device(c10::DeviceType::CPU)};
  }

  void copy_data(void* destination, const void* source, std::size_t count) const override {
    std::memcpy(destination, source, count);
  }

 private:
  // A data pointer's context: the block, and the pool it returns to.
  struct Block {
    std::shared_ptr<SharedPool> pool;
    void* memory;
  };
  static void releaseBlock(void* context) {
    auto* block = static_cast<Block*>(context);
    block->pool->release(block->memory);
    delete block;
  }

  std::shared_ptr<SharedPool> pool_;
};

}  // namespace

std::shared_ptr<c10::Allocator> sharedPoolAllocator() {
  static auto allocator = std::make_shared<PoolAllocator>();
  return allocator;
}

void usePoolForCpuTensors(bool enable) {
  // c10 keeps one CPU allocator; ours takes over, then hands back.
  static std::mutex mutex;
  static c10::Allocator* previous = nullptr;
  constexpr uint8_t kPriority = 100;
  std::lock_guard<std::mutex> lock(mutex);
  if (enable && previous == nullptr) {
    previous = c10::GetCPUAllocator();
    c10::SetCPUAllocator(sharedPoolAllocator().get(), kPriority);
  } else if (!enable && previous != nullptr) {
    c10::SetCPUAllocator(previous, kPriority);
    previous = nullptr;
  }
}

// ------------------------------------------------------------------ Work

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

// -------------------------------------------------------- process group

ProcessGroupMojo::ProcessGroupMojo(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                   int size, std::chrono::milliseconds timeout,
                                   std::vector<uint64_t> globalRanks,
                                   std::optional<AcceleratorSetup> accelerator)
    : Backend(rank, size),
      accelerator_(std::move(accelerator)),
      timeout_(timeout),
      store_(store),
      globalRanks_(std::move(globalRanks)),
      status_(std::make_shared<c10d::ProcessGroupStatus>()),
      watched_(WatchdogSettings::get().mode != WatchdogSettings::Mode::Off) {
  static std::atomic<size_t> groups{0};
  groupId_ = groups++;
  if (globalRanks_.empty())
    for (int each = 0; each < size; ++each) globalRanks_.push_back(each);
  TORCH_CHECK_VALUE(static_cast<int>(globalRanks_.size()) == size, "the group has ", size,
                    " ranks but ", globalRanks_.size(), " global ranks were given");
  try {
    host_ = std::make_unique<Communicator>(hostCollectiveLibrary());
  } catch (const std::exception& error) {
    TORCH_CHECK(false, error.what(), " (reinstall torch-mojo: its libmojoccl.so is missing or broken)");
  }
  createCommunicator(*host_, *store, "torch_mojo_unique_id");
  traceLibrary(host_->library());
  if (accelerator_) {
    // As ProcessGroupNCCL does with a bound device: the communicator is made
    // now, on the current GPU, with a communication stream of its own.
    const c10::Device device = accelerator_->device;
    std::shared_ptr<CclLibrary> library;
    try {
      library = std::make_shared<CclLibrary>(accelerator_->libraryPath, accelerator_->libraryKind);
    } catch (const std::exception& error) {
      TORCH_CHECK(false, error.what(), " (it was found for ", device.str(),
                  " tensors; set TORCH_MOJO_BACKEND_",
                  accelerator_->libraryKind == "rccl" ? "RCCL" : "NCCL", "_LIB to a working library)");
    }
    c10::DeviceGuard onDevice(device);
    c10::impl::VirtualGuardImpl guard(device.type());
    c10::Stream stream = guard.getStreamFromGlobalPool(device, /*isHighPriority=*/false);
    device_.reset(new DeviceChannel{device, stream,
                                    std::make_unique<Communicator>(library, stream.native_handle())});
    createCommunicator(*device_->comm, *store, "torch_mojo_device_unique_id");
    traceLibrary(*library);
  }
  worker_ = std::thread(&ProcessGroupMojo::workerLoop, this);
  if (watched_) Watchdog::get().add(this);
  init();
}

ProcessGroupMojo::~ProcessGroupMojo() { shutdown(); }

std::exception_ptr ProcessGroupMojo::classify(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const CclError& failure) {
    // Invalid usage (a mismatch, a bad argument) is the caller's to handle;
    // anything else means the ranks are no longer in step: the watchdog's.
    if (failure.code != ncclInvalidUsage && failure.code != ncclInvalidArgument) {
      std::lock_guard<std::mutex> lock(mutex_);
      fatalError_ = failure.what();
    }
    return distBackendError(failure.what());
  } catch (...) {
    return error;
  }
}

Communicator* ProcessGroupMojo::communicatorFor(const at::Tensor& tensor) const {
  Communicator* comm = tensor.device().is_cpu() ? host_.get()
                       : device_ && tensor.device() == device_->device ? device_->comm.get()
                                                                       : nullptr;
  TORCH_CHECK_VALUE(comm != nullptr,
                    "the mojo distributed backend handles mojo and cpu tensors; got a tensor on ",
                    tensor.device(), " (this process group takes cpu",
                    device_ ? " and " + device_->device.str() : std::string(),
                    " tensors: move it to torch.accelerator.current_accelerator() or to the CPU "
                    "with .cpu())");
  TORCH_CHECK_VALUE(tensor.layout() == at::kStrided, "the mojo backend takes dense tensors; got a ",
                    tensor.layout(), " tensor");
  ncclDatatypeOf(tensor);
  return comm;
}

const at::Tensor& ProcessGroupMojo::onlyTensor(const std::vector<at::Tensor>& tensors,
                                               const char* call) const {
  TORCH_CHECK_VALUE(tensors.size() == 1, call, " with the mojo backend takes one tensor per call, got ",
                    tensors.size());
  checkTensor(tensors[0]);
  return tensors[0];
}

void ProcessGroupMojo::checkLike(const at::Tensor& tensor, const at::Tensor& reference,
                                 const char* what) const {
  checkTensor(tensor);
  TORCH_CHECK_VALUE(tensor.device() == reference.device(), what, " is on ", tensor.device(),
                    " but the input is on ", reference.device(),
                    "; the tensors of one call must all be on one device");
  TORCH_CHECK_TYPE(tensor.scalar_type() == reference.scalar_type(), what, " has dtype ",
                   dtypeName(tensor), " but the input has ", dtypeName(reference));
}

void ProcessGroupMojo::checkSameSize(const at::Tensor& tensor, const at::Tensor& reference,
                                     const char* what) const {
  checkLike(tensor, reference, what);
  TORCH_CHECK_VALUE(tensor.numel() == reference.numel(), what, " has ", tensor.numel(),
                    " elements where ", reference.numel(), " are expected; the mojo backend ",
                    "moves equal-sized tensors");
}

void ProcessGroupMojo::createCommunicator(Communicator& comm, c10d::Store& store,
                                          const std::string& key) {
  // As ProcessGroupNCCL does: rank 0 makes the unique id, the store carries
  // it to the others. The store is already prefixed for this group.
  try {
    ncclUniqueId id{};
    if (rank_ == 0) {
      id = comm.newUniqueId();
      store.set(key, std::vector<uint8_t>(id.internal, id.internal + sizeof(id.internal)));
    } else {
      std::vector<uint8_t> bytes = store.get(key);
      TORCH_CHECK(bytes.size() == sizeof(id.internal), "the unique id in the store has ",
                  bytes.size(), " bytes, expected ", sizeof(id.internal),
                  " (do all ranks run the same torch-mojo?)");
      std::memcpy(id.internal, bytes.data(), bytes.size());
    }
    comm.init(id, size_, rank_);
  } catch (const CclError& error) {
    C10_THROW_ERROR(DistBackendError, error.what());
  }
}

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupMojo::getBackendOptions() {
  return c10::make_intrusive<Options>("mojo", timeout_.load());
}

namespace {

void sendTensor(Communicator& comm, const at::Tensor& tensor, int peer) {
  comm.send(tensor.data_ptr(), tensor.numel(), ncclDatatypeOf(tensor), peer);
}

void recvTensor(Communicator& comm, const at::Tensor& tensor, int peer) {
  comm.recv(tensor.data_ptr(), tensor.numel(), ncclDatatypeOf(tensor), peer);
}

}  // namespace

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
      rank_, type, sequence, c10::str("#", sequence, " (", description, ")"), profilingName, inputs,
      outputs, deviceJob ? std::optional<c10::Device>(device_->device) : std::nullopt);
  Job job{work, std::move(issue), std::move(finish), {}, std::make_shared<CompletionEvent>(), {}};
  job.comm = comm;
  job.trace = Trace{sequence, description, Clock::now(), Trace::State::Queued,
                    deviceJob ? device_->device.str() : "cpu"};
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
  const bool isP2P = type == OpType::SEND || type == OpType::RECV;
  std::string name = profilingName;
  if (type == OpType::SEND) name += c10::str(" ", rank_, "->", peer);
  if (type == OpType::RECV) name += c10::str(" ", rank_, "<-", peer);
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
  job.issue(*job.comm);
  if (job.finish) job.finish();
}

void ProcessGroupMojo::startRunning(const Job& job) {
  running_ = true;
  runningSequence_ = job.work->getSequencenumber();
  runningTrace_ = job.trace;
  if (Trace* trace = traceOf(runningSequence_)) trace->state = Trace::State::Running;
  status_->lastStartedSeq = static_cast<int64_t>(runningSequence_);
}

ProcessGroupMojo::Trace* ProcessGroupMojo::traceOf(uint64_t sequence) {
  for (auto& trace : history_)
    if (trace.sequence == sequence) return &trace;
  return nullptr;
}

ProcessGroupMojo::Trace ProcessGroupMojo::traceOf(const Job& job) {
  const Trace* recorded = traceOf(job.work->getSequencenumber());
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
    // After an abort the library only knows "aborted"; say why.
    if (aborted_) error = distBackendError(abortReason_);
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
    const auto ended = error ? Trace::State::Failed : Trace::State::Completed;
    Trace* trace = traceOf(sequence);
    if (trace != nullptr) trace->state = ended;
    if (job.batch)
      for (const auto& member : *job.batch)
        if (Trace* memberTrace = traceOf(member.work->getSequencenumber())) memberTrace->state = ended;
    status_->lastCompletedSeq = static_cast<int64_t>(sequence);
    if (!fatalError_.empty() && watched_) {
      // The ranks are out of step: the watchdog reports it (and, in its
      // default mode, ends the run) before the caller sees the error.
      failure_ = fatalError_;
      failed_ = trace != nullptr ? *trace : Trace{sequence, job.work->description()};
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

void ProcessGroupMojo::workerLoop() {
  // How often device jobs in flight are checked for their end.
  constexpr auto kDevicePoll = std::chrono::milliseconds(1);
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

ProcessGroupMojo::Health ProcessGroupMojo::health() {
  std::lock_guard<std::mutex> lock(mutex_);
  // A device job in flight was issued before the one running on the host.
  const bool running = running_ || !inFlight_.empty();
  Health health{running,  running || !queue_.empty(), {},     {history_.begin(), history_.end()},
                failure_, failed_,                    timeout_.load()};
  if (!inFlight_.empty()) {
    health.current = traceOf(inFlight_.front());
  } else if (running_) {
    const Trace* recorded = traceOf(runningSequence_);
    health.current = recorded != nullptr ? *recorded : runningTrace_;
  } else if (!queue_.empty()) {
    health.current = traceOf(queue_.front());
  }
  return health;
}

bool ProcessGroupMojo::reported(uint64_t sequence) {
  std::lock_guard<std::mutex> lock(mutex_);
  return sequence <= reportedUpTo_;
}

void ProcessGroupMojo::markReported(uint64_t sequence) {
  std::lock_guard<std::mutex> lock(mutex_);
  reportedUpTo_ = std::max(reportedUpTo_, sequence);
  failure_.clear();
}

void ProcessGroupMojo::releaseFailedJob(uint64_t sequence) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    releasedUpTo_ = std::max(releasedUpTo_, sequence);
  }
  failureReported_.notify_all();
}

bool ProcessGroupMojo::coordinationDue(std::chrono::milliseconds period) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto now = Clock::now();
  if (now - lastCoordination_ < period) return false;
  lastCoordination_ = now;
  return true;
}

bool ProcessGroupMojo::newRequest(uint64_t epoch) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (epoch <= epochSeen_) return false;
  epochSeen_ = epoch;
  return true;
}

void ProcessGroupMojo::recordGroupRanks() {
  std::call_once(ranksRecorded_, [this] {
    flight_recorder::recordGroupRanks({getGroupUid(), getGroupDesc()}, globalRanks_);
  });
}

void ProcessGroupMojo::abortCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!host_->initialised() || aborted_) return;
    aborted_ = true;
    abortReason_ = c10::str("[rank ", globalRank(), "] the communicator was aborted by the watchdog");
  }
  host_->abort();
  if (device_) device_->comm->abort();
}

void ProcessGroupMojo::stopThreads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  workAvailable_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void ProcessGroupMojo::abort() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!host_->initialised()) return;
    if (!aborted_) abortReason_ = c10::str("[rank ", rank_, "] the process group was aborted");
    aborted_ = true;
  }
  host_->abort();
  if (device_) device_->comm->abort();
  stopThreads();
  if (watched_) Watchdog::get().remove(this);
  closeCommunicators();
}

void ProcessGroupMojo::shutdown() {
  if (!host_ || !host_->initialised()) return;
  stopThreads();  // lets queued collectives (and those on the device) finish first
  if (watched_) Watchdog::get().remove(this);
  closeCommunicators();
}

void ProcessGroupMojo::closeCommunicators() {
  // An aborted communicator is only forgotten (Communicator::destroy).
  host_->destroy();
  if (device_) device_->comm->destroy();
}

c10::intrusive_ptr<c10d::Backend> ProcessGroupMojo::split(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<Options>& opts) {
  auto found = std::find(ranks.begin(), ranks.end(), rank_);
  if (found == ranks.end()) return nullptr;  // not a member: no group here
  // c10d's splitGroup asks the backend of each device type for its split,
  // and this one backend serves the CPU and the accelerator: the second
  // request, with the same store, gets the group the first one made. (The
  // store lives as long as that group, so its address cannot be reused.)
  if (lastSplit_ && lastSplit_->store == store.get() && lastSplit_->ranks == ranks)
    if (auto made = lastSplit_->group.lock()) return made;
  const auto timeout = opts ? opts->timeout : timeout_.load();
  std::vector<uint64_t> members;
  for (int rank : ranks) members.push_back(globalRanks_[rank]);
  c10::intrusive_ptr<c10d::Backend> made = c10::make_intrusive<ProcessGroupMojo>(
      store, static_cast<int>(found - ranks.begin()), static_cast<int>(ranks.size()), timeout,
      members, accelerator_);
  lastSplit_.emplace(LastSplit{store.get(), ranks, c10::weak_intrusive_ptr<c10d::Backend>(made)});
  return made;
}

// ------------------------------------------------------------ reductions

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  at::Tensor tensor = onlyTensor(tensors, "all_reduce");
  const ncclRedOp_t op = ncclRedOpOf(opts.reduceOp, tensor);
  at::Tensor buffer = tensor.contiguous();
  return enqueue(
      OpType::ALLREDUCE, "nccl:all_reduce",
      describe("all_reduce", tensor, reduceOpName(opts.reduceOp.op_)), tensors, tensors,
      [buffer, op](Communicator& comm) {
        comm.allReduce(buffer.data_ptr(), buffer.data_ptr(), buffer.numel(), ncclDatatypeOf(buffer),
                        op);
      },
      [tensor, buffer] { copyBack(tensor, buffer); }, !opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK_VALUE(!tensors.empty(), "allreduce_coalesced needs at least one tensor");
  for (const auto& tensor : tensors) checkLike(tensor, tensors[0], "a coalesced tensor");
  const ncclRedOp_t op = ncclRedOpOf(opts.reduceOp, tensors[0]);
  // One collective over all tensors laid end to end.
  std::vector<at::Tensor> flat;
  for (const auto& tensor : tensors) flat.push_back(tensor.reshape({-1}));
  at::Tensor buffer = at::cat(flat);
  return enqueue(
      OpType::ALLREDUCE_COALESCED, "nccl:allreduce_coalesced",
      describe("allreduce_coalesced", buffer, reduceOpName(opts.reduceOp.op_)), tensors, tensors,
      [buffer, op](Communicator& comm) {
        comm.allReduce(buffer.data_ptr(), buffer.data_ptr(), buffer.numel(), ncclDatatypeOf(buffer),
                        op);
      },
      [tensors, buffer] {
        int64_t offset = 0;
        for (const auto& tensor : tensors) {
          const_cast<at::Tensor&>(tensor).copy_(
              buffer.narrow(0, offset, tensor.numel()).view(tensor.sizes()));
          offset += tensor.numel();
        }
      },
      !opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::reduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::ReduceOptions& opts) {
  at::Tensor tensor = onlyTensor(tensors, "reduce");
  checkRoot(opts.rootRank, size_, "reduce");
  const ncclRedOp_t op = ncclRedOpOf(opts.reduceOp, tensor);
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor buffer = tensor.contiguous();
  return enqueue(
      OpType::REDUCE, "nccl:reduce",
      describe("reduce", tensor, c10::str(reduceOpName(opts.reduceOp.op_), " root ", root).c_str()),
      tensors, tensors,
      [buffer, op, root](Communicator& comm) {
        comm.reduce(buffer.data_ptr(), buffer.data_ptr(), buffer.numel(), ncclDatatypeOf(buffer), op,
                     root);
      },
      [tensor, buffer] { copyBack(tensor, buffer); }, !opts.asyncOp);
}

void ProcessGroupMojo::checkReduceScatterFrom(const at::Tensor& output,
                                              const at::Tensor& input) const {
  checkTensor(output);
  checkLike(input, output, "the reduce_scatter_tensor input");
  TORCH_CHECK_VALUE(input.numel() == size_ * output.numel(),
                    "reduce_scatter_tensor needs an input of world size x output elements (",
                    size_, " x ", output.numel(), "), got ", input.numel());
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  std::vector<at::Tensor> outputs{output}, inputs{input};
  return reduce_scatter_tensor_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(!inputs.empty() && outputs.size() == inputs.size(),
                    "reduce_scatter_tensor needs as many outputs as inputs, and at least one");
  for (size_t i = 0; i < inputs.size(); ++i) checkReduceScatterFrom(outputs[i], inputs[i]);
  const ncclRedOp_t op = ncclRedOpOf(opts.reduceOp, outputs[0]);
  std::vector<at::Tensor> sources, buffers;
  for (size_t i = 0; i < inputs.size(); ++i) {
    sources.push_back(inputs[i].contiguous());
    buffers.push_back(writableBuffer(outputs[i]));
  }
  std::string description = inputs.size() == 1
                                ? describe("reduce_scatter_tensor", outputs[0],
                                           reduceOpName(opts.reduceOp.op_))
                                : c10::str("reduce_scatter_tensor_coalesced ", inputs.size(),
                                           " tensors ", reduceOpName(opts.reduceOp.op_));
  // A coalesced batch is COALESCED, as for all-gathers: torch before 2.13
  // has no REDUCE_SCATTER_TENSOR_COALESCED, and the GPU machines run 2.11.
  return enqueue(
      inputs.size() == 1 ? OpType::_REDUCE_SCATTER_BASE : OpType::COALESCED,
      inputs.size() == 1 ? "nccl:_reduce_scatter_base" : "nccl:reduce_scatter_tensor_coalesced",
      description, inputs, outputs,
      [sources, buffers, op](Communicator& comm) {
        for (size_t i = 0; i < sources.size(); ++i)
          comm.reduceScatter(sources[i].data_ptr(), buffers[i].data_ptr(), buffers[i].numel(),
                              ncclDatatypeOf(buffers[i]), op);
      },
      [outputs, buffers] {
        for (size_t i = 0; i < outputs.size(); ++i) copyBack(outputs[i], buffers[i]);
      },
      !opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  at::Tensor output = onlyTensor(outputs, "reduce_scatter");
  TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                    "reduce_scatter needs a list of ", size_, " input tensors (one per rank)");
  std::vector<at::Tensor> flat;
  for (const auto& input : inputs[0]) {
    checkSameSize(input, output, "a reduce_scatter input");
    flat.push_back(input.reshape({-1}));
  }
  std::vector<at::Tensor> single{output}, joined{at::cat(flat)};
  return reduce_scatter_tensor_coalesced(single, joined, opts);
}

// ------------------------------------------------------------ broadcasts

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::broadcast(std::vector<at::Tensor>& tensors,
                                                           const c10d::BroadcastOptions& opts) {
  at::Tensor tensor = onlyTensor(tensors, "broadcast");
  checkRoot(opts.rootRank, size_, "broadcast");
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor buffer = tensor.contiguous();
  return enqueue(
      OpType::BROADCAST, "nccl:broadcast",
      describe("broadcast", tensor, c10::str("root ", root).c_str()), tensors, tensors,
      [buffer, root](Communicator& comm) {
        comm.broadcast(buffer.data_ptr(), buffer.data_ptr(), buffer.numel(), ncclDatatypeOf(buffer),
                        root);
      },
      [tensor, buffer] { copyBack(tensor, buffer); }, !opts.asyncOp);
}

// ------------------------------------------------------------ all-gathers

void ProcessGroupMojo::checkAllGatherInto(const at::Tensor& output, const at::Tensor& input) const {
  checkTensor(input);
  checkLike(output, input, "the all_gather_into_tensor output");
  TORCH_CHECK_VALUE(output.numel() == size_ * input.numel(),
                    "all_gather_into_tensor needs an output of world size x input elements (",
                    size_, " x ", input.numel(), "), got ", output.numel());
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  std::vector<at::Tensor> outputs{output}, inputs{input};
  return allgather_into_tensor_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(!inputs.empty() && outputs.size() == inputs.size(),
                    "all_gather_into_tensor needs as many outputs as inputs, and at least one");
  std::vector<at::Tensor> sources, buffers;
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkAllGatherInto(outputs[i], inputs[i]);
    sources.push_back(inputs[i].contiguous());
    buffers.push_back(writableBuffer(outputs[i]));
  }
  std::string description = inputs.size() == 1
                                ? describe("all_gather_into_tensor", inputs[0])
                                : c10::str("allgather_into_tensor_coalesced ", inputs.size(), " tensors");
  return enqueue(
      inputs.size() == 1 ? OpType::_ALLGATHER_BASE : OpType::COALESCED,
      inputs.size() == 1 ? "nccl:_all_gather_base" : "nccl:all_gather_into_tensor_coalesced",
      description, inputs, outputs,
      [sources, buffers](Communicator& comm) {
        for (size_t i = 0; i < sources.size(); ++i)
          comm.allGather(sources[i].data_ptr(), buffers[i].data_ptr(), sources[i].numel(),
                          ncclDatatypeOf(sources[i]));
      },
      [outputs, buffers] {
        for (size_t i = 0; i < outputs.size(); ++i) copyBack(outputs[i], buffers[i]);
      },
      !opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  std::vector<std::vector<at::Tensor>> lists = outputs;
  return allgather_coalesced(lists, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(!inputs.empty() && outputLists.size() == inputs.size(),
                    "all_gather needs one output list per input");
  std::vector<at::Tensor> sources, gathered, targets;
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkTensor(inputs[i]);
    TORCH_CHECK_VALUE(static_cast<int>(outputLists[i].size()) == size_, "all_gather needs a list of ",
                      size_, " output tensors (one per rank), got ", outputLists[i].size());
    for (const auto& output : outputLists[i]) {
      checkSameSize(output, inputs[i], "an all_gather output");
      targets.push_back(output);
    }
    sources.push_back(inputs[i].contiguous());
    gathered.push_back(at::empty({size_ * inputs[i].numel()}, inputs[i].options()));
  }
  const int size = size_;
  return enqueue(
      inputs.size() == 1 ? OpType::ALLGATHER : OpType::ALLGATHER_COALESCED, "nccl:all_gather",
      inputs.size() == 1 ? describe("all_gather", inputs[0])
                         : c10::str("allgather_coalesced ", inputs.size(), " tensors"),
      inputs, targets,
      [sources, gathered](Communicator& comm) {
        for (size_t i = 0; i < sources.size(); ++i)
          comm.allGather(sources[i].data_ptr(), gathered[i].data_ptr(), sources[i].numel(),
                          ncclDatatypeOf(sources[i]));
      },
      [targets, gathered, sources, size] {
        for (size_t i = 0; i < sources.size(); ++i) {
          const int64_t numel = sources[i].numel();
          for (int peer = 0; peer < size; ++peer) {
            const at::Tensor& target = targets[i * size + peer];
            const_cast<at::Tensor&>(target).copy_(
                gathered[i].narrow(0, peer * numel, numel).view(target.sizes()));
          }
        }
      },
      !opts.asyncOp);
}

// --------------------------------------------- gather, scatter, all-to-all

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  at::Tensor input = onlyTensor(inputs, "gather");
  checkRoot(opts.rootRank, size_, "gather");
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor source = input.contiguous();
  if (rank_ != root) {
    TORCH_CHECK_VALUE(outputs.empty() || outputs[0].empty(),
                      "gather: only the root (rank ", root, ") passes a gather list");
    return enqueue(OpType::GATHER, "nccl:gather", describe("gather", input, c10::str("root ", root).c_str()),
                   inputs, {},
                   [source, root](Communicator& comm) { sendTensor(comm, source, root); });
  }
  TORCH_CHECK_VALUE(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                    "gather: the root needs a gather list of ", size_, " tensors (one per rank)");
  std::vector<at::Tensor> targets = outputs[0], buffers;
  for (const auto& target : targets) {
    checkSameSize(target, input, "a gather output");
    buffers.push_back(writableBuffer(target));
  }
  return enqueue(
      OpType::GATHER, "nccl:gather", describe("gather", input, c10::str("root ", root).c_str()),
      inputs, targets,
      [buffers, root](Communicator& comm) {
        comm.group([&] {
          for (size_t peer = 0; peer < buffers.size(); ++peer)
            if (static_cast<int>(peer) != root) recvTensor(comm, buffers[peer], peer);
        });
      },
      [targets, buffers, source, root] {
        const_cast<at::Tensor&>(buffers[root]).copy_(source.view(buffers[root].sizes()));
        for (size_t peer = 0; peer < targets.size(); ++peer) copyBack(targets[peer], buffers[peer]);
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  at::Tensor output = onlyTensor(outputs, "scatter");
  checkRoot(opts.rootRank, size_, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  at::Tensor buffer = writableBuffer(output);
  if (rank_ != root) {
    TORCH_CHECK_VALUE(inputs.empty() || inputs[0].empty(),
                      "scatter: only the root (rank ", root, ") passes a scatter list");
    return enqueue(
        OpType::SCATTER, "nccl:scatter", describe("scatter", output, c10::str("root ", root).c_str()),
        {}, outputs, [buffer, root](Communicator& comm) { recvTensor(comm, buffer, root); },
        [output, buffer] { copyBack(output, buffer); });
  }
  TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                    "scatter: the root needs a scatter list of ", size_, " tensors (one per rank)");
  std::vector<at::Tensor> sources;
  for (const auto& input : inputs[0]) {
    checkSameSize(input, output, "a scatter input");
    sources.push_back(input.contiguous());
  }
  return enqueue(
      OpType::SCATTER, "nccl:scatter", describe("scatter", output, c10::str("root ", root).c_str()),
      inputs[0], outputs,
      [sources, root](Communicator& comm) {
        comm.group([&] {
          for (size_t peer = 0; peer < sources.size(); ++peer)
            if (static_cast<int>(peer) != root) sendTensor(comm, sources[peer], peer);
        });
      },
      [output, sources, root] {
        const_cast<at::Tensor&>(output).copy_(sources[root].view(output.sizes()));
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& outputSplitSizes,
    std::vector<int64_t>& inputSplitSizes, const c10d::AllToAllOptions& opts) {
  checkTensor(input);
  checkLike(output, input, "the all_to_all_single output");
  // Split sizes count rows (the first dimension); empty means equal parts.
  auto splits = [this](const at::Tensor& tensor, const std::vector<int64_t>& given,
                       const char* which) {
    const int64_t total = tensor.dim() == 0 ? 1 : tensor.size(0);
    if (given.empty()) {
      TORCH_CHECK_VALUE(total % size_ == 0, "all_to_all_single: the ", which, " has ", total,
                        " rows, which do not split into ", size_, " equal parts; pass ", which,
                        "_split_sizes");
      return std::vector<int64_t>(size_, total / size_);
    }
    TORCH_CHECK_VALUE(static_cast<int>(given.size()) == size_, "all_to_all_single: ", which,
                      "_split_sizes needs ", size_, " entries, got ", given.size());
    TORCH_CHECK_VALUE(std::accumulate(given.begin(), given.end(), int64_t{0}) == total,
                      "all_to_all_single: ", which, "_split_sizes add up to ",
                      std::accumulate(given.begin(), given.end(), int64_t{0}), " but the ", which,
                      " has ", total, " rows");
    return given;
  };
  std::vector<int64_t> sendRows = splits(input, inputSplitSizes, "input");
  std::vector<int64_t> recvRows = splits(output, outputSplitSizes, "output");
  at::Tensor source = input.contiguous();
  at::Tensor buffer = writableBuffer(output);
  std::vector<at::Tensor> sendParts, recvParts;
  int64_t sendAt = 0, recvAt = 0;
  for (int peer = 0; peer < size_; ++peer) {
    sendParts.push_back(rows(source, sendAt, sendRows[peer]));
    recvParts.push_back(rows(buffer, recvAt, recvRows[peer]));
    sendAt += sendRows[peer];
    recvAt += recvRows[peer];
  }
  TORCH_CHECK_VALUE(sendParts[rank_].numel() == recvParts[rank_].numel(),
                    "all_to_all_single: this rank sends itself ", sendParts[rank_].numel(),
                    " elements but expects ", recvParts[rank_].numel(), " from itself");
  return enqueue(
      OpType::ALLTOALL_BASE, "nccl:all_to_all_single", describe("all_to_all_single", input),
      {input}, {output},
      [this, sendParts, recvParts](Communicator& comm) {
        comm.group([&] {
          for (int peer = 0; peer < size_; ++peer) {
            if (peer == rank_) continue;
            sendTensor(comm, sendParts[peer], peer);
            recvTensor(comm, recvParts[peer], peer);
          }
        });
      },
      [this, output, buffer, sendParts, recvParts] {
        const_cast<at::Tensor&>(recvParts[rank_]).copy_(sendParts[rank_]);
        copyBack(output, buffer);
      },
      !opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::alltoall(std::vector<at::Tensor>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllToAllOptions& /*opts*/) {
  TORCH_CHECK_VALUE(static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_,
                    "all_to_all needs ", size_, " input and ", size_, " output tensors");
  std::vector<at::Tensor> sources, buffers;
  for (int peer = 0; peer < size_; ++peer) {
    checkTensor(inputs[peer]);
    checkLike(outputs[peer], inputs[peer], "an all_to_all output");
    sources.push_back(inputs[peer].contiguous());
    buffers.push_back(writableBuffer(outputs[peer]));
  }
  TORCH_CHECK_VALUE(sources[rank_].numel() == buffers[rank_].numel(), "all_to_all: this rank sends itself ",
                    sources[rank_].numel(), " elements but expects ", buffers[rank_].numel());
  return enqueue(
      OpType::ALLTOALL, "nccl:all_to_all", c10::str("all_to_all ", size_, " tensors"), inputs,
      outputs,
      [this, sources, buffers](Communicator& comm) {
        comm.group([&] {
          for (int peer = 0; peer < size_; ++peer) {
            if (peer == rank_) continue;
            sendTensor(comm, sources[peer], peer);
            recvTensor(comm, buffers[peer], peer);
          }
        });
      },
      [this, outputs, sources, buffers] {
        const_cast<at::Tensor&>(buffers[rank_]).copy_(sources[rank_].view(buffers[rank_].sizes()));
        for (int peer = 0; peer < size_; ++peer) copyBack(outputs[peer], buffers[peer]);
      });
}

// --------------------------------------------------------- point to point

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::send(std::vector<at::Tensor>& tensors, int dstRank,
                                                      int /*tag: matched by order, as NCCL*/) {
  at::Tensor tensor = onlyTensor(tensors, "send");
  checkRoot(dstRank, size_, "send: destination");
  at::Tensor source = tensor.contiguous();
  return enqueue(OpType::SEND, "nccl:send", describe("send", tensor, c10::str("to ", dstRank).c_str()),
                 tensors, {},
                 [source, dstRank](Communicator& comm) { sendTensor(comm, source, dstRank); },
                 nullptr,
                 false, dstRank);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::recv(std::vector<at::Tensor>& tensors, int srcRank,
                                                      int /*tag*/) {
  at::Tensor tensor = onlyTensor(tensors, "recv");
  checkRoot(srcRank, size_, "recv: source");
  at::Tensor buffer = writableBuffer(tensor);
  return enqueue(
      OpType::RECV, "nccl:recv", describe("recv", tensor, c10::str("from ", srcRank).c_str()), {},
      tensors, [buffer, srcRank](Communicator& comm) { recvTensor(comm, buffer, srcRank); },
      [tensor, buffer] { copyBack(tensor, buffer); }, false, srcRank);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::recvAnysource(std::vector<at::Tensor>& /*tensors*/,
                                                               int /*tag*/) {
  TORCH_CHECK_VALUE(false, "recv without a source rank is not supported by the mojo backend "
                           "(nor by NCCL): pass src=");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::barrier(const c10d::BarrierOptions& opts) {
  // As ProcessGroupNCCL does: an all-reduce of one element. On an
  // accelerator, what the caller's stream holds ends first, as NCCL's
  // barrier synchronizes the device.
  if (device_) {
    c10::impl::VirtualGuardImpl guard(device_->device.type());
    guard.getStream(device_->device).synchronize();
  }
  at::Tensor token = at::zeros({1}, at::TensorOptions().dtype(at::kByte));
  auto issue = [this, token](Communicator& comm) {
    // The group's device collectives issued before it end first.
    if (device_) device_->stream.synchronize();
    comm.allReduce(token.data_ptr(), token.data_ptr(), 1, ncclUint8, ncclSum);
  };
  return enqueue(OpType::BARRIER, "nccl:barrier", "barrier", {}, {token}, issue, nullptr,
                 !opts.asyncOp);
}

}  // namespace torch_mojo
