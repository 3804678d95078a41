// Point-to-point calls of ProcessGroupMojo, and the barriers, which only
// synchronise: like the collectives (collectives.cc), each checks on the
// caller's thread, then queues a job.
#include "backend/process_group_mojo.hpp"

#include <thread>

#include <ATen/Functions.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include "backend/tensors.h"

namespace torch_mojo {

using c10d::OpType;

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::send(std::vector<at::Tensor>& tensors, int dstRank,
                                                      int /*tag: matched by order, as NCCL*/) {
  at::Tensor tensor = onlyTensor(tensors, "send");
  checkRoot(dstRank, size_, "send: destination");
  at::Tensor source = tensor.contiguous();
  return enqueue(OpType::SEND, "nccl:send", describe("send", tensor, ("to " + std::to_string(dstRank)).c_str()),
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
      OpType::RECV, "nccl:recv", describe("recv", tensor, ("from " + std::to_string(srcRank)).c_str()), {},
      tensors, [buffer, srcRank](Communicator& comm) { recvTensor(comm, buffer, srcRank); },
      [tensor, buffer] { copyBack(tensor, buffer); }, false, srcRank);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupMojo::recvAnysource(std::vector<at::Tensor>& tensors,
                                                               int /*tag*/) {
  at::Tensor tensor = onlyTensor(tensors, "recv");
  TORCH_CHECK_VALUE(tensor.device().is_cpu(), "recv without a source rank takes CPU tensors (NCCL "
                    "has no such receive); got one on ", tensor.device(), ": pass src=");
  TORCH_CHECK_VALUE(!coalescing_, "recv without a source rank cannot be part of a coalesced batch; "
                    "pass src=");
  at::Tensor buffer = writableBuffer(tensor);
  auto source = std::make_shared<std::atomic<int>>(-1);
  Job job = makeJob(
      OpType::RECVANYSOURCE, "nccl:recv", describe("recv", tensor, "from any rank"), {}, tensors,
      [buffer, source](Communicator& comm) {
        source->store(comm.recvFromAny(buffer.data_ptr(), buffer.numel(), ncclDatatypeOf(buffer)));
      },
      [tensor, buffer] { copyBack(tensor, buffer); });
  job.work->reportSourceRank(source);
  return submit(std::move(job));
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

void ProcessGroupMojo::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  // Through the store, not the library: a missing rank cannot hold up the
  // others, and rank 0 sees which ranks checked in.
  using std::chrono::milliseconds;
  const milliseconds timeout = opts.timeout == c10d::kUnsetTimeout ? timeout_.load() : opts.timeout;
  const std::string round = c10::str("torch_mojo_monitored_barrier/", ++monitoredBarriers_, "/");
  const std::string outcome = round + "outcome";
  if (rank_ != 0) {
    store_->set(round + std::to_string(rank_), std::vector<uint8_t>{1});
    // Rank 0 decides `timeout` after it arrives, which may be after us: once
    // it has arrived, its verdict is at most one more timeout away.
    auto verdict = [&] {
      try {
        store_->wait({outcome}, timeout);
        return true;
      } catch (const std::exception&) {
        return false;
      }
    };
    if (!verdict() && !(store_->check({round + "0"}) && verdict()))
      C10_THROW_ERROR(DistBackendError,
                      c10::str("[rank ", rank_, "] monitored_barrier: rank 0 did not let this rank "
                               "through within ", timeout.count(), " ms of arriving: it failed or left"));
    std::vector<uint8_t> said = store_->get(outcome);
    std::string text(said.begin(), said.end());
    if (text != "ok") C10_THROW_ERROR(DistBackendError, c10::str("[rank ", rank_, "] ", text));
    return;
  }
  store_->set(round + "0", std::vector<uint8_t>{1});
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<int> missing;
  for (int peer = 1; peer < size_; ++peer) {
    const std::string key = round + std::to_string(peer);
    // After the deadline, a rank still counts if it has checked in by now.
    while (!store_->check({key})) {
      if (std::chrono::steady_clock::now() >= deadline) {
        missing.push_back(peer);
        break;
      }
      std::this_thread::sleep_for(milliseconds(5));
    }
    if (!missing.empty() && !waitAllRanks) break;
  }
  std::string text = "ok";
  if (!missing.empty()) {
    text = c10::str(missing.size() == 1 ? "Rank " : "Ranks ", c10::Join(", ", missing),
                    " failed to pass monitoredBarrier in ", timeout.count(), " ms (as reported by "
                    "rank 0): look at what ", missing.size() == 1 ? "it" : "they", " did instead");
  }
  store_->set(outcome, std::vector<uint8_t>(text.begin(), text.end()));
  if (!missing.empty()) C10_THROW_ERROR(DistBackendError, c10::str("[rank 0] ", text));
}

}  // namespace torch_mojo
