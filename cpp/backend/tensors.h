// Tensors as the collective library sees them: the NCCL datatype and
// reduction for a torch dtype and ReduceOp, the words that describe a call
// in reports, and the buffers a call reads and writes.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "backend/communicator.h"
#include "mojoccl/nccl.h"

namespace torch_mojo {

// What a reduction sends: for PREMUL_SUM (NCCL's sum of every rank's
// input times a factor, a number or a one-element tensor) a copy scaled by
// the factor, which the library then sums; the caller's input stays as it
// was. Otherwise the input itself, made contiguous.
at::Tensor reductionInput(const c10d::ReduceOp& reduceOp, const at::Tensor& input);

std::string dtypeName(const at::Tensor& tensor);
// Raises TypeError for a dtype the library cannot carry.
ncclDataType_t ncclDatatypeOf(const at::Tensor& tensor);
const char* reduceOpName(c10d::ReduceOp::RedOpType op);
// Raises for an op the library has no reduction for (PREMUL_SUM, AVG on bool).
ncclRedOp_t ncclRedOpOf(const c10d::ReduceOp& reduceOp, const at::Tensor& tensor);

// Raises ValueError unless `root` is a rank of a group of `size`.
void checkRoot(int64_t root, int size, const char* call);

// "all_reduce 1024 x float32 sum": what reports call a collective.
std::string describe(const char* op, const at::Tensor& tensor, const char* extra = nullptr);

// Where a collective may write `output`: itself when contiguous, else a
// fresh buffer whose contents copyBack() moves into `output` afterwards.
at::Tensor writableBuffer(const at::Tensor& output);
void copyBack(const at::Tensor& output, const at::Tensor& buffer);

void sendTensor(Communicator& comm, const at::Tensor& tensor, int peer);
void recvTensor(Communicator& comm, const at::Tensor& tensor, int peer);

// Where each rank's part of an all-to-all lies in a contiguous tensor:
// counts and displacements in elements, by rank.
struct PartLayout {
  std::vector<size_t> counts, displacements;
};
// Parts of `rowsByRank[p]` rows each (the first dimension), one after another.
PartLayout partsByRows(const at::Tensor& tensor, const std::vector<int64_t>& rowsByRank);
// The part `layout` places at `rank` in `tensor`, flattened.
at::Tensor part(const at::Tensor& tensor, const PartLayout& layout, int rank);

// sendParts[p] to rank p and recvParts[p] from it, for every other rank,
// in one group of sends and receives.
void sendAndReceiveParts(Communicator& comm, const std::vector<at::Tensor>& sendParts,
                         const std::vector<at::Tensor>& recvParts, int rank);
// The parts of `source` to every rank and those of `buffer` from it: one
// ncclAllToAllv where the library has one, which also copies the part to
// ourselves (returns true), else a group of sends and receives to the
// other ranks (returns false).
bool exchangeParts(Communicator& comm, const at::Tensor& source, const PartLayout& sendParts,
                   const at::Tensor& buffer, const PartLayout& recvParts, int rank);

// A CPU tensor of `numel` elements in the registered pool (SharedPool):
// collectives on it read peers' memory in place.
at::Tensor sharedTensor(int64_t numel, const at::TensorOptions& options);

// The pool as a c10 allocator: what getMemAllocator() returns, and what
// torch_mojo.memory.cpu_tensors_in_pool() makes torch's CPU allocator for a
// while, so that tensors torch allocates itself (DDP's buckets) live there.
std::shared_ptr<c10::Allocator> sharedPoolAllocator();
void usePoolForCpuTensors(bool enable);

}  // namespace torch_mojo
