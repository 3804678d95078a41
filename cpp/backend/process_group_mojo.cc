#include "backend/process_group_mojo.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include <ATen/Functions.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

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

void checkTensor(const at::Tensor& tensor) {
  TORCH_CHECK_VALUE(tensor.device().is_cpu(),
                    "the mojo distributed backend handles mojo and cpu tensors; got a tensor on ",
                    tensor.device(), " (move it to torch.accelerator.current_accelerator() or "
                    "to the CPU)");
  TORCH_CHECK_VALUE(tensor.layout() == at::kStrided, "the mojo backend takes dense tensors; got a ",
                    tensor.layout(), " tensor");
  ncclDatatypeOf(tensor);
}

const at::Tensor& onlyTensor(const std::vector<at::Tensor>& tensors, const char* call) {
  TORCH_CHECK_VALUE(tensors.size() == 1, call, " with the mojo backend takes one tensor per call, got ",
                    tensors.size());
  checkTensor(tensors[0]);
  return tensors[0];
}

void checkSameKind(const at::Tensor& tensor, const at::Tensor& reference, const char* what) {
  checkTensor(tensor);
  TORCH_CHECK_TYPE(tensor.scalar_type() == reference.scalar_type(), what, " has dtype ",
                   dtypeName(tensor), " but the input has ", dtypeName(reference));
}

std::string describe(const char* op, const at::Tensor& tensor, const char* reduceOp = nullptr) {
  std::string text = c10::str(op, " ", tensor.numel(), " x ", dtypeName(tensor));
  return reduceOp != nullptr ? text + " " + reduceOp : text;
}

// A contiguous tensor with the contents of `tensor` (itself when possible).
at::Tensor contiguousCopy(const at::Tensor& tensor) { return tensor.contiguous(); }

// Where a collective may write `output`: itself when contiguous, else a
// fresh buffer whose contents copyBack() moves into `output` afterwards.
at::Tensor writableBuffer(const at::Tensor& output) {
  return output.is_contiguous() ? output : at::empty_like(output, at::MemoryFormat::Contiguous);
}

void copyBack(at::Tensor& output, const at::Tensor& buffer) {
  if (!buffer.is_same(output)) output.copy_(buffer);
}

bool traceEnabled() {
  const char* value = std::getenv("TORCH_MOJO_BACKEND_TRACE");
  return value == nullptr || std::strcmp(value, "0") != 0;
}

// "[TRACE] collectives via <path> (<library> version <code>)", once per
// library and process.
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

// ------------------------------------------------------------------ Work

WorkMojo::WorkMojo(int rank, c10d::OpType type, uint64_t sequence, const char* profilingTitle,
                   const std::vector<at::Tensor>& inputs, std::vector<at::Tensor> outputs)
    : Work(rank, type, profilingTitle, inputs),
      sequence_(sequence),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()))) {}

void WorkMojo::complete(std::exception_ptr error) {
  // The future first: whoever wait() releases may read it at once.
  if (error)
    future_->setError(error);
  else
    future_->markCompleted(c10::IValue(outputs_));
  finish(error);
}

// -------------------------------------------------------- process group

ProcessGroupMojo::ProcessGroupMojo(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                   int size, std::chrono::milliseconds timeout)
    : Backend(rank, size), timeout_(timeout) {
  try {
    library_ = hostCollectiveLibrary();
  } catch (const std::exception& error) {
    TORCH_CHECK(false, error.what(), " (reinstall torch-mojo: its libmojoccl.so is missing or broken)");
  }
  createCommunicator(store);
  traceLibrary(*library_);
  worker_ = std::thread(&ProcessGroupMojo::workerLoop, this);
  monitor_ = std::thread(&ProcessGroupMojo::monitorLoop, this);
  init();
}

ProcessGroupMojo::~ProcessGroupMojo() { shutdown(); }

void ProcessGroupMojo::check(ncclResult_t result, const char* call) const {
  try {
    library_->check(result, call, comm_);
  } catch (const CclError& error) {
    C10_THROW_ERROR(DistBackendError, error.what());
  }
}

void ProcessGroupMojo::createCommunicator(const c10::intrusive_ptr<c10d::Store>& store) {
  // As ProcessGroupNCCL does: rank 0 makes the unique id, the store carries
  // it to the others. The store is already prefixed for this group.
  const std::string key = "torch_mojo_unique_id";
  ncclUniqueId id{};
  if (rank_ == 0) {
    check(library_->api().getUniqueId(&id), "ncclGetUniqueId");
    store->set(key, std::vector<uint8_t>(id.internal, id.internal + sizeof(id.internal)));
  } else {
    std::vector<uint8_t> bytes = store->get(key);
    TORCH_CHECK(bytes.size() == sizeof(id.internal), "the unique id in the store has ",
                bytes.size(), " bytes, expected ", sizeof(id.internal),
                " (do all ranks run the same torch-mojo?)");
    std::memcpy(id.internal, bytes.data(), bytes.size());
  }
  check(library_->api().commInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
}

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupMojo::getBackendOptions() {
  return c10::make_intrusive<Options>("mojo", timeout_.load());
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::enqueue(OpType type, const char* profilingTitle,
                                                         std::string description,
                                                         const std::vector<at::Tensor>& inputs,
                                                         std::vector<at::Tensor> outputs,
                                                         std::function<void()> run) {
  auto work = c10::make_intrusive<WorkMojo>(rank_, type, ++sequence_, profilingTitle, inputs,
                                            std::move(outputs));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(!stopping_, "the mojo process group was shut down");
    queue_.push_back(Job{work, std::move(description), std::move(run)});
  }
  queueChanged_.notify_all();
  return work;
}

void ProcessGroupMojo::workerLoop() {
  while (true) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queueChanged_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
      runningJob_ = c10::str("#", job.work->getSequencenumber(), " (", job.description, ")");
      runningSince_ = std::chrono::steady_clock::now();
    }
    std::exception_ptr error;
    try {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (aborted_) std::rethrow_exception(distBackendError(abortReason_));
      }
      job.run();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      // After an abort the library only knows "aborted"; say why.
      error = aborted_ ? distBackendError(abortReason_) : std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      running_ = false;
    }
    job.work->complete(error);
  }
}

void ProcessGroupMojo::monitorLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!(stopping_ && !running_ && queue_.empty())) {
    queueChanged_.wait_for(lock, std::chrono::milliseconds(200));
    if (!running_ || aborted_) continue;
    auto age = std::chrono::steady_clock::now() - runningSince_;
    auto timeout = timeout_.load();
    if (age < timeout) continue;
    double seconds = std::chrono::duration<double>(timeout).count();
    abortReason_ = c10::str("[rank ", rank_, "] Watchdog caught collective operation timeout: "
                            "collective ", runningJob_, " has not completed ", seconds,
                            " s after it was issued (timeout ", seconds,
                            " s, the timeout= of init_process_group). Every rank must issue the "
                            "same collectives in the same order; a rank that never issued this "
                            "one is the place to look.");
    aborted_ = true;
    std::fprintf(stderr, "%s\n", abortReason_.c_str());
    std::fflush(stderr);
    lock.unlock();
    library_->api().commAbort(comm_);  // the running call fails within ~50 ms
    lock.lock();
  }
}

void ProcessGroupMojo::stopThreads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queueChanged_.notify_all();
  if (worker_.joinable()) worker_.join();
  queueChanged_.notify_all();
  if (monitor_.joinable()) monitor_.join();
}

void ProcessGroupMojo::abort() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (comm_ == nullptr) return;
    if (!aborted_) abortReason_ = c10::str("[rank ", rank_, "] the process group was aborted");
    aborted_ = true;
  }
  library_->api().commAbort(comm_);
  stopThreads();
  comm_ = nullptr;
}

void ProcessGroupMojo::shutdown() {
  if (comm_ == nullptr) return;
  stopThreads();  // lets queued collectives finish first
  bool aborted;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    aborted = aborted_;
  }
  if (!aborted) library_->api().commDestroy(comm_);
  comm_ = nullptr;
}

// ----------------------------------------------------------- collectives

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  at::Tensor tensor = onlyTensor(tensors, "all_reduce");
  const ncclDataType_t datatype = ncclDatatypeOf(tensor);
  const ncclRedOp_t op = ncclRedOpOf(opts.reduceOp, tensor);
  return enqueue(OpType::ALLREDUCE, "mojo:all_reduce",
                 describe("all_reduce", tensor, reduceOpName(opts.reduceOp.op_)), tensors, tensors,
                 [this, tensor, datatype, op]() mutable {
                   at::Tensor buffer = contiguousCopy(tensor);
                   check(library_->api().allReduce(buffer.data_ptr(), buffer.data_ptr(),
                                                   buffer.numel(), datatype, op, comm_, nullptr),
                         "ncclAllReduce");
                   copyBack(tensor, buffer);
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK_VALUE(!tensors.empty(), "allreduce_coalesced needs at least one tensor");
  for (const auto& tensor : tensors) checkSameKind(tensor, tensors[0], "a coalesced tensor");
  const ncclDataType_t datatype = ncclDatatypeOf(tensors[0]);
  const ncclRedOp_t op = ncclRedOpOf(opts.reduceOp, tensors[0]);
  int64_t total = 0;
  for (const auto& tensor : tensors) total += tensor.numel();
  std::string description = c10::str("allreduce_coalesced ", tensors.size(), " tensors, ", total,
                                     " x ", dtypeName(tensors[0]), " ",
                                     reduceOpName(opts.reduceOp.op_));
  return enqueue(OpType::ALLREDUCE_COALESCED, "mojo:allreduce_coalesced", description, tensors,
                 tensors, [this, tensors, datatype, op]() mutable {
                   // One collective over all tensors laid end to end.
                   std::vector<at::Tensor> flat;
                   for (const auto& tensor : tensors) flat.push_back(tensor.reshape({-1}));
                   at::Tensor buffer = at::cat(flat);
                   check(library_->api().allReduce(buffer.data_ptr(), buffer.data_ptr(),
                                                   buffer.numel(), datatype, op, comm_, nullptr),
                         "ncclAllReduce");
                   int64_t offset = 0;
                   for (auto& tensor : tensors) {
                     tensor.copy_(buffer.narrow(0, offset, tensor.numel()).view(tensor.sizes()));
                     offset += tensor.numel();
                   }
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::broadcast(std::vector<at::Tensor>& tensors,
                                                           const c10d::BroadcastOptions& opts) {
  at::Tensor tensor = onlyTensor(tensors, "broadcast");
  TORCH_CHECK_VALUE(opts.rootRank >= 0 && opts.rootRank < size_, "broadcast root ", opts.rootRank,
                    " is not a rank of this group of ", size_);
  const ncclDataType_t datatype = ncclDatatypeOf(tensor);
  const int root = static_cast<int>(opts.rootRank);
  return enqueue(OpType::BROADCAST, "mojo:broadcast",
                 describe("broadcast", tensor) + c10::str(" root ", root), tensors, tensors,
                 [this, tensor, datatype, root]() mutable {
                   at::Tensor buffer = contiguousCopy(tensor);
                   check(library_->api().broadcast(buffer.data_ptr(), buffer.data_ptr(),
                                                   buffer.numel(), datatype, root, comm_, nullptr),
                         "ncclBroadcast");
                   copyBack(tensor, buffer);
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& /*opts*/) {
  at::Tensor input = onlyTensor(inputs, "all_gather");
  TORCH_CHECK_VALUE(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                    "all_gather needs a list of ", size_, " output tensors (one per rank)");
  for (const auto& output : outputs[0]) {
    checkSameKind(output, input, "an all_gather output");
    TORCH_CHECK_VALUE(output.numel() == input.numel(), "all_gather outputs must have as many ",
                      "elements as the input (", input.numel(), "), got ", output.numel(),
                      "; the mojo backend gathers equal-sized tensors");
  }
  const ncclDataType_t datatype = ncclDatatypeOf(input);
  std::vector<at::Tensor> targets = outputs[0];
  return enqueue(OpType::ALLGATHER, "mojo:all_gather", describe("all_gather", input), inputs,
                 targets, [this, input, targets, datatype]() mutable {
                   at::Tensor source = contiguousCopy(input);
                   at::Tensor gathered = at::empty({size_ * source.numel()}, source.options());
                   check(library_->api().allGather(source.data_ptr(), gathered.data_ptr(),
                                                   source.numel(), datatype, comm_, nullptr),
                         "ncclAllGather");
                   for (int peer = 0; peer < size_; ++peer)
                     targets[peer].copy_(gathered.narrow(0, peer * source.numel(), source.numel())
                                             .view(targets[peer].sizes()));
                 });
}

void ProcessGroupMojo::checkAllGatherInto(const at::Tensor& output, const at::Tensor& input) const {
  checkTensor(input);
  checkSameKind(output, input, "the all_gather_into_tensor output");
  TORCH_CHECK_VALUE(output.numel() == size_ * input.numel(),
                    "all_gather_into_tensor needs an output of world size x input elements (",
                    size_, " x ", input.numel(), "), got ", output.numel());
}

void ProcessGroupMojo::allGatherInto(at::Tensor& output, const at::Tensor& input) {
  at::Tensor source = contiguousCopy(input);
  at::Tensor buffer = writableBuffer(output);
  check(library_->api().allGather(source.data_ptr(), buffer.data_ptr(), source.numel(),
                                  ncclDatatypeOf(input), comm_, nullptr),
        "ncclAllGather");
  copyBack(output, buffer);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& /*opts*/) {
  checkAllGatherInto(output, input);
  return enqueue(OpType::_ALLGATHER_BASE, "mojo:_allgather_base",
                 describe("all_gather_into_tensor", input), {input}, {output},
                 [this, input, output]() mutable { allGatherInto(output, input); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& /*opts*/) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(),
                    "allgather_into_tensor_coalesced needs as many outputs as inputs");
  for (size_t i = 0; i < inputs.size(); ++i) checkAllGatherInto(outputs[i], inputs[i]);
  return enqueue(OpType::COALESCED, "mojo:allgather_into_tensor_coalesced",
                 c10::str("allgather_into_tensor_coalesced ", inputs.size(), " tensors"), inputs,
                 outputs, [this, inputs, outputs]() mutable {
                   for (size_t i = 0; i < inputs.size(); ++i) allGatherInto(outputs[i], inputs[i]);
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  at::Tensor output = onlyTensor(outputs, "reduce_scatter");
  TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                    "reduce_scatter needs a list of ", size_, " input tensors (one per rank)");
  for (const auto& input : inputs[0]) {
    checkSameKind(input, output, "a reduce_scatter input");
    TORCH_CHECK_VALUE(input.numel() == output.numel(), "reduce_scatter inputs must have as many ",
                      "elements as the output (", output.numel(), "), got ", input.numel());
  }
  const ncclDataType_t datatype = ncclDatatypeOf(output);
  const ncclRedOp_t op = ncclRedOpOf(opts.reduceOp, output);
  std::vector<at::Tensor> sources = inputs[0];
  return enqueue(OpType::REDUCE_SCATTER, "mojo:reduce_scatter",
                 describe("reduce_scatter", output, reduceOpName(opts.reduceOp.op_)), sources,
                 outputs, [this, output, sources, datatype, op]() mutable {
                   std::vector<at::Tensor> flat;
                   for (const auto& source : sources) flat.push_back(source.reshape({-1}));
                   at::Tensor input = at::cat(flat);
                   at::Tensor buffer = writableBuffer(output);
                   check(library_->api().reduceScatter(input.data_ptr(), buffer.data_ptr(),
                                                       buffer.numel(), datatype, op, comm_,
                                                       nullptr),
                         "ncclReduceScatter");
                   copyBack(output, buffer);
                 });
}

void ProcessGroupMojo::checkReduceScatterFrom(const at::Tensor& output,
                                              const at::Tensor& input) const {
  checkTensor(output);
  checkSameKind(input, output, "the reduce_scatter_tensor input");
  TORCH_CHECK_VALUE(input.numel() == size_ * output.numel(),
                    "reduce_scatter_tensor needs an input of world size x output elements (",
                    size_, " x ", output.numel(), "), got ", input.numel());
}

void ProcessGroupMojo::reduceScatterFrom(at::Tensor& output, const at::Tensor& input,
                                         ncclRedOp_t op) {
  at::Tensor source = contiguousCopy(input);
  at::Tensor buffer = writableBuffer(output);
  check(library_->api().reduceScatter(source.data_ptr(), buffer.data_ptr(), buffer.numel(),
                                      ncclDatatypeOf(output), op, comm_, nullptr),
        "ncclReduceScatter");
  copyBack(output, buffer);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  checkReduceScatterFrom(output, input);
  const ncclRedOp_t op = ncclRedOpOf(opts.reduceOp, output);
  return enqueue(OpType::_REDUCE_SCATTER_BASE, "mojo:_reduce_scatter_base",
                 describe("reduce_scatter_tensor", output, reduceOpName(opts.reduceOp.op_)),
                 {input}, {output},
                 [this, input, output, op]() mutable { reduceScatterFrom(output, input, op); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(),
                    "reduce_scatter_tensor_coalesced needs as many outputs as inputs");
  for (size_t i = 0; i < inputs.size(); ++i) checkReduceScatterFrom(outputs[i], inputs[i]);
  const ncclRedOp_t op = inputs.empty() ? ncclSum : ncclRedOpOf(opts.reduceOp, outputs[0]);
  return enqueue(OpType::REDUCE_SCATTER_TENSOR_COALESCED, "mojo:reduce_scatter_tensor_coalesced",
                 c10::str("reduce_scatter_tensor_coalesced ", inputs.size(), " tensors ",
                          reduceOpName(opts.reduceOp.op_)),
                 inputs, outputs, [this, inputs, outputs, op]() mutable {
                   for (size_t i = 0; i < inputs.size(); ++i)
                     reduceScatterFrom(outputs[i], inputs[i], op);
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::barrier(const c10d::BarrierOptions& /*opts*/) {
  // As ProcessGroupNCCL does: an all-reduce of one element.
  at::Tensor token = at::zeros({1}, at::TensorOptions().dtype(at::kByte));
  return enqueue(OpType::BARRIER, "mojo:barrier", "barrier", {}, {token}, [this, token]() {
    check(library_->api().allReduce(token.data_ptr(), token.data_ptr(), 1, ncclUint8, ncclSum,
                                    comm_, nullptr),
          "ncclAllReduce");
  });
}

}  // namespace torch_mojo
