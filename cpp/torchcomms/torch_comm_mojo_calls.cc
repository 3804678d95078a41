// TorchCommMojo's calls, each turned into the process group's, and the
// Work they return.
#include "torchcomms/torch_comm_mojo.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include <unistd.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <comms/torchcomms/utils/StoreManager.hpp>
#include <comms/torchcomms/utils/Utils.hpp>

namespace torch_mojo {

namespace {

using torch::comms::ReduceOp;
using RedOpType = ReduceOp::RedOpType;

c10d::ReduceOp toC10d(const ReduceOp& op) {
  switch (op.type()) {
    case RedOpType::SUM: return c10d::ReduceOp::SUM;
    case RedOpType::PRODUCT: return c10d::ReduceOp::PRODUCT;
    case RedOpType::MIN: return c10d::ReduceOp::MIN;
    case RedOpType::MAX: return c10d::ReduceOp::MAX;
    case RedOpType::BAND: return c10d::ReduceOp::BAND;
    case RedOpType::BOR: return c10d::ReduceOp::BOR;
    case RedOpType::BXOR: return c10d::ReduceOp::BXOR;
    case RedOpType::AVG: return c10d::ReduceOp::AVG;
    case RedOpType::PREMUL_SUM:
      // The group says what it does with it (the same message as on c10d).
      return std::visit([](const auto& factor) { return c10d::makePreMulSum(factor); },
                        *op.factor());
  }
  TORCH_CHECK_VALUE(false, "unknown torchcomms ReduceOp ", static_cast<int>(op.type()));
}

// torchcomms' per-call timeout where it gives one; kUnsetTimeout lets the
// group's own decide, as on the c10d path.
template <typename Options>
std::chrono::milliseconds timeoutOf(const Options& options) {
  return options.timeout == torch::comms::kNoTimeout ? c10d::kUnsetTimeout : options.timeout;
}

std::vector<int64_t> toInt64(const std::vector<uint64_t>& sizes) {
  return {sizes.begin(), sizes.end()};
}

}  // namespace

// ------------------------------------------------------------------ Work

c10::intrusive_ptr<TorchWorkMojo> TorchWorkMojo::of(c10::intrusive_ptr<c10d::Work> work) {
  auto made = c10::make_intrusive<TorchWorkMojo>(std::move(work));
  made->setStatus(WorkStatus::INPROGRESS);
  return made;
}

void TorchWorkMojo::wait() {
  runWaitPreHooks();
  try {
    work_->wait();
  } catch (...) {
    finishOnce(WorkStatus::ERROR);
    throw;
  }
  finishOnce(WorkStatus::COMPLETED);
  runWaitPostHooks();
}

void TorchWorkMojo::finishOnce(WorkStatus status) {
  if (!finished_.exchange(true)) setStatus(status);
}

void TorchWorkMojo::followGroupWork() {
  c10::intrusive_ptr<TorchWorkMojo> self = c10::intrusive_ptr<TorchWorkMojo>::reclaim_copy(this);
  work_->getFuture()->addCallback([self](c10::ivalue::Future& future) {
    self->finishOnce(future.hasError() ? WorkStatus::ERROR : WorkStatus::COMPLETED);
  });
}

void TorchWorkMojo::markCompleted(c10::intrusive_ptr<c10::ivalue::Future> future,
                                  std::vector<at::Tensor> outputs) {
  work_->getFuture()->addCallback([future, outputs](c10::ivalue::Future& done) {
    if (done.hasError())
      future->setError(done.exception_ptr());
    else
      future->markCompleted(c10::IValue(outputs));
  });
}

// ------------------------------------------------------------- calls

TorchCommMojo::Work TorchCommMojo::run(bool async_op,
                                       const std::function<c10::intrusive_ptr<c10d::Work>()>& call) {
  auto work = TorchWorkMojo::of(call());
  if (async_op) {
    work->followGroupWork();
  } else {
    work->wait();  // on a device: the current stream waits, not the host
  }
  return work;
}

TorchCommMojo::Work TorchCommMojo::coalesced(bool async_op,
                                             const std::function<void()>& calls) {
  return run(async_op, [&] {
    group().startCoalescing();
    try {
      calls();
    } catch (...) {
      group().endCoalescing();  // the batch is dropped with the error
      throw;
    }
    return group().endCoalescing();
  });
}

void TorchCommMojo::checkRoot(int root, const char* call) const {
  TORCH_CHECK_VALUE(root >= 0 && root < size_, call, ": root ", root,
                    " is not a rank of this communicator of ", size_);
}

TorchCommMojo::Work TorchCommMojo::send(const at::Tensor& tensor, int dst, bool async_op,
                                        const torch::comms::SendOptions& options) {
  return run(async_op, [&] {
    std::vector<at::Tensor> tensors{tensor};
    return group().send(tensors, dst, options.tag);
  });
}

TorchCommMojo::Work TorchCommMojo::recv(at::Tensor& tensor, int src, bool async_op,
                                        const torch::comms::RecvOptions& options) {
  return run(async_op, [&] {
    std::vector<at::Tensor> tensors{tensor};
    return group().recv(tensors, src, options.tag);
  });
}

TorchCommMojo::Work TorchCommMojo::batch_op_issue(
    const std::vector<torch::comms::BatchSendRecv::P2POp>& ops, bool async_op,
    const torch::comms::BatchP2POptions& /*options*/) {
  using OpType = torch::comms::BatchSendRecv::P2POp::OpType;
  return coalesced(async_op, [&] {
    for (const auto& op : ops) {
      std::vector<at::Tensor> tensors{op.tensor};
      if (op.type == OpType::SEND)
        group().send(tensors, op.peer, 0);
      else
        group().recv(tensors, op.peer, 0);
    }
  });
}

TorchCommMojo::Work TorchCommMojo::broadcast(at::Tensor& tensor, int root, bool async_op,
                                             const torch::comms::BroadcastOptions& options) {
  checkRoot(root, "broadcast");
  return run(async_op, [&] {
    std::vector<at::Tensor> tensors{tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.timeout = timeoutOf(options);
    opts.asyncOp = async_op;
    return group().broadcast(tensors, opts);
  });
}

TorchCommMojo::Work TorchCommMojo::all_reduce(at::Tensor& tensor, const ReduceOp& op,
                                              bool async_op,
                                              const torch::comms::AllReduceOptions& options) {
  return run(async_op, [&] {
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = toC10d(op);
    opts.timeout = timeoutOf(options);
    opts.asyncOp = async_op;
    return group().allreduce(tensors, opts);
  });
}

TorchCommMojo::Work TorchCommMojo::reduce(const at::Tensor& tensor, int root, const ReduceOp& op,
                                          bool async_op,
                                          const torch::comms::ReduceOptions& options) {
  checkRoot(root, "reduce");
  return run(async_op, [&] {
    std::vector<at::Tensor> tensors{tensor};
    c10d::ReduceOptions opts;
    opts.reduceOp = toC10d(op);
    opts.rootRank = root;
    opts.timeout = timeoutOf(options);
    opts.asyncOp = async_op;
    return group().reduce(tensors, opts);
  });
}

TorchCommMojo::Work TorchCommMojo::all_gather(const std::vector<at::Tensor>& tensor_list,
                                              const at::Tensor& tensor, bool async_op,
                                              const torch::comms::AllGatherOptions& options) {
  return run(async_op, [&] {
    std::vector<std::vector<at::Tensor>> outputs{tensor_list};
    std::vector<at::Tensor> inputs{tensor};
    c10d::AllgatherOptions opts;
    opts.timeout = timeoutOf(options);
    opts.asyncOp = async_op;
    return group().allgather(outputs, inputs, opts);
  });
}

// Uneven parts: each rank broadcasts its own, all in one library group.
TorchCommMojo::Work TorchCommMojo::all_gather_v(const std::vector<at::Tensor>& tensor_list,
                                                const at::Tensor& tensor, bool async_op,
                                                const torch::comms::AllGatherOptions& options) {
  TORCH_CHECK_VALUE(static_cast<int>(tensor_list.size()) == size_, "all_gather_v: ",
                    tensor_list.size(), " output tensors for a communicator of ", size_);
  TORCH_CHECK_VALUE(tensor_list[rank_].numel() == tensor.numel(), "all_gather_v: this rank's output ",
                    "has ", tensor_list[rank_].numel(), " elements and its input ", tensor.numel());
  tensor_list[rank_].copy_(tensor);
  return coalesced(async_op, [&] {
    for (int root = 0; root < size_; ++root) {
      std::vector<at::Tensor> part{tensor_list[root]};
      c10d::BroadcastOptions opts;
      opts.rootRank = root;
      opts.timeout = timeoutOf(options);
      group().broadcast(part, opts);
    }
  });
}

TorchCommMojo::Work TorchCommMojo::all_gather_single(
    at::Tensor& output, const at::Tensor& input, bool async_op,
    const torch::comms::AllGatherSingleOptions& options) {
  return run(async_op, [&] {
    at::Tensor in = input;
    c10d::AllgatherOptions opts;
    opts.timeout = timeoutOf(options);
    opts.asyncOp = async_op;
    return group()._allgather_base(output, in, opts);
  });
}

TorchCommMojo::Work TorchCommMojo::reduce_scatter(
    at::Tensor& output, const std::vector<at::Tensor>& input_list, const ReduceOp& op,
    bool async_op, const torch::comms::ReduceScatterOptions& options) {
  return run(async_op, [&] {
    std::vector<at::Tensor> outputs{output};
    std::vector<std::vector<at::Tensor>> inputs{input_list};
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = toC10d(op);
    opts.timeout = timeoutOf(options);
    opts.asyncOp = async_op;
    return group().reduce_scatter(outputs, inputs, opts);
  });
}

// Uneven parts: a reduce to each part's rank, all in one library group;
// the callers' inputs stay as they were.
TorchCommMojo::Work TorchCommMojo::reduce_scatter_v(
    at::Tensor& output, const std::vector<at::Tensor>& input_list, const ReduceOp& op,
    bool async_op, const torch::comms::ReduceScatterOptions& options) {
  TORCH_CHECK_VALUE(static_cast<int>(input_list.size()) == size_, "reduce_scatter_v: ",
                    input_list.size(), " input tensors for a communicator of ", size_);
  TORCH_CHECK_VALUE(input_list[rank_].numel() == output.numel(), "reduce_scatter_v: this rank's ",
                    "input part has ", input_list[rank_].numel(), " elements and its output ",
                    output.numel());
  return coalesced(async_op, [&] {
    for (int root = 0; root < size_; ++root) {
      at::Tensor part = root == rank_ ? output.copy_(input_list[root]) : input_list[root].clone();
      std::vector<at::Tensor> tensors{part};
      c10d::ReduceOptions opts;
      opts.reduceOp = toC10d(op);
      opts.rootRank = root;
      opts.timeout = timeoutOf(options);
      group().reduce(tensors, opts);
    }
  });
}

TorchCommMojo::Work TorchCommMojo::reduce_scatter_single(
    at::Tensor& output, const at::Tensor& input, const ReduceOp& op, bool async_op,
    const torch::comms::ReduceScatterSingleOptions& options) {
  return run(async_op, [&] {
    at::Tensor in = input;
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = toC10d(op);
    opts.timeout = timeoutOf(options);
    opts.asyncOp = async_op;
    return group()._reduce_scatter_base(output, in, opts);
  });
}

TorchCommMojo::Work TorchCommMojo::all_to_all_single(
    at::Tensor& output, const at::Tensor& input, bool async_op,
    const torch::comms::AllToAllSingleOptions& options) {
  return all_to_all_v_single(output, input, {}, {}, async_op,
                             torch::comms::AllToAllvSingleOptions{{options.hints, options.timeout}});
}

TorchCommMojo::Work TorchCommMojo::all_to_all_v_single(
    at::Tensor& output, const at::Tensor& input, const std::vector<uint64_t>& output_split_sizes,
    const std::vector<uint64_t>& input_split_sizes, bool async_op,
    const torch::comms::AllToAllvSingleOptions& options) {
  return run(async_op, [&] {
    at::Tensor in = input;
    std::vector<int64_t> outputSplits = toInt64(output_split_sizes);
    std::vector<int64_t> inputSplits = toInt64(input_split_sizes);
    c10d::AllToAllOptions opts;
    opts.timeout = timeoutOf(options);
    opts.asyncOp = async_op;
    return group().alltoall_base(output, in, outputSplits, inputSplits, opts);
  });
}

TorchCommMojo::Work TorchCommMojo::all_to_all(const std::vector<at::Tensor>& output_tensor_list,
                                              const std::vector<at::Tensor>& input_tensor_list,
                                              bool async_op,
                                              const torch::comms::AllToAllOptions& options) {
  return run(async_op, [&] {
    std::vector<at::Tensor> outputs = output_tensor_list;
    std::vector<at::Tensor> inputs = input_tensor_list;
    c10d::AllToAllOptions opts;
    opts.timeout = timeoutOf(options);
    opts.asyncOp = async_op;
    return group().alltoall(outputs, inputs, opts);
  });
}

TorchCommMojo::Work TorchCommMojo::barrier(bool async_op,
                                           const torch::comms::BarrierOptions& options) {
  return run(async_op, [&] {
    c10d::BarrierOptions opts;
    opts.timeout = timeoutOf(options);
    opts.asyncOp = async_op;
    return group().barrier(opts);
  });
}

TorchCommMojo::Work TorchCommMojo::scatter(at::Tensor& output_tensor,
                                           const std::vector<at::Tensor>& input_tensor_list,
                                           int root, bool async_op,
                                           const torch::comms::ScatterOptions& options) {
  checkRoot(root, "scatter");
  return run(async_op, [&] {
    std::vector<at::Tensor> outputs{output_tensor};
    std::vector<std::vector<at::Tensor>> inputs;
    if (rank_ == root) inputs.push_back(input_tensor_list);
    c10d::ScatterOptions opts;
    opts.rootRank = root;
    opts.timeout = timeoutOf(options);
    opts.asyncOp = async_op;
    return group().scatter(outputs, inputs, opts);
  });
}

TorchCommMojo::Work TorchCommMojo::gather(const std::vector<at::Tensor>& output_tensor_list,
                                          const at::Tensor& input_tensor, int root, bool async_op,
                                          const torch::comms::GatherOptions& options) {
  checkRoot(root, "gather");
  return run(async_op, [&] {
    std::vector<std::vector<at::Tensor>> outputs;
    if (rank_ == root) outputs.push_back(output_tensor_list);
    std::vector<at::Tensor> inputs{input_tensor};
    c10d::GatherOptions opts;
    opts.rootRank = root;
    opts.timeout = timeoutOf(options);
    opts.asyncOp = async_op;
    return group().gather(outputs, inputs, opts);
  });
}

}  // namespace torch_mojo
