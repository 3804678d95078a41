// ProcessGroupMojo's life: its communicators, the checks of a call's
// tensors, split(), abort() and shutdown(), and what the watchdog reads.
// The collectives are in collectives.cc, the job queue in work_queue.cc.
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

// The first rank of a group publishes its communicator's id in the store;
// the others wait for it as long as libmojoccl waits for its peers, not the
// store's timeout (half an hour by default).
void awaitUniqueId(c10d::Store& store, const std::string& key) {
  const int asked = std::atoi(environment("MOJOCCL_BOOTSTRAP_TIMEOUT_S").c_str());
  const int seconds = asked > 0 ? asked : MOJOCCL_BOOTSTRAP_TIMEOUT_S_DEFAULT;
  try {
    store.wait({key}, std::chrono::seconds(seconds));
  } catch (const c10::DistStoreError& error) {
    C10_THROW_ERROR(DistBackendError,
                    c10::str("the group's first rank did not publish its communicator in the store "
                             "within ", seconds, " s (MOJOCCL_BOOTSTRAP_TIMEOUT_S): it never "
                             "created the group, or the ranks disagree on who is in it (as after "
                             "shrink_group with different ranks_to_exclude) [", error.what_without_backtrace(), "]"));
  }
}

// torchrun keeps its store across the restarts of a job (--max-restarts),
// and torch's keys for a group are the same in every attempt: without a
// prefix of its own, a restarted rank could read the communicator id of
// the attempt before and wait for a rank that is gone.
c10::intrusive_ptr<c10d::Store> forThisAttempt(const c10::intrusive_ptr<c10d::Store>& store) {
  const std::string attempt = environment("TORCHELASTIC_RESTART_COUNT");
  if (attempt.empty()) return store;
  return c10::make_intrusive<c10d::PrefixStore>("mojo_attempt_" + attempt, store);
}

// The job's own store, without a group's prefix (but this attempt's): what
// one process says of itself there, every group can read. Where each
// global rank runs ("host H, pid P"), so that a rank that never checks in
// to a later group can still be named with its host; which ranks' processes
// are ending.
c10::intrusive_ptr<c10d::Store> jobStore(const c10::intrusive_ptr<c10d::Store>& store) {
  auto* prefixed = dynamic_cast<c10d::PrefixStore*>(store.get());
  return forThisAttempt(prefixed != nullptr ? prefixed->getUnderlyingNonPrefixStore() : store);
}

// Where the store under the groups' prefixes is a TCPStore, a watch on its server.
std::shared_ptr<StoreWatch> watchServerOf(const c10::intrusive_ptr<c10d::Store>& store) {
  auto* prefixed = dynamic_cast<c10d::PrefixStore*>(store.get());
  auto base = prefixed != nullptr ? prefixed->getUnderlyingNonPrefixStore() : store;
  auto* tcp = dynamic_cast<c10d::TCPStore*>(base.get());
  return tcp != nullptr ? StoreWatch::of(tcp->getHost(), tcp->getPort()) : nullptr;
}

std::string whereaboutsKey(uint64_t globalRank) {
  return "torch_mojo_where/" + std::to_string(globalRank);
}

// The global ranks whose processes are ending, each appended as "R,": one
// key, read in one round trip however large the job.
constexpr const char* kExitingKey = "torch_mojo_exiting";

std::set<uint64_t> exitingRanks(c10d::Store& job) {
  std::set<uint64_t> ranks;
  if (!job.check({kExitingKey})) return ranks;
  std::vector<uint8_t> text = job.get(kExitingKey);
  uint64_t rank = 0;
  for (uint8_t c : text) {
    if (c == ',') {
      ranks.insert(rank);
      rank = 0;
    } else {
      rank = rank * 10 + (c - '0');
    }
  }
  return ranks;
}

// Every group alive in this process, for announceExit.
std::mutex liveGroupsMutex;
std::set<ProcessGroupMojo*> liveGroups;

void publishWhereabouts(c10d::Store& job, uint64_t globalRank) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  job.set(whereaboutsKey(globalRank), c10::str("host ", host, ", pid ", getpid()));
}

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
      const std::string entry = std::to_string(group->globalRank()) + ",";
      group->jobStore_->append(kExitingKey, std::vector<uint8_t>(entry.begin(), entry.end()));
    } catch (const std::exception&) {
      // The store went with its host: the peers will have more to say than this.
    }
  }
}

std::vector<int> ProcessGroupMojo::failedRanks() {
  std::vector<int> failed = host_->failedRanks();
  // The store, not the communicator, says who is ending: where a node's
  // first rank has left, the communicator no longer hears of that node.
  // Without a store to ask, the ranks that ended without leaving are what is known.
  try {
    const std::set<uint64_t> exiting =
        storeGone() ? std::set<uint64_t>{} : exitingRanks(*jobStore_);
    for (int rank = 0; rank < size_; ++rank)
      if (rank != rank_ && exiting.count(globalRanks_[rank])) failed.push_back(rank);
  } catch (const std::exception&) {
  }
  std::sort(failed.begin(), failed.end());
  failed.erase(std::unique(failed.begin(), failed.end()), failed.end());
  return failed;
}

std::exception_ptr ProcessGroupMojo::classify(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const CclError& failure) {
    // Invalid usage (a mismatch, a bad argument) is the caller's to handle;
    // anything else means the ranks are no longer in step: the watchdog's.
    if (failure.code != ncclInvalidUsage && failure.code != ncclInvalidArgument) {
      std::lock_guard<std::mutex> lock(mutex_);
      fatalError_ = failure.what();
      // The first error is the one getError() tells (an abort after a
      // timeout makes the calls fail as well).
      auto none = c10d::ErrorType::SUCCESS;
      error_.compare_exchange_strong(none, failure.code == ncclRemoteError
                                               ? c10d::ErrorType::REMOTE_ERROR
                                               : c10d::ErrorType::COMM_ERROR);
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
  // it to the others. The store is already prefixed for this group. Each
  // rank checks in first, so that a creation that fails can say who never
  // came.
  store.set(key + "/checked_in/" + std::to_string(rank_), std::vector<uint8_t>{1});
  try {
    ncclUniqueId id{};
    if (rank_ == 0) {
      id = comm.newUniqueId();
      store.set(key, std::vector<uint8_t>(id.internal, id.internal + sizeof(id.internal)));
    } else {
      awaitUniqueId(store, key);
      std::vector<uint8_t> bytes = store.get(key);
      TORCH_CHECK(bytes.size() == sizeof(id.internal), "the unique id in the store has ",
                  bytes.size(), " bytes, expected ", sizeof(id.internal),
                  " (do all ranks run the same torch-mojo?)");
      std::memcpy(id.internal, bytes.data(), bytes.size());
    }
    comm.init(id, size_, rank_);
  } catch (const CclError& error) {
    C10_THROW_ERROR(DistBackendError, neverCheckedIn(store, key) + error.what());
  } catch (const c10::DistBackendError& error) {
    C10_THROW_ERROR(DistBackendError, neverCheckedIn(store, key) + error.what_without_backtrace());
  }
}

std::string ProcessGroupMojo::neverCheckedIn(c10d::Store& store, const std::string& key) {
  std::string missing;
  try {
    auto& job = jobStore_;
    for (int rank = 0; rank < size_; ++rank) {
      if (store.check({key + "/checked_in/" + std::to_string(rank)})) continue;
      const uint64_t global = globalRanks_[rank];
      std::string where = "never seen";
      if (job->check({whereaboutsKey(global)})) {
        std::vector<uint8_t> text = job->get(whereaboutsKey(global));
        where = std::string(text.begin(), text.end());
      }
      missing += c10::str(missing.empty() ? "" : ", ", rank, " (global rank ", global, ", ", where, ")");
    }
  } catch (const std::exception&) {
    return "";  // the store is gone too (its host failed): the error alone says what happened
  }
  if (missing.empty()) return "";
  return c10::str("[rank ", globalRank(), "] the group of ", size_, " ranks was not created; ",
                  "rank(s) that never checked in: ", missing, ". ");
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

GroupHealth ProcessGroupMojo::health() {
  std::lock_guard<std::mutex> lock(mutex_);
  // A device job in flight was issued before the one running on the host.
  const bool running = running_ || !inFlight_.empty();
  GroupHealth health{running,  running || !queue_.empty(), {}, {history_.begin(), history_.end()},
                     failure_, failed_,                    timeout_.load()};
  if (!inFlight_.empty()) {
    health.current = traceOf(inFlight_.front());
  } else if (running_) {
    const JobTrace* recorded = traceOf(runningSequence_);
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

const char* ProcessGroupMojo::raisesInCaller() const {
  if (WatchdogSettings::get().mode == WatchdogSettings::Mode::Raise)
    return "TORCH_MOJO_BACKEND_PG_WATCHDOG=raise";
  return raisingOwner_.load();
}

void ProcessGroupMojo::onFailure(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  failureHook_ = std::move(hook);
}

void ProcessGroupMojo::runFailureHook() {
  std::function<void()> hook;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    hook = failureHook_;
  }
  if (hook) hook();
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

void ProcessGroupMojo::abortCommunicator(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!host_->initialised() || aborted_) return;
    aborted_ = true;
    abortReason_ = c10::str("[rank ", globalRank(), "] ", reason);
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
