// ProcessGroupMojo's life: its communicators made and traced, split() and
// shrink(). What it keeps in torch's store is in group_store.cc, how it
// fails and ends (and what the watchdog reads) in group_failure.cc, the
// collectives and their checks in collectives.cc, the job queue in
// work_queue.cc.
#include "backend/process_group_mojo.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include <unistd.h>

#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/logger.hpp>

#include "backend/environment.h"
#include "backend/group_store.h"
#include "backend/tensors.h"
#include "backend/watchdog.hpp"

namespace torch_mojo {

namespace {

bool traceEnabled() { return environment("TORCH_MOJO_BACKEND_TRACE") != "0"; }

void trace(const std::string& line) {
  if (line.empty() || !traceEnabled()) return;
  std::fprintf(stderr, "[TRACE] %s\n", line.c_str());
  std::fflush(stderr);
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

// Every group alive in this process, for announceExit.
std::mutex liveGroupsMutex;
std::set<ProcessGroupMojo*> liveGroups;

}  // namespace

ProcessGroupMojo::ProcessGroupMojo(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                   int size, std::chrono::milliseconds timeout,
                                   std::vector<uint64_t> globalRanks,
                                   std::optional<AcceleratorSetup> accelerator, StoreScope scope)
    : Backend(rank, size),
      accelerator_(std::move(accelerator)),
      timeout_(timeout),
      store_(scope == StoreScope::Group ? store : forThisAttempt(store)),
      jobStore_(scope == StoreScope::Group ? store : jobStore(store)),
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
  publishWhereabouts(*jobStore_, globalRank());
  storeWatch_ = watchServerOf(store);
  createCommunicator(*host_, *store_, "torch_mojo_unique_id");
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
    createCommunicator(*device_->comm, *store_, "torch_mojo_device_unique_id");
    traceLibrary(*library);
  }
  if (watched_) Watchdog::get().add(this);
  {
    std::lock_guard<std::mutex> lock(liveGroupsMutex);
    liveGroups.insert(this);
  }
  init();
  // Last: a member thread still joinable when a later statement throws
  // would end the process (std::terminate in ~thread).
  std::promise<std::string> started;
  std::future<std::string> openMp = started.get_future();
  worker_ = std::thread(&ProcessGroupMojo::workerLoop, this, std::move(started));
  trace(openMp.get());
}

ProcessGroupMojo::~ProcessGroupMojo() {
  {
    std::lock_guard<std::mutex> lock(liveGroupsMutex);
    liveGroups.erase(this);
  }
  shutdown();
}

void ProcessGroupMojo::announceExit() {
  std::lock_guard<std::mutex> lock(liveGroupsMutex);
  for (ProcessGroupMojo* group : liveGroups) {
    if (group->storeGone()) continue;
    try {
      sayExiting(*group->jobStore_, group->globalRank());
    } catch (const std::exception&) {
      // The store went with its host: the peers will have more to say than this.
    }
  }
}


std::shared_ptr<c10::Allocator> ProcessGroupMojo::getMemAllocator() {
  return sharedPoolAllocator();
}

at::Tensor ProcessGroupMojo::allocateTensor(long size, at::TensorOptions options) {
  return sharedTensor(size, options);
}

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupMojo::getBackendOptions() {
  return c10::make_intrusive<Options>("mojo", timeout_.load());
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

c10::intrusive_ptr<c10d::Backend> ProcessGroupMojo::shrink(
    const std::vector<int64_t>& ranksToExclude, int shrinkFlags,
    const c10::intrusive_ptr<Options>& opts) {
  constexpr int kShrinkAbort = 0x01;  // torch.distributed.SHRINK_ABORT
  std::set<int64_t> excluded(ranksToExclude.begin(), ranksToExclude.end());
  std::string without;
  for (int64_t rank : excluded) {
    TORCH_CHECK_VALUE(rank >= 0 && rank < size_, "shrink: rank ", rank,
                      " is not a rank of this group of ", size_);
    without += (without.empty() ? "" : ",") + std::to_string(rank);
  }
  TORCH_CHECK_VALUE(!excluded.count(rank_), "shrink: rank ", rank_,
                    " excludes itself; only the ranks that stay call shrink_group");
  if (shrinkFlags & kShrinkAbort)
    abortCommunicator("the group was shrunk with SHRINK_ABORT (without ranks " + without +
                      "): use the group shrink_group returned");
  std::vector<uint64_t> members;
  int newRank = -1;
  for (int rank = 0; rank < size_; ++rank) {
    if (excluded.count(rank)) continue;
    if (rank == rank_) newRank = static_cast<int>(members.size());
    members.push_back(globalRanks_[rank]);
  }
  // The ranks that stay meet under a key of their own: the how-manieth
  // shrink of this group, and whom it leaves out (ranks that disagree on
  // that wait apart, and fail at the bootstrap timeout, instead of meeting).
  auto store = c10::make_intrusive<c10d::PrefixStore>(
      "mojo_shrink/" + std::to_string(++shrinks_) + "/without/" + without, store_);
  const auto timeout = opts ? opts->timeout : timeout_.load();
  return c10::make_intrusive<ProcessGroupMojo>(store, newRank, static_cast<int>(members.size()),
                                               timeout, members, accelerator_);
}

}  // namespace torch_mojo
