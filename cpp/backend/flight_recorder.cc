#include "backend/flight_recorder.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <torch/csrc/distributed/c10d/FlightRecorder.hpp>
#include <torch/csrc/distributed/c10d/FlightRecorderDetail.hpp>

#include "backend/environment.h"

namespace c10d {
// The recorder asks for durations only when an entry has a start event;
// ours never do (no device timing), so there is nothing to measure.
template <>
float getDurationFromEvent<torch_mojo::CompletionEvent>(torch_mojo::CompletionEvent&,
                                                        torch_mojo::CompletionEvent&) {
  return 0;
}
template struct FlightRecorder<torch_mojo::CompletionEvent>;
}  // namespace c10d

namespace torch_mojo::flight_recorder {

namespace {

using Recorder = c10d::FlightRecorder<CompletionEvent>;

Recorder& recorder() { return *Recorder::get(); }

void makeParentDirectories(const std::string& path) {
  for (size_t slash = path.find('/', 1); slash != std::string::npos; slash = path.find('/', slash + 1))
    mkdir(path.substr(0, slash).c_str(), 0755);
}

// "{job_id}" in the prefix becomes the batch system's job id, so that
// dumps on node-local storage of different jobs do not overwrite each other
// and can be collected per job.
std::string withJobId(std::string prefix) {
  const std::string placeholder = "{job_id}";
  const size_t at = prefix.find(placeholder);
  if (at == std::string::npos) return prefix;
  std::string job = "nojob";
  for (const char* name : {"SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID", "TORCHELASTIC_RUN_ID"}) {
    const std::string value = environment(name);
    if (!value.empty()) {
      job = value;
      break;
    }
  }
  return prefix.replace(at, placeholder.size(), job);
}

}  // namespace

bool enabled() { return recorder().enabled_; }

std::optional<size_t> record(size_t groupId, const std::tuple<std::string, std::string>& groupName,
                             size_t collectiveSequence, size_t p2pSequence, size_t opId,
                             const std::string& profilingName, const std::vector<at::Tensor>& inputs,
                             const std::vector<at::Tensor>& outputs, CompletionEvent* end,
                             std::chrono::milliseconds timeout,
                             std::shared_ptr<c10d::ProcessGroupStatus> status, bool isP2P) {
  return recorder().record(groupId, groupName, collectiveSequence, p2pSequence, opId, profilingName,
                           inputs, outputs, nullptr, end, timeout, std::move(status), isP2P);
}

void retire(std::optional<size_t> id) { recorder().retire_id(id, /*compute_duration=*/false); }

void recordGroupRanks(const std::tuple<std::string, std::string>& groupName,
                      const std::vector<uint64_t>& globalRanks) {
  recorder().record_pg_ranks(groupName, globalRanks);
}

std::string dumpPickle(bool includeCollectives, bool includeStackTraces, bool onlyActive) {
  return recorder().dump(std::nullopt, includeCollectives, includeStackTraces, onlyActive);
}

std::string dumpJson(bool includeCollectives, bool onlyActive) {
  return recorder().dump_json(std::nullopt, includeCollectives, onlyActive);
}

std::string writeDump(int globalRank, bool onlyActive) {
  std::string prefix = environment("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
                                    environment("HOME", nullptr, "/tmp") + "/.cache/torch/comm_lib_trace_rank_");
  bool stacks = environment("TORCH_INCLUDE_STACK_TRACE", "TORCH_INCLUDE_STACK_TRACE", "1") != "0";
  std::string path = withJobId(prefix) + std::to_string(globalRank);
  makeParentDirectories(path);
  std::string dump = dumpPickle(true, stacks, onlyActive);
  // Written aside, then renamed: a reader never sees half a dump.
  std::string partial = path + ".partial";
  FILE* file = std::fopen(partial.c_str(), "wb");
  if (file == nullptr) return "";
  bool written = std::fwrite(dump.data(), 1, dump.size(), file) == dump.size();
  written = std::fclose(file) == 0 && written;
  if (!written || std::rename(partial.c_str(), path.c_str()) != 0) return "";
  return path;
}

}  // namespace torch_mojo::flight_recorder
