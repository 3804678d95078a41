// The flight recorder: torch's own c10d::FlightRecorder, kept for the `mojo`
// backend alone, so that its dumps are PyTorch's format (what
// `python -m torch.distributed.flight_recorder.fr_trace` reads) without
// mixing with other backends' records.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>

namespace c10d {
struct ProcessGroupStatus;
}

namespace torch_mojo {

// What the recorder asks of an "end event": whether the collective ended.
struct CompletionEvent {
  std::atomic<bool> done{false};
  bool query() const { return done.load(); }
};

namespace flight_recorder {

// False when TORCH_FR_BUFFER_SIZE is 0.
bool enabled();

std::optional<size_t> record(size_t groupId, const std::tuple<std::string, std::string>& groupName,
                             size_t collectiveSequence, size_t p2pSequence, size_t opId,
                             const std::string& profilingName, const std::vector<at::Tensor>& inputs,
                             const std::vector<at::Tensor>& outputs, CompletionEvent* end,
                             std::chrono::milliseconds timeout,
                             std::shared_ptr<c10d::ProcessGroupStatus> status, bool isP2P);

// Marks the entry completed (its event must say so first).
void retire(std::optional<size_t> id);

void recordGroupRanks(const std::tuple<std::string, std::string>& groupName,
                      const std::vector<uint64_t>& globalRanks);

// PyTorch's pickle and JSON dumps of the record.
std::string dumpPickle(bool includeCollectives, bool includeStackTraces, bool onlyActive);
std::string dumpJson(bool includeCollectives, bool onlyActive);

// Writes the pickle dump to TORCH_FR_DUMP_TEMP_FILE (or
// TORCH_NCCL_DEBUG_INFO_TEMP_FILE, default ~/.cache/torch/comm_lib_trace_rank_)
// followed by the global rank. Returns the file's path.
std::string writeDump(int globalRank, bool onlyActive);

}  // namespace flight_recorder
}  // namespace torch_mojo
