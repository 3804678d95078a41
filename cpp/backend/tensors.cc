#include "backend/tensors.h"

#include <cstring>

#include <ATen/Functions.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include "backend/process_group_mojo.hpp"
#include "backend/shared_pool.h"

namespace torch_mojo {

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
    case c10d::ReduceOp::PREMUL_SUM:  // reductionInput has scaled the input
      TORCH_CHECK_TYPE(at::isFloatingType(tensor.scalar_type()),
                       "ReduceOp.PREMUL_SUM takes floating-point tensors (as with NCCL); got ",
                       dtypeName(tensor));
      return ncclSum;
    default:
      TORCH_CHECK_VALUE(false, "ReduceOp.", c10::str(reduceOpName(reduceOp.op_)),
                        " is not supported by the mojo backend; use SUM, AVG, PRODUCT, MIN or MAX");
  }
}

at::Tensor reductionInput(const c10d::ReduceOp& reduceOp, const at::Tensor& input) {
  if (reduceOp.op_ != c10d::ReduceOp::PREMUL_SUM) return input.contiguous();
  const auto* factor = dynamic_cast<const c10d::PreMulSumSupplement*>(reduceOp.supplement_.get());
  TORCH_CHECK_VALUE(factor != nullptr, "ReduceOp.PREMUL_SUM without its factor: make it with "
                                       "torch.distributed._make_nccl_premul_sum(factor)");
  if (factor->tensor_factor.defined()) return input.mul(factor->tensor_factor.to(input.device()));
  return input.mul(factor->double_factor);
}

void checkRoot(int64_t root, int size, const char* call) {
  TORCH_CHECK_VALUE(root >= 0 && root < size, call, " root ", root,
                    " is not a rank of this group of ", size);
}

// Built for every call: plain concatenation, where c10::str would build
// an ostringstream (about 0.3 us a call).
std::string describe(const char* op, const at::Tensor& tensor, const char* extra) {
  std::string text = std::string(op) + " " + std::to_string(tensor.numel()) + " x " + dtypeName(tensor);
  if (extra != nullptr) text.append(" ").append(extra);
  return text;
}

at::Tensor writableBuffer(const at::Tensor& output) {
  return output.is_contiguous() ? output : at::empty_like(output, at::MemoryFormat::Contiguous);
}

void copyBack(const at::Tensor& output, const at::Tensor& buffer) {
  if (!buffer.is_same(output)) const_cast<at::Tensor&>(output).copy_(buffer);
}

void sendTensor(Communicator& comm, const at::Tensor& tensor, int peer) {
  comm.send(tensor.data_ptr(), tensor.numel(), ncclDatatypeOf(tensor), peer);
}

void recvTensor(Communicator& comm, const at::Tensor& tensor, int peer) {
  comm.recv(tensor.data_ptr(), tensor.numel(), ncclDatatypeOf(tensor), peer);
}

// Offsets in numbers rather than a view per rank: a view costs a trip
// through the dispatcher, and an all-to-all needs two per rank per call.
PartLayout partsByRows(const at::Tensor& tensor, const std::vector<int64_t>& rowsByRank) {
  const int64_t rows = tensor.dim() == 0 ? 1 : tensor.size(0);
  const size_t perRow = rows == 0 ? 0 : static_cast<size_t>(tensor.numel() / rows);
  PartLayout layout;
  size_t at = 0;
  for (int64_t count : rowsByRank) {
    layout.counts.push_back(static_cast<size_t>(count) * perRow);
    layout.displacements.push_back(at);
    at += layout.counts.back();
  }
  return layout;
}

at::Tensor part(const at::Tensor& tensor, const PartLayout& layout, int rank) {
  return tensor.view(-1).narrow(0, layout.displacements[rank], layout.counts[rank]);
}

void sendAndReceiveParts(Communicator& comm, const std::vector<at::Tensor>& sendParts,
                         const std::vector<at::Tensor>& recvParts, int rank) {
  comm.group([&] {
    for (int peer = 0; peer < static_cast<int>(sendParts.size()); ++peer) {
      if (peer == rank) continue;
      sendTensor(comm, sendParts[peer], peer);
      recvTensor(comm, recvParts[peer], peer);
    }
  });
}

bool exchangeParts(Communicator& comm, const at::Tensor& source, const PartLayout& sendParts,
                   const at::Tensor& buffer, const PartLayout& recvParts, int rank) {
  if (!comm.hasAllToAllv()) {
    std::vector<at::Tensor> sends, receives;
    for (int peer = 0; peer < static_cast<int>(sendParts.counts.size()); ++peer) {
      sends.push_back(part(source, sendParts, peer));
      receives.push_back(part(buffer, recvParts, peer));
    }
    sendAndReceiveParts(comm, sends, receives, rank);
    return false;
  }
  comm.allToAllv(source.data_ptr(), sendParts.counts, sendParts.displacements, buffer.data_ptr(), recvParts.counts,
                 recvParts.displacements, ncclDatatypeOf(source));
  return true;
}

// ------------------------------------------- tensors in the registered pool

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

}  // namespace torch_mojo
