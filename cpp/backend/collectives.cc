// The collectives of ProcessGroupMojo: each checks its tensors on the
// caller's thread, then queues a job of library calls (`issue`) and of
// copies into the caller's tensors (`finish`). Point-to-point calls and
// barriers are in point_to_point.cc.
#include "backend/process_group_mojo.hpp"

#include <algorithm>
#include <numeric>

#include <ATen/Functions.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include "backend/tensors.h"

namespace torch_mojo {

namespace {

using c10d::OpType;

std::vector<int64_t> gatherInts(Communicator& comm, std::vector<int64_t> mine, int size) {
  std::vector<int64_t> all(mine.size() * size);
  if (!mine.empty()) comm.allGather(mine.data(), all.data(), mine.size(), ncclInt64);
  return all;
}

// gloo's way: every rank gathers every rank's indices and values and adds
// them up itself (coalesce() sums the entries of one index). The entries
// travel padded to the largest count; a shape that differs between ranks is
// an error on every rank, since every rank sees every shape.
at::Tensor sumSparse(Communicator& comm, const at::Tensor& tensor, int size) {
  const at::Tensor input = tensor.coalesce();
  const int64_t sparseDims = input.sparse_dim(), dims = input.dim();
  const std::vector<int64_t> counts = gatherInts(comm, {sparseDims, dims, input._nnz()}, size);
  for (int peer = 0; peer < size; ++peer)
    TORCH_CHECK_VALUE(counts[3 * peer] == sparseDims && counts[3 * peer + 1] == dims,
                      "sparse all_reduce: rank ", peer, "'s tensor has ", counts[3 * peer + 1],
                      " dimensions (", counts[3 * peer], " sparse) where this rank's has ", dims,
                      " (", sparseDims, " sparse); every rank must pass a tensor of one shape");
  const std::vector<int64_t> shapes = gatherInts(comm, input.sizes().vec(), size);
  for (int peer = 0; peer < size; ++peer)
    TORCH_CHECK_VALUE(std::equal(input.sizes().begin(), input.sizes().end(), &shapes[peer * dims]),
                      "sparse all_reduce: rank ", peer, "'s tensor has shape ",
                      c10::IntArrayRef(&shapes[peer * dims], dims), " where this rank's has ",
                      input.sizes(), "; every rank must pass a tensor of one shape");
  int64_t widest = 0;
  for (int peer = 0; peer < size; ++peer) widest = std::max(widest, counts[3 * peer + 2]);
  if (widest == 0) return input;
  const at::Tensor values = input._values();
  at::Tensor indices = at::zeros({sparseDims, widest}, input._indices().options());
  indices.narrow(1, 0, input._nnz()).copy_(input._indices());
  std::vector<int64_t> valueShape = values.sizes().vec();
  valueShape[0] = widest;
  at::Tensor paddedValues = at::zeros(valueShape, values.options());
  paddedValues.narrow(0, 0, input._nnz()).copy_(values);
  at::Tensor allIndices = at::empty({size, sparseDims, widest}, indices.options());
  valueShape.insert(valueShape.begin(), size);
  at::Tensor allValues = at::empty(valueShape, values.options());
  comm.allGather(indices.data_ptr(), allIndices.data_ptr(), indices.numel(), ncclInt64);
  comm.allGather(paddedValues.data_ptr(), allValues.data_ptr(), paddedValues.numel(),
                 ncclDatatypeOf(values));
  std::vector<at::Tensor> eachIndices, eachValues;
  for (int peer = 0; peer < size; ++peer) {
    eachIndices.push_back(allIndices[peer].narrow(1, 0, counts[3 * peer + 2]));
    eachValues.push_back(allValues[peer].narrow(0, 0, counts[3 * peer + 2]));
  }
  return at::sparse_coo_tensor(at::cat(eachIndices, 1), at::cat(eachValues, 0), input.sizes(),
                               input.options())
      .coalesce();
}

}  // namespace

// ------------------------------------------------------------ reductions

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::allreduce(std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  if (tensors.size() == 1 && tensors[0].layout() == at::kSparse) return allreduceSparse(tensors, opts);
  at::Tensor tensor = onlyTensor(tensors, "all_reduce");
  const ncclRedOp_t op = ncclRedOpOf(opts.reduceOp, tensor);
  at::Tensor buffer = reductionInput(opts.reduceOp, tensor);
  return enqueue(
      OpType::ALLREDUCE, "nccl:all_reduce",
      describe("all_reduce", tensor, reduceOpName(opts.reduceOp.op_)), tensors, tensors,
      [buffer, op](Communicator& comm) {
        comm.allReduce(buffer.data_ptr(), buffer.data_ptr(), buffer.numel(), ncclDatatypeOf(buffer),
                        op);
      },
      [tensor, buffer] { copyBack(tensor, buffer); }, !opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::allreduceSparse(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  const at::Tensor& tensor = tensors[0];
  TORCH_CHECK_VALUE(tensor.device().is_cpu(), "a sparse all_reduce takes CPU tensors; got one on ",
                    tensor.device(), " (move it with .cpu(), or make it dense with .to_dense())");
  TORCH_CHECK_VALUE(opts.reduceOp == c10d::ReduceOp::SUM, "a sparse all_reduce supports ",
                    "ReduceOp.SUM only (as gloo), got ReduceOp.",
                    c10::str(reduceOpName(opts.reduceOp.op_)), "; make the tensor dense with .to_dense()");
  TORCH_CHECK_VALUE(!coalescing_, "a sparse all_reduce cannot be part of a coalesced batch: its ",
                    "second step depends on the first; call it outside the batch");
  ncclDatatypeOf(tensor);
  const int size = size_;
  auto sum = std::make_shared<at::Tensor>();
  return submit(makeJob(
                    OpType::ALLREDUCE, "nccl:all_reduce",
                    c10::str("all_reduce sparse ", tensor._nnz(), " entries of ", tensor.numel(), " x ",
                             dtypeName(tensor), " sum"),
                    tensors, tensors,
                    [tensor, size, sum](Communicator& comm) { *sum = sumSparse(comm, tensor, size); },
                    [tensor, sum] { const_cast<at::Tensor&>(tensor).copy_(*sum); }, -1, host_.get()),
                !opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK_VALUE(!tensors.empty(), "allreduce_coalesced needs at least one tensor");
  for (const auto& tensor : tensors) checkLike(tensor, tensors[0], "a coalesced tensor");
  const ncclRedOp_t op = ncclRedOpOf(opts.reduceOp, tensors[0]);
  // One collective over all tensors laid end to end.
  std::vector<at::Tensor> flat;
  for (const auto& tensor : tensors) flat.push_back(tensor.reshape({-1}));
  at::Tensor buffer = reductionInput(opts.reduceOp, at::cat(flat));
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
  at::Tensor buffer = reductionInput(opts.reduceOp, tensor);
  const bool isRoot = rank_ == root;
  return enqueue(
      OpType::REDUCE, "nccl:reduce",
      describe("reduce", tensor, (std::string(reduceOpName(opts.reduceOp.op_)) + " root " + std::to_string(root)).c_str()),
      tensors, tensors,
      [buffer, op, root](Communicator& comm) {
        comm.reduce(buffer.data_ptr(), buffer.data_ptr(), buffer.numel(), ncclDatatypeOf(buffer), op,
                     root);
      },
      // As NCCL's: only the root's tensor takes the result; the others keep theirs.
      [tensor, buffer, isRoot] { if (isRoot) copyBack(tensor, buffer); }, !opts.asyncOp);
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
    sources.push_back(reductionInput(opts.reduceOp, inputs[i]));
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
      describe("broadcast", tensor, ("root " + std::to_string(root)).c_str()), tensors, tensors,
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
  TORCH_CHECK_VALUE(!inputs.empty() && outputs.size() == inputs.size(),
                    "all_gather needs one output list per input");
  return allGatherLists(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  // torch's layout is one list per rank, each with one tensor per input.
  TORCH_CHECK_VALUE(!inputs.empty(), "all_gather_coalesced needs at least one input tensor");
  TORCH_CHECK_VALUE(static_cast<int>(outputLists.size()) == size_, "all_gather_coalesced needs ",
                    size_, " output lists (one per rank), got ", outputLists.size());
  std::vector<std::vector<at::Tensor>> perInput(inputs.size());
  for (size_t peer = 0; peer < outputLists.size(); ++peer) {
    TORCH_CHECK_VALUE(outputLists[peer].size() == inputs.size(), "all_gather_coalesced: the output ",
                      "list for rank ", peer, " has ", outputLists[peer].size(), " tensors, one per ",
                      "input (", inputs.size(), ") is needed");
    for (size_t i = 0; i < inputs.size(); ++i) perInput[i].push_back(outputLists[peer][i]);
  }
  return allGatherLists(perInput, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::allGatherLists(
    const std::vector<std::vector<at::Tensor>>& outputLists, const std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
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
    return enqueue(OpType::GATHER, "nccl:gather", describe("gather", input, ("root " + std::to_string(root)).c_str()),
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
      OpType::GATHER, "nccl:gather", describe("gather", input, ("root " + std::to_string(root)).c_str()),
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
        OpType::SCATTER, "nccl:scatter", describe("scatter", output, ("root " + std::to_string(root)).c_str()),
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
      OpType::SCATTER, "nccl:scatter", describe("scatter", output, ("root " + std::to_string(root)).c_str()),
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
  at::Tensor source = input.contiguous();
  at::Tensor buffer = writableBuffer(output);
  // The layouts live once, shared by the job's two steps: copied into each
  // they cost more than the library's whole call at small sizes.
  struct Exchange {
    PartLayout send, recv;
    bool selfCopied = false;
  };
  auto exchange = std::make_shared<Exchange>(Exchange{partsByRows(source, splits(input, inputSplitSizes, "input")),
                                                      partsByRows(buffer, splits(output, outputSplitSizes, "output"))});
  TORCH_CHECK_VALUE(exchange->send.counts[rank_] == exchange->recv.counts[rank_],
                    "all_to_all_single: this rank sends itself ", exchange->send.counts[rank_],
                    " elements but expects ", exchange->recv.counts[rank_], " from itself");
  return enqueue(
      OpType::ALLTOALL_BASE, "nccl:all_to_all_single", describe("all_to_all_single", input),
      {input}, {output},
      [this, source, buffer, exchange](Communicator& comm) {
        exchange->selfCopied = exchangeParts(comm, source, exchange->send, buffer, exchange->recv, rank_);
      },
      [this, output, source, buffer, exchange] {
        if (!exchange->selfCopied) part(buffer, exchange->recv, rank_).copy_(part(source, exchange->send, rank_));
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
      [this, sources, buffers](Communicator& comm) { sendAndReceiveParts(comm, sources, buffers, rank_); },
      [this, outputs, sources, buffers] {
        const_cast<at::Tensor&>(buffers[rank_]).copy_(sources[rank_].view(buffers[rank_].sizes()));
        for (int peer = 0; peer < size_; ++peer) copyBack(outputs[peer], buffers[peer]);
      });
}

// ---- the checks of a call's tensors, on the caller's thread

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

}  // namespace torch_mojo
